"""Rules for choosing γ, compared offline: greedy decodes replayed exactly (T = 0), sampled
ones walked as a model (T > 0).

Letters: P prompt tokens, N new tokens, T = P + N, G drafted depth, D draft layers' passes,
K drafted positions a sampled decode reached, R replicates.

At T = 0 the emitted text does not depend on the γ a rule chooses: it is the target's
greedy continuation. So one pass per prompt records everything a rule can see or gain:
for every start ℓ (the pending token's index, ℓ = P-1 .. T-2) and depth j = 1..G,
  hit[ℓ, j]   whether the draft's j-th proposal from ℓ equals the greedy token ℓ+j
              (β_j at T = 0: p and the draft's warped q are one-hot),
  depth[ℓ]    the leading run of hits (a step from ℓ proposing γ accepts min(depth, γ)),
  lookup[ℓ]   whether a hybrid's prompt lookup matched there (its source, `adaptive`).
The feature draft's proposals come from `model.unrolled_feature_logits` over the target's
features of the whole greedy text, which equal the decode loop's q_j when the draft's
earlier proposals were accepted (that function's docstring). An independent draft's j-th
proposal from ℓ, once its earlier j-1 were hits, is its greedy token after the text up to
ℓ+j-1: one teacher-forced forward of the draft over the greedy text gives every such
proposal. hit[ℓ, j] past the first miss is then not the loop's proposal, but nothing reads
it: a step accepts the leading run of hits and observes the first miss after it.
`greedy_trace` is checked against the loop's own accepted counts in
tests/test_gamma_replay.py.

At T > 0 the text depends on the choices, so no replay is exact. `sampled_trace` records
one sampled decode at a fixed γ = G instead: the exact β_i = Σ min(p_i, q_i) of every
drafted position it reached, in order (the loop's own `accept_prob`). `replay_sampled`
then walks each trace under a rule, R times: a step from position a proposing γ reads
β_{a+1..a+γ} (cycling through the trace), accepts draft j with probability β_j (the
probability token-wise verification accepts it) given its j-1 predecessors were accepted,
observes the positions it reached, and moves a on by as many. Every position counts as the
draft model's (the decode does not record a hybrid's source per step), at the draft's
step costs. It is a model of sampled decoding, not a replay of it: it holds each
position's β to the recorded text and draws acceptance independently.

`replay` then walks a trace under a rule: at ℓ choose γ (from what the rule has observed
so far, as `adaptive` does in the loop), emit min(depth, γ) + 1 tokens at a cost of
s_src(γ) plain steps (the measured step costs), observe the hits the loop observes, and
move on. Tokens per plain-step cost is the rule's predicted speedup over autoregressive
decoding on that prompt. The choice and the bookkeeping of each step are the decode
loop's own functions (the rule's `init`, `choose` and `observe`, `adaptive.GammaRule`;
held to 0..G as `AutoGamma.choose` holds them). The measured s(0) includes the
catch-up calls a draft makes while it is skipped (a feature draft's, every L skipped
tokens). An independent draft instead feeds all the tokens it skipped when it next drafts
(`IndependentDraft.catch_up`, W tokens a call): given `CatchUp` (W and one call's measured
cost), the replay charges a step that drafts after b skipped tokens ceil(b / W) such calls
on top of s(γ); without it that catch-up is not counted. A `Rule` with catch_up_aware
also chooses on those costs (the catch-up the row owes added to every s(γ >= 1)). How
closely the replay predicts measured speedups is in docs/results.md#gamma-rules.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.decoding.loop import autoregressive_generate, speculative_generate
from specdec_jax.decoding.spec import DecodeSpec
from specdec_jax.drafts import ngram
from specdec_jax.drafts.feature import FeatureDraft
from specdec_jax.drafts.hybrid import HybridDraft
from specdec_jax.drafts.independent import IndependentDraft
from specdec_jax.drafts.registry import as_draft
from specdec_jax.gamma import adaptive
from specdec_jax.models.model import Model
from specdec_jax.models.model import forward, init_cache, unrolled_feature_logits
from specdec_jax.models.sampling import SamplingConfig


@dataclasses.dataclass(frozen=True)
class GreedyTrace:
  """One prompt's greedy decode, as seen from every start (module docstring)."""

  hit: np.ndarray  # bool [N,G]: hit[i, j-1] for the start ℓ = P-1+i
  lookup: np.ndarray  # bool [N]

  @property
  def depth(self) -> np.ndarray:
    """int [N]: accepted drafts of a step from each start that proposes all G."""
    return np.cumprod(self.hit, axis=1).sum(axis=1)


@dataclasses.dataclass(frozen=True)
class Rule:
  """How a row picks γ each step.

  fixed: always this γ (a fixed-γ run); oracle: the γ of the best tokens/cost knowing the
  step's depth (a bound, not a rule); otherwise gamma='auto' under `gamma_rule` (any
  `adaptive.GammaRule`, the decode loop's default unless named), told each step's source
  when by_source (else always DRAFT: one estimate for both sources); catch_up_aware: the
  rule sees each s(γ >= 1) with the catch-up the row owes added (`CatchUp`), as that step
  would cost.
  """

  gamma_rule: adaptive.GammaRule = adaptive.DEFAULT_RULE
  by_source: bool = True
  fixed: int | None = None
  oracle: bool = False
  catch_up_aware: bool = False  # choose on s(γ) plus the catch-up the row owes (`CatchUp`)


@dataclasses.dataclass(frozen=True)
class CatchUp:
  """What a draft that falls behind on γ = 0 steps pays when it next drafts (an independent
  draft, module docstring): width W tokens fed per catch-up call, cost one call's time in
  plain steps (`studies.catch_up_cost`: the draft's cache-only call over W tokens over
  the target's one-token call)."""

  width: int
  cost: float

  def owed(self, behind):
    """Plain steps of the calls that feed `behind` skipped tokens (an int, or int [rows]):
    ceil(behind / W) calls each."""
    return -(-np.asarray(behind) // self.width) * self.cost


def greedy_trace(target_params, target_config, draft_params, draft_config, prompt, *,
                 max_new_tokens: int, depth: int, vocab_size: int | None = None
                 ) -> GreedyTrace:
  """The trace of one prompt (token ids) for a feature or independent draft or a hybrid
  over one (module docstring); draft_config: the Draft (or the model draft's ModelConfig).
  vocab_size: the target's real vocabulary (draft columns past it are never proposed)."""
  draft = as_draft(draft_config)
  hybrid = draft if isinstance(draft, HybridDraft) else None
  inner = hybrid.inner if hybrid is not None else draft
  if not isinstance(inner, (FeatureDraft, IndependentDraft)):
    raise ValueError(f"greedy_trace needs a feature or independent draft or a hybrid over "
                     f"one, got {type(draft).__name__}")
  out = autoregressive_generate(
      Model(target_config, target_params), [prompt],
      spec=DecodeSpec(max_new_tokens, sampling=SamplingConfig(temperature=0.0),
                      vocab_size=vocab_size))
  seq = np.asarray(list(prompt) + out.row(0), np.int32)
  total, first = len(seq), len(prompt) - 1
  if isinstance(inner, FeatureDraft):
    proposals = _feature_proposals(target_params, draft_params, jnp.asarray(seq)[None],
                                   target_config=target_config, feature=inner.config,
                                   depth=depth)
  else:
    proposals = _independent_proposals(draft_params, jnp.asarray(seq)[None],
                                       config=inner.config, depth=depth,
                                       vocab_size=vocab_size)
  hits = _hits(proposals, seq, depth)[first:total - 1]
  if hybrid is not None:
    buffer = np.zeros((total - 1 - first, total + depth + 1), np.int32)
    buffer[:, :total] = seq
    looked, found = ngram.lookup(jnp.asarray(buffer), jnp.arange(first + 1, total),
                                 min_n=hybrid.min_n, max_n=hybrid.max_n,
                                 gamma=depth)
    looked, found = np.asarray(looked), np.asarray(found)
    later = np.arange(first, total - 1)[:, None] + 1 + np.arange(depth)[None, :]
    truth = np.where(later < total, seq[np.minimum(later, total - 1)], -1)
    hits = np.where(found[:, None], looked == truth, hits)
    lookups = found
  else:
    lookups = np.zeros(total - 1 - first, bool)
  return GreedyTrace(hit=hits.astype(bool), lookup=lookups)


def _feature_proposals(target_params, draft_params, seq, *, target_config, feature, depth):
  """int [G,T]: the feature draft's pass j proposal at position i (reading the text up to i)."""
  total = seq.shape[1]
  cache = {**init_cache(target_config, 1, total), "length": jnp.zeros((1,), jnp.int32)}
  positions = jnp.arange(total, dtype=jnp.int32)[None]
  _, _, features = _forward(target_params, seq, positions, cache, config=target_config,
                            return_logits=False, hidden_layers=feature.feature_layers)
  logits = _unrolled(draft_params, seq, features, config=feature,
                     input_embed=target_params["embed"], depth=depth, full_vocab=True)
  return np.asarray(jnp.argmax(logits[:, 0], axis=-1))  # [G,T]: pass j at position i


def _independent_proposals(draft_params, seq, *, config, depth, vocab_size):
  """int [G,T]: the independent draft's greedy token after the text up to position i, the
  same for every pass j (teacher forced: module docstring)."""
  total = seq.shape[1]
  cache = {**init_cache(config, 1, total), "length": jnp.zeros((1,), jnp.int32)}
  positions = jnp.arange(total, dtype=jnp.int32)[None]
  logits = _forward(draft_params, seq, positions, cache, config=config)[0][0]  # [T,V]
  logits = logits[:, :vocab_size]  # the true vocabulary, as the loop's `warp_vocab` cuts it
  return np.broadcast_to(np.asarray(jnp.argmax(logits, axis=-1)), (depth, total))


def _hits(proposals, seq, depth):
  """bool [T,G]: (ℓ, j) -> pass j's proposal at position ℓ+j-1 equals seq[ℓ+j]."""
  total = len(seq)
  start = np.arange(total)[:, None]
  j = np.arange(1, depth + 1)[None, :]
  at = np.minimum(start + j - 1, total - 1)  # pass j reads position ℓ+j-1
  proposal = proposals[j - 1, at]
  truth = np.where(start + j < total, seq[np.minimum(start + j, total - 1)], -1)
  return proposal == truth


_forward = jax.jit(forward, static_argnames=("config", "return_logits", "hidden_layers"))
_unrolled = jax.jit(unrolled_feature_logits, static_argnames=("config", "depth", "full_vocab"))


def replay(trace: GreedyTrace, rule: Rule, costs: np.ndarray,
           max_new_tokens: int | None = None, catch_up: CatchUp | None = None) -> dict:
  """One prompt under one rule -> dict(speedup (tokens per plain-step cost), tokens,
  cost, steps, gammas {γ: steps}, sequence [γ of each step, in order], catch_up (plain
  steps of catch-up calls within cost)).

  costs float [2,G'+1]: s_src(0..G') (`adaptive.CostTable.loop_costs`); G' <= G of the
  trace. max_new_tokens: stop once this many are emitted (default: the trace's N).
  catch_up: the draft's deferred catch-up (module docstring); None: not counted.
  """
  costs = np.asarray(costs, np.float64)
  gmax = costs.shape[1] - 1
  if gmax > trace.hit.shape[1]:
    raise ValueError(f"costs cover gamma up to {gmax}; the trace has depth "
                     f"{trace.hit.shape[1]}")
  n_max = len(trace.lookup) if max_new_tokens is None else max_new_tokens
  depth = trace.depth
  rule_state = rule.gamma_rule.init(1)
  at, tokens, cost, owed_total, behind, sequence = 0, 0, 0.0, 0.0, 0, []
  while tokens < n_max and at < len(depth):
    source = adaptive.LOOKUP if trace.lookup[at] else adaptive.DRAFT
    column = jnp.asarray([source if rule.by_source else adaptive.DRAFT])
    owed = 0.0 if catch_up is None else catch_up.owed(behind)
    s = costs[source] + owed * (np.arange(gmax + 1) > 0)  # what each γ costs this step
    seen = s if rule.catch_up_aware else costs[source]
    if rule.fixed is not None:
      gamma = rule.fixed
    elif rule.oracle:
      gamma = int(np.argmax((np.minimum(depth[at], np.arange(gmax + 1)) + 1) / s))
    else:  # the decode loop's own rule, on this step's source costs
      both = jnp.asarray(np.stack([seen, seen]), jnp.float32)
      gamma = min(max(int(rule.gamma_rule.choose(rule_state, both, column)[0]), 0), gmax)
    accepted = min(int(depth[at]), gamma)
    rule_state = rule.gamma_rule.observe(  # the decode loop's own bookkeeping
        rule_state, chosen=jnp.asarray([gamma]), proposes=jnp.ones((1,), bool),
        num_accepted=jnp.asarray([accepted]),
        beta=jnp.asarray(trace.hit[None, at, :gmax], jnp.float32), source=column)
    sequence.append(gamma)
    tokens += accepted + 1
    cost += s[gamma]
    owed_total += float(owed) if gamma > 0 else 0.0
    behind = 0 if gamma > 0 else behind + 1  # a γ = 0 step skips the draft (batch 1)
    at += accepted + 1
  return dict(speedup=tokens / cost, tokens=tokens, cost=cost, steps=len(sequence),
              gammas=dict(collections.Counter(sequence)), sequence=sequence,
              catch_up=owed_total)


@dataclasses.dataclass(frozen=True)
class SampledTrace:
  """One prompt's sampled decode at a fixed γ (module docstring): beta float [K], the exact
  β of the K drafted positions it reached, in order."""

  beta: np.ndarray

  @property
  def spread(self) -> float:
    """The variance of β over the positions divided by α(1 - α), that of Bernoulli draws
    of the same mean α (1 at T = 0, where every β is 0 or 1)."""
    return pooled_spread([self])


def pooled_spread(traces: list[SampledTrace]) -> float:
  """The mean over traces of the variance of β over each one's positions, divided by the
  mean of α(1 - α) (`SampledTrace.spread` for one trace)."""
  alphas = np.asarray([t.beta.mean() for t in traces])
  return float(np.mean([t.beta.var() for t in traces])
               / max(float(np.mean(alphas * (1.0 - alphas))), 1e-12))


def sampled_trace(target: Model, draft: Model, prompt, *, spec: DecodeSpec, seed: int = 0
                  ) -> SampledTrace:
  """The trace of one prompt (token ids) sampled under `spec` (a fixed γ, T > 0)."""
  out = speculative_generate(target, draft, [prompt], spec=spec, seed=seed)
  return SampledTrace(beta=np.asarray(out.accept_prob[0][out.reached()[0]], np.float64))


def replay_sampled(traces: list[SampledTrace], rule: Rule, costs: np.ndarray, *,
                   max_new_tokens: int, replicates: int, seed: int = 0,
                   catch_up: CatchUp | None = None) -> list[dict]:
  """Each trace under one rule, `replicates` times (module docstring) -> per trace
  dict(speedup (the geometric mean over replicates of tokens per plain-step cost), steps
  and drafting steps (means over replicates)).

  costs float [2,G+1]: s_src(0..G); the draft's row is taken for every step. The rule's
  own `init`, `choose` and `observe` run on all traces × replicates as rows of one batch
  (each row's choice depends on its own past only). rule.oracle and rule.catch_up_aware
  are not defined here. catch_up: counted as in `replay` (None: not counted).
  """
  if rule.oracle:
    raise ValueError("replay_sampled has no oracle: a step's outcome is drawn, not known")
  if rule.catch_up_aware:
    raise ValueError("replay_sampled chooses on the table's costs: no catch_up_aware rule")
  s = np.asarray(costs, np.float64)[adaptive.DRAFT]
  gmax = len(s) - 1
  both = jnp.asarray(np.stack([s, s]), jnp.float32)
  rows = len(traces) * replicates
  lengths = np.repeat([t.beta.size for t in traces], replicates)  # [rows]
  pools = np.zeros((len(traces), lengths.max()))
  for i, t in enumerate(traces):
    pools[i, :t.beta.size] = t.beta
  pools = np.repeat(pools, replicates, axis=0)  # [rows, K_max]
  rng = np.random.default_rng(seed)
  at = rng.integers(0, 1 << 20, rows)  # each replicate starts at its own place
  source = jnp.full((rows,), adaptive.DRAFT, jnp.int32)
  gamma_rule = rule.gamma_rule
  choose = jax.jit(lambda st: gamma_rule.choose(st, both, source))
  observe = jax.jit(lambda st, chosen, live, accepted, beta: gamma_rule.observe(
      st, chosen=chosen, proposes=live, num_accepted=accepted, beta=beta, source=source))
  state = gamma_rule.init(rows)
  tokens, cost = np.zeros(rows, np.int64), np.zeros(rows)
  steps, drafting = np.zeros(rows, np.int64), np.zeros(rows, np.int64)
  behind = np.zeros(rows, np.int64)  # tokens each row's draft skipped (`CatchUp`)
  while (tokens < max_new_tokens).any():
    live = tokens < max_new_tokens
    gamma = np.full(rows, rule.fixed) if rule.fixed is not None else np.clip(
        np.asarray(choose(state)), 0, gmax)
    gamma = np.where(live, gamma, 0)
    drafted = np.arange(gmax)[None] < gamma[:, None]  # [rows, G]
    read = np.take_along_axis(pools, (at[:, None] + np.arange(gmax)) % lengths[:, None], 1)
    beta = np.where(drafted, read, 0.0).astype(np.float32)
    accept = (rng.random((rows, gmax)) < beta) & drafted
    accepted = np.cumprod(accept, axis=1).sum(axis=1)
    at += np.minimum(accepted + 1, gamma)
    tokens += np.where(live, accepted + 1, 0)
    cost += np.where(live, s[gamma], 0.0)
    if catch_up is not None:
      cost += np.where(live & (gamma > 0), catch_up.owed(behind), 0.0)
      behind = np.where(gamma > 0, 0, behind + 1)
    steps += live
    drafting += live & (gamma > 0)
    if rule.fixed is None:
      state = observe(state, jnp.asarray(gamma, jnp.int32), jnp.asarray(live),
                      jnp.asarray(accepted, jnp.int32), jnp.asarray(beta))
  speedup = np.log(np.minimum(tokens, max_new_tokens) / cost).reshape(len(traces), replicates)
  return [dict(speedup=float(np.exp(speedup[i].mean())),
               steps=float(steps.reshape(len(traces), -1)[i].mean()),
               drafting_steps=float(drafting.reshape(len(traces), -1)[i].mean()))
          for i in range(len(traces))]
