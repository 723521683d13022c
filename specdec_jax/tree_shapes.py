"""Static shapes of token trees for multi-candidate verification.

Letters: N drafted nodes, D = max depth (the longest root-to-leaf path), K = the most
children any position has.

A tree step drafts N tokens arranged as a tree below the *root*, the pending token
whose successors are being drafted. The root is implicit: it is not a node, its index
is -1 in `parents`. Two numberings are used:
  node i      0..N-1, the drafted tokens, parents listed before children;
  position    0..N,   0 = the root, i + 1 = node i (the rows of the per-position draft
              and target distributions q_at / p_at of `tree_verify`).
A node's depth is 1 for the root's children, so a path of accepted nodes is at most D
long and a step emits at most D + 1 tokens.

`TreeShape` is a frozen, hashable dataclass (a static argument under jit). Shapes used
by SpecInfer (Miao et al., ASPLOS 2024) and the static trees of EAGLE (Li et al. 2024)
are `from_branching`: every node at depth d has b_d children; EAGLE-2's dynamic trees
(Li et al. 2024) fit a fixed node budget with a per-row `node_mask` in `tree_verify`.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np


def _check_int(name: str, value, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ValueError(f"{name} = {value!r} must be an int >= {minimum}")
  return int(value)


@dataclasses.dataclass(frozen=True)
class TreeShape:
  """A static tree of N drafted nodes below an implicit root.

  parents: tuple of N ints; parents[i] = -1 for a child of the root, else an earlier
    node index (0 <= parents[i] < i), so parents come before their children.
  Derived (not part of equality or the hash): depths [N] (1 = child of the root),
  child_rank [N] (0-based rank among siblings, in node order), num_nodes = N,
  max_depth = D.
  """

  parents: tuple
  depths: tuple = dataclasses.field(init=False, repr=False, compare=False)
  child_rank: tuple = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self):
    parents = self.parents
    if isinstance(parents, (str, bytes)) or not hasattr(parents, "__len__"):
      raise ValueError(f"parents must be a sequence of ints, got {parents!r}")
    parents = tuple(parents)
    if not parents:
      raise ValueError(f"a tree needs at least one drafted node, got parents = {parents!r}")
    depths, rank, seen = [], [], {}
    for i, p in enumerate(parents):
      if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not -1 <= p < i:
        raise ValueError(f"parents[{i}] = {p!r} must be -1 (the root) or an earlier node "
                         f"index in [0, {i})")
      p = int(p)
      depths.append(1 if p < 0 else depths[p] + 1)
      rank.append(seen.get(p, 0))
      seen[p] = rank[-1] + 1
    object.__setattr__(self, "parents", tuple(int(p) for p in parents))
    object.__setattr__(self, "depths", tuple(depths))
    object.__setattr__(self, "child_rank", tuple(rank))

  @property
  def num_nodes(self) -> int:
    """N, the number of drafted nodes (the root not counted)."""
    return len(self.parents)

  @property
  def max_depth(self) -> int:
    """D, the depth of the deepest node: at most D drafts accepted per step."""
    return max(self.depths)

  @classmethod
  def from_branching(cls, branching) -> "TreeShape":
    """Every position at depth d (the root is depth 0) has branching[d] children.

    Nodes are numbered level by level, siblings contiguous: (3, 2) gives 3 + 6 nodes.
    """
    if isinstance(branching, (str, bytes)) or not hasattr(branching, "__len__"):
      raise ValueError(f"branching must be a sequence of ints >= 1, got {branching!r}")
    if len(branching) == 0:
      raise ValueError(f"branching must name at least one level, got {tuple(branching)!r}")
    widths = [_check_int(f"branching[{d}]", b, 1) for d, b in enumerate(branching)]
    parents, level = [], [-1]
    for width in widths:
      next_level = []
      for p in level:
        for _ in range(width):
          next_level.append(len(parents))
          parents.append(p)
      level = next_level
    return cls(tuple(parents))

  @classmethod
  def chain(cls, gamma: int) -> "TreeShape":
    """γ nodes in a line (branching 1 everywhere): the token-wise `verify` case."""
    gamma = _check_int("gamma", gamma, 1)
    return cls(tuple(range(-1, gamma - 1)))

  def children(self) -> tuple:
    """Per position (0 = root, i + 1 = node i): the tuple of its child node indices."""
    kids = [[] for _ in range(self.num_nodes + 1)]
    for i, p in enumerate(self.parents):
      kids[p + 1].append(i)
    return tuple(tuple(k) for k in kids)

  @functools.cached_property
  def _children_table(self) -> np.ndarray:
    kids = self.children()
    width = max(len(k) for k in kids)
    table = np.full((self.num_nodes + 1, width), -1, np.int32)
    for pos, k in enumerate(kids):
      table[pos, :len(k)] = k
    table.setflags(write=False)
    return table

  def children_table(self) -> np.ndarray:
    """int32 [N+1, K]: per position its child node indices in rank order, -1 padded."""
    return self._children_table

  def paths(self) -> tuple:
    """Per node i: the node indices from the root's child down to i (length depths[i])."""
    out = []
    for p in self.parents:
      out.append((out[p] if p >= 0 else ()) + (len(out),))
    return tuple(out)

  def ancestor_mask(self) -> np.ndarray:
    """bool [N, N]: mask[i, j] iff node j is node i itself or one of its ancestors
    (the tree-attention mask over the drafted nodes; the prefix is visible to all)."""
    mask = np.zeros((self.num_nodes, self.num_nodes), bool)
    for i, path in enumerate(self.paths()):
      mask[i, list(path)] = True
    return mask

  def parent_positions(self) -> np.ndarray:
    """int32 [N]: the position of each node's parent (0 = root), i.e. parents + 1."""
    return np.asarray(self.parents, np.int32) + 1
