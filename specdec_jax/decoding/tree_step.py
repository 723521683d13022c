"""One tree step per loop iteration: a token tree drafted, scored in one call, verified.

Letters: B batch, N drafted nodes, N' sent nodes (N, or a dynamic tree's budget), D max
depth, V vocabulary, S cache slots, F target feature width. Node / position numbering as
in `verification.tree_shapes` (position 0 = the root = the pending token, position i + 1
= node i).

A tree step for row b (length ℓ = num_tokens[b]-1, pending token t at position ℓ) keeps
the decode-state invariant (`decoding.state`):
  1. `draft.propose_tree` drafts the N nodes (a model draft level by level with
     tree-masked calls, `drafts.tree_drafting`; a lookup its candidates' chains);
  2. one target call over [t, nodes] at slots ℓ..ℓ+N', positions ℓ + [0, depths], tree
     attention -> p_at [B,N+1,V] after the chain's warp (and the target's features). A
     dynamic tree (`TreeShape.budget` N') sends only the N' nodes of the largest draft log
     path probability (`tree_drafting.select_nodes`), in node order; their rows of p go
     back to their node positions and `node_mask` marks them (rule 'topk' only: which
     candidates a row sends depends on the draft alone, so the walk stays exact);
  3. `tree_verify(shape, nodes, q_at, p_at, verify_keys, rule=...)` -> the accepted path
     (n nodes) and y; the row emits the path's tokens then y;
  4. the accepted path's K/V move to contiguous slots (node at depth d: from its call
     slot to slot ℓ+d) in the target cache; the draft follows (`advance_tree`).
Records: accepted[b, s] = n, gammas[b, s] = D for live rows (-1 idle); accept_prob stays
zeros (β of a tree position is not defined by one q and one p).

State widths: the state is `init_state`'s with G = N (`DecodeSpec.gamma` of a tree), so a
feature draft's features hold N+1 >= D+1 positions and the caches N slots beyond the
emitted tokens, room for the N+1 tokens of the target call at ℓ <= P+M-1.

Keys: the chain's (`decoding.state`): node i is drawn with split(draft_key, N)[i];
verify_key is `tree_verify`'s row key. At T=0 a chain shape with rule 'sampled' gives
exactly the chain's tokens (verifier 'token', same γ); at T>0 the verifier's key use
differs from `verify`'s, so the two agree in law, not token for token.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specdec_jax.decoding.spec import DecodeSpec
from specdec_jax.decoding.state import DecodeState, emit, record, split_step_keys
from specdec_jax.decoding.step import warp_vocab
from specdec_jax.drafts.base import Draft, pending_tokens, with_length
from specdec_jax.drafts.tree_drafting import (compact_path, position_mask, select_nodes,
                                              slot_mask)
from specdec_jax.models.model import ModelConfig, forward
from specdec_jax.verification.tree_verify import tree_verify

Array = jax.Array


def tree_step_fn(target_params, draft_params, state: DecodeState, *,
                 target_config: ModelConfig, draft: Draft, spec: DecodeSpec) -> DecodeState:
  """One tree step for every row (module docstring) -> the new `DecodeState`. Not jitted;
  `loop.run_steps` runs it as its loop body when the spec's proposer is a tree."""
  shape, rule = spec.tree.shape, spec.tree.rule
  vocab, sampling = spec.vocab_size, spec.sampling
  warp_fn = functools.partial(warp_vocab, vocab=vocab, sampling=sampling)
  n_nodes, depth = shape.num_nodes, shape.max_depth
  length = state.num_tokens - 1
  draft_keys, verify_keys = split_step_keys(state, n_nodes)
  nodes, q_at, draft_state, scores = draft.propose_tree(
      draft_params, target_params, state, draft_keys, shape=shape, rule=rule, warp_fn=warp_fn,
      vocab_size=vocab, greedy=sampling.temperature == 0)

  # the call's positions: 0 = the root, then every node or, for a dynamic tree, the
  # selected ones (call[b, j] = the node at position j+1 of row b's call)
  rows = jnp.arange(nodes.shape[0])[:, None]
  node_mask = None
  if shape.budget is None:
    call = jnp.broadcast_to(jnp.arange(n_nodes, dtype=jnp.int32), nodes.shape)
  else:
    call = select_nodes(shape, scores)  # [B,N']
    node_mask = jnp.zeros(nodes.shape, bool).at[rows, call].set(True)
  at = jnp.concatenate([jnp.zeros_like(call[:, :1]), call + 1], axis=1)  # [B,N'+1]
  target_in = jnp.concatenate([pending_tokens(state)[:, None],
                               jnp.take_along_axis(nodes, call, axis=1)], axis=1)
  positions = length[:, None] + jnp.asarray((0,) + shape.depths)[at]
  visible = jnp.asarray(position_mask(shape))[at[:, :, None], at[:, None, :]]  # [B,N'+1,N'+1]
  slots = state.target_cache["k"].shape[2]
  layers = draft.target_layers
  out = forward(target_params, target_in, positions, with_length(state.target_cache, length),
                config=target_config, attn_mask=slot_mask(visible, length, slots),
                hidden_layers=layers)
  p_at = warp_fn(out[0])  # [B,N'+1,V]
  if shape.budget is not None:  # back to positions of the candidate tree (unsent: never read)
    p_at = jnp.zeros(p_at.shape[:1] + (n_nodes + 1,) + p_at.shape[2:],
                     p_at.dtype).at[rows, at].set(p_at)
  path, block, num_accepted = tree_verify(shape, nodes, q_at, p_at, verify_keys, rule=rule,
                                          node_mask=node_mask)
  # the path's nodes as positions of the call (the target cache's slots ℓ+1+j)
  slot_of = jnp.full(nodes.shape, -1, jnp.int32).at[rows, call].set(
      jnp.arange(call.shape[1], dtype=jnp.int32))
  call_path = jnp.where(path >= 0, jnp.take_along_axis(slot_of, jnp.maximum(path, 0), 1), -1)

  state = record(state, num_accepted, jnp.full_like(num_accepted, depth))
  state = emit(state, jnp.maximum(block, 0), num_accepted + 1, eos_id=spec.eos_id,
               max_new_tokens=spec.max_new_tokens)
  new_length = state.num_tokens - 1
  target_cache = with_length(compact_path(out[1], length, call_path), new_length)
  draft_state = draft.advance_tree(draft_state, length=length, new_length=new_length,
                                   path=path, call_path=call_path,
                                   target_features=out[2] if layers else None)
  return state.replace(target_cache=target_cache, draft_state=draft_state,
                       step=state.step + 1)
