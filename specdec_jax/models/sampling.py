"""Sampling rules as pure functions. Letters: B batch, V vocabulary.

`warp` is the one function that turns logits into the probabilities that are both
sampled from and used in the acceptance ratio, for the draft (q) and the target (p)
alike: q must be the very array the draft sampled from, and p the target's law under the
same rules (docs/background.md#one-warp).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """Sampling rules; hashable, so it is a static argument of the jitted loops.

  temperature: 0 means greedy (one-hot argmax); top_k: 0 disables; top_p: 1 disables.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    validate_sampling(self.temperature, self.top_k, self.top_p)


def validate_sampling(temperature, top_k, top_p) -> None:
  """Raises ValueError naming the offending sampling setting."""
  if not isinstance(temperature, (int, float)) or not temperature >= 0:
    raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
  if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
    raise ValueError(f"top_k must be an int >= 0 (0 disables), got {top_k!r}")
  if not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p must lie in (0, 1], got {top_p!r}")


def warp(logits: Array, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Array:
  """logits[..., V] -> probabilities[..., V] (float32) after temperature, top-k, top-p.

  The settings are Python numbers (static under jit). Truncated entries are exact
  zeros. Temperature 0 gives the one-hot argmax (lowest index on ties).
  """
  validate_sampling(temperature, top_k, top_p)
  logits = logits.astype(jnp.float32)
  vocab = logits.shape[-1]
  if temperature == 0:
    return jax.nn.one_hot(jnp.argmax(logits, axis=-1), vocab, dtype=jnp.float32)
  logits = logits / temperature
  if top_k and top_k < vocab:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if top_p < 1.0:
    # Keep the smallest set of most likely tokens whose mass reaches top_p
    # (a token is kept if the mass strictly before it is < top_p).
    sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
    sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    keep = mass_before < top_p
    threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
  return jax.nn.softmax(logits, axis=-1)


def sample(key: Array, probs: Array, greedy: bool = False) -> Array:
  """One token id per row from probs[..., V] (exact zeros are never drawn).

  greedy=True (static; for the one-hot probs of temperature 0) takes the argmax,
  the same token, without drawing V Gumbel variates.
  """
  if greedy:
    return jnp.argmax(probs, axis=-1).astype(jnp.int32)
  return jax.random.categorical(key, jnp.log(probs), axis=-1).astype(jnp.int32)
