"""The decode state, its prefill, emitting tokens and the key schedule.

Letters: B batch, G drafted positions a step holds (γ, γ_max or a tree's N; 0 for
autoregressive decoding), L a draft's skip lag, P longest prompt, M max_new_tokens,
S cache slots, W token-buffer width.

Decode state invariant (every row b):
  tokens[b, :num_tokens[b]] is the prompt followed by the emitted tokens;
  the last of them, tokens[b, num_tokens[b]-1], is *pending*: it is not yet in the
  target's cache, which holds exactly num_tokens[b]-1 entries. The draft's state
  (`draft_state`, owned by the draft kind, `drafts.base`) follows the same tokens.

Key schedule (one root per row; nothing depends on batch size or layout):
  row_key[b]      = fold_in(PRNGKey(seed[b]), row_id[b])
  step_key[b, s]  = fold_in(row_key[b], s)             s = loop step, 0-based
  draft_key, verify_key = split(step_key[b, s])
  draft_keys[i]   = split(draft_key, G)[i]              x_{i+1} (a chain) or node i (a tree)
  verify: u_key, resample_key = split(verify_key)       u[1..G], correction/bonus
  autoregressive: the token of step s is sample(step_key[b, s], p).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.drafts.base import Draft, with_length
from specdec_jax.models import sharding
from specdec_jax.models.model import ModelConfig, forward, init_cache

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
  draft_state: Any  # the draft kind's own pytree (a cache, features, or None)
  accepted: Array  # int32 [B,M], drafts accepted per row per step; -1 where the row idled
  accept_prob: Array  # float32 [B,M,G], β = Σ min(p,q) of each drafted position
  gammas: Array  # int32 [B,M], drafts proposed per row per step (γ_b); -1 where it idled
  rule_state: Any = None  # the proposer's per-row state (gamma 'auto': the rule's, leading B)


def init_state(target_params, draft_params, tokens: Array, prompt_len: Array, row_keys: Array,
               *, target_config: ModelConfig, draft: Draft | None, gamma: int,
               max_new_tokens: int, lag: int = 0, proposer=None, mesh=None) -> DecodeState:
  """Prefills the target cache and the draft's state with the prompts and builds the state.

  gamma: G; lag: the draft's skip lag under gamma 'auto' (`DecodeSpec.lag`): the caches
  and token buffer get G + L slots beyond P + M. proposer: the spec's proposer (static,
  without its cost table), whose `init` gives the rows' rule state (gamma 'auto': the
  rule's; None for the others). mesh: a ('data', 'model') `jax.sharding.Mesh`; the fresh caches
  are pinned to `sharding.cache_sharding` (batch over 'data', kv heads over 'model').
  """
  batch, width = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), tokens.shape)
  slots = width + max_new_tokens + gamma + lag

  def empty_cache(config):
    cache = init_cache(config, batch, slots)
    return cache if mesh is None else sharding.constrain_cache(cache, mesh)

  layers = () if draft is None else draft.target_layers
  out = forward(target_params, tokens, positions, empty_cache(target_config),
                config=target_config, return_logits=False, hidden_layers=layers)
  draft_state = None
  if draft is not None:
    draft_state = draft.prefill(draft_params, target_params, tokens, positions, prompt_len,
                                target_features=out[2] if layers else None,
                                empty_cache=empty_cache, window=gamma + 1 + lag)
  buffer = jnp.zeros((batch, width + max_new_tokens + gamma + lag + 1), jnp.int32)
  return DecodeState(
      tokens=jax.lax.dynamic_update_slice(buffer, tokens, (0, 0)),
      num_tokens=prompt_len,
      prompt_len=prompt_len,
      done=jnp.zeros((batch,), bool),
      row_keys=row_keys,
      step=jnp.zeros((), jnp.int32),
      target_cache=with_length(out[1], prompt_len - 1),
      draft_state=draft_state,
      accepted=jnp.full((batch, max_new_tokens), -1, jnp.int32),
      accept_prob=jnp.zeros((batch, max_new_tokens, gamma), jnp.float32),
      gammas=jnp.full((batch, max_new_tokens), -1, jnp.int32),
      rule_state=None if proposer is None else proposer.init(batch),
  )


def emit(state: DecodeState, block: Array, count: Array, *, eos_id: int | None,
         max_new_tokens: int) -> DecodeState:
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
  return state.replace(tokens=tokens, num_tokens=state.num_tokens + count,
                       done=done | state.done)


def step_keys(state: DecodeState) -> Array:
  """uint32 [B,2]: step_key[b, state.step] of the key schedule."""
  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(state.row_keys, state.step)


def split_step_keys(state: DecodeState, count: int) -> tuple[Array, Array]:
  """(draft_keys uint32 [B,count,2], verify_keys uint32 [B,2]) of this step."""
  split = jax.vmap(jax.random.split)(step_keys(state))  # [B,2,2]
  draft = jax.vmap(lambda k: jax.random.split(k, count))(split[:, 0])
  return draft, split[:, 1]


def record(state: DecodeState, num_accepted: Array, gammas: Array,
           beta: Array | None = None) -> DecodeState:
  """Writes this step's accepted count and γ_b (-1 for rows already done) and β."""
  live = ~state.done
  state = state.replace(
      accepted=state.accepted.at[:, state.step].set(jnp.where(live, num_accepted, -1)),
      gammas=state.gammas.at[:, state.step].set(jnp.where(live, gammas, -1)))
  if beta is not None:
    state = state.replace(accept_prob=state.accept_prob.at[:, state.step].set(beta))
  return state
