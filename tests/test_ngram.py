"""Prompt-lookup (n-gram) drafts: the lookup, exactness, greedy equality and errors.

The whole-sequence tests reuse test_exactness's enumeration (vocabulary 4, 4 new
tokens, 40,000 rows). False-failure rate: each chi-square case fails for a correct
sampler with probability SIGNIFICANCE = 1e-3 (four cases: at most 0.4% for the
file); seeds are fixed, so the outcome is deterministic. The naive "correct from p"
verifier, the negative control, must fail the same test.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from helpers import (SIGNIFICANCE, assert_greedy_equals_autoregressive, chi_square_pvalue,
                     tiny_config, tiny_model)
from specdec_jax import SamplingConfig
from specdec_jax.loading import ByteTokenizer, load_draft
from specdec_jax.drafts import ngram, registry
from specdec_jax.drafts.ngram import NgramDraft, propose
from specdec_jax.verification.verify import block_verify, verify
from test_exactness import (assert_naive_verifier_fails, exact_sequence_probs, sample_sequences,
                            sequence_index)


def reference_proposals(row: list[int], max_n: int, gamma: int) -> list[int]:
  """The module docstring's rule, written as a plain loop over n and starts."""
  length = len(row)
  for n in range(max_n, 0, -1):
    if length <= n:
      continue
    suffix = row[length - n:]
    for j in range(length - n - 1, -1, -1):  # most recent first, j + n <= L - 1
      if row[j:j + n] == suffix:
        shift = length - n - j
        return [row[j + n + i % shift] for i in range(gamma)]
  return [row[-1]] * gamma


def test_proposals_equal_the_reference_rule():
  rng = np.random.default_rng(0)
  width, rows = 40, 300
  tokens = rng.integers(0, 5, size=(rows, width)).astype(np.int32)  # 5 ids: many matches
  tokens[:20] = rng.integers(0, 50, size=(20, width))  # and rows with few or none
  lengths = rng.integers(1, width + 1, size=rows).astype(np.int32)
  for max_n, gamma in ((1, 3), (3, 5), (4, 8)):
    got = np.asarray(propose(jnp.asarray(tokens), jnp.asarray(lengths), max_n=max_n,
                             gamma=gamma))
    want = [reference_proposals(tokens[b, :lengths[b]].tolist(), max_n, gamma)
            for b in range(rows)]
    np.testing.assert_array_equal(got, np.asarray(want))


def test_proposals_on_a_repeat_and_without_a_match():
  tokens = jnp.asarray([[1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3, 0, 0],
                        [5, 5, 5, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                        [1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
  got = propose(tokens, jnp.asarray([11, 4, 4]), max_n=3, gamma=5)
  # the latest "1 2 3" was followed by 7, then the periodic continuation; a run goes on;
  # no earlier copy of any suffix: the pending token, repeated.
  np.testing.assert_array_equal(got, [[7, 1, 2, 3, 7], [5, 5, 5, 5, 5], [4, 4, 4, 4, 4]])


@pytest.fixture(scope="module")
def ngram_pair():
  target = tiny_config(vocab=4, layers=2, width=16, max_seq_len=16)
  return target, tiny_model(target, 10, factor=4.0), NgramDraft(2), None


NGRAM_CASES = [
    (1, SamplingConfig(temperature=1.0), verify),
    pytest.param(3, SamplingConfig(temperature=1.0), verify, marks=pytest.mark.slow),
    pytest.param(3, SamplingConfig(temperature=0.7, top_p=0.9), verify,
                 marks=pytest.mark.slow),
    (3, SamplingConfig(temperature=1.0), block_verify),
]


@pytest.mark.parametrize("gamma,sampling,verifier", NGRAM_CASES)
def test_ngram_sequences_follow_target_distribution(ngram_pair, gamma, sampling, verifier):
  """q is one-hot at the lookup's proposal, and whole sequences follow the target."""
  exact = exact_sequence_probs(ngram_pair[0], ngram_pair[1], sampling)
  out = sample_sequences(ngram_pair, gamma, sampling, verifier=verifier, seed=6)
  assert 0.1 < out.alpha() < 0.9  # proposals are accepted often, not always
  assert chi_square_pvalue(sequence_index(out.tokens), exact) > SIGNIFICANCE


def test_ngram_negative_control_fails(ngram_pair):
  assert_naive_verifier_fails(ngram_pair, seed=6)


def test_greedy_ngram_equals_greedy_autoregressive():
  """T=0: identical tokens to plain greedy decoding; every row accepts drafts and some
  step a whole block (a tiny random model's greedy text falls into loops, which the
  lookup then predicts). The verifier is not a parameter: at T=0 the step verifies with
  `greedy_verify`."""
  target = tiny_config(vocab=32, layers=2, width=32, max_seq_len=128)
  pair = (target, tiny_model(target, 3), NgramDraft(3), None)
  prompts = [[1, 2, 3, 4, 1, 2, 3], [7, 7, 7], [5, 9, 11, 30, 2]]
  for gamma in (1, 4):
    out = assert_greedy_equals_autoregressive(pair, prompts, gamma=gamma, max_new_tokens=60)
    accepted = np.asarray(out.accepted)
    assert (accepted > 0).any(axis=1).all() and (accepted == gamma).any()


def test_ngram_draft_names_and_errors():
  tok = ByteTokenizer()
  cfg, params = load_draft("ngram:3", tok, None, None)
  assert cfg == NgramDraft(3) and params is None and cfg == registry.make("ngram:3")
  for bad in ("ngram:0", "ngram:x", "ngram:"):
    with pytest.raises(ValueError, match="ngram"):
      load_draft(bad, tok, None, None)
  with pytest.raises(ValueError, match="max_n >= 1, got -2"):
    NgramDraft(-2)


def test_lookup_candidates_with_one_candidate_is_lookup():
  """K = 1: the same D proposals and `found` as `lookup`, over random buffers and n."""
  rng = np.random.default_rng(0)
  for _ in range(50):
    tokens = jnp.asarray(rng.integers(0, 4, (3, 24)), jnp.int32)
    length = jnp.asarray(rng.integers(1, 24, 3), jnp.int32)
    for lo, hi in ((1, 3), (2, 2)):
      want, found = ngram.lookup(tokens, length, min_n=lo, max_n=hi, gamma=5)
      got, got_found = ngram.lookup_candidates(tokens, length, min_n=lo, max_n=hi, count=1,
                                               depth=5)
      np.testing.assert_array_equal(got[:, 0], want)
      np.testing.assert_array_equal(got_found[:, 0], found)


def test_lookup_candidates_are_recent_matches_with_distinct_first_tokens():
  # "1 2" occurs at 1 (-> 7 4), 5 (-> 8 3) and 9 (-> 7 4): the oldest repeats the newest's 7
  tokens = jnp.asarray([[5, 1, 2, 7, 9, 1, 2, 8, 3, 1, 2, 7, 4, 1, 2]], jnp.int32)
  got, found = ngram.lookup_candidates(tokens, jnp.asarray([15]), min_n=2, max_n=2, count=3,
                                       depth=2)
  np.testing.assert_array_equal(got[0], [[7, 4], [8, 3], [2, 2]])  # none left: pending token
  np.testing.assert_array_equal(found[0], [True, True, False])
