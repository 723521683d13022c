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

`NgramDraft` is the draft kind ('ngram:<n>'); `hybrid.HybridDraft` ('hybrid:<n>') takes the
lookup's proposals only on rows with a match of at least n tokens (`lookup`'s `found`), and
another draft's elsewhere.

In a token tree (rule 'topk' only) the root's K children are the first followers of up to
K earlier matches with distinct first tokens, each heading a chain of its match's
continuation (`lookup_candidates`; the shape must be such chains below the root,
`lookup_tree_ranks`): a deterministic candidate set, so rule 'topk' is exact for it.
"""


from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.drafts.base import DRAFT, Draft, Plan, check_levels
from specdec_jax.verification.tree_shapes import TreeShape

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class NgramDraft(Draft):
  """A prompt-lookup draft: match up to `max_n` trailing tokens (config name 'ngram:<n>').
  No params, no cache, no vocabulary of its own; q is one-hot at each proposal."""

  max_n: int = 3

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

  @property
  def may_propose_nothing(self) -> bool:
    return True

  @property
  def cost_sources(self) -> tuple[str, ...]:
    return ("lookup",)  # it proposes only where its lookup matches

  def plan(self, state, gamma):
    looked = lookup(state.tokens, state.num_tokens, min_n=1, max_n=self.max_n, gamma=gamma)
    return Plan(proposes=looked[1], source=jnp.full(looked[1].shape, DRAFT, jnp.int32),
                lookup=looked)

  def propose(self, params, target_params, state, keys, *, plan, chosen, warp_fn, greedy,
              vocab_size, shallow=None):
    xs = plan.lookup[0][:, :keys.shape[1]]
    return xs, jax.nn.one_hot(xs, vocab_size, dtype=jnp.float32), None

  def check_tree(self, shape, rule, vocab_size) -> None:
    check_lookup_tree(shape, rule)

  def propose_tree(self, params, target_params, state, keys, *, shape, rule, warp_fn,
                   vocab_size, greedy):
    nodes, _ = lookup_tree(state, shape=shape, min_n=1, max_n=self.max_n)
    return nodes, None, None, None  # rule 'topk' (check_tree): q is never read


def lookup_tree_ranks(shape: TreeShape) -> np.ndarray | None:
  """int32 [N]: per node the rank of its depth-1 ancestor (the lookup candidate it reads),
  or None if the shape is not chains below the root (a node at depth >= 2 of rank > 0)."""
  if any(d > 1 and r > 0 for d, r in zip(shape.depths, shape.child_rank)):
    return None
  return np.asarray([path[0] for path in shape.rank_paths()], np.int32)


def check_lookup_tree(shape, rule: str) -> None:
  """Raises ValueError naming the value if a lookup cannot propose this tree."""
  check_levels(shape)
  if rule != "topk":
    raise ValueError(f"a lookup draft's tree needs tree_rule 'topk' (its candidates are a "
                     f"deterministic set, not draws from q), got {rule!r}")
  if lookup_tree_ranks(shape) is None:
    raise ValueError(f"a lookup draft's tree must be chains below the root (every node at "
                     f"depth >= 2 an only child, e.g. branching (3, 1, 1)), got rank paths "
                     f"{shape.rank_paths()}")
  if shape.budget is not None:
    raise ValueError(f"a dynamic tree (budget {shape.budget}) needs a model draft's "
                     f"probabilities to rank its candidates; a lookup has none")


def lookup_tree(state, *, shape: TreeShape, min_n: int, max_n: int) -> tuple[Array, Array]:
  """A lookup's tree -> (nodes int32 [B,N], found bool [B]): node i is depth(i)'s token of
  the candidate its depth-1 ancestor's rank names (`lookup_candidates`); found: the row has
  a match of min_n..max_n tokens."""
  ranks = lookup_tree_ranks(shape)
  cands, found = lookup_candidates(state.tokens, state.num_tokens, min_n=min_n, max_n=max_n,
                                   count=int(ranks.max()) + 1, depth=shape.max_depth)  # [B,K,D]
  return cands[:, ranks, np.asarray(shape.depths) - 1], found[:, 0]


def match_starts(tokens: Array, length: Array, n: int, count: int) -> Array:
  """int32 [B,count]: starts j of the `count` most recent earlier copies of
  tokens[b, L-n:L] with j + n <= L - 1, most recent first; -1 past the last (or where
  L <= n). tokens [B,W], length [B]."""
  width = tokens.shape[1]
  starts = jnp.arange(width - n + 1)
  suffix = jnp.take_along_axis(tokens, jnp.maximum(length[:, None] - n, 0) + jnp.arange(n),
                               axis=1)  # [B,n]
  same = jnp.ones((tokens.shape[0], starts.size), bool)
  for k in range(n):  # n is small and static: n shifted compares of [B,W-n+1]
    same &= tokens[:, k: k + starts.size] == suffix[:, k: k + 1]
  valid = starts[None, :] + n <= length[:, None] - 1
  found = jnp.where(same & valid, starts[None, :], -1)
  if count == 1:
    return jnp.max(found, axis=1, keepdims=True).astype(jnp.int32)
  return jax.lax.top_k(found, min(count, starts.size))[0].astype(jnp.int32)


def match_start(tokens: Array, length: Array, n: int) -> Array:
  """int32 [B]: start j of the most recent earlier copy of tokens[b, L-n:L] with
  j + n <= L - 1, or -1 where there is none (or L <= n). tokens [B,W], length [B]."""
  return match_starts(tokens, length, n, 1)[:, 0]


def lookup(tokens: Array, length: Array, *, min_n: int, max_n: int,
           gamma: int) -> tuple[Array, Array]:
  """(proposals int32 [B,G], found bool [B]): the continuation of the longest earlier match
  of n trailing tokens, min_n <= n <= max_n (see the module docstring); where there is
  none, found is False and every proposal is the pending token.

  tokens int [B,W]: each row's known tokens in tokens[b, :length[b]], the last pending.
  """
  follow = jnp.full(length.shape, -1, jnp.int32)  # index j + n of the first follower
  for n in range(max_n, min_n - 1, -1):  # longest match first
    j = match_start(tokens, length, n)
    follow = jnp.where((follow < 0) & (j >= 0), j + n, follow)
  return continuations(tokens, length, follow[:, None], gamma)[:, 0], follow >= 0


def continuations(tokens: Array, length: Array, follow: Array, depth: int) -> Array:
  """int32 [B,K,D]: the D tokens from each first follower follow [B,K] (index j + n of a
  match), read with the match's shift d = L - n - j (periodic past L); the pending token
  t[L-1] where follow < 0 (no match)."""
  found = follow >= 0
  shift = jnp.where(found, length[:, None] - follow, 1)  # d >= 1
  idx = jnp.where(found[..., None], follow[..., None] + jnp.arange(depth) % shift[..., None],
                  (length - 1)[:, None, None])  # [B,K,D]
  out = jnp.take_along_axis(tokens, idx.reshape(idx.shape[0], -1), axis=1)
  return out.reshape(idx.shape).astype(jnp.int32)


def lookup_candidates(tokens: Array, length: Array, *, min_n: int, max_n: int, count: int,
                      depth: int, scan: int = 4) -> tuple[Array, Array]:
  """(proposals int32 [B,K,D], found bool [B,K]), K = count, D = depth: up to K
  continuations of earlier matches with distinct first tokens, for a token tree whose
  root has K children, each the head of a chain (`decoding.tree_step`).

  Per row, the longest n (max_n .. min_n) with any match is used; of its scan*K most
  recent matches, the first of each distinct first follower is kept, most recent
  first. Candidate k reads its continuation as `lookup` does (periodic past L); where
  fewer than K remain, found is False and the proposals are the pending token. With
  K = 1 it is `lookup` (its D proposals and found).
  """
  rows = jnp.arange(tokens.shape[0])[:, None]
  starts = jnp.full((tokens.shape[0], scan * count), -1, jnp.int32)
  used = jnp.zeros(length.shape, jnp.int32)  # the n of the kept starts, 0 = none yet
  for n in range(max_n, min_n - 1, -1):  # longest match first
    j = match_starts(tokens, length, n, scan * count)
    j = jnp.pad(j, ((0, 0), (0, scan * count - j.shape[1])), constant_values=-1)
    take = (used == 0) & (j[:, 0] >= 0)
    starts = jnp.where(take[:, None], j, starts)
    used = jnp.where(take, n, used)
  follow = jnp.where(starts >= 0, starts + used[:, None], -1)  # [B,M] first follower
  first = jnp.where(follow >= 0, tokens[rows, jnp.maximum(follow, 0)], -1)
  earlier = jnp.tril(jnp.ones((first.shape[1],) * 2, bool), -1)  # [M,M]: j < k
  repeat = jnp.any(earlier[None] & (first[:, None, :] == first[:, :, None]), axis=2)
  keep = (follow >= 0) & ~repeat
  order = jnp.argsort(~keep, axis=1, stable=True)[:, :count]  # kept ones, most recent first
  follow = jnp.where(jnp.take_along_axis(keep, order, 1),
                     jnp.take_along_axis(follow, order, 1), -1)  # [B,K]
  return continuations(tokens, length, follow, depth), follow >= 0


def propose(tokens: Array, length: Array, *, max_n: int, gamma: int) -> Array:
  """int32 [B,G]: the n-gram draft's proposals (see the module docstring).

  tokens int [B,W]: each row's known tokens in tokens[b, :length[b]], the last pending.
  """
  return lookup(tokens, length, min_n=1, max_n=max_n, gamma=gamma)[0]
