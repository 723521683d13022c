"""A vocabulary-subset head's logits spread over the whole vocabulary.

Letters: C columns of the head (`ModelConfig.head_tokens`), V vocabulary.

A subset head scores C of the V ids; every other id gets logit -inf (q = 0: it is only
emitted from the verifier's residual). The spread is a gather, column[v] where the head
has id v (`subset_columns`), not a scatter of the C logits into a row of V: on a TPU a
scatter serializes, and around one XLA:TPU copies the Qwen pair's draft cache inside its
fixed-γ loops (docs/tpu_plan.md names the one loop that copies with the gather instead).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.lru_cache(maxsize=8)
def subset_columns(head_tokens: tuple[int, ...], vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
  """(column [V] int32, kept [V] bool): id v is the head's column column[v] where kept[v]
  (head_tokens[column[v]] = v); elsewhere the head has no column for it (column 0)."""
  ids = np.asarray(head_tokens, np.int64)
  column = np.zeros(vocab_size, np.int32)
  column[ids] = np.arange(len(ids), dtype=np.int32)
  kept = np.zeros(vocab_size, bool)
  kept[ids] = True
  return column, kept


def full_vocab_logits(logits: jax.Array, head_tokens: tuple[int, ...],
                      vocab_size: int) -> jax.Array:
  """logits [..., C] of a subset head -> [..., V], -inf at the ids the head leaves out."""
  column, kept = subset_columns(head_tokens, vocab_size)
  return jnp.where(kept, jnp.take(logits, column, axis=-1), -jnp.inf)
