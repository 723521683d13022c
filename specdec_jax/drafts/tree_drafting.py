"""Token trees drafted by a model, level by level, and the tree-attention masks.

Letters: B batch, N drafted nodes, D max depth, V vocabulary, S cache slots, P positions
drafted so far, R query positions of one call. Node / position numbering as in
`verification.tree_shapes` (position 0 = the root = the pending token, position i + 1 =
node i).

A model draft drafts a tree level by level (nodes numbered level by level): one draft
call per depth 1..D-1 over all nodes of that depth (the depth-D nodes are drawn, never
fed). Node i is written at draft slot ℓ+1+i, at position ℓ+depth(i), and attends the
prefix slots <= ℓ and its own ancestors' slots (`tree_mask`). The children of a position
are drawn per rule:
  'sampled': k children i.i.d. from q at that position (node i uses keys[:, i]);
  'topk':    the k most likely tokens of the draft's logits there (deterministic; at
             T=0 a greedy draft's top-k, not k copies of its argmax).
A dynamic tree (`TreeShape.budget` N') ranks its candidates by log path probability
Σ log q(x | parent) under the draft's logits / SELECTION_TEMPERATURE (`scores`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.drafts.base import (TreeChildren, check_levels, tree_children, tree_levels,
                                     with_length)
from specdec_jax.verification.tree_shapes import TreeShape
from specdec_jax.verification.tree_verify import TREE_VERIFIERS

Array = jax.Array
# A dynamic tree ranks its candidates by log path probability under the draft's logits
# divided by this. Below 1 the ranking trusts the draft's first choices more than its raw
# probabilities say: under rule 'topk' a node is accepted when its token is the one the
# target draws (at T = 0 its argmax), which the draft's sharpened law tracks better. The
# value was chosen on the held-out prompt set (scripts/tree_study.py; docs/results.md#trees).
SELECTION_TEMPERATURE = 0.5


def check_model_tree(shape, rule: str, vocab_size: int) -> None:
  """Raises ValueError naming the value if a model draft cannot draft this tree."""
  check_levels(shape)
  if rule not in TREE_VERIFIERS:
    raise ValueError(f"tree_rule must be one of {sorted(TREE_VERIFIERS)}, got {rule!r}")
  if shape.budget is not None and rule != "topk":
    raise ValueError(f"a dynamic tree (budget {shape.budget}) needs tree_rule 'topk' "
                     f"(choosing among i.i.d. draws by their probability would bias them), "
                     f"got rule {rule!r}")
  widest = shape.children_table().shape[1]
  if rule == "topk" and widest > vocab_size:
    raise ValueError(f"rule 'topk' needs at most vocab_size={vocab_size} children per "
                     f"position, the tree has {widest}")


def position_mask(shape: TreeShape) -> np.ndarray:
  """bool [N+1,N+1]: position r attends position c (0 = the root, seen by all)."""
  full = np.zeros((shape.num_nodes + 1, shape.num_nodes + 1), bool)
  full[:, 0] = True
  full[1:, 1:] = shape.ancestor_mask()
  return full


def slot_mask(visible: Array, length: Array, slots: int) -> Array:
  """visible bool [B,R,M+1] over the call's positions (the root at slot ℓ, position j at
  slot ℓ+j) -> bool [B,R,S]: those slots plus every slot < ℓ."""
  last = visible.shape[2] - 1
  rel = jnp.arange(slots)[None, :] - length[:, None]  # [B,S]
  at = jnp.broadcast_to(jnp.clip(rel, 0, last)[:, None, :], visible.shape[:2] + (slots,))
  tree = jnp.take_along_axis(visible, at, axis=2)  # [B,R,S]
  return (rel[:, None] < 0) | ((rel[:, None] <= last) & tree)


def tree_mask(shape: TreeShape, length: Array, slots: int, rows) -> Array:
  """bool [B,R,S]: query positions `rows` (0 = root) attend the slots < ℓ, the root's
  slot ℓ and their own ancestors' (and own) slots ℓ+1+j. length: ℓ int32 [B]."""
  full = position_mask(shape)
  return slot_mask(jnp.broadcast_to(jnp.asarray(full[np.asarray(rows)]),
                                    (length.shape[0], len(rows), full.shape[1])),
                   length, slots)


def select_nodes(shape: TreeShape, scores: Array) -> Array:
  """A dynamic tree's call nodes: int32 [B,N'] ascending, the N' = budget nodes of the
  largest draft log path probability scores [B,N] (ties: the lower index, so a parent,
  never less likely than its child, is chosen before it)."""
  return jnp.sort(jax.lax.top_k(scores, shape.budget)[1], axis=1).astype(jnp.int32)


def compact_path(cache: dict, length: Array, path: Array) -> dict:
  """Moves the path's K/V (node path[b, d-1] at slot ℓ+1+path) to slots ℓ+d, d = 1..D,
  every layer; slots past the path keep their entries. path int32 [B,D], -1 past n."""
  depth = path.shape[1]
  dest = length[:, None] + 1 + jnp.arange(depth)[None, :]  # [B,D]
  src = jnp.where(path >= 0, length[:, None] + 1 + path, dest)
  rows = jnp.arange(path.shape[0])[:, None]

  def move(x):  # [L,B,S,K,H]
    return x.at[:, rows, dest].set(x[:, rows, src])
  return {**cache, "k": move(cache["k"]), "v": move(cache["v"])}


def draft_levels(shape: TreeShape, rule: str, root_logits: Array, cache: dict, hiddens,
                 level_fn, *, keys: Array, length: Array, warp_fn, vocab_size: int,
                 greedy: bool, forced: tuple[Array, Array] | None = None):
  """The tree of a model draft whose root call gave root_logits [B,P0,V] and cache ->
  (nodes int32 [B,N], q_at float32 [B,N+1,V] (zeros at depth-D positions), cache, scores
  float32 [B,N] (a dynamic tree) or None).

  level_fn(x [B,n], positions [B,n], cache, mask [B,n,S], parents (static [n]), hiddens)
  -> (logits [B,n,V], cache, hiddens): one draft call over a level's nodes, for depths
  1..D-1; the depth-D nodes are drawn and never fed (as a chain never feeds x_d: the next
  step's first call writes an accepted one). hiddens is whatever the kind carries from
  level to level. forced: (nodes int32 [B,N], rows bool [B]) or None; on those rows the
  nodes are these instead of drawn (a hybrid's lookup tree), so the calls, and the cache,
  see the tree the row proposes.
  """
  rank = root_logits[:, :, :vocab_size]  # [B,P,V]: positions drafted so far
  q_at = warp_fn(root_logits)
  nodes, logq = [], []
  spans = tree_levels(shape)
  slots = cache["k"].shape[2]
  for depth, (start, end) in enumerate(spans, 1):
    x = tree_children(shape, rule, start, end, TreeChildren(q_at, rank), keys, greedy)
    if forced is not None:
      x = jnp.where(forced[1][:, None], forced[0][:, start:end], x)
    nodes.append(x)
    parents = shape.parent_positions()[start:end]
    if shape.budget is not None:  # log q(x | parent) of the unwarped draft, for the ranking
      parent_logits = rank[:, parents] / SELECTION_TEMPERATURE
      logq.append(jnp.take_along_axis(jax.nn.log_softmax(parent_logits, axis=-1),
                                      x[:, :, None], axis=2)[..., 0])
    if depth == len(spans):
      break
    mask = tree_mask(shape, length, slots, np.arange(start, end) + 1)
    positions = jnp.broadcast_to((length + depth)[:, None], x.shape)
    logits, cache, hiddens = level_fn(x, positions, with_length(cache, length + 1 + start),
                                      mask, parents, hiddens)
    rank = jnp.concatenate([rank, logits[..., :vocab_size]], axis=1)
    q_at = jnp.concatenate([q_at, warp_fn(logits)], axis=1)
  leaves = shape.num_nodes + 1 - q_at.shape[1]
  q_at = jnp.pad(q_at, ((0, 0), (0, leaves), (0, 0)))
  scores = None
  if shape.budget is not None:  # log path probabilities, parents before children
    logq = jnp.concatenate(logq, axis=1)  # [B,N]
    logq = jnp.where(jnp.isnan(logq), -jnp.inf, logq)
    scores = jnp.zeros((logq.shape[0], 1), logq.dtype)  # the root's, position 0
    for start, end in spans:
      scores = jnp.concatenate(
          [scores, scores[:, shape.parent_positions()[start:end]] + logq[:, start:end]], 1)
    scores = scores[:, 1:]
  return jnp.concatenate(nodes, axis=1), q_at, cache, scores
