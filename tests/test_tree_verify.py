"""Tree verification (`tree_verify`): exact laws by enumeration, and by sampling.

A tiny vocabulary (V = 3); the target p(. | prefix) and the draft q(. | prefix) are fixed
random conditional tables (T = 1) over the tokens emitted in this step. A step emits 1..D+1
tokens; the law of that sequence is computed (1) by an independent float64 reference
(`reference_law`: the rule as written in SpecInfer, Miao et al. ASPLOS 2024, and for
top-k candidates as in EAGLE-2, Li et al. 2024, summed over every draft outcome, children
i.i.d. from q) and (2) from the implementation's terms (`tree_verification_terms`) over
every enumerated tree weighted by its draft probability. Both must agree, and the law
"completed" by fresh draws from p up to D+1 tokens must be the target's law of D+1 tokens.
Enumerations have no false-failure rate (float tolerances only). Sampling tests are
chi-square tests failing below SIGNIFICANCE = 1e-3, so a correct implementation fails one
check with probability 1e-3 (stated per test); seeds are fixed, so runs are deterministic.
The negative control (no residual update after a rejection) must fail both kinds.
"""

import functools
import itertools

import jax
import numpy as np
import pytest

from helpers import SIGNIFICANCE, chi_square_pvalue
from specdec_jax.verification.tree_shapes import TreeShape
from specdec_jax.verification.tree_verify import TREE_VERIFIERS, tree_verification_terms, tree_verify
from specdec_jax.verification.verify import residual_distribution, verify

V = 3
ROWS = 20_000
SHAPES = [(2, 1), (3, 2)]
_verify = jax.jit(tree_verify, static_argnums=0, static_argnames=("rule", "residual_fn"))
_terms = jax.jit(tree_verification_terms, static_argnums=0,
                 static_argnames=("rule", "residual_fn"))


keep_p = lambda p, q: p  # noqa: E731  broken: no residual update after a rejection


# ------------------------------------------------------------------ model tables

def tables(seed, depth, zeros=False):
  """(p, q): lists of conditional tables, entry j of shape [V]*j + [V] (prefix -> law)."""
  rng = np.random.default_rng(seed)
  p = [rng.dirichlet(np.ones(V), (V,) * j) for j in range(depth + 1)]
  q = [rng.dirichlet(np.ones(V), (V,) * j) for j in range(depth + 1)]
  if zeros:  # a draft that never proposes the last token (q = 0 where p > 0)
    q = [t * (np.arange(V) < V - 1) / t[..., :-1].sum(-1, keepdims=True) for t in q]
  return p, q


def position_laws(shape, tokens, table):
  """float [B,N+1,V]: the table's law at every position of trees tokens [B,N]."""
  rows = [table[len(path)][tuple(tokens[:, list(path)].T)] for path in shape.paths()]
  return np.stack([np.broadcast_to(table[0], (len(tokens), V))] + rows, axis=1)


def enumerate_trees(shape, q):
  """All trees: tokens [V^N,N] and their draft probabilities [V^N]."""
  tokens = np.array(list(itertools.product(range(V), repeat=shape.num_nodes)), np.int32)
  parent = position_laws(shape, tokens, q)[:, shape.parent_positions()]  # [B,N,V]
  return tokens, np.prod(np.take_along_axis(parent, tokens[..., None], -1)[..., 0], axis=1)


def sample_trees(shape, q, rows, seed):
  """tokens [rows,N], every node drawn from q at its parent (numpy, seeded); seed None:
  one tree whose children are the draft's most likely tokens in rank order (top-k)."""
  rng = np.random.default_rng(seed)
  tokens = np.zeros((rows, shape.num_nodes), np.int32)
  for i, path in enumerate(shape.paths()):
    law = np.broadcast_to(q[len(path) - 1][tuple(tokens[:, list(path[:-1])].T)], (rows, V))
    if seed is None:
      tokens[:, i] = np.argsort(-law, axis=-1, kind="stable")[:, shape.child_rank[i]]
    else:
      tokens[:, i] = (rng.random((rows, 1)) > np.cumsum(law, -1)).sum(-1).clip(0, V - 1)
  return tokens


# ------------------------------------------------------------------ laws

def reference_law(shape, p, q, rule, tree=None, residual=True):
  """{emitted tuple: probability}, float64, written from the rule's description.

  tree None: every position's children drawn i.i.d. from q (all outcomes enumerated,
  subtrees independent given their root token); else the fixed tree tokens [N].
  """
  kids = shape.children()

  @functools.lru_cache(maxsize=None)
  def law(pos, prefix):
    pt, qt = p[len(prefix)][prefix], q[len(prefix)][prefix]
    out = {}

    def add(d, w):
      for k, m in d.items():
        out[k] = out.get(k, 0.0) + w * m

    if tree is None:
      combos = [(c, np.prod([qt[t] for t in c])) for c in
                itertools.product(range(V), repeat=len(kids[pos]))]
    else:
      combos = [(tuple(int(tree[i]) for i in kids[pos]), 1.0)]
    for combo, w in [(c, w) for c, w in combos if w > 0]:
      run, reach, taken = pt.copy(), 1.0, set()
      for node, t in zip(kids[pos], combo):
        if rule == "sampled":
          a = min(1.0, run[t] / qt[t])
          add(law(node + 1, prefix + (t,)), w * reach * a)
          reach *= 1.0 - a
          if residual:
            r = np.maximum(run - qt, 0.0)
            run = r / r.sum() if r.sum() > 0 else run
        elif t not in taken:  # topk: y ~ p lands on the first child holding y
          add(law(node + 1, prefix + (t,)), w * pt[t])
          taken.add(t)
      if rule == "topk":
        run = pt * ~np.isin(np.arange(V), list(taken))
        reach = run.sum()
        run = run / reach if reach > 0 else pt
      add({prefix + (y,): run[y] for y in range(V)}, w * reach)
    return out

  return law(0, ())


def implementation_law(shape, tokens, weights, p, q, rule, residual_fn=residual_distribution,
                       q_at=None):
  """{emitted tuple: probability} from the implementation's terms over trees [B,N]
  weighted by weights [B]; q_at [B,N+1,V] replaces the q handed to the verifier."""
  q_at = position_laws(shape, tokens, q) if q_at is None else q_at
  accept, stop, stop_law = (np.asarray(a, np.float64) for a in _terms(
      shape, tokens, q_at, position_laws(shape, tokens, p), rule=rule,
      residual_fn=residual_fn))
  assert np.isfinite(stop_law).all() and (accept >= 0).all() and (stop >= -1e-6).all()
  out = {}
  for pos in range(shape.num_nodes + 1):
    nodes = list(shape.paths()[pos - 1]) if pos else []
    mass = (weights * np.prod(accept[:, nodes], axis=1) * stop[:, pos])[:, None] * stop_law[:, pos]
    flat = np.zeros(V ** (len(nodes) + 1))
    index = (tokens[:, nodes] * V ** np.arange(len(nodes), 0, -1)).sum(1)[:, None] + np.arange(V)
    np.add.at(flat, index, mass)
    for i in np.flatnonzero(flat):
      seq = tuple(int(t) for t in np.unravel_index(i, (V,) * (len(nodes) + 1)))
      out[seq] = out.get(seq, 0.0) + flat[i]
  return out


def completed(law, p, depth):
  """[V]*(D+1): the emitted sequence, then fresh draws from p up to D+1 tokens."""
  joint = target_joint(p, depth)
  out = np.zeros_like(joint)
  for seq, m in law.items():
    out[seq] += m * joint[seq] / joint[seq].sum()
  return out


def target_joint(p, depth):
  """[V]*(D+1): the target's autoregressive law of D+1 tokens."""
  joint = p[0]
  for j in range(1, depth + 1):
    joint = joint[..., None] * p[j]
  return joint


def assert_same_law(a, b, atol):
  diff = max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))
  assert diff < atol, diff


def sequence_ids(tokens, n):
  """int [B]: an id per emitted sequence tokens[:n+1] (length-major, base V)."""
  offset = np.cumsum([0] + [V ** j for j in range(1, tokens.shape[1] + 1)])
  digits = np.where(np.arange(tokens.shape[1]) <= n[:, None], tokens, 0)
  value = (digits * V ** np.arange(tokens.shape[1] - 1, -1, -1)).sum(1) // V ** (
      tokens.shape[1] - 1 - n)
  return offset[n] + value


def law_vector(law, depth):
  """{emitted tuple: probability} -> [Σ_j V^j] indexed by `sequence_ids`."""
  vec = np.zeros(sum(V ** j for j in range(1, depth + 2)))
  for seq, m in law.items():
    padded = np.array([seq + (0,) * (depth + 1 - len(seq))])
    vec[sequence_ids(padded, np.array([len(seq) - 1]))] += m
  return vec


# ------------------------------------------------------------------ exact tests

CASES = [(b, rule, zeros) for b in SHAPES for rule in ("sampled", "topk")
         for zeros in (False, True)]


def assert_exact(shape, p, ref, impl):
  """impl = ref (float32 terms), and both complete to the target's law of D+1 tokens."""
  assert_same_law(impl, ref, 2e-6)
  target = target_joint(p, shape.max_depth)
  for law, atol in ((ref, 1e-12), (impl, 2e-6)):
    np.testing.assert_allclose(completed(law, p, shape.max_depth), target, atol=atol)


@pytest.mark.parametrize("branching,rule,zeros", CASES)
def test_law_matches_target_exact(branching, rule, zeros):
  """Over all draft trees (children i.i.d. from q; zeros: q = 0 on a token p allows), the
  reference and the implementation give one law, and it completes to the target's."""
  shape = TreeShape.from_branching(branching)
  p, q = tables(1, shape.max_depth, zeros)
  tokens, weights = enumerate_trees(shape, q)
  assert_exact(shape, p, reference_law(shape, p, q, rule),
               implementation_law(shape, tokens, weights, p, q, rule))


@pytest.mark.parametrize("branching", SHAPES)
def test_topk_deterministic_tree_exact(branching):
  """Children = the draft's top-k at every position (one fixed tree): still exact."""
  shape = TreeShape.from_branching(branching)
  p, q = tables(2, shape.max_depth)
  tree = sample_trees(shape, q, 1, seed=None)
  assert_exact(shape, p, reference_law(shape, p, q, "topk", tree=tree[0]),
               implementation_law(shape, tree, np.ones(1), p, q, "topk"))


@pytest.mark.parametrize("branching", SHAPES)
def test_negative_control_without_residual_exact(branching):
  """Keeping p after a rejection (no norm(max(p - q, 0))) changes the law measurably, in
  the reference and in the implementation alike."""
  shape = TreeShape.from_branching(branching)
  p, q = tables(1, shape.max_depth)
  target = target_joint(p, shape.max_depth)
  ref = completed(reference_law(shape, p, q, "sampled", residual=False), p, shape.max_depth)
  tokens, weights = enumerate_trees(shape, q)
  impl = completed(implementation_law(shape, tokens, weights, p, q, "sampled", keep_p), p,
                   shape.max_depth)
  np.testing.assert_allclose(impl, ref, atol=2e-6)
  assert 0.5 * np.abs(ref - target).sum() > 0.1  # TV: 0.24 for (2, 1), 0.30 for (3, 2)


# ------------------------------------------------------------------ sampling tests

def run_rows(shape, p, q, rule, tokens, seed, **kw):
  out = _verify(shape, tokens, position_laws(shape, tokens, q), position_laws(shape, tokens, p),
                jax.random.PRNGKey(seed), rule=rule, **kw)
  return tuple(np.asarray(a) for a in out)


@pytest.mark.parametrize("branching,rule", [(b, r) for b in SHAPES for r in TREE_VERIFIERS])
def test_monte_carlo_matches_exact_law(branching, rule):
  """ROWS rows, trees drawn from q, the jitted verifier: chi-square of the emitted
  sequences (length and tokens) against the exact law. One check: false-failure 1e-3."""
  shape = TreeShape.from_branching(branching)
  p, q = tables(1, shape.max_depth)
  tokens = sample_trees(shape, q, ROWS, seed=5)
  path, out, n = run_rows(shape, p, q, rule, tokens, seed=6)
  assert ((out >= 0) == (np.arange(shape.max_depth + 1) <= n[:, None])).all()
  accepted = np.where(path >= 0, np.take_along_axis(tokens, np.maximum(path, 0), 1), -1)
  assert (np.where(path >= 0, accepted, out[:, :-1]) == out[:, :-1]).all()
  exact = law_vector(reference_law(shape, p, q, rule), shape.max_depth)
  assert chi_square_pvalue(sequence_ids(out, n), exact) > SIGNIFICANCE


def test_monte_carlo_negative_control_fails():
  """The no-residual variant, sampled through the jitted verifier, emits sequences the
  exact law gives probability 0 (or fails the chi-square test at 1e-9); (3, 2)."""
  shape = TreeShape.from_branching((3, 2))
  p, q = tables(1, shape.max_depth)
  tokens = sample_trees(shape, q, ROWS, seed=5)
  _, out, n = run_rows(shape, p, q, "sampled", tokens, seed=6, residual_fn=keep_p)
  exact = law_vector(reference_law(shape, p, q, "sampled"), shape.max_depth)
  ids = sequence_ids(out, n)
  impossible = (exact[ids] == 0).sum()  # sequences the exact law never emits
  assert impossible > 100 or chi_square_pvalue(ids, exact) < 1e-9, impossible


def test_chain_law_equals_verify():
  """chain(3) with "sampled" is token-wise `verify` (Leviathan et al.): its exact law
  (terms over all chains = the reference) against `verify`'s samples on chains drawn
  from q. One chi-square check: false-failure 1e-3."""
  shape = TreeShape.chain(3)
  p, q = tables(3, 3)
  law = implementation_law(shape, *enumerate_trees(shape, q), p, q, "sampled")
  assert_same_law(law, reference_law(shape, p, q, "sampled"), 2e-6)
  exact = law_vector(law, 3)
  tokens = sample_trees(shape, q, ROWS, seed=7)
  p_at, q_at = position_laws(shape, tokens, p), position_laws(shape, tokens, q)
  out, n = (np.asarray(a) for a in verify(tokens, q_at[:, :3], p_at, jax.random.PRNGKey(8)))
  assert chi_square_pvalue(sequence_ids(out, n), exact) > SIGNIFICANCE


# ------------------------------------------------------------------ deterministic tests

@pytest.mark.parametrize("rule", list(TREE_VERIFIERS))
def test_greedy_follows_target_argmax(rule):
  """One-hot p: the emitted tokens are the target's argmax path and n is the depth of the
  deepest drafted prefix of it; on a chain, token for token `verify`'s output."""
  for shape in (TreeShape.from_branching((3, 2, 1)), TreeShape.chain(3)):
    p, q = tables(4, shape.max_depth)
    p = [np.eye(V)[t.argmax(-1)] for t in p]
    tokens = sample_trees(shape, q, 500, seed=9)
    path, out, n = run_rows(shape, p, q, rule, tokens, seed=10)
    for b in range(len(tokens)):
      pos, greedy, match = 0, [], [-1]
      while match:  # descend into the first child holding the argmax, if any
        pos = match[0] + 1
        greedy.append(int(p[len(greedy)][tuple(greedy)].argmax()))
        match = [i for i in shape.children()[pos] if tokens[b, i] == greedy[-1]]
      assert n[b] == len(greedy) - 1 and list(out[b, :n[b] + 1]) == greedy
      assert list(path[b, :n[b]]) == list(shape.paths()[pos - 1] if pos else ())
    if shape.num_nodes == shape.max_depth and rule == "sampled":
      p_at, q_at = position_laws(shape, tokens, p), position_laws(shape, tokens, q)
      ref, ref_n = (np.asarray(a) for a in verify(tokens, q_at[:, :-1], p_at,
                                                  jax.random.PRNGKey(0)))
      assert (ref_n == n).all()
      assert (np.where(np.arange(4) <= n[:, None], ref, -1) == out).all()


def test_batch_independence():
  """A row's output depends only on (key, row index, its inputs)."""
  shape = TreeShape.from_branching((3, 2))
  p, q = tables(1, 2)
  tokens = sample_trees(shape, q, 8, seed=11)
  for rule in TREE_VERIFIERS:
    full = run_rows(shape, p, q, rule, tokens, seed=12)
    head = run_rows(shape, p, q, rule, tokens[:3], seed=12)
    for a, b in zip(full, head):
      np.testing.assert_array_equal(a[:3], b)
    keys = jax.random.split(jax.random.PRNGKey(13), 8)
    other = np.concatenate([tokens[:1], sample_trees(shape, q, 7, seed=14)])
    outs = [_verify(shape, t, position_laws(shape, t, q), position_laws(shape, t, p), keys,
                    rule=rule) for t in (tokens, other)]
    for a, b in zip(*outs):
      np.testing.assert_array_equal(np.asarray(a)[0], np.asarray(b)[0])


def test_broken_draft_rows_are_not_proposed():
  """A NaN / unnormalised q row at a position: its children are never accepted and y ~ p
  there, so the law stays exact; a child with q(x) = 0 is never accepted."""
  shape = TreeShape.from_branching((2, 1))
  p, q = tables(1, 2)
  tokens, weights = enumerate_trees(shape, q)
  q_at, p_at = position_laws(shape, tokens, q), position_laws(shape, tokens, p)
  for bad in (np.nan, np.inf, 2.0):
    broken = q_at.copy()
    broken[:, 1, 0] = bad  # node 0's q row: its child (node 2) is not proposed
    accept, stop, stop_law = (np.asarray(a) for a in _terms(shape, tokens, broken, p_at))
    assert (accept[:, 2] == 0).all() and np.allclose(stop_law[:, 1], p_at[:, 1], atol=1e-6)
    path, _, _ = _verify(shape, tokens, broken, p_at, jax.random.PRNGKey(1))
    assert not (np.asarray(path) == 2).any()
    law = implementation_law(shape, tokens, weights, p, q, "sampled", q_at=broken)
    np.testing.assert_allclose(completed(law, p, 2), target_joint(p, 2), atol=2e-6)
  zero = q_at.copy()
  zero[:, 0] = np.eye(V)[0]  # q at the root is one-hot: children with token != 0 invalid
  accept = np.asarray(_terms(shape, tokens, zero, p_at)[0])
  assert (accept[:, :2][tokens[:, :2] != 0] == 0).all()


def test_tree_shapes():
  """Derived fields, helpers, equality and hashing (a static jit argument)."""
  s = TreeShape.from_branching((3, 2, 2, 1))
  assert (s.num_nodes, s.max_depth, s.depths[2:4], s.depths[-1]) == (33, 4, (1, 2), 4)
  assert s.child_rank[:9] == (0, 1, 2, 0, 1, 0, 1, 0, 1)
  assert TreeShape.chain(3) == TreeShape((-1, 0, 1)) == TreeShape([-1, 0, 1])
  assert hash(TreeShape.chain(3)) == hash(TreeShape((-1, 0, 1)))
  t = TreeShape.from_branching((2, 1))
  assert t.parents == (-1, -1, 0, 1) and t.paths() == ((0,), (1,), (0, 2), (1, 3))
  assert t.children() == ((0, 1), (2,), (3,), (), ())
  np.testing.assert_array_equal(t.ancestor_mask(), [[1, 0, 0, 0], [0, 1, 0, 0],
                                                    [1, 0, 1, 0], [0, 1, 0, 1]])
  np.testing.assert_array_equal(t.children_table(), [[0, 1], [2, -1], [3, -1], [-1, -1],
                                                     [-1, -1]])


@pytest.mark.parametrize("make,match", [
    (lambda: TreeShape(()), r"at least one"),
    (lambda: TreeShape((0,)), r"parents\[0\] = 0"),
    (lambda: TreeShape((-1, 2)), r"parents\[1\] = 2"),
    (lambda: TreeShape((-1, -2)), r"parents\[1\] = -2"),
    (lambda: TreeShape.from_branching((2, -1)), r"branching\[1\] = -1"),
    (lambda: TreeShape.from_branching(()), r"at least one level"),
    (lambda: TreeShape.chain(0), r"gamma = 0"),
])
def test_bad_shapes_raise(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_bad_verifier_inputs_raise():
  shape = TreeShape.from_branching((2, 1))
  tokens, q_at, p_at = np.zeros((2, 4), np.int32), np.ones((2, 5, V)) / V, np.ones((2, 5, V)) / V
  key = jax.random.PRNGKey(0)
  with pytest.raises(ValueError, match="'beam'"):
    tree_verify(shape, tokens, q_at, p_at, key, rule="beam")
  with pytest.raises(ValueError, match=r"\(2, 3\)"):
    tree_verify(shape, tokens[:, :3], q_at, p_at, key)
  with pytest.raises(ValueError, match=r"\(2, 5, 4\)"):
    tree_verify(shape, tokens, np.ones((2, 5, 4)) / 4, p_at, key)
  with pytest.raises(ValueError, match="q_at"):
    tree_verify(shape, tokens, None, p_at, key, rule="sampled")
  out = _verify(shape, tokens, None, p_at, key, rule="topk")  # topk never reads q
  assert out[1].shape == (2, 3)


SPARSE = TreeShape.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])  # unbalanced, depth 3


@pytest.mark.parametrize("rule", ["sampled", "topk"])
def test_sparse_tree_law_matches_target_exact(rule):
  """A sparse `from_paths` tree (children only below rank-0 nodes): the same exact
  enumeration as `test_law_matches_target_exact`."""
  p, q = tables(3, SPARSE.max_depth)
  tokens, weights = enumerate_trees(SPARSE, q)
  assert_exact(SPARSE, p, reference_law(SPARSE, p, q, rule),
               implementation_law(SPARSE, tokens, weights, p, q, rule))
