"""Token-wise exact verification (Leviathan et al. 2023, Alg. 1; Chen et al. 2023, Alg. 2).

Letters: B batch, G = γ drafted tokens per row, V vocabulary.

For each row, with draft tokens x_1..x_G sampled from q_1..q_G and target
distributions p_1..p_{G+1} for the same prefixes:
  1. accept x_i iff u_i * q_i(x_i) < p_i(x_i), u_i ~ U[0,1) (no division);
  2. keep the leading run of accepted tokens, n of them;
  3. if n < G, draw the correction from norm(max(0, p_{n+1} - q_{n+1}))
     (falling back to p_{n+1} when that mass underflows to zero);
     if n == G, draw a bonus token from p_{G+1};
  4. the row emits tokens[:n+1].

The accepted mass of token x is min(p(x), q(x)) and the residual supplies exactly
max(0, p - q), so every emitted token is distributed as p.

A verifier is any function with the signature of `verify`; `speculative_step`
takes it as an argument so that a block verifier can sit beside this one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specdec_jax.sampling import sample

Array = jax.Array


def _row_keys(key: Array, batch: int) -> Array:
  """A key per row: `key` itself if it already holds B keys, else split(key, B)."""
  typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
  single_ndim = 0 if typed else 1
  if key.ndim == single_ndim:
    return jax.random.split(key, batch)
  if key.ndim == single_ndim + 1 and key.shape[0] == batch:
    return key
  raise ValueError(f"key must be one PRNG key or a batch of {batch} keys, got shape {key.shape}")


def residual_distribution(p: Array, q: Array) -> Array:
  """norm(max(0, p - q)) over the last axis; p itself where that mass underflows to 0."""
  residual = jnp.maximum(p - q, 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  return jnp.where(mass > jnp.finfo(jnp.float32).tiny, residual / mass, p)


def _verify_row(draft_tokens, draft_probs, target_probs, key, residual_fn):
  """One row: draft_tokens[G], draft_probs[G,V], target_probs[G+1,V] -> (tokens[G+1], n)."""
  gamma = draft_tokens.shape[0]
  key_accept, key_resample = jax.random.split(key)
  u = jax.random.uniform(key_accept, (gamma,), jnp.float32)
  q_x = jnp.take_along_axis(draft_probs, draft_tokens[:, None], axis=-1)[:, 0]
  p_x = jnp.take_along_axis(target_probs[:gamma], draft_tokens[:, None], axis=-1)[:, 0]
  accepted = u * q_x < p_x
  num_accepted = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32)))

  # q_{G+1} is zero, so the residual at n == G is p_{G+1} itself: the bonus token.
  q_padded = jnp.concatenate([draft_probs, jnp.zeros_like(draft_probs[:1])], axis=0)
  residual = residual_fn(target_probs[num_accepted], q_padded[num_accepted])
  next_token = sample(key_resample, residual)

  tokens = jnp.concatenate([draft_tokens, next_token[None]])
  tokens = tokens.at[num_accepted].set(next_token)
  return tokens, num_accepted.astype(jnp.int32)


def verify(draft_tokens: Array, draft_probs: Array, target_probs: Array, key: Array, *,
           residual_fn=residual_distribution):
  """Vectorized accept/reject.

  Args:
    draft_tokens: int [B,G], the drafted tokens.
    draft_probs: float [B,G,V], q_i, the distributions the drafts were sampled from.
    target_probs: float [B,G+1,V], p_i after the same warp as q.
    key: one PRNG key (split into B row keys) or B keys (one per row).
    residual_fn: (p[V], q[V]) -> the correction distribution. Only tests change it
      (the naive "correct from p" variant is their negative control).

  Returns:
    tokens: int32 [B,G+1]; row b emits tokens[b, :num_accepted[b]+1]. Entries past
      that hold the rejected drafts (never emitted).
    num_accepted: int32 [B], the length n of the leading accepted run (0..G).
  """
  draft_tokens = jnp.asarray(draft_tokens)
  draft_probs = jnp.asarray(draft_probs, jnp.float32)
  target_probs = jnp.asarray(target_probs, jnp.float32)
  if draft_tokens.ndim != 2 or not jnp.issubdtype(draft_tokens.dtype, jnp.integer):
    raise ValueError(f"draft_tokens must be an int array [B,G], got {draft_tokens.dtype} "
                     f"{draft_tokens.shape}")
  b, g = draft_tokens.shape
  if g < 1:
    raise ValueError(f"gamma (draft_tokens.shape[1]) must be >= 1, got {g}")
  if draft_probs.ndim != 3 or draft_probs.shape[:2] != (b, g):
    raise ValueError(f"draft_probs must be [B,G,V] = [{b},{g},V], got {draft_probs.shape}")
  v = draft_probs.shape[2]
  if target_probs.shape != (b, g + 1, v):
    raise ValueError(f"target_probs must be [B,G+1,V] = {(b, g + 1, v)}, got "
                     f"{target_probs.shape} (draft and target vocabularies must match)")
  keys = _row_keys(key, b)
  row = functools.partial(_verify_row, residual_fn=residual_fn)
  return jax.vmap(row)(draft_tokens.astype(jnp.int32), draft_probs, target_probs, keys)


def acceptance_probability(draft_probs: Array, target_probs: Array) -> Array:
  """β_i = Σ_x min(p_i(x), q_i(x)) = 1 - TV(p_i, q_i). [B,G,V],[B,G(+1),V] -> [B,G]."""
  g = draft_probs.shape[-2]
  return jnp.sum(jnp.minimum(draft_probs, target_probs[..., :g, :]), axis=-1)
