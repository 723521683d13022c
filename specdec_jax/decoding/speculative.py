"""Speculative and autoregressive decoding, each a prefill and one jitted `lax.while_loop`.

Letters: B batch, G = γ drafted tokens per step, V vocabulary, P longest prompt,
M max_new_tokens, S cache slots, W token-buffer width.

Decode state invariant (both samplers, every row b):
  tokens[b, :num_tokens[b]] is the prompt followed by the emitted tokens;
  the last of them, tokens[b, num_tokens[b]-1], is *pending*: it is not yet in
  either cache, so both caches hold exactly num_tokens[b]-1 entries.

One speculative step for row b (length ℓ = num_tokens[b]-1, pending token t):
  1. the draft feeds t, x_1, .., x_{G-1} (a `lax.scan` of G cached calls),
     sampling x_i ~ q_i = warp(draft logits) and keeping q_i;
  2. one cache-only draft call writes x_G (head skipped), so the draft has seen
     every token the target will see;
  3. one target call over [t, x_1..x_G] at positions ℓ..ℓ+G gives p_1..p_{G+1};
  4. the verifier (`block_verify` by default, or token-wise `verify`) accepts n tokens
     and draws the correction or bonus token y;
  5. the row emits x_1..x_n, y (cut at EOS or max_new_tokens); both caches roll
     back by setting their length to the new num_tokens-1. y is the new pending
     token, fed to both models at the start of the next step.
Rows advance by their own n, never by the batch minimum; finished rows idle.

A feature draft (`ModelConfig.kind == 'feature'`, EAGLE-3 style; see `model`) pairs the
token at position j with the target's features at j-1. Its cache holds positions below
ℓ_d = draft_cache['length'] computed from the target's true features, and the state
carries `features` [B,G+1,F], the target's features at ℓ_d-1 .. ℓ_d+G-1. Steps 1-2 become:
  1'. one draft call re-reads positions ℓ_d .. ℓ_d+G (tokens from the buffer, true
      features; fixed width G+1, only ℓ_d..ℓ valid per row, later slots are overwritten
      before they are attended) and gives q_1 from the output at position ℓ;
  2'. a `lax.scan` of G-1 cached calls feeds x_i at position ℓ+i with the draft's own
      last hidden state as context, sampling x_{i+1} ~ q_{i+1}.
The target call of step 3 also returns its features at ℓ..ℓ+G; they become `features`
and ℓ_d = ℓ+1, so the next step's re-read covers the n+1 ≤ G+1 positions accepted.
Steps 3-5, `verify` and the key schedule are the same for both kinds.

A prompt-lookup draft (`ngram.NgramDraft`, kind 'ngram', no params, no cache) replaces
steps 1-2 by `ngram.propose` on the row's own tokens, with q one-hot at each proposal.
A hybrid draft (`ngram.HybridDraft`, kind 'hybrid') runs steps 1'-2' of its feature draft
on every row, then rows where `ngram.lookup` finds a match take its proposals, q one-hot
(`_draft_hybrid`). The choice is a function of the known tokens alone, so each row's x is
still drawn from the q handed to the verifier; the target call runs on the chosen x, so
the features and re-read of the next step are the emitted tokens' whichever was chosen.

Per-row proposal counts (`adaptive`). Each step, row b proposes γ_b <= G drafts: G for a
fixed γ; 0 where a prompt lookup finds no match (a draft with nothing to say proposes
nothing); with gamma='auto' (G = γ_max, a cost table given) `adaptive.choose_gamma` of
the row's acceptance estimate for its proposal source this step (a hybrid's lookup or
the draft model, `proposal_source`). A hybrid step where every row proposing two or more
takes the lookup skips the feature draft's deeper drafts (`drafting.draft_hybrid`). The
step runs one of the static target-call widths k in `adaptive.call_widths`, the
narrowest with k >= max_b γ_b + 1: the draft draws d = max(k-1, 1) tokens (d = 1 at k=1
gives q_1 for the estimate), the target sees [t, x_1..x_{k-1}], and xs, qs, ps are
padded to G (zero q rows) so the verifier, called with num_proposed=γ_b, draws the same
uniforms and emits the same tokens for a row whatever width its batch took. At k=1
nothing is proposed and y ~ p_1 is drawn with the row's resampling key (the argmax at
T=0), on one position. `run_steps` runs one inner `while_loop` per width inside the
loop of steps, each taking the steps whose width is its own (one compiled loop; no
conditional, whose branches would receive copies of both caches); the single jitted
`speculative_step` picks the width with a `lax.switch`. A feature draft's re-read keeps
its fixed width G+1 at every k, so its cache and features stay those of the emitted
tokens. With a fixed γ and no lookup the step is the single width G+1, unchanged.

Plain steps skip the draft (gamma='auto' with a feature or hybrid draft). The re-read and
`features` are FEATURE_LAG positions wider (G+1+L), and the caches and token buffer L
slots longer. A step in which no live row proposes (γ_b = 0) or probes, and every live
row's ℓ - ℓ_d <= G+L-1, calls the target alone at width 1 (`may_skip_draft`): the draft
cache keeps ℓ_d and the target's features at ℓ join `features` at index ℓ - ℓ_d + 1, so
the next drafting step's re-read (ℓ_d..ℓ, now up to G+L+1 positions) reads true features
for every skipped token, as if it had never been skipped (a test compares with a fresh
prefill). A row's γ_b = 0 steps observe q_1 for α̂ only on its probes, every FEATURE_LAG-th
γ_b = 0 step of the row (`probes`, counted in `plain_run`), on which the draft runs: what a
row observes, and so every choice and token, depends on its own past only, not on whether
its neighbours made the step skip.

Key schedule (one root per row; nothing depends on batch size or layout):
  row_key[b]      = fold_in(PRNGKey(seed[b]), row_id[b])
  step_key[b, s]  = fold_in(row_key[b], s)             s = loop step, 0-based
  draft_key, verify_key = split(step_key[b, s])
  draft_keys[i]   = split(draft_key, G)[i]              sample x_{i+1} (i < d)
  verify: u_key, resample_key = split(verify_key)       u[1..G], correction/bonus
  autoregressive: the token of step s is sample(step_key[b, s], p).
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.gamma import adaptive

from specdec_jax.drafts import ngram

from specdec_jax.models import sharding
from specdec_jax.decoding.arguments import (DEFAULT_VERIFIER, FEATURE_LAG, VERIFIERS,  # noqa: F401
                                   GenerateArgs, Verifier, _check_params, _check_positive_int,
                                   _row_keys, check_feature_draft, feature_lag,
                                   prepare_generate, prepare_prompts, resolve_verifier,
                                   resolve_vocab)
from specdec_jax.drafts.drafting import (DRAFT_FNS, DraftConfig, feature_part, pending_tokens,
                                  with_length)
from specdec_jax.models.model import ModelConfig, forward, init_cache
from specdec_jax.decoding.results import GenerationResult, reached_positions  # noqa: F401
from specdec_jax.decoding.results import finish as _finish
from specdec_jax.models.sampling import SamplingConfig, sample, warp
from specdec_jax.verification.verify import (acceptance_probability, block_verify, greedy_verify,
                                valid_proposals)

Array = jax.Array
@flax.struct.dataclass
class DecodeState:
  """Everything the decode loop carries; shapes are fixed, progress lives in indices."""

  tokens: Array  # int32 [B,W], prompt then emitted tokens, right-padded
  num_tokens: Array  # int32 [B], valid entries of `tokens` (last one pending)
  prompt_len: Array  # int32 [B]
  done: Array  # bool [B]
  row_keys: Array  # uint32 [B,2], see the key schedule
  step: Array  # int32 [], loop steps taken
  target_cache: dict
  draft_cache: dict | None
  features: Array | None  # float [B,G+1,F], a feature draft's target features (see above)
  accepted: Array  # int32 [B,M], drafts accepted per row per step; -1 where the row idled
  accept_prob: Array  # float32 [B,M,G], β = Σ min(p,q) of each drafted position
  gammas: Array  # int32 [B,M], drafts proposed per row per step (γ_b); -1 where it idled
  alpha_estimate: Array | None = None  # float32 [B,2], α̂ per source, gamma='auto' (`adaptive`)
  plain_run: Array | None = None  # int32 [B], γ_b = 0 steps since the row's last probe


# --------------------------------------------------------------------------- step

def _emit(state: DecodeState, block: Array, count: Array, *, eos_id: int | None,
          max_new_tokens: int) -> tuple[DecodeState, Array]:
  """Appends block[b, :count[b]] (cut at EOS / max_new_tokens) to each live row."""
  generated = state.num_tokens - state.prompt_len
  count = jnp.minimum(count, max_new_tokens - generated)
  done = state.done | (generated + count >= max_new_tokens)
  if eos_id is not None:
    idx = jnp.arange(block.shape[1])[None, :]
    is_eos = (block == eos_id) & (idx < count[:, None])
    first_eos = jnp.argmax(is_eos, axis=1)
    hit = is_eos.any(axis=1)
    count = jnp.where(hit, first_eos + 1, count)
    done = done | hit
  count = jnp.where(state.done, 0, count)
  tokens = jax.vmap(lambda row, blk, at: jax.lax.dynamic_update_slice(row, blk, (at,)))(
      state.tokens, block.astype(jnp.int32), state.num_tokens)
  new = state.replace(tokens=tokens, num_tokens=state.num_tokens + count,
                      done=done | state.done)
  return new, count


def _step_keys(state: DecodeState) -> Array:
  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(state.row_keys, state.step)


def step_plan(state: DecodeState, *, draft_config: DraftConfig, gamma: int,
              costs: Array | None) -> tuple[Array, Array, tuple[Array, Array] | None]:
  """Row b's proposal count this step -> (chosen int32 [B] = γ_b, proposes bool [B],
  a lookup's (proposals int32 [B,G], found bool [B]) or None); module docstring, "Per-row
  proposal counts". costs float32 [2,G+1] (`adaptive.CostTable.loop_costs`) or None.
  """
  live = ~state.done
  proposes, lookup = live, None  # rows whose draft has something to say
  if draft_config.kind in ("ngram", "hybrid"):
    n = (1, draft_config.max_n) if draft_config.kind == "ngram" else (
        draft_config.min_n, draft_config.max_n)
    lookup = ngram.lookup(state.tokens, state.num_tokens, min_n=n[0], max_n=n[1], gamma=gamma)
  if draft_config.kind == "ngram":
    proposes = live & lookup[1]
  if costs is None:
    chosen = jnp.full(state.num_tokens.shape, gamma, jnp.int32)
  else:
    chosen = adaptive.choose_gamma_by_source(state.alpha_estimate, costs,
                                             proposal_source(state, draft_config, lookup))
  return jnp.where(proposes, chosen, 0), proposes, lookup


def proposal_source(state: DecodeState, draft_config: DraftConfig, lookup) -> Array:
  """int32 [B]: each row's proposal source this step (`adaptive`): LOOKUP where a hybrid's
  lookup matched, else DRAFT. lookup: step_plan's (proposals, found) or None."""
  if draft_config.kind == "hybrid":
    return jnp.where(lookup[1], adaptive.LOOKUP, adaptive.DRAFT).astype(jnp.int32)
  return jnp.full(state.num_tokens.shape, adaptive.DRAFT, jnp.int32)


def step_widths(draft_config: DraftConfig, gamma: int, costs) -> tuple[int, ...]:
  """The static target-call widths of a step (`adaptive.call_widths`)."""
  return adaptive.call_widths(gamma, costs is not None, draft_config.kind == "ngram")


def speculative_step_fn(target_params, draft_params, state: DecodeState, *,
                        target_config: ModelConfig, draft_config: DraftConfig, gamma: int,
                        sampling: SamplingConfig, vocab_size: int, eos_id: int | None,
                        max_new_tokens: int, verifier: Verifier = block_verify,
                        costs: Array | None = None, width: int | None = None,
                        skip_draft: bool = False) -> DecodeState:
  """One speculative step for every row (see the module docstring). Not jitted.

  costs: float32 [2,G+1] (`adaptive.CostTable.loop_costs`) for gamma='auto' (γ_max =
  gamma); None for a fixed γ. width: the call width this step takes, when the caller has chosen
  it (`decode_loop`: the width `adaptive.width_index` picks from this state); None picks
  it here, a `lax.switch` over `step_widths` where there are several. skip_draft (width
  1, a feature draft, `may_skip_draft` true): a plain step that leaves the feature draft
  behind (module docstring, "Plain steps skip the draft").
  """
  warp_fn = functools.partial(_warp_vocab, vocab=vocab_size, temperature=sampling.temperature,
                              top_k=sampling.top_k, top_p=sampling.top_p)
  feature = feature_part(draft_config) is not None
  length = state.num_tokens - 1
  pending = pending_tokens(state)
  split = jax.vmap(jax.random.split)(_step_keys(state))  # [B,2,2]
  draft_keys = jax.vmap(lambda k: jax.random.split(k, gamma))(split[:, 0])  # [B,G,2]
  verify_keys = split[:, 1]
  live = ~state.done
  chosen, proposes, lookup = step_plan(state, draft_config=draft_config, gamma=gamma,
                                       costs=costs)
  extra = dict(lookup=lookup, chosen=chosen) if draft_config.kind == "hybrid" else {}
  widths = step_widths(draft_config, gamma, costs)
  # At T=0 every p is one-hot: `greedy_verify` gives the verifiers' tokens without their
  # V-wide residual arithmetic.
  verify_fn = greedy_verify if sampling.temperature == 0 else verifier

  def draft_and_target(width: int, pad: bool = True):
    """A branch: d = max(width-1, 1) drafts and a target call of `width` tokens ->
    (xs [B,G], qs [B,G,V], ps [B,G+1,V], target cache, draft cache, features [B,G+1,F]);
    pad=False keeps xs [B,d], qs [B,d,V], ps [B,width,V]."""
    def run():
      d = max(width - 1, 1)
      if skip_draft:  # nothing proposed, the draft not called (its cache stays at ℓ_d)
        xs = jnp.zeros((length.shape[0], 1), jnp.int32)
        qs = jnp.zeros((length.shape[0], 1, vocab_size), jnp.float32)
        draft_cache = state.draft_cache
      elif draft_config.kind == "ngram":
        xs = lookup[0][:, :d]
        qs = jax.nn.one_hot(xs, vocab_size, dtype=jnp.float32)
        draft_cache = None
      else:
        xs, qs, draft_cache = DRAFT_FNS[draft_config.kind](
            target_params, draft_params, state, draft_keys[:, :d], draft_config=draft_config,
            gamma=d, warp_fn=warp_fn, greedy=sampling.temperature == 0, **extra)
      target_in = jnp.concatenate([pending[:, None], xs[:, :width - 1]], axis=1)  # [B,k]
      positions = length[:, None] + jnp.arange(width)[None, :]
      out = forward(target_params, target_in, positions,
                    with_length(state.target_cache, length), config=target_config,
                    hidden_layers=feature_part(draft_config).feature_layers if feature else ())
      ps = warp_fn(out[0])  # [B,k,V]
      features = out[2].astype(state.features.dtype) if feature else None
      if skip_draft:  # the target's features at ℓ join the buffer at index ℓ - ℓ_d + 1
        at = length - state.draft_cache["length"] + 1
        features = jax.vmap(lambda row, f, i: jax.lax.dynamic_update_slice(row, f, (i, 0)))(
            state.features, features, at)
      elif feature:
        features = jnp.pad(features, ((0, 0), (0, state.features.shape[1] - width), (0, 0)))
      if pad and width < gamma + 1:
        # Pad to G: zero q rows are never proposals, and the p rows past k (finite copies
        # of p_k) are never drawn from, since every row's γ_b <= k - 1.
        xs = jnp.pad(xs, ((0, 0), (0, gamma - d)))
        qs = jnp.pad(qs, ((0, 0), (0, gamma - d), (0, 0)))
        ps = jnp.pad(ps, ((0, 0), (0, gamma + 1 - width), (0, 0)), mode="edge")
      return xs, qs, ps, out[1], draft_cache, features
    return run

  if len(widths) == 1:  # a fixed γ, every row proposes G: one width
    xs, qs, ps, target_cache, draft_cache, features = draft_and_target(widths[0])()
    block, num_accepted = verify_fn(xs, qs, ps, verify_keys)
  elif width == 1:
    # No row proposes: the verifier draws y ~ p_1 with the row's resampling key, which
    # does not depend on G (its uniforms go unused), so one position stands for G.
    # At T=0 that draw is the argmax of the one-hot p_1, as a plain step takes it.
    xs, qs, ps, target_cache, draft_cache, features = draft_and_target(1, pad=False)()
    if sampling.temperature == 0:
      block = jnp.argmax(ps[:, 0], axis=-1).astype(jnp.int32)[:, None]
      num_accepted = jnp.zeros_like(length)
    else:
      block, num_accepted = verifier(xs, qs, jnp.concatenate([ps, ps], axis=1), verify_keys,
                                     num_proposed=chosen)
    block = jnp.pad(block, ((0, 0), (0, gamma + 1 - block.shape[1])))
  elif width is not None:
    xs, qs, ps, target_cache, draft_cache, features = draft_and_target(width)()
    block, num_accepted = verify_fn(xs, qs, ps, verify_keys, num_proposed=chosen)
  else:
    xs, qs, ps, target_cache, draft_cache, features = jax.lax.switch(
        adaptive.width_index(widths, chosen), [draft_and_target(k) for k in widths])
    block, num_accepted = verify_fn(xs, qs, ps, verify_keys, num_proposed=chosen)
  beta = acceptance_probability(qs, ps, valid_proposals(xs, qs))
  beta = jnp.pad(beta, ((0, 0), (0, gamma - beta.shape[1])))  # [B,G]
  state = state.replace(
      accepted=state.accepted.at[:, state.step].set(jnp.where(live, num_accepted, -1)),
      accept_prob=state.accept_prob.at[:, state.step].set(beta),
      gammas=state.gammas.at[:, state.step].set(jnp.where(live, chosen, -1)))
  if costs is not None and not skip_draft:  # observed: proposed (or q_1 of γ_b = 0), reached
    j = jnp.arange(gamma)[None, :]
    observed = (proposes[:, None] & (j <= num_accepted[:, None])
                & (j < jnp.maximum(chosen, 1)[:, None]))
    if state.plain_run is not None:  # with a feature lag, a γ_b = 0 row observes q_1 only
      observed = observed & ((chosen > 0) | probes(state, chosen))[:, None]  # on its probes
    state = state.replace(alpha_estimate=adaptive.update_alpha(
        state.alpha_estimate, beta, observed, proposal_source(state, draft_config, lookup)))
  if state.plain_run is not None:
    state = state.replace(plain_run=jnp.where((chosen > 0) | probes(state, chosen), 0,
                                              state.plain_run + 1))
  state, _ = _emit(state, block, num_accepted + 1, eos_id=eos_id, max_new_tokens=max_new_tokens)
  new_length = state.num_tokens - 1
  if skip_draft:  # ℓ_d stays: the next drafting step's re-read covers the skipped tokens
    state = state.replace(features=features)
  elif feature:  # the re-read of the next step starts right after the pending token t
    state = state.replace(features=features)
    draft_cache = with_length(draft_cache, length + 1)
  elif draft_cache is not None:
    draft_cache = with_length(draft_cache, new_length)
  return state.replace(target_cache=with_length(target_cache, new_length),
                       draft_cache=draft_cache, step=state.step + 1)


def _warp_vocab(logits: Array, *, vocab: int, temperature: float, top_k: int,
                top_p: float) -> Array:
  """warp of logits [..., ≥vocab] cut to the true vocabulary [..., vocab]."""
  return warp(logits[..., :vocab], temperature, top_k, top_p)


def autoregressive_step_fn(target_params, state: DecodeState, *, target_config: ModelConfig,
                           sampling: SamplingConfig, vocab_size: int, eos_id: int | None,
                           max_new_tokens: int) -> DecodeState:
  """One plain decoding step: feed the pending token, sample one token per row."""
  length = state.num_tokens - 1
  logits, target_cache = forward(target_params, pending_tokens(state)[:, None], length[:, None],
                                 with_length(state.target_cache, length), config=target_config)
  p = warp(logits[:, 0, :vocab_size], sampling.temperature, sampling.top_k, sampling.top_p)
  greedy = sampling.temperature == 0
  token = jax.vmap(functools.partial(sample, greedy=greedy))(_step_keys(state), p)
  live = ~state.done
  idle = jnp.where(live, 0, -1)
  state = state.replace(accepted=state.accepted.at[:, state.step].set(idle),
                        gammas=state.gammas.at[:, state.step].set(idle))
  state, _ = _emit(state, token[:, None], jnp.ones_like(length), eos_id=eos_id,
                   max_new_tokens=max_new_tokens)
  return state.replace(target_cache=with_length(target_cache, state.num_tokens - 1),
                       step=state.step + 1)


_STEP_STATICS = ("target_config", "draft_config", "gamma", "sampling", "vocab_size", "eos_id",
                 "max_new_tokens", "verifier")

speculative_step = jax.jit(speculative_step_fn, static_argnames=_STEP_STATICS)
speculative_step.__doc__ = ("Jitted `speculative_step_fn`: (target_params, draft_params, state, "
                            "*, statics, costs=None) -> state.")
autoregressive_step = jax.jit(autoregressive_step_fn, static_argnames=(
    "target_config", "sampling", "vocab_size", "eos_id", "max_new_tokens"))


# --------------------------------------------------------------------------- loops

def probes(state: DecodeState, chosen: Array) -> Array:
  """bool [B]: rows whose draft runs for q_1 this step though they propose nothing: every
  FEATURE_LAG-th γ_b = 0 step in a row (a function of the row's own past)."""
  return (chosen == 0) & (state.plain_run >= FEATURE_LAG - 1)


def may_skip_draft(state: DecodeState, chosen: Array) -> Array:
  """bool []: this step may skip a feature draft (module docstring, "Plain steps skip the
  draft"): no live row proposes or probes, and every live row's re-read still covers one
  more position after it. chosen int32 [B] (γ_b of `step_plan`)."""
  behind = state.num_tokens - 1 - state.draft_cache["length"]  # ℓ - ℓ_d [B]
  room = behind <= state.features.shape[1] - 2
  return jnp.all(state.done | ((chosen == 0) & ~probes(state, chosen) & room))


def init_state(target_params, draft_params, tokens: Array, prompt_len: Array, row_keys: Array,
               *, target_config: ModelConfig, draft_config: DraftConfig | None, gamma: int,
               max_new_tokens: int, mesh=None, adaptive_gamma: bool = False) -> DecodeState:
  """Prefills both caches with the prompts (cache-only calls) and builds the state.

  mesh: a ('data', 'model') `jax.sharding.Mesh`; the fresh caches are pinned to
  `sharding.cache_sharding` (batch over 'data', kv heads over 'model').
  adaptive_gamma: gamma='auto' (gamma = γ_max): every row's α̂ starts at
  `adaptive.ALPHA_PRIOR`; a feature draft's re-read and features get FEATURE_LAG more
  positions, the caches and token buffer FEATURE_LAG more slots (`feature_lag`).

  A feature draft reads the target's prefill features shifted by one position
  (position 0 gets zeros) and starts with ℓ_d = ℓ (see the module docstring).
  """
  batch, width = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), tokens.shape)
  draft_config = feature_part(draft_config) or draft_config  # a hybrid prefills as its feature
  feature = draft_config is not None and draft_config.kind == "feature"
  layers = draft_config.feature_layers if feature else ()
  lag = feature_lag(draft_config, adaptive_gamma)
  slots = width + max_new_tokens + gamma + lag

  def empty_cache(config):
    cache = init_cache(config, batch, slots)
    return cache if mesh is None else sharding.constrain_cache(cache, mesh)

  out = forward(target_params, tokens, positions, empty_cache(target_config),
                config=target_config, return_logits=False, hidden_layers=layers)
  target_cache = with_length(out[1], prompt_len - 1)
  draft_cache = features = None
  if feature:
    f = out[2]  # [B,W,F]: the target's features at positions 0..W-1
    shifted = jnp.pad(f, ((0, 0), (1, gamma + lag), (0, 0)))  # shifted[:, j] = f[:, j-1]
    _, draft_cache = forward(draft_params, tokens, positions,
                             empty_cache(draft_config), config=draft_config,
                             return_logits=False, input_embed=target_params["embed"],
                             target_features=shifted[:, :width])
    draft_cache = with_length(draft_cache, prompt_len - 1)
    features = jax.vmap(lambda row, at: jax.lax.dynamic_slice_in_dim(
        row, at, gamma + 1 + lag))(shifted, prompt_len - 1)
  elif draft_config is not None and draft_config.kind == "model":
    _, draft_cache = forward(draft_params, tokens, positions,
                             empty_cache(draft_config), config=draft_config,
                             return_logits=False)
    draft_cache = with_length(draft_cache, prompt_len - 1)

  buffer = jnp.zeros((batch, width + max_new_tokens + gamma + lag + 1), jnp.int32)
  return DecodeState(
      tokens=jax.lax.dynamic_update_slice(buffer, tokens, (0, 0)),
      num_tokens=prompt_len,
      prompt_len=prompt_len,
      done=jnp.zeros((batch,), bool),
      row_keys=row_keys,
      step=jnp.zeros((), jnp.int32),
      target_cache=target_cache,
      draft_cache=draft_cache,
      features=features,
      accepted=jnp.full((batch, max_new_tokens), -1, jnp.int32),
      accept_prob=jnp.zeros((batch, max_new_tokens, gamma), jnp.float32),
      gammas=jnp.full((batch, max_new_tokens), -1, jnp.int32),
      alpha_estimate=adaptive.initial_alpha(batch) if adaptive_gamma else None,
      plain_run=jnp.zeros((batch,), jnp.int32) if lag else None,
  )


init_state_jit = jax.jit(init_state, static_argnames=(
    "target_config", "draft_config", "gamma", "max_new_tokens", "mesh", "adaptive_gamma"))


def _any_live(state: DecodeState, axis_name: str | None) -> Array:
  live = jnp.any(~state.done).astype(jnp.int32)
  if axis_name is not None:  # every device loops until the last row anywhere is done
    live = jax.lax.pmax(live, axis_name)
  return live > 0


def decode_loop(target_params, draft_params, tokens, prompt_len, row_keys, *,
                target_config: ModelConfig, draft_config: DraftConfig | None, gamma: int,
                sampling: SamplingConfig, vocab_size: int, eos_id: int | None,
                max_new_tokens: int, verifier: Verifier = block_verify,
                axis_name: str | None = None, mesh=None, costs=None,
                tree=None, tree_rule: str = "sampled") -> DecodeState:
  """Prefill (`init_state`) + `run_steps`, in one function (pmap and the mesh path jit
  it whole; `speculative_generate` compiles the two parts as programs of their own).
  draft_config None means autoregressive; the rest as `run_steps`; mesh: the device mesh
  of sharded inputs (`parallel.mesh_generate`), which pins the fresh caches.
  """
  state = init_state(target_params, draft_params, tokens, prompt_len, row_keys,
                     target_config=target_config, draft_config=draft_config,
                     gamma=gamma if draft_config is not None else 0,
                     max_new_tokens=max_new_tokens, mesh=mesh,
                     adaptive_gamma=costs is not None)
  return run_steps(target_params, draft_params, state, target_config=target_config,
                   draft_config=draft_config, gamma=gamma, sampling=sampling,
                   vocab_size=vocab_size, eos_id=eos_id, max_new_tokens=max_new_tokens,
                   verifier=verifier, axis_name=axis_name, costs=costs, tree=tree,
                   tree_rule=tree_rule)


def run_steps(target_params, draft_params, state: DecodeState, *,
              target_config: ModelConfig, draft_config: DraftConfig | None, gamma: int,
              sampling: SamplingConfig, vocab_size: int, eos_id: int | None,
              max_new_tokens: int, verifier: Verifier = block_verify,
              axis_name: str | None = None, costs=None, tree=None,
              tree_rule: str = "sampled") -> DecodeState:
  """One `lax.while_loop` of steps from `state` until every row is done or state.step
  reaches max_new_tokens. draft_config None means autoregressive.

  axis_name: the pmap axis (`parallel.pmap_generate`); it changes no token. costs: float32
  [2,G+1] (`adaptive.CostTable.loop_costs`, a traced input: any table, one compiled loop)
  for gamma='auto' with γ_max = gamma; None for a fixed γ.
  tree: a `TreeShape` (static): every step is `tree_decode.tree_step_fn` with rule
  tree_rule ('sampled' | 'topk'), one width N+1; gamma must be >= N (state widths).
  The cost table times its steps in this same compiled loop, from states it builds
  (`machine_costs.measure_steps`).
  """
  common = dict(target_config=target_config, sampling=sampling, vocab_size=vocab_size,
                eos_id=eos_id, max_new_tokens=max_new_tokens)
  if draft_config is None:
    body = functools.partial(autoregressive_step_fn, target_params, **common)
  elif tree is not None:
    from specdec_jax.decoding import tree_decode  # it imports this module
    body = functools.partial(tree_decode.tree_step_fn, target_params, draft_params,
                             draft_config=draft_config, shape=tree, rule=tree_rule, **common)
    costs = None  # one width
  else:
    body = functools.partial(speculative_step_fn, target_params, draft_params,
                             draft_config=draft_config, gamma=gamma, verifier=verifier,
                             costs=costs, **common)

  def cond(s):
    return _any_live(s, axis_name) & (s.step < max_new_tokens)

  widths = () if draft_config is None or tree is not None else step_widths(
      draft_config, gamma, costs)
  if len(widths) <= 1:
    return jax.lax.while_loop(cond, body, state)

  # Several call widths: one inner while_loop per width, each taking the steps whose
  # chosen width is its own, in turn (module docstring). No step runs under a
  # conditional, whose branches XLA:CPU gives copies of both caches. With a feature lag,
  # kind 0 is the plain step that skips the draft.
  skips = feature_lag(draft_config, costs is not None) > 0
  kinds = ([dict(width=1, skip_draft=True)] if skips else []) + [
      dict(width=k) for k in widths]

  def kind_of(s):
    chosen, _, _ = step_plan(s, draft_config=draft_config, gamma=gamma, costs=costs)
    index = adaptive.width_index(widths, chosen)
    if not skips:
      return index
    return jnp.where(may_skip_draft(s, chosen), 0, index + 1)

  # The carry holds the next step's kind, planned once after each step (a hybrid's plan
  # includes its lookup), not again in every inner loop's condition.
  def advance(carry, index):
    s = body(carry[0], **kinds[index])
    return s, kind_of(s)

  def steps_at(carry, index):
    return jax.lax.while_loop(
        lambda c: jnp.any(~c[0].done) & (c[0].step < max_new_tokens) & (c[1] == index),
        functools.partial(advance, index=index), carry)

  final, _ = jax.lax.while_loop(
      lambda c: cond(c[0]), lambda c: functools.reduce(steps_at, range(len(kinds)), c),
      (state, kind_of(state)))
  return final


_LOOP_STATICS = ("target_config", "draft_config", "gamma", "sampling", "vocab_size", "eos_id",
                 "max_new_tokens", "verifier", "axis_name", "mesh", "tree", "tree_rule")
decode_loop_jit = jax.jit(decode_loop, static_argnames=_LOOP_STATICS)
run_steps_jit = jax.jit(run_steps, static_argnames=tuple(
    name for name in _LOOP_STATICS if name != "mesh"))


def prefill(target_params, draft_params, args: GenerateArgs) -> DecodeState:
  """The starting state of `prepare_generate`'s args (`init_state_jit`), compiled under
  the same statics wherever it is called (the generate functions, the cost table)."""
  s = args.statics
  return init_state_jit(target_params, draft_params, args.tokens, args.prompt_len,
                        args.row_keys, target_config=s["target_config"],
                        draft_config=s["draft_config"], gamma=s["gamma"],
                        max_new_tokens=s["max_new_tokens"],
                        adaptive_gamma=args.costs is not None)


def run_steps_of(target_params, draft_params, state: DecodeState, args: GenerateArgs,
                 costs=None) -> DecodeState:
  """`run_steps_jit` from `state` under args' statics; costs: float32 [2,G+1] in place of
  args.costs (the cost table forces one width with it)."""
  return run_steps_jit(target_params, draft_params, state,
                       costs=args.costs if costs is None else costs, **args.statics)


def speculative_generate(target_params, draft_params, prompts, *, target_config: ModelConfig,
                         draft_config: DraftConfig, gamma: int | str, max_new_tokens: int,
                         sampling: SamplingConfig | None = None, seed=0, row_ids=None,
                         eos_id: int | None = None, pad_id: int = 0,
                         vocab_size: int | None = None,
                         verifier: Verifier | str | None = None, gamma_max: int | None = None,
                         costs: adaptive.CostTable | None = None,
                         prompt_width: int | None = None, tree=None,
                         tree_rule: str = "sampled") -> GenerationResult:
  """Speculative sampling of up to max_new_tokens per prompt, one jitted while_loop.

  gamma: drafts per step, or 'auto': each row and step picks 0..gamma_max from its
  acceptance estimate and the cost table `costs` (`adaptive`; `machine_costs`).

  prompts: a list of B token-id lists (any lengths >= 1) or an int array [B,P].
  seed: an int or B ints; row b's randomness derives from (seed[b], row_ids[b]) only.
  verifier: 'block' (default, `block_verify`), 'token' (`verify`) or a function.
  prompt_width: pad the prompts to at least this width (`prepare_prompts`).
  draft_config: a ModelConfig (independent or feature draft), an `ngram.NgramDraft`
  (draft_params None) or an `ngram.HybridDraft` (draft_params its feature draft's).
  tree: a `tree_shapes.TreeShape` drafts a token tree each step (`tree_decode`; any
  draft, lookup and hybrid ones with 'topk' and chains below the root; gamma is then
  ignored, 'auto' refused); tree_rule 'sampled' (SpecInfer, i.i.d. children) or 'topk'
  (the draft's top-k children).
  """
  _check_params(target_params, target_config, "target")
  _check_params(draft_params, draft_config, "draft")
  args = prepare_generate(prompts, target_config=target_config, draft_config=draft_config,
                          gamma=gamma, max_new_tokens=max_new_tokens, sampling=sampling,
                          seed=seed, row_ids=row_ids, eos_id=eos_id, pad_id=pad_id,
                          vocab_size=vocab_size, verifier=verifier, gamma_max=gamma_max,
                          costs=costs, prompt_width=prompt_width, tree=tree,
                          tree_rule=tree_rule)
  state = run_steps_of(target_params, draft_params, prefill(target_params, draft_params, args),
                       args)
  return _finish(state, max_new_tokens, pad_id)


def autoregressive_generate(target_params, prompts, *, target_config: ModelConfig,
                            max_new_tokens: int, sampling: SamplingConfig | None = None, seed=0,
                            row_ids=None, eos_id: int | None = None, pad_id: int = 0,
                            vocab_size: int | None = None,
                            prompt_width: int | None = None) -> GenerationResult:
  """Plain sampling with the same warp, cache, loop and key roots as the speculative one."""
  _check_params(target_params, target_config, "target")
  args = prepare_generate(prompts, target_config=target_config, draft_config=None, gamma=0,
                          max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                          row_ids=row_ids, eos_id=eos_id, pad_id=pad_id, vocab_size=vocab_size,
                          verifier=None, prompt_width=prompt_width)
  state = run_steps_of(target_params, None, prefill(target_params, None, args), args)
  return _finish(state, max_new_tokens, pad_id)
