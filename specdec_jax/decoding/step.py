"""One speculative step (a chain of drafts) and one autoregressive step, for every row.

Letters: B batch, G = γ (or γ_max) drafted positions, d drafted tokens this step, k the
target call's width, V vocabulary, F target feature width.

One speculative step for row b (length ℓ = num_tokens[b]-1, pending token t):
  1. plan: the draft's `plan` (which rows have something to propose, their proposal
     source) and each row's γ_b from the proposer (`DecodeSpec.proposer.choose`: G for a
     fixed γ, the γ rule's choice from the row's own rule state under gamma 'auto'), 0 for
     rows with nothing to propose (`step_plan`);
  2. draft: `draft.propose` draws x_1..x_d with the q_i they were drawn from;
  3. score: one target call over [t, x_1..x_{k-1}] at positions ℓ..ℓ+k-1 gives p_1..p_k
     (and the target's features where the draft reads them: `observe_target`);
  4. verify: the verifier (`block_verify` by default, or token-wise `verify`) accepts n
     tokens and draws the correction or bonus token y;
  5. observe: the proposer updates each row's rule state (`observe`); emit x_1..x_n, y
     (cut at EOS or max_new_tokens); the target cache's length becomes the new
     num_tokens-1 and the draft rolls back (`rollback`). y is the new pending token.
Rows advance by their own n, never by the batch minimum; finished rows idle.

Call widths. The step runs one of the static widths k of `step_widths` (the proposer's),
the narrowest with k >= max_b γ_b + 1 (`kind_index`, the one place it is chosen): the
draft draws d = max(k-1, 1) tokens (at k = 1 a draft that is not skipped still runs once,
so its state follows the tokens), and xs, qs, ps are padded to G (zero q rows) so the
verifier, called with num_proposed = γ_b, draws the same uniforms and emits the same
tokens for a row whatever width its batch took. At k = 1 nothing is proposed and y ~ p_1
is drawn with the row's resampling key (the argmax at T = 0), on one position. A fixed γ
whose draft always proposes is the single width G+1.

Plain steps skip the draft (gamma 'auto' with a draft whose `skip_lag` L > 0): a step in
which no live row proposes (γ_b = 0) and every live row's draft state has room to fall one
more position behind calls the target alone at width 1 (`may_skip_draft`; the step kind
SKIP). The draft catches up on the skipped tokens before it next runs, or when a row runs
out of room (`catch_up_needed`; the kind CATCH_UP, `decoding.loop`). A γ_b = 0 step
observes nothing for the row's rule state, so what a row observes, and so every choice
and token, depends on its own past only.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.decoding.spec import DecodeSpec
from specdec_jax.decoding.state import (DecodeState, emit, record, split_step_keys,
                                        step_keys)
from specdec_jax.drafts.base import Draft, Plan, pending_tokens, sample_rows, with_length
from specdec_jax.gamma import adaptive
from specdec_jax.models.model import ModelConfig, forward
from specdec_jax.models.sampling import SamplingConfig, warp
from specdec_jax.verification.verify import (acceptance_probability, greedy_verify,
                                             valid_proposals)

Array = jax.Array


@flax.struct.dataclass
class StepPlan:
  """This step's plan: chosen int32 [B] (γ_b), proposes bool [B] (live rows with something
  to propose) and the draft's own `Plan`."""

  chosen: Array
  proposes: Array
  draft: Plan


def step_plan(state: DecodeState, draft: Draft, spec: DecodeSpec,
              costs: Array | None) -> StepPlan:
  """Step 1 (module docstring): the proposer's γ_b (`Proposer.choose`) where the row has
  something to propose, else 0. costs: float32 [2,G+1] (`CostTable.loop_costs`) for gamma
  'auto', else None."""
  plan = draft.plan(state, spec.gamma)
  proposes = ~state.done & plan.proposes
  chosen = spec.proposer.choose(state.rule_state, costs, plan.source)
  return StepPlan(chosen=jnp.where(proposes, chosen, 0), proposes=proposes, draft=plan)


def step_widths(draft: Draft, spec: DecodeSpec) -> tuple[int, ...]:
  """The static target-call widths of a chain step (`Proposer.call_widths`), ascending."""
  return tuple(spec.proposer.call_widths(draft.may_propose_nothing))


SKIP, CATCH_UP = 0, -1  # step kinds besides the widths k >= 1 (`step_kinds`)


def drafting_widths(draft: Draft, spec: DecodeSpec) -> tuple[int, ...]:
  """The call widths the loop compiles (`step_widths`), less width 1 for a draft with a
  skip lag: there a step in which no live row proposes is SKIP (after a CATCH_UP where a
  row has no room to fall behind, `kind_index`), so a width-1 step that runs the draft
  never comes."""
  widths = step_widths(draft, spec)
  if spec.lag(draft) == 0:
    return widths
  return tuple(k for k in widths if k > 1)  # γ_max >= 1: width γ_max + 1 >= 2 stays


def step_kinds(draft: Draft, spec: DecodeSpec) -> tuple[int, ...]:
  """The static kinds of step the loop compiles: the call widths (`drafting_widths`), and
  before them, for a draft with a skip lag under gamma 'auto', SKIP (a plain step that
  leaves the draft behind, target call width 1) and CATCH_UP (the draft's catch-up call,
  no step)."""
  widths = drafting_widths(draft, spec)
  return ((SKIP, CATCH_UP) + widths) if spec.lag(draft) > 0 else widths


def kind_index(state: DecodeState, plan: StepPlan, draft: Draft, spec: DecodeSpec) -> Array:
  """int32 []: the index in `step_kinds` of the step `plan` asks for, the one place a
  step's kind is chosen: the narrowest width >= max_b γ_b + 1 (`adaptive.width_index`),
  or SKIP / CATCH_UP (`may_skip_draft`, `catch_up_needed`)."""
  index = adaptive.width_index(drafting_widths(draft, spec), plan.chosen)
  if spec.lag(draft) == 0:
    return index
  return jnp.where(catch_up_needed(state, draft, plan.chosen), 1,
                   jnp.where(may_skip_draft(state, draft, plan.chosen), 0, index + 2))


def may_skip_draft(state: DecodeState, draft: Draft, chosen: Array) -> Array:
  """bool []: this step may skip the draft (module docstring): no live row proposes, and
  every live row's draft state has room to fall behind. chosen int32 [B]."""
  room = draft.room_to_skip(state.draft_state, state.num_tokens - 1)
  return jnp.all(state.done | ((chosen == 0) & room))


def catch_up_needed(state: DecodeState, draft: Draft, chosen: Array) -> Array:
  """bool []: the draft must catch up (`Draft.catch_up`) before this step: a live row runs
  out of room on a step that would skip the draft, or is not ready on one that runs it."""
  length = state.num_tokens - 1
  skipping = jnp.all(state.done | (chosen == 0))
  ok = jnp.where(skipping, draft.room_to_skip(state.draft_state, length),
                 draft.ready_to_draft(state.draft_state, length))
  return jnp.any(~state.done & ~ok)


def warp_vocab(logits: Array, *, vocab: int, sampling: SamplingConfig) -> Array:
  """`warp` of logits [..., >=vocab] cut to the true vocabulary [..., vocab]."""
  return warp(logits[..., :vocab], sampling.temperature, sampling.top_k, sampling.top_p)


def speculative_step_fn(target_params, draft_params, state: DecodeState, plan: StepPlan, *,
                        target_config: ModelConfig, draft: Draft, spec: DecodeSpec,
                        width: int) -> DecodeState:
  """One speculative step for every row (module docstring). Not jitted.

  plan: this step's `step_plan`. width (static): a call width of `step_widths` >= max_b
  γ_b + 1, or SKIP: a plain step (target call width 1) that leaves the draft behind
  (`may_skip_draft` true). `kind_index` chooses it.
  """
  gamma, sampling, vocab = spec.gamma, spec.sampling, spec.vocab_size
  warp_fn = functools.partial(warp_vocab, vocab=vocab, sampling=sampling)
  greedy = sampling.temperature == 0
  length = state.num_tokens - 1
  pending = pending_tokens(state)
  draft_keys, verify_keys = split_step_keys(state, gamma)
  chosen = plan.chosen
  widths = step_widths(draft, spec)
  skip_draft = width == SKIP
  if skip_draft:
    width = 1
  elif width not in widths:
    raise ValueError(f"width={width} is not a call width of this step {widths} or SKIP")
  layers = draft.target_layers
  # At T=0 every p is one-hot: `greedy_verify` gives the verifiers' tokens without their
  # V-wide residual arithmetic.
  verify_fn = greedy_verify if greedy else spec.verify_fn

  def draft_and_target(width: int, pad: bool = True):
    """A branch: d = max(width-1, 1) drafts and a target call of `width` tokens ->
    (xs [B,G], qs [B,G,V], ps [B,G+1,V], target cache, draft state); pad=False keeps
    xs [B,d], qs [B,d,V], ps [B,width,V]."""
    def run():
      d = max(width - 1, 1)
      if skip_draft:  # nothing proposed, the draft not called
        xs = jnp.zeros((length.shape[0], 1), jnp.int32)
        qs = jnp.zeros((length.shape[0], 1, vocab), jnp.float32)
        draft_state = state.draft_state
      else:
        xs, qs, draft_state = draft.propose(
            draft_params, target_params, state, draft_keys[:, :d], plan=plan.draft,
            chosen=chosen, warp_fn=warp_fn, greedy=greedy, vocab_size=vocab)
      target_in = jnp.concatenate([pending[:, None], xs[:, :width - 1]], axis=1)  # [B,k]
      positions = length[:, None] + jnp.arange(width)[None, :]
      out = forward(target_params, target_in, positions,
                    with_length(state.target_cache, length), config=target_config,
                    hidden_layers=layers)
      ps = warp_fn(out[0])  # [B,k,V]
      draft_state = draft.observe_target(draft_state, out[2] if layers else None,
                                         length=length, width=width, skipped=skip_draft)
      if pad and width < gamma + 1:
        # Pad to G: zero q rows are never proposals, and the p rows past k (finite copies
        # of p_k) are never drawn from, since every row's γ_b <= k - 1.
        xs = jnp.pad(xs, ((0, 0), (0, gamma - d)))
        qs = jnp.pad(qs, ((0, 0), (0, gamma - d), (0, 0)))
        ps = jnp.pad(ps, ((0, 0), (0, gamma + 1 - width), (0, 0)), mode="edge")
      return xs, qs, ps, out[1], draft_state
    return run

  if widths == (width,) and not spec.adaptive:  # a fixed γ, every row proposes G
    xs, qs, ps, target_cache, draft_state = draft_and_target(width)()
    block, num_accepted = verify_fn(xs, qs, ps, verify_keys)
  elif width == 1:
    # No row proposes: the verifier draws y ~ p_1 with the row's resampling key, which
    # does not depend on G (its uniforms go unused), so one position stands for G.
    # At T=0 that draw is the argmax of the one-hot p_1, as a plain step takes it.
    xs, qs, ps, target_cache, draft_state = draft_and_target(1, pad=False)()
    if greedy:
      block = jnp.argmax(ps[:, 0], axis=-1).astype(jnp.int32)[:, None]
      num_accepted = jnp.zeros_like(length)
    else:
      block, num_accepted = verify_fn(xs, qs, jnp.concatenate([ps, ps], axis=1), verify_keys,
                                      num_proposed=chosen)
    block = jnp.pad(block, ((0, 0), (0, gamma + 1 - block.shape[1])))
  else:
    xs, qs, ps, target_cache, draft_state = draft_and_target(width)()
    block, num_accepted = verify_fn(xs, qs, ps, verify_keys, num_proposed=chosen)
  beta = acceptance_probability(qs, ps, valid_proposals(xs, qs))
  beta = jnp.pad(beta, ((0, 0), (0, gamma - beta.shape[1])))  # [B,G]
  state = record(state, num_accepted, chosen, beta)
  state = state.replace(rule_state=spec.proposer.observe(
      state.rule_state, chosen=chosen, proposes=plan.proposes, num_accepted=num_accepted,
      beta=beta, source=plan.draft.source))
  state = emit(state, block, num_accepted + 1, eos_id=spec.eos_id,
               max_new_tokens=spec.max_new_tokens)
  new_length = state.num_tokens - 1
  draft_state = draft.rollback(draft_state, length=length, new_length=new_length,
                               skipped=skip_draft)
  return state.replace(target_cache=with_length(target_cache, new_length),
                       draft_state=draft_state, step=state.step + 1)


def autoregressive_step_fn(target_params, state: DecodeState, *, target_config: ModelConfig,
                           spec: DecodeSpec) -> DecodeState:
  """One plain decoding step: feed the pending token, sample one token per row."""
  length = state.num_tokens - 1
  logits, target_cache = forward(target_params, pending_tokens(state)[:, None], length[:, None],
                                 with_length(state.target_cache, length), config=target_config)
  p = warp_vocab(logits[:, 0], vocab=spec.vocab_size, sampling=spec.sampling)
  token = sample_rows(step_keys(state), p, spec.sampling.temperature == 0)
  zeros = jnp.zeros_like(length)
  state = record(state, zeros, zeros)
  state = emit(state, token[:, None], jnp.ones_like(length), eos_id=spec.eos_id,
               max_new_tokens=spec.max_new_tokens)
  return state.replace(target_cache=with_length(target_cache, state.num_tokens - 1),
                       step=state.step + 1)


def planned_step_fn(target_params, draft_params, state: DecodeState,
                    costs: Array | None = None, *, target_config: ModelConfig, draft: Draft,
                    spec: DecodeSpec) -> DecodeState:
  """One whole step on its own: `step_plan`, then `speculative_step_fn` at the width
  `adaptive.width_index` chooses (a `lax.switch` where there are several). It never skips
  the draft; the loop's steps (`decoding.loop`) give the same tokens at T = 0 and the same
  law at any temperature. costs: float32 [2,G+1] for gamma 'auto', else None."""
  plan = step_plan(state, draft, spec, costs)
  widths = step_widths(draft, spec)
  step = functools.partial(speculative_step_fn, target_config=target_config, draft=draft,
                           spec=spec)
  if len(widths) == 1:
    return step(target_params, draft_params, state, plan, width=widths[0])
  return jax.lax.switch(adaptive.width_index(widths, plan.chosen),
                        [functools.partial(step, width=k) for k in widths],
                        target_params, draft_params, state, plan)


speculative_step = jax.jit(planned_step_fn,
                           static_argnames=("target_config", "draft", "spec"))
speculative_step.__doc__ = ("Jitted `planned_step_fn`: (target_params, draft_params, state, "
                            "costs=None, *, target_config, draft, spec) -> state.")
