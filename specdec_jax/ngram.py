"""Prompt-lookup (n-gram) drafts: propose what followed an earlier match of the last n tokens.

Letters: B batch, W token-buffer width, G = γ drafted tokens per step, N = max_n.

For row b with known tokens t = tokens[b, :L] (prompt, generated, pending last), the
draft looks for the most recent start j of an earlier copy of the last n tokens,
  t[j : j+n] == t[L-n : L]  with  j + n <= L - 1   (at least one known token follows),
trying n = N, N-1, .., 1 and keeping the longest n that matches. The G proposals are
the tokens that followed, read periodically with the match's shift d = L - n - j:
  x_i = t[j + n + ((i - 1) mod d)],   i = 1..G,
which is the continuation itself while it is known and repeats it past L (a match
that overlaps the suffix, such as a run "aaaa", predicts the run goes on). With no
match for any n, every proposal is the pending token t[L-1]: cheap and valid.

The draft distribution q is one-hot at each proposal, so verification is exact
with either verifier (accept x with probability p(x); the residual is p without x).
Everything is fixed-shape and runs inside the jitted decode loop; the draft has no
parameters and no cache.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class NgramDraft:
  """A prompt-lookup draft: match up to `max_n` trailing tokens (config name 'ngram:<n>')."""

  max_n: int = 3

  kind = "ngram"  # beside ModelConfig.kind 'model' | 'feature'

  def __post_init__(self):
    if isinstance(self.max_n, bool) or not isinstance(self.max_n, int) or self.max_n < 1:
      raise ValueError(f"ngram draft needs max_n >= 1, got {self.max_n!r}")

  @classmethod
  def from_name(cls, name: str) -> "NgramDraft":
    """'ngram:<n>' -> NgramDraft(n)."""
    _, _, n = name.partition(":")
    try:
      return cls(int(n))
    except ValueError:
      raise ValueError(f"ngram draft name must be 'ngram:<n>' with n >= 1, got {name!r}") from None


def match_start(tokens: Array, length: Array, n: int) -> Array:
  """int32 [B]: start j of the most recent earlier copy of tokens[b, L-n:L] with
  j + n <= L - 1, or -1 where there is none (or L <= n). tokens [B,W], length [B]."""
  width = tokens.shape[1]
  starts = jnp.arange(width - n + 1)
  suffix = jnp.take_along_axis(tokens, jnp.maximum(length[:, None] - n, 0) + jnp.arange(n),
                               axis=1)  # [B,n]
  same = jnp.ones((tokens.shape[0], starts.size), bool)
  for k in range(n):  # n is small and static: n shifted compares of [B,W-n+1]
    same &= tokens[:, k: k + starts.size] == suffix[:, k: k + 1]
  valid = starts[None, :] + n <= length[:, None] - 1
  return jnp.max(jnp.where(same & valid, starts[None, :], -1), axis=1).astype(jnp.int32)


def propose(tokens: Array, length: Array, *, max_n: int, gamma: int) -> Array:
  """int32 [B,G]: the n-gram draft's proposals (see the module docstring).

  tokens int [B,W]: each row's known tokens in tokens[b, :length[b]], the last pending.
  """
  follow = jnp.full(length.shape, -1, jnp.int32)  # index j + n of the first follower
  for n in range(max_n, 0, -1):  # longest match first
    j = match_start(tokens, length, n)
    follow = jnp.where((follow < 0) & (j >= 0), j + n, follow)
  found = follow >= 0
  shift = jnp.where(found, length - follow, 1)  # d = L - n - j >= 1
  idx = jnp.where(found[:, None], follow[:, None] + jnp.arange(gamma)[None, :] % shift[:, None],
                  (length - 1)[:, None])
  return jnp.take_along_axis(tokens, idx, axis=1).astype(jnp.int32)
