"""Sparse tree shapes (`tree_shapes.from_paths`, `best_first`, `expected_tokens`,
`parse_tree`): pure functions of small tables, checked against brute force."""

import itertools

import numpy as np
import pytest

from specdec_jax.verification.tree_shapes import (TreeShape, best_first, expected_tokens, parse_tree,
                                     paths_string)

# a[d-1, r]: acceptance by depth and child rank, falling with rank (a measured table's form)
ACCEPT = np.array([[0.42, 0.13, 0.06, 0.04], [0.45, 0.12, 0.07, 0.03], [0.5, 0.1, 0.05, 0.0]])


def all_paths(branching):
  return [t for depth in range(1, len(branching) + 1)
          for t in itertools.product(*[range(b) for b in branching[:depth]])]


@pytest.mark.parametrize("branching", [(1,), (2, 1), (3, 2), (2, 2, 1)])
def test_paths_of_a_full_tree_equal_from_branching(branching):
  full = TreeShape.from_branching(branching)
  assert TreeShape.from_paths(all_paths(branching)) == full
  assert TreeShape.from_paths(reversed(all_paths(branching))) == full  # any listing order
  assert TreeShape.from_paths(full.rank_paths()) == full
  assert parse_tree(paths_string(full)) == full == parse_tree("x".join(map(str, branching)))


def test_sparse_tree_numbering_and_text():
  s = parse_tree("paths:0,1,00,01,000")
  assert s.parents == (-1, -1, 0, 0, 2) and s.depths == (1, 1, 2, 2, 3)
  assert s.child_rank == (0, 1, 0, 1, 0)
  assert paths_string(s) == "paths:0,1,00,01,000"
  assert parse_tree("  ") is None and parse_tree("3,2") == TreeShape.from_branching((3, 2))


def brute_expected(shape, accept):
  total = 1.0
  for path in shape.rank_paths():
    prob = 1.0
    for depth, rank in enumerate(path, 1):
      row = accept[min(depth, len(accept)) - 1]
      prob *= row[rank] if rank < len(row) else 0.0
    total += prob
  return total


def test_expected_tokens_of_a_chain_is_the_geometric_sum():
  a = np.array([[0.6, 0.2]])
  assert expected_tokens(TreeShape.chain(3), a) == pytest.approx(1 + 0.6 + 0.36 + 0.216)
  for shape in (TreeShape.from_branching((3, 2)), parse_tree("paths:0,1,2,00,000,0000")):
    assert expected_tokens(shape, ACCEPT) == pytest.approx(brute_expected(shape, ACCEPT))


@pytest.mark.parametrize("num_nodes", [1, 2, 4, 6, 8])
def test_best_first_is_the_best_tree_of_its_size(num_nodes):
  """Against every prefix-closed, rank-contiguous tree of that many nodes (depth <= 4,
  ranks < 4): none predicts more tokens per call."""
  best = best_first(ACCEPT, num_nodes)
  assert best.num_nodes == num_nodes
  candidates = [t for t in all_paths((4, 4, 4, 4)) if len(t) <= 4]
  top = 0.0
  for subset in _closed_subsets(candidates, num_nodes):
    top = max(top, brute_expected(TreeShape.from_paths(subset), ACCEPT))
  assert expected_tokens(best, ACCEPT) == pytest.approx(top)


def _closed_subsets(candidates, size):
  """Prefix-closed, rank-contiguous sets of `size` paths, grown one node at a time."""
  frontier = {frozenset()}
  for _ in range(size):
    grown = set()
    for s in frontier:
      for t in candidates:
        if t in s:
          continue
        parent_ok = len(t) == 1 or t[:-1] in s
        rank_ok = t[-1] == 0 or t[:-1] + (t[-1] - 1,) in s
        if parent_ok and rank_ok:
          grown.add(s | {t})
    frontier = grown
  return [sorted(s) for s in frontier]


def test_best_first_with_no_second_choices_is_a_chain():
  assert best_first(np.array([[0.7, 0.0]]), 4) == TreeShape.chain(4)
  assert best_first(np.array([[0.7, 0.0]]), 3, max_depth=2) == parse_tree("paths:0,1,00")


@pytest.mark.parametrize("make,match", [
    (lambda: TreeShape.from_paths([]), "at least one"),
    (lambda: TreeShape.from_paths("01"), "sequence of rank tuples"),
    (lambda: TreeShape.from_paths([(0,), (0, 0), (0, 0)]), r"\(0, 0\) is listed twice"),
    (lambda: TreeShape.from_paths([(0,), (1, 0)]), r"\(1,\) is missing"),
    (lambda: TreeShape.from_paths([(0,), (2,)]), r"skips a rank: \(1,\) is missing"),
    (lambda: TreeShape.from_paths([(0,), (-1,)]), "-1"),
    (lambda: TreeShape.from_paths([()]), "non-empty"),
    (lambda: parse_tree("paths:0,a"), "'paths:0,a'"),
    (lambda: parse_tree("3;2"), "'3;2'"),
    (lambda: best_first([[0.7, 0.6]], 3), "sum"),
    (lambda: best_first([[np.nan]], 3), "nan"),
    (lambda: best_first([[0.5]], 0), "num_nodes = 0"),
    (lambda: expected_tokens(TreeShape.chain(2), [0.5]), "table"),
    (lambda: TreeShape.chain(3).with_budget(4), "budget = 4 must be at most the 3"),
    (lambda: TreeShape.chain(3).with_budget(0), "budget = 0"),
    (lambda: parse_tree("dynamic:x:3x2"), "'dynamic:x:3x2'"),
    (lambda: parse_tree("dynamic:4"), "'dynamic:4'"),
])
def test_bad_input_raises(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_a_mixture_of_tables_averages_their_predictions():
  """[P, D, K]: the mean of the P tables' figures; best-first then serves both kinds of
  text: a deep spine for a predictable table and wide first levels for a hard one."""
  easy = np.array([[0.8, 0.0, 0.0]])
  hard = np.array([[0.3, 0.25, 0.2]])
  mix = np.stack([easy, hard])
  for shape in (TreeShape.chain(4), TreeShape.from_branching((3, 1))):
    assert expected_tokens(shape, mix) == pytest.approx(
        (expected_tokens(shape, easy) + expected_tokens(shape, hard)) / 2)
  best = best_first(mix, 8)
  assert best.max_depth >= 4 and len(best.children()[0]) >= 2, paths_string(best)
  assert expected_tokens(best, mix) > max(expected_tokens(best_first(easy, 8), mix),
                                          expected_tokens(best_first(hard, 8), mix))


def test_dynamic_tree_is_its_candidates_with_a_budget():
  shape = parse_tree("dynamic:4:3x2")
  assert shape == TreeShape.from_branching((3, 2)).with_budget(4)
  assert (shape.num_nodes, shape.call_nodes, shape.max_depth) == (9, 4, 2)
  assert shape != TreeShape.from_branching((3, 2))  # static and dynamic compile apart
  assert shape.with_budget(None).call_nodes == 9
  assert parse_tree("dynamic:2:paths:0,1,00").parents == (-1, -1, 0)
