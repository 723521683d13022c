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

A verifier is any function with the signature of `verify`; a `DecodeSpec` holds one
(`spec.verify_fn`) so that a block verifier can sit beside this one. At T = 0 the chain
step calls `greedy_verify` instead (it emits the same tokens on one-hot p).

Block verification (`block_verify`; Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami,
Suresh, "Block Verification Accelerates Speculative Decoding", ICLR 2025,
arXiv:2403.10444) verifies the block jointly, with the same inputs:
  w_0 = 1,  w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))                    i = 1..G
  r_i = Σ_x max(0, w_i p_{i+1}(x) - q_{i+1}(x))   with q_{G+1} ≡ 0 (so r_G = w_G)
  h_0 = 1,  h_i = r_i / (r_i + 1 - w_i)  (1 where 0/0; h_G = w_G)        i = 1..G
  τ = max({0} ∪ {i ≥ 1 : η_i < h_i}),  η_i ~ U[0,1)
  y ~ norm(max(0, w_τ p_{τ+1} - q_{τ+1}))  (p_{τ+1} where that mass underflows)
and the row emits x_1..x_τ, y. Every emitted token is still distributed as p given
the emitted prefix; E[τ] is never below token-wise verification's E[n] (equal at
G = 1); the paper proves it optimal in expected tokens per iteration.

Proposals that are not proposals (both verifiers). Leviathan et al.'s proof needs only
that x_i was drawn from the q_i handed to the verifier. A drafted position i is *valid*
when q_i is a distribution and x_i could have come from it:
  every q_i(v) finite and >= 0,  |Σ_v q_i(v) - 1| <= Q_SUM_TOLERANCE,
  0 <= x_i < V  and  q_i(x_i) > 0,
and when i < num_proposed (a per-row count the caller may pass: a draft that has
nothing to say, or a γ chosen per row). With m = the length of the leading run of
valid positions, the verifier treats the row as if the draft had proposed x_1..x_m
only: positions past m are never accepted, q_{m+1} is replaced by 0, so the token at
the cut is drawn from p_{m+1} (token-wise) or norm(w_m p_{m+1}) = p_{m+1} (block, whose
h_m becomes w_m as at the end of a block of m). Every emitted token is then distributed
as p for ANY draft output: NaN, ±inf, negative, unnormalised, or zero mass on the token
it proposed. The check is vectorized, runs under jit and never syncs to the host.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specdec_jax.models.sampling import sample

Array = jax.Array

# |Σ q - 1| above this makes a drafted position invalid (a float32 softmax over 49152
# entries sums to 1 within ~1e-6; the sampler draws from q / Σ q).
Q_SUM_TOLERANCE = 1e-3


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


def valid_proposals(draft_tokens: Array, draft_probs: Array,
                    num_proposed: Array | None = None) -> Array:
  """int32 [B]: m, the leading run of valid drafted positions (module docstring), <= G.

  draft_tokens int [B,G], draft_probs float [B,G,V], num_proposed int [B] or None (= G).
  """
  vocab = draft_probs.shape[-1]
  inside = (draft_tokens >= 0) & (draft_tokens < vocab)
  q_x = jnp.take_along_axis(draft_probs, jnp.clip(draft_tokens, 0, vocab - 1)[..., None],
                            axis=-1)[..., 0]
  total = jnp.sum(draft_probs, axis=-1)
  valid = (jnp.all(jnp.isfinite(draft_probs) & (draft_probs >= 0), axis=-1)
           & (jnp.abs(total - 1.0) <= Q_SUM_TOLERANCE) & inside & (q_x > 0))
  m = jnp.sum(jnp.cumprod(valid.astype(jnp.int32), axis=-1), axis=-1)
  if num_proposed is not None:
    m = jnp.minimum(m, jnp.clip(jnp.asarray(num_proposed, jnp.int32), 0, valid.shape[-1]))
  return m.astype(jnp.int32)


def _proposed_terms(draft_tokens, draft_probs, target_probs, num_valid):
  """One row's q(x_i), p(x_i) [G] and q padded with zero rows past m [G+1,V].

  Positions i >= m read q(x) = p(x) = 1 (finite, never used: they cannot be accepted)
  and their q rows are 0, so no non-finite value of the draft reaches the verifier's
  arithmetic.
  """
  gamma, vocab = draft_probs.shape
  proposed = jnp.arange(gamma) < num_valid
  tokens = jnp.clip(draft_tokens, 0, vocab - 1)[:, None]
  q_x = jnp.take_along_axis(draft_probs, tokens, axis=-1)[:, 0]
  p_x = jnp.take_along_axis(target_probs[:gamma], tokens, axis=-1)[:, 0]
  q_x = jnp.where(proposed, q_x, 1.0)
  p_x = jnp.where(proposed, p_x, 1.0)
  q_rows = jnp.where(proposed[:, None], draft_probs, 0.0)
  q_padded = jnp.concatenate([q_rows, jnp.zeros_like(q_rows[:1])], axis=0)
  return proposed, q_x, p_x, q_padded


def _verify_row(draft_tokens, draft_probs, target_probs, key, num_valid, residual_fn):
  """One row: draft_tokens[G], draft_probs[G,V], target_probs[G+1,V], m -> (tokens[G+1], n)."""
  gamma = draft_tokens.shape[0]
  key_accept, key_resample = jax.random.split(key)
  u = jax.random.uniform(key_accept, (gamma,), jnp.float32)
  proposed, q_x, p_x, q_padded = _proposed_terms(draft_tokens, draft_probs, target_probs,
                                                 num_valid)
  accepted = (u * q_x < p_x) & proposed
  num_accepted = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32)))

  # q is zero at and past m (q_{G+1} always), so the residual at n == m is p_{m+1} itself:
  # the bonus token at m == G, a plain draw from p where the proposals stop.
  residual = residual_fn(target_probs[num_accepted], q_padded[num_accepted])
  return _with_correction(draft_tokens, num_accepted, residual, key_resample)


def _with_correction(draft_tokens, num_accepted, correction, key):
  """One row's output: drafts [G] with y ~ correction [V] (key) at index n -> (tokens[G+1], n)."""
  next_token = sample(key, correction)
  tokens = jnp.concatenate([draft_tokens, next_token[None]])
  tokens = tokens.at[num_accepted].set(next_token)
  return tokens, num_accepted.astype(jnp.int32)


def verify(draft_tokens: Array, draft_probs: Array, target_probs: Array, key: Array, *,
           num_proposed: Array | None = None, residual_fn=residual_distribution):
  """Vectorized accept/reject.

  Args:
    draft_tokens: int [B,G], the drafted tokens.
    draft_probs: float [B,G,V], q_i, the distributions the drafts were sampled from.
    target_probs: float [B,G+1,V], p_i after the same warp as q.
    key: one PRNG key (split into B row keys) or B keys (one per row).
    num_proposed: int [B] or None (= G): row b proposed only its first num_proposed[b]
      drafts; later ones are never accepted (module docstring, "Proposals that are not
      proposals"). Invalid q rows cut the proposals the same way.
    residual_fn: (p[V], q[V]) -> the correction distribution. Only tests change it
      (the naive "correct from p" variant is their negative control).

  Returns:
    tokens: int32 [B,G+1]; row b emits tokens[b, :num_accepted[b]+1]. Entries past
      that hold the rejected drafts (never emitted).
    num_accepted: int32 [B], the length n of the leading accepted run (0..m <= G).
  """
  draft_tokens, draft_probs, target_probs = _check_verifier_args(draft_tokens, draft_probs,
                                                                  target_probs)
  b = draft_tokens.shape[0]
  keys = _row_keys(key, b)
  num_valid = valid_proposals(draft_tokens, draft_probs, num_proposed)
  row = functools.partial(_verify_row, residual_fn=residual_fn)
  return jax.vmap(row)(draft_tokens, draft_probs, target_probs, keys, num_valid)


def acceptance_probability(draft_probs: Array, target_probs: Array,
                           num_valid: Array | None = None) -> Array:
  """β_i = Σ_x min(p_i(x), q_i(x)) = 1 - TV(p_i, q_i). [B,G,V],[B,G(+1),V] -> [B,G].

  num_valid int [B] (`valid_proposals`): positions at and past it get β = 0 (nothing
  was proposed there), so a broken draft never reports a NaN acceptance.
  """
  g = draft_probs.shape[-2]
  beta = jnp.sum(jnp.minimum(draft_probs, target_probs[..., :g, :]), axis=-1)
  if num_valid is None:
    return beta
  return jnp.where(jnp.arange(g) < jnp.asarray(num_valid)[..., None], beta, 0.0)


# --------------------------------------------------------------- block verification

def block_residual_distribution(p: Array, q: Array, weight: Array) -> Array:
  """norm(max(0, weight * p - q)) over the last axis; p itself where that mass underflows.

  p, q: [..., V]; weight: [...] (w_τ of `block_verify`). weight = 1 gives
  `residual_distribution`; q = 0 (the bonus position) gives p.
  """
  residual = jnp.maximum(jnp.asarray(weight)[..., None] * p - q, 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  return jnp.where(mass > jnp.finfo(jnp.float32).tiny,
                   residual / jnp.where(mass > 0, mass, 1.0), p)


def _block_terms_row(draft_tokens, draft_probs, target_probs, num_valid):
  """One row: tokens[G], q[G,V], p[G+1,V], m -> (weights w[G+1], stop probabilities
  h[G+1], q with zero rows at and past m [G+1,V]). Past m the block is cut: h_i = 0 for
  i > m and h_m = w_m, as at the end of a block of m drafts."""
  gamma = draft_tokens.shape[0]
  _, q_x, p_x, q_padded = _proposed_terms(draft_tokens, draft_probs, target_probs, num_valid)

  def step(w, pq):
    p_i, q_i = pq
    wp = w * p_i
    # min(1, w p / q) without dividing by zero (q = 0 only for impossible drafts).
    w = jnp.where(wp > q_i, 1.0, wp / jnp.maximum(q_i, jnp.finfo(jnp.float32).tiny))
    return w, w

  _, w_tail = jax.lax.scan(step, jnp.float32(1.0), (p_x, q_x))
  weights = jnp.concatenate([jnp.ones((1,), jnp.float32), w_tail])  # w_0..w_G
  excess = jnp.sum(jnp.maximum(weights[:, None] * target_probs - q_padded, 0.0), axis=-1)
  denom = excess + (1.0 - weights)  # >= excess in floating point too, so h <= 1
  stop = jnp.where(denom > 0, excess / jnp.where(denom > 0, denom, 1.0), 1.0)
  index = jnp.arange(gamma + 1)
  stop = jnp.where(index < num_valid, stop, jnp.where(index == num_valid, weights, 0.0))
  stop = stop.at[0].set(1.0)
  return weights, stop, q_padded


def _check_verifier_args(draft_tokens, draft_probs, target_probs):
  """The argument checks of `verify`; returns (tokens int32, q float32, p float32)."""
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
  return draft_tokens.astype(jnp.int32), draft_probs, target_probs


def block_verification_terms(draft_tokens: Array, draft_probs: Array, target_probs: Array,
                             num_proposed: Array | None = None):
  """The deterministic part of `block_verify`, for exact (enumerated) analysis.

  Returns weights w [B,G+1] (w_0..w_G), stop probabilities h [B,G+1] (h_0 = 1) and the
  correction distributions [B,G+1,V] (row τ is drawn from when the row stops at τ).
  Given the drafts, P(τ = i) = h_i Π_{j>i} (1 - h_j).
  """
  tokens, q, p = _check_verifier_args(draft_tokens, draft_probs, target_probs)
  num_valid = valid_proposals(tokens, q, num_proposed)
  weights, stop, q_padded = jax.vmap(_block_terms_row)(tokens, q, p, num_valid)
  return weights, stop, block_residual_distribution(p, q_padded, weights)


def _block_verify_row(draft_tokens, draft_probs, target_probs, key, num_valid, residual_fn):
  """One row: draft_tokens[G], draft_probs[G,V], target_probs[G+1,V], m -> (tokens[G+1], τ)."""
  gamma = draft_tokens.shape[0]
  weights, stop, q_padded = _block_terms_row(draft_tokens, draft_probs, target_probs,
                                             num_valid)
  key_accept, key_resample = jax.random.split(key)
  eta = jax.random.uniform(key_accept, (gamma,), jnp.float32)  # η_1..η_G
  positions = jnp.arange(1, gamma + 1, dtype=jnp.int32)
  num_accepted = jnp.max(jnp.where(eta < stop[1:], positions, 0))  # the backward scan's τ
  correction = residual_fn(target_probs[num_accepted], q_padded[num_accepted],
                           weights[num_accepted])
  return _with_correction(draft_tokens, num_accepted, correction, key_resample)


def block_verify(draft_tokens: Array, draft_probs: Array, target_probs: Array, key: Array, *,
                 num_proposed: Array | None = None, residual_fn=block_residual_distribution):
  """Block verification (Sun et al., ICLR 2025, arXiv:2403.10444); vectorized.

  A drop-in replacement for `verify` (same arguments, same return contract). Per row,
  positions 1-based (p_i = target_probs[b, i-1], q_i = draft_probs[b, i-1]):
    w_0 = 1,  w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))                     [G+1]
    r_i = Σ_x max(0, w_i p_{i+1}(x) - q_{i+1}(x)),  q_{G+1} ≡ 0             [G+1]
    h_0 = 1,  h_i = r_i / (r_i + 1 - w_i)  (1 where 0/0, so h_G = w_G)      [G+1]
    τ = max({0} ∪ {i in 1..G : η_i < h_i})   (the paper's scan from i = G down)
    y ~ norm(max(0, w_τ p_{τ+1} - q_{τ+1})), or p_{τ+1} if that mass underflows;
        at τ = G this is the bonus token y ~ p_{G+1}.
  The row emits x_1..x_τ, y. Positions past m = `valid_proposals` (invalid q, or
  num_proposed) cut the block there: h_m = w_m, h_i = 0 for i > m, q_{m+1} ≡ 0, so any
  draft output leaves the law exact. Exact zeros in p or q are fine (no division by zero);
  one-hot p and q (greedy) give w_i = 1 on the leading run of matches, h = 1 at its end,
  so τ and y equal `verify`'s argmax matching exactly.

  Keys (as in `verify`): `key` is one PRNG key (split into B row keys) or B keys. Each
  row key k gives key_accept, key_resample = split(k); η_1..η_G =
  uniform(key_accept, (G,)) take the place of verify's u, and y = sample(key_resample,
  correction).

  Args:
    draft_tokens: int [B,G], the drafted tokens.
    draft_probs: float [B,G,V], q_i, the distributions the drafts were sampled from.
    target_probs: float [B,G+1,V], p_i after the same warp as q.
    key: one PRNG key or B keys.
    num_proposed: int [B] or None (= G): row b proposed only its first num_proposed[b]
      drafts (see `verify`).
    residual_fn: (p[V], q[V], w) -> the correction distribution. Only tests change it
      (negative controls).

  Returns:
    tokens: int32 [B,G+1]; row b emits tokens[b, :num_accepted[b]+1]. Entries past that
      hold the rejected drafts (never emitted).
    num_accepted: int32 [B], τ (0..m <= G), the number of drafts emitted.
  """
  tokens, q, p = _check_verifier_args(draft_tokens, draft_probs, target_probs)
  keys = _row_keys(key, tokens.shape[0])
  num_valid = valid_proposals(tokens, q, num_proposed)
  row = functools.partial(_block_verify_row, residual_fn=residual_fn)
  return jax.vmap(row)(tokens, q, p, keys, num_valid)


# --------------------------------------------------------------- greedy (temperature 0)

def greedy_verify(draft_tokens: Array, draft_probs: Array, target_probs: Array,
                  key: Array | None = None, *, num_proposed: Array | None = None):
  """Both verifiers' output when every p_i is one-hot (temperature 0), without their
  V-wide residual arithmetic or draws: the leading run of valid drafts equal to
  argmax p_i is accepted and y = argmax p_{n+1}. Same arguments and return contract as
  `verify` (key unused). With one-hot p, `verify` and `block_verify` accept x_i iff it
  is valid and p_i(x_i) = 1, and their correction norm(max(0, p - q)) (or p where the
  proposals stop) is p's own one-hot, so the tokens are theirs exactly (tests compare).
  """
  del key
  tokens, q, p = _check_verifier_args(draft_tokens, draft_probs, target_probs)
  gamma = tokens.shape[1]
  best = jnp.argmax(p, axis=-1).astype(jnp.int32)  # [B,G+1]
  num_valid = valid_proposals(tokens, q, num_proposed)
  match = (tokens == best[:, :gamma]) & (jnp.arange(gamma)[None, :] < num_valid[:, None])
  num_accepted = jnp.sum(jnp.cumprod(match.astype(jnp.int32), axis=1), axis=1)
  y = jnp.take_along_axis(best, num_accepted[:, None], axis=1)[:, 0]
  out = jnp.concatenate([tokens, y[:, None]], axis=1)
  out = out.at[jnp.arange(tokens.shape[0]), num_accepted].set(y)
  return out, num_accepted.astype(jnp.int32)
