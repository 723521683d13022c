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

Sparse trees (Medusa's and EAGLE's default trees) are `from_paths`: each node named by
its rank path, the child ranks from the root down ("0" = the draft's first choice at
depth 1, "01" = its second choice below that). `best_first` builds the N-node tree that
maximizes the expected tokens per target call under a table a[d, r] of acceptance
rates per depth and child rank (measured by `scripts/tree_study.py --rank_table`), and
`expected_tokens` gives that model's figure for any shape. `parse_tree` reads both
notations from a config string.

A *dynamic* tree (EAGLE-2, Li et al. 2024) is a shape with a node `budget` N' < N: the N
nodes are drafted as candidates, and each row sends only the N' of the largest draft path
probability to the target (`decoding.tree_step`), so the tree's form follows the draft's
confidence step by step ('dynamic:6:3x2x1' in a config: 6 of the 9 nodes of a 3x2x1 tree;
scripts/tree_study.py also takes 'dynamic:15:best:48', a 48-node best-first candidate tree).
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
  budget: None for a static tree; else N' in 1..N, a dynamic tree's node budget: each step
    a row sends the N' candidate nodes of the largest draft path probability to the
    target (`decoding.tree_step`), so `call_nodes` = N'.
  Derived (not part of equality or the hash): depths [N] (1 = child of the root),
  child_rank [N] (0-based rank among siblings, in node order), num_nodes = N,
  max_depth = D.
  """

  parents: tuple
  budget: int | None = None
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
    if self.budget is not None:
      budget = _check_int("tree budget", self.budget, 1)
      if budget > len(parents):
        raise ValueError(f"tree budget = {budget} must be at most the {len(parents)} "
                         f"candidate nodes it is chosen from")
      object.__setattr__(self, "budget", budget)
    object.__setattr__(self, "depths", tuple(depths))
    object.__setattr__(self, "child_rank", tuple(rank))

  @property
  def num_nodes(self) -> int:
    """N, the number of drafted nodes (the root not counted)."""
    return len(self.parents)

  @property
  def call_nodes(self) -> int:
    """The drafted nodes of one target call: the budget of a dynamic tree, else N."""
    return self.num_nodes if self.budget is None else self.budget

  def with_budget(self, budget: int | None) -> "TreeShape":
    """The same candidate nodes as a dynamic tree of node budget `budget` (None: static)."""
    return dataclasses.replace(self, budget=budget)

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
  def from_paths(cls, paths) -> "TreeShape":
    """Nodes named by rank paths: tuples of child ranks from the root down.

    Every proper prefix of a path must be a path too, and the ranks of each node's
    children must be 0..k-1. Nodes are numbered level by level, siblings in rank order,
    so `from_paths` of every path of a full tree equals `from_branching`.
    """
    if isinstance(paths, (str, bytes)) or not hasattr(paths, "__iter__"):
      raise ValueError(f"paths must be a sequence of rank tuples, got {paths!r}")
    seen = set()
    for path in paths:
      if isinstance(path, (str, bytes)) or not hasattr(path, "__len__") or not path:
        raise ValueError(f"a path must be a non-empty tuple of child ranks, got {path!r}")
      path = tuple(_check_int("a child rank", r, 0) for r in path)
      if path in seen:
        raise ValueError(f"path {path} is listed twice")
      seen.add(path)
    if not seen:
      raise ValueError(f"a tree needs at least one drafted node, got paths = {paths!r}")
    for path in seen:
      if len(path) > 1 and path[:-1] not in seen:
        raise ValueError(f"path {path} has no parent: {path[:-1]} is missing")
      if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in seen:
        raise ValueError(f"path {path} skips a rank: {path[:-1] + (path[-1] - 1,)} is "
                         "missing (a node's children take ranks 0..k-1)")
    order = sorted(seen, key=lambda t: (len(t), t))
    index = {path: i for i, path in enumerate(order)}
    return cls(tuple(index[t[:-1]] if len(t) > 1 else -1 for t in order))

  def rank_paths(self) -> tuple:
    """Per node i: its rank path, the child ranks from the root down (`from_paths`)."""
    out = []
    for p, r in zip(self.parents, self.child_rank):
      out.append((out[p] if p >= 0 else ()) + (r,))
    return tuple(out)

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


def _rates(accept: np.ndarray, depth: int, rank: int) -> np.ndarray:
  """a[:, depth, rank] over the P tables (depth 1-based; depths past a table use its last
  row; ranks past it are 0) -> [P]."""
  row = accept[:, min(depth, accept.shape[1]) - 1]
  return row[:, rank] if rank < row.shape[1] else np.zeros(accept.shape[0])


def _check_accept(accept) -> np.ndarray:
  """[D', K] or [P, D', K] rates -> float64 [P, D', K]."""
  table = np.asarray(accept, np.float64)
  if table.ndim == 2:
    table = table[None]
  if table.ndim != 3 or table.size == 0 or not np.isfinite(table).all() \
      or (table < 0).any() or (table.sum(-1) > 1 + 1e-9).any():
    raise ValueError("accept must be a non-empty [D, K] (or [P, D, K]) table of rates >= 0 "
                     f"whose rows sum to at most 1, got {np.asarray(accept).tolist()!r}")
  return table


def _path_probs(table: np.ndarray, path) -> np.ndarray:
  """[P]: Π_d a_p[d, r_d] along a rank path, per table p."""
  prob = np.ones(table.shape[0])
  for depth, rank in enumerate(path, 1):
    prob = prob * _rates(table, depth, rank)
  return prob


def expected_tokens(shape: TreeShape, accept) -> float:
  """Tokens per target call the rank model predicts: 1 + Σ_nodes mean_p Π_path a_p[d, r].

  accept: [D', K] rates, a[d-1, r] = P(the target's token is the draft's rank-r choice at
  depth d | the path down to its parent was accepted), greedy (T = 0) with rule 'topk';
  or [P, D', K], P such tables (e.g. one per prompt) averaged with equal weight, a
  mixture that keeps the correlation between depths that one pooled table loses. Within
  a table each level's rate is taken as independent of the ranks above it.
  """
  table = _check_accept(accept)
  return 1.0 + float(sum(_path_probs(table, path).mean() for path in shape.rank_paths()))


def best_first(accept, num_nodes: int, max_depth: int = 16) -> TreeShape:
  """A `num_nodes`-node tree of large `expected_tokens` under accept ([D', K] or
  [P, D', K]).

  Adds, one at a time, the candidate node of the highest mean path probability: a first
  child of a chosen node (or of the root) or the next-ranked sibling of one. With one
  table whose rates fall with rank (each at most 1), every prefix and lower-ranked
  sibling of a chosen path is at least as likely, so the greedy set is optimal (Medusa
  and EAGLE choose their static trees this way).
  """
  table = _check_accept(accept)
  num_nodes = _check_int("num_nodes", num_nodes, 1)
  max_depth = _check_int("max_depth", max_depth, 1)
  chosen, frontier = [], {(0,): _rates(table, 1, 0)}
  while len(chosen) < num_nodes and frontier:
    path = max(frontier, key=lambda t: (frontier[t].mean(), -len(t)))
    prob = frontier.pop(path)
    chosen.append(path)
    if len(path) < max_depth:
      frontier[path + (0,)] = prob * _rates(table, len(path) + 1, 0)
    frontier[path[:-1] + (path[-1] + 1,)] = _path_probs(table, path[:-1] + (path[-1] + 1,))
  return TreeShape.from_paths(chosen)


def parse_tree(text: str) -> TreeShape | None:
  """A config string -> TreeShape; '' -> None (a chain).

  '3,2,1' or '3x2x1': `from_branching`. 'paths:0,1,00,000': `from_paths`, each path a
  string of child ranks 0..9 from the root down. 'dynamic:N\':<either>': those candidate
  nodes as a dynamic tree of node budget N' (`TreeShape.budget`).
  """
  text = str(text).strip()
  if not text:
    return None
  if text.startswith("dynamic:"):
    budget, _, rest = text[len("dynamic:"):].partition(":")
    if not budget.strip().isdigit() or not rest.strip():
      raise ValueError(f"a dynamic tree is 'dynamic:<node budget>:<candidate tree>', e.g. "
                       f"'dynamic:6:3x2x1', got {text!r}")
    return parse_tree(rest).with_budget(int(budget))
  if text.startswith("paths:"):
    items = [t.strip() for t in text[len("paths:"):].split(",")]
    if not all(t.isdigit() for t in items):
      raise ValueError(f"tree paths must be digit strings of child ranks, e.g. "
                       f"'paths:0,1,00', got {text!r}")
    return TreeShape.from_paths([tuple(int(c) for c in t) for t in items])
  try:
    branching = tuple(int(b) for b in text.replace("x", ",").split(","))
  except ValueError:
    raise ValueError(f"tree must be branching per depth ('3,2,1' or '3x2x1') or rank paths "
                     f"('paths:0,1,00'), got {text!r}") from None
  return TreeShape.from_branching(branching)


def paths_string(shape: TreeShape) -> str:
  """The 'paths:...' notation of `parse_tree` for a shape (ranks must be <= 9)."""
  paths = shape.rank_paths()
  if max(max(p) for p in paths) > 9:
    raise ValueError("paths_string needs child ranks <= 9")
  return "paths:" + ",".join("".join(str(r) for r in p) for p in paths)
