"""Theory beside measurement: Leviathan et al. §3 formulas and side-by-side timings.

Letters: B batch, G = γ drafted tokens per step.

  α                    mean exact acceptance probability Σ min(p, q)
  E[tokens/step]       (1 - α^(G+1)) / (1 - α)                  (i.i.d. acceptance)
  c                    draft step time / target step time      (one token, batch B)
  v(k)                 target time for k tokens / for 1 token  (1 on ideal hardware)
  predicted speedup    E[tokens/step] / (G c + v(G+1))          (`adaptive.step_cost`; G = 0: 1)
  never-drafting floor (P + N) / (P + D + N - 1 + s)            (`never_drafting_floor`)

Timings are wall-clock medians over repeats after a warm-up call, so compile time
is excluded (`specdec_jax.bench.timing`); the ratio speculative/autoregressive is measured
in one process, on the same model, settings and prompts.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from specdec_jax.bench import timing
from specdec_jax.gamma import adaptive
from specdec_jax.gamma.gamma_replay import CatchUp
from specdec_jax.models.matmul import dot_products_only
from specdec_jax.models.model import ModelConfig, forward, init_cache
from specdec_jax.models.sampling import SamplingConfig
from specdec_jax.decoding.loop import autoregressive_generate, speculative_generate
from specdec_jax.decoding.spec import DecodeSpec
from specdec_jax.drafts.hybrid import HybridDraft
from specdec_jax.drafts.independent import IndependentDraft
from specdec_jax.drafts.registry import as_draft
from specdec_jax.models.model import Model

# side_by_side_per_prompt pads each prompt to a multiple of this many tokens.
PROMPT_BUCKET = 32


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
  """E(α, γ) = (1 - α^(γ+1)) / (1 - α) (`adaptive.expected_tokens`); γ + 1 at α = 1."""
  return float(adaptive.expected_tokens(float(alpha), gamma)[gamma])


def expected_tokens_total(alpha: float, histogram: dict[int, int]) -> float:
  """Σ_γ n_γ E(α, γ): the expected tokens of the steps a run took ({γ: steps}); a plain
  step (γ = 0) counts 1 token whatever α (also NaN, where nothing was drafted)."""
  return sum(n * (expected_tokens_per_step(alpha, g) if g else 1.0)
             for g, n in histogram.items())


def predicted_speedup(alpha: float, gamma: int, c: float, verify_cost: float = 1.0) -> float:
  """E(α, γ) / s(γ), s(γ) = `adaptive.step_cost` of `adaptive.draft_calls(γ)` at c and
  v(γ+1) = verify_cost (1: Leviathan's formula, γ c + 1 for γ >= 1)."""
  return expected_tokens_per_step(alpha, gamma) / adaptive.step_cost(
      adaptive.draft_calls(gamma), c, verify_cost)


def never_drafting_floor(target_prefill: float, draft_prefill: float, new_tokens: int,
                         probe_step: float) -> float:
  """(P + N) / (P + D + N - 1 + s): a whole generation's speed over plain decoding's for a
  prompt whose rows draft in one probe step of cost s and never again, every other step a
  plain one (s(0) = 1), both timings with their prefills; P the target's prefill, D what
  the draft's adds, s, all in plain steps; N new tokens, one per plain step
  (docs/background.md#gamma-floor)."""
  return (target_prefill + new_tokens) / (
      target_prefill + draft_prefill + new_tokens - 1 + probe_step)


def best_gamma(alpha: float, c: float, verify_costs: dict[int, float], max_gamma: int = 8):
  """(γ, predicted speedup) maximising the prediction over γ = 0..max_gamma, as gamma
  'auto' searches (`adaptive.CostTable.best_gamma`); verify_costs maps k -> v(k)."""
  scores = {g: predicted_speedup(alpha, g, c, verify_costs.get(g + 1, 1.0))
            for g in range(0, max_gamma + 1)}
  g = max(scores, key=scores.get)
  return g, scores[g]


def forward_call(params, config: ModelConfig, *, batch: int, tokens: int, context: int,
                 return_logits: bool = True, input_embed=None,
                 logits_at_last: bool = False,
                 dot_products: bool = False) -> Callable[[], object] | None:
  """A zero-argument call for `timing` (which blocks on its result): one cached forward
  of `tokens` new tokens after `context` ones (logits_at_last: the head at the last token
  only; dot_products: every matmul a `jnp.dot`, `models.matmul.dot_products_only`); config
  None (a draft without a model, see `Draft.model_config`) gives None. See
  `call_seconds`."""
  if config is None:
    return None
  slots = context + tokens
  cache = {**init_cache(config, batch, slots), "length": jnp.full((batch,), context, jnp.int32)}
  toks = jnp.zeros((batch, tokens), jnp.int32)
  pos = context + jnp.broadcast_to(jnp.arange(tokens, dtype=jnp.int32), (batch, tokens))
  feature = {}
  if config.feature_layers:  # a feature draft, timed as it drafts: on its own hidden state
    feature = dict(input_embed=input_embed, hidden_layers=(config.num_layers,),
                   context=jnp.ones((batch, tokens, config.embed_dim), config.jnp_dtype))
  if logits_at_last:
    feature["logits_at"] = jnp.full((batch, 1), tokens - 1, jnp.int32)
  timed = _timed_forward_dot_products if dot_products else _timed_forward
  return lambda: timed(params, toks, pos, cache, config=config,
                       return_logits=return_logits, **feature)


def call_seconds(params, config: ModelConfig, *, batch: int, tokens: int, context: int,
                 repeats: int = 20, return_logits: bool = True,
                 input_embed=None) -> float:
  """Median seconds of one cached forward of `tokens` new tokens after `context` ones.

  A feature draft needs input_embed (the target's embedding) and is timed as it drafts:
  on its own hidden state as context, returning that state too. An n-gram draft has no
  forward: 0.0 (its lookup runs inside the step and shows in the measured speedup).
  """
  fn = forward_call(params, config, batch=batch, tokens=tokens, context=context,
                    return_logits=return_logits, input_embed=input_embed)
  return 0.0 if fn is None else timing.repeated_seconds(fn, repeats)[1]


# One jitted forward for every timing call: compiled once per (config, shapes), not per call.
_timed_forward = jax.jit(forward, static_argnames=("config", "return_logits", "hidden_layers"))


def _forward_dot_products(*args, **kw):
  with dot_products_only():
    return forward(*args, **kw)


# Its own jit (a trace reads `dot_products_only` once; the cache does not key on it).
_timed_forward_dot_products = jax.jit(
    _forward_dot_products, static_argnames=("config", "return_logits", "hidden_layers"))


def verify_cost_curve(params, config: ModelConfig, *, batch: int, context: int,
                      max_tokens: int, repeats: int = 20) -> dict[int, float]:
  """v(k) = t(k tokens) / t(1 token) for k = 1..max_tokens, the widths timed in turn
  within each of `repeats` rounds after a compiling call each (`timing.interleaved_seconds`),
  so a drift in machine speed hits every width alike instead of biasing the widths timed
  late."""
  fns = {k: forward_call(params, config, batch=batch, tokens=k, context=context)
         for k in range(1, max_tokens + 1)}
  seconds, _ = timing.interleaved_seconds(fns, repeats, warmup=True)
  return {k: (1.0 if k == 1 else seconds[k] / seconds[1]) for k in fns}


def cost_coefficient(target_params, target_config: ModelConfig, draft_params,
                     draft_config, *, batch: int, context: int,
                     repeats: int = 20) -> float:
  """c = draft step time / target step time (one token each, same batch and context),
  the two calls timed in turn after a compiling call each (`timing.interleaved_seconds`).
  draft_config: a Draft or a model draft's ModelConfig; 0.0 for a draft without a model."""
  draft = forward_call(draft_params, as_draft(draft_config).model_config, batch=batch,
                       tokens=1, context=context,
                       input_embed=target_params.get("embed"))
  if draft is None:
    return 0.0
  fns = dict(target=forward_call(target_params, target_config, batch=batch, tokens=1,
                                 context=context), draft=draft)
  seconds, _ = timing.interleaved_seconds(fns, repeats, warmup=True)
  return seconds["draft"] / seconds["target"]


def catch_up_cost(target_params, target_config: ModelConfig, draft_params, draft_config, *,
                  batch: int, context: int, repeats: int = 20):
  """The deferred catch-up of a draft that feeds the tokens it skipped when it next drafts
  (an independent draft, or a hybrid over one): `gamma_replay.CatchUp` with W = its
  `skip_lag` and one cache-only call of the draft over W tokens in target-call times (one
  token), the two calls timed in turn. None for every other draft (a feature draft
  catches up while it is skipped, within s(0))."""
  draft = as_draft(draft_config)
  inner = draft.inner if isinstance(draft, HybridDraft) else draft
  if not isinstance(inner, IndependentDraft):
    return None
  width = inner.skip_lag
  fns = dict(target=forward_call(target_params, target_config, batch=batch, tokens=1,
                                 context=context),
             catch_up=forward_call(draft_params, inner.model_config, batch=batch,
                                   tokens=width, context=context, return_logits=False))
  seconds, _ = timing.interleaved_seconds(fns, repeats, warmup=True)
  return CatchUp(width=width, cost=seconds["catch_up"] / seconds["target"])


@dataclasses.dataclass
class SideBySide:
  """One benchmark: both samplers on the same prompts, settings and seed."""

  gamma: int | str  # drafts per step, or 'auto' (see gamma_histogram)
  batch: int
  max_new_tokens: int
  ar_tokens_per_s: float
  sd_tokens_per_s: float
  speedup: float  # sd / ar tokens per second
  ar_compile_s: float  # first call minus median call (compile + first run overhead)
  sd_compile_s: float
  acceptance_rate: float  # accepted drafts / drafted
  alpha: float  # mean Σ min(p, q) over drafted positions
  tokens_per_step: float
  predicted_tokens_per_step: float  # E[tokens/step] at α, averaged over the γ used
  repeats: int
  gamma_histogram: dict | None = None  # {γ: row-steps that used it} (speculative run)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def side_by_side(target: Model, draft: Model, prompts, *, spec: DecodeSpec, seed: int = 0,
                 repeats: int = 3, prompt_width: int | None = None,
                 return_results: bool = False):
  """Times autoregressive and speculative generation alternately, median of repeats.

  spec: the speculative run's `DecodeSpec` (the autoregressive run takes its sampling,
  eos and vocabulary); prompt_width pads the prompts of both (`spec.prepare_prompts`).
  A tree's α reads 0 (β is not recorded). Returns a SideBySide, or (SideBySide, the
  speculative GenerationResult) with return_results.
  """
  common = dict(seed=seed, prompt_width=prompt_width)

  def ar():
    return autoregressive_generate(target, prompts, spec=spec, **common)

  def sd():
    return speculative_generate(target, draft, prompts, spec=spec, **common)

  first = {name: timing.timed_call(fn)[0] for name, fn in (("ar", ar), ("sd", sd))}
  med, results = timing.interleaved_seconds({"ar": ar, "sd": sd}, repeats)
  ar_tps = results["ar"].lengths.sum() / med["ar"]
  sd_tps = results["sd"].lengths.sum() / med["sd"]
  out = results["sd"]
  alpha = out.alpha()
  histogram = adaptive.gamma_histogram(out.gammas)
  used = sum(histogram.values())
  predicted = expected_tokens_total(alpha, histogram) / max(used, 1)
  summary = SideBySide(
      gamma="auto" if spec.adaptive else spec.gamma, batch=len(prompts),
      max_new_tokens=spec.max_new_tokens,
      ar_tokens_per_s=float(ar_tps), sd_tokens_per_s=float(sd_tps),
      speedup=float(sd_tps / ar_tps), ar_compile_s=first["ar"] - med["ar"],
      sd_compile_s=first["sd"] - med["sd"], acceptance_rate=out.acceptance_rate(), alpha=alpha,
      tokens_per_step=out.tokens_per_step(),
      predicted_tokens_per_step=predicted, repeats=repeats, gamma_histogram=histogram)
  return (summary, out) if return_results else summary


def prompt_bucket(tokens: int) -> int:
  """The width a prompt of `tokens` tokens is padded to in `side_by_side_per_prompt`."""
  return -(-tokens // PROMPT_BUCKET) * PROMPT_BUCKET


def side_by_side_per_prompt(target: Model, draft: Model, prompts, *, domains, ids=None,
                            copies: int = 1, progress: str = "", **kw) -> dict:
  """`side_by_side` on each prompt alone, then a summary per domain and overall.

  prompts [P] token-id lists; domains [P] and ids [P] (default '0'..'P-1') label them;
  copies: each prompt runs as a batch of that many copies of itself (rows sample their own
  text at T > 0; tok/s counts every row's tokens); progress: a progress bar's label on
  stderr, one tick per prompt ('' for none);
  kw as `side_by_side` (spec, seed, repeats). Returns dict(prompts=[one
  dict per prompt: id, domain, prompt_tokens, tokens and the SideBySide fields],
  domains=`prompt_sets.domain_summary` rows: speedup as a geometric mean with the
  t-interval of the mean log-ratio, α and acceptance as means with t-intervals).
  """
  from specdec_jax.bench import prompt_sets
  ids = [str(i) for i in range(len(prompts))] if ids is None else list(ids)
  if not len(prompts) == len(domains) == len(ids):
    raise ValueError(f"need one domain and id per prompt: {len(prompts)} prompts, "
                     f"{len(domains)} domains, {len(ids)} ids")
  # Prompts run padded to a multiple of PROMPT_BUCKET, bucket by bucket: one pair of
  # compiled loops per bucket, not per prompt length. Dropping them after each bucket
  # keeps the process under vm.max_map_count (tests/conftest.py) on a long prompt set.
  widths = [prompt_bucket(len(p)) for p in prompts]
  order = sorted(range(len(prompts)), key=lambda i: (widths[i], i))
  rows = [None] * len(prompts)
  from tqdm import tqdm
  bar = tqdm(order, desc=progress, unit="prompt", dynamic_ncols=True, disable=not progress)
  for at, i in enumerate(bar):
    res, out = side_by_side(target, draft, [prompts[i]] * copies, return_results=True,
                            prompt_width=widths[i], **kw)
    rows[i] = dict(id=ids[i], domain=domains[i], prompt_tokens=len(prompts[i]),
                   prompt_width=widths[i], tokens=int(out.lengths.sum()), **res.to_dict())
    if at + 1 == len(order) or widths[order[at + 1]] != widths[i]:
      jax.clear_caches()
  summary = prompt_sets.domain_summary(
      domains, speedup=[r["speedup"] for r in rows], alpha=[r["alpha"] for r in rows],
      acceptance=[r["acceptance_rate"] for r in rows])
  return dict(prompts=rows, domains=summary)
