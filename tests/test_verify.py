"""`verify` preserves the target distribution: by computation and by sampling.

Every sampling test is a chi-square goodness-of-fit test that fails when its
p-value is below SIGNIFICANCE = 1e-3: a correct implementation would fail it for
a random seed with probability 1e-3 per test. Seeds are fixed, so each test is
deterministic. The naive "correct from p" variant (negative control) must fail
the same test, with a p-value far below the threshold.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import (SIGNIFICANCE, assert_greedy_equals_autoregressive, chi_square_pvalue,
                     law_pair, speculative)
from specdec_jax import SamplingConfig
from specdec_jax.models.sampling import warp
from specdec_jax.verification.verify import (acceptance_probability, block_verify, greedy_verify,
                                residual_distribution, verify)

P = np.array([0.2, 0.5, 0.3], np.float32)
Q = np.array([0.6, 0.3, 0.1], np.float32)


def naive_verify(*args):
  """The broken variant: correction drawn from p instead of norm(max(0, p - q))."""
  return verify(*args, residual_fn=lambda p, q: p)


def run_verify(p_rows, q_rows, n, seed, verifier=verify):
  """Draws n rows of drafts from q ([G,V]) and verifies them against p ([G+1,V])."""
  g = q_rows.shape[0]
  key_draft, key_verify = jax.random.split(jax.random.PRNGKey(seed))
  q = jnp.broadcast_to(jnp.asarray(q_rows), (n,) + q_rows.shape)
  p = jnp.broadcast_to(jnp.asarray(p_rows), (n,) + p_rows.shape)
  drafts = jax.random.categorical(key_draft, jnp.log(q), axis=-1)  # [n,G]
  tokens, accepted = jax.jit(verifier)(drafts, q, p, key_verify)
  assert tokens.shape == (n, g + 1) and accepted.shape == (n,)
  return np.asarray(tokens), np.asarray(accepted)


# ------------------------------------ the worked example (docs/background.md#worked-example)

def test_worked_example_by_computation():
  p, q = jnp.asarray(P), jnp.asarray(Q)
  accepted_mass = jnp.minimum(p, q)
  np.testing.assert_allclose(accepted_mass, [0.2, 0.3, 0.1], atol=1e-7)
  np.testing.assert_allclose(acceptance_probability(q[None, None], p[None, None]), [[0.6]],
                             atol=1e-6)
  residual = residual_distribution(p, q)
  np.testing.assert_allclose(residual, [0.0, 0.5, 0.5], atol=1e-6)
  output = accepted_mass + (1 - accepted_mass.sum()) * residual
  np.testing.assert_allclose(output, P, atol=1e-6)
  naive = accepted_mass + (1 - accepted_mass.sum()) * p
  np.testing.assert_allclose(naive, [0.28, 0.50, 0.22], atol=1e-6)


def test_worked_example_by_sampling():
  bonus = np.full(3, 1 / 3, np.float32)
  tokens, _ = run_verify(np.stack([P, bonus]), Q[None], 200_000, seed=0)
  assert chi_square_pvalue(tokens[:, 0], P) > SIGNIFICANCE


def test_negative_control_naive_correction_fails():
  bonus = np.full(3, 1 / 3, np.float32)
  tokens, _ = run_verify(np.stack([P, bonus]), Q[None], 200_000, seed=0, verifier=naive_verify)
  freq = np.bincount(tokens[:, 0], minlength=3) / len(tokens)
  np.testing.assert_allclose(freq, [0.28, 0.50, 0.22], atol=0.005)
  assert chi_square_pvalue(tokens[:, 0], P) < 1e-12


# --------------------------------------------------------------- random p and q

def _random_dists(key, g, v, kind):
  kp, kq = jax.random.split(key)
  p_logits = 2.0 * jax.random.normal(kp, (g + 1, v))
  q_logits = 2.0 * jax.random.normal(kq, (g, v))
  if kind == "random":
    return warp(p_logits), warp(q_logits)
  if kind == "equal":
    p = warp(p_logits)
    return p, p[:g]
  if kind == "near_equal":
    p = warp(p_logits)
    return p, warp(p_logits[:g] + 1e-6 * q_logits)
  if kind == "disjoint":
    half = v // 2
    p = warp(p_logits.at[:, half:].set(-jnp.inf))
    q = warp(q_logits.at[:, :half].set(-jnp.inf))
    return p, q
  if kind == "top_k":
    return warp(p_logits, top_k=3), warp(q_logits, top_k=3)
  if kind == "top_p":
    return warp(p_logits, top_p=0.8), warp(q_logits, top_p=0.8)
  raise ValueError(kind)


CASES = [(kind, g) for kind in ("random", "disjoint", "equal", "near_equal", "top_k", "top_p")
         for g in (1, 4, 8)]


@pytest.mark.parametrize("kind,gamma", CASES)
def test_every_emitted_position_is_distributed_as_p(kind, gamma):
  """tokens[:, i] for rows that emitted position i (n >= i) is distributed as p_{i+1}."""
  v, n = 6, 60_000
  p, q = _random_dists(jax.random.PRNGKey(gamma * 7 + len(kind)), gamma, v, kind)
  p, q = np.asarray(p), np.asarray(q)
  tokens, accepted = run_verify(p, q, n, seed=gamma)
  if kind == "equal":
    assert (accepted == gamma).all()
  if kind == "disjoint":
    assert (accepted == 0).all()
  for i in range(gamma + 1):
    emitted = accepted >= i
    if emitted.sum() < 2_000:  # too few samples for a meaningful test of a late position
      continue
    pvalue = chi_square_pvalue(tokens[emitted, i], p[i])
    assert pvalue > SIGNIFICANCE, (i, pvalue)


def test_acceptance_count_matches_leading_run():
  """num_accepted equals the leading run of u*q(x) < p(x) for a constructed case."""
  q = jnp.asarray([[[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]])
  p = jnp.asarray([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.3, 0.7]]])
  drafts = jnp.asarray([[0, 1, 1]])  # p(x) = 1, 1, 0: accept, accept, reject
  tokens, accepted = verify(drafts, q, p, jax.random.PRNGKey(0))
  assert int(accepted[0]) == 2
  assert tokens[0, :2].tolist() == [0, 1]
  assert int(tokens[0, 2]) == 0  # residual of p=[1,0], q=[.5,.5] is [1, 0]


def test_per_row_keys_are_used_independently():
  """Row b with key k_b gives the same result alone or inside a batch."""
  p, q = (np.asarray(x) for x in _random_dists(jax.random.PRNGKey(3), 4, 6, "random"))
  drafts = jnp.asarray([[0, 1, 2, 3]] * 5)
  keys = jax.random.split(jax.random.PRNGKey(9), 5)
  qb = jnp.broadcast_to(q, (5,) + q.shape)
  pb = jnp.broadcast_to(p, (5,) + p.shape)
  tokens, accepted = verify(drafts, qb, pb, keys)
  for b in range(5):
    t1, a1 = verify(drafts[b:b + 1], qb[:1], pb[:1], keys[b:b + 1])
    assert int(a1[0]) == int(accepted[b])
    assert t1[0].tolist() == tokens[b].tolist()


@pytest.mark.parametrize("bad,match", [
    (dict(draft_tokens=np.zeros((2, 3), np.float32)), "draft_tokens"),
    (dict(draft_tokens=np.zeros((2, 0), np.int32), draft_probs=np.zeros((2, 0, 4))), "gamma"),
    (dict(draft_probs=np.zeros((2, 3, 5))), "target_probs"),
    (dict(target_probs=np.zeros((2, 3, 4))), "target_probs"),
    (dict(key=jax.random.split(jax.random.PRNGKey(0), 3)), "key"),
])
@pytest.mark.parametrize("verifier", [verify, block_verify])
def test_verifiers_reject_bad_shapes(bad, match, verifier):
  args = dict(draft_tokens=np.zeros((2, 3), np.int32), draft_probs=np.full((2, 3, 4), 0.25),
              target_probs=np.full((2, 4, 4), 0.25), key=jax.random.PRNGKey(0))
  args.update(bad)
  with pytest.raises(ValueError, match=match):
    verifier(**args)


def test_residual_underflow_falls_back_to_p():
  p = jnp.asarray([0.25, 0.75])
  np.testing.assert_array_equal(residual_distribution(p, p), p)


@pytest.mark.parametrize("verifier", [verify, pytest.param(block_verify, marks=pytest.mark.slow)])
def test_the_step_calls_the_specs_verifier_at_t1_and_greedy_verify_at_t0(verifier):
  """At T = 1 the verifier given as a function is the one the step calls: the same
  function under another name gives the named verifier's tokens, and the naive residual
  other ones. At T = 0 the step verifies with `greedy_verify` and never calls it (a
  verifier that raises when called still gives greedy decoding's tokens)."""
  pair = law_pair()
  prompts = [[1, 3, 0]] * 16
  def run(verifier):
    return speculative(pair, prompts, gamma=3, max_new_tokens=4, seed=3, verifier=verifier,
                       sampling=SamplingConfig(temperature=1.0)).tokens
  named = run("token" if verifier is verify else "block")
  np.testing.assert_array_equal(run(lambda *a, **k: verifier(*a, **k)), named)
  naive = functools.partial(verifier, residual_fn=lambda p, q, *w: p)
  assert (run(naive) != named).any()

  def never(*args, **kwargs):
    raise AssertionError("the spec's verifier was called at T = 0")
  assert_greedy_equals_autoregressive(pair, prompts[:2], max_new_tokens=4, verifier=never)


# --------------------------------------------------------------- greedy (temperature 0)

def test_greedy_verify_equals_both_verifiers_on_one_hot_targets():
  """One-hot p (T=0): `greedy_verify` emits the tokens of `verify` and `block_verify`,
  with greedy (one-hot) and sampled (soft) drafts, broken q rows, out-of-range tokens
  and per-row num_proposed."""
  rng = np.random.default_rng(0)
  b, g, v = 64, 4, 5
  p = jax.nn.one_hot(rng.integers(0, v, (b, g + 1)), v)
  best = np.asarray(jnp.argmax(p, -1))
  # drafts that often match the target's argmax, so long accepted runs occur
  drafts = np.where(rng.random((b, g)) < 0.7, best[:, :g], rng.integers(0, v, (b, g)))
  soft = rng.dirichlet(np.ones(v), (b, g)).astype(np.float32)
  soft[np.arange(b)[:, None], np.arange(g)[None, :], drafts] += 0.5
  soft /= soft.sum(-1, keepdims=True)
  one_hot = np.asarray(jax.nn.one_hot(drafts, v))
  broken = soft.copy()
  broken[::7, 2] = np.nan  # a NaN row cuts the proposals there
  drafts_bad = drafts.copy()
  drafts_bad[::5, 1] = v + 3  # out of the vocabulary
  num_proposed = rng.integers(0, g + 1, b)
  key = jax.random.PRNGKey(3)
  for q, x, n in [(one_hot, drafts, None), (soft, drafts, None), (broken, drafts, None),
                  (soft, drafts_bad, None), (soft, drafts, num_proposed)]:
    kw = {} if n is None else dict(num_proposed=n)
    got_tokens, got_n = greedy_verify(x, q, p, key, **kw)
    for ref in (verify, block_verify):
      tokens, accepted = ref(x, q, p, key, **kw)
      np.testing.assert_array_equal(got_n, accepted)
      emitted = np.arange(g + 1)[None, :] <= np.asarray(accepted)[:, None]
      np.testing.assert_array_equal(np.where(emitted, got_tokens, -1),
                                    np.where(emitted, tokens, -1))
  assert np.asarray(greedy_verify(drafts, one_hot, p)[1]).max() >= 2  # long runs occurred
