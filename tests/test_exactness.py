"""Whole generated sequences follow the target's exact sequence distribution.

A tiny random target and draft (vocabulary 4) generate 4 new tokens after a fixed
prompt; the target's probability of each of the 4^4 = 256 continuations is
computed exactly by enumeration (one full forward over all of them, after the
same warp). N speculative samples (one per batch row, each row its own key
stream) are compared by a chi-square test with cells expected below 5 pooled.

False-failure rate: each case fails for a correct sampler with probability
SIGNIFICANCE = 1e-3 over seeds (eleven tests: at most 1.1% for the file); seeds are
fixed, so the outcome is deterministic. The naive "correct from p" verifier, the
negative control, must fail the same test.
"""

import functools

import numpy as np
import pytest

from helpers import (SIGNIFICANCE, chi_square_pvalue, law_feature_pair, law_of_continuations,
                     law_pair, speculative, tiny_model)
from specdec_jax import DecodeSpec, Model, SamplingConfig, autoregressive_generate
from specdec_jax.verification.verify import block_verify, verify

VOCAB, NEW, ROWS = 4, 4, 40_000
PROMPT = [1, 3, 0]


@pytest.fixture(scope="module")
def pair():
  return law_pair(VOCAB)


def exact_sequence_probs(config, params, sampling: SamplingConfig) -> np.ndarray:
  """[VOCAB**NEW] target probability of every continuation, index = base-VOCAB digits."""
  return law_of_continuations(config, params, sampling, PROMPT, VOCAB, NEW)


def sequence_index(tokens: np.ndarray) -> np.ndarray:
  return (tokens * VOCAB ** np.arange(NEW - 1, -1, -1)).sum(axis=1)


def sample_sequences(pair, gamma, sampling, verifier=verify, seed=0):
  out = speculative(pair, [PROMPT] * ROWS, gamma=gamma, max_new_tokens=NEW, sampling=sampling,
                    seed=seed, verifier=verifier)
  assert (out.lengths == NEW).all()
  return out


CASES = [
    (1, SamplingConfig(temperature=1.0)),
    (3, SamplingConfig(temperature=1.0)),
    (3, SamplingConfig(temperature=0.7)),
    (1, SamplingConfig(temperature=1.0, top_p=0.9)),
    (3, SamplingConfig(temperature=0.7, top_p=0.9)),
]


@pytest.mark.parametrize("gamma,sampling", CASES[:2] + [
    pytest.param(*CASES[2], marks=pytest.mark.slow),
    pytest.param(*CASES[3], marks=pytest.mark.slow), CASES[4]])
def test_sequences_follow_target_distribution(pair, gamma, sampling):
  exact = exact_sequence_probs(pair[0], pair[1], sampling)
  np.testing.assert_allclose(exact.sum(), 1.0, atol=1e-5)
  out = sample_sequences(pair, gamma, sampling)
  assert 0.2 < out.alpha() < 0.95  # the draft is neither useless nor the target
  pvalue = chi_square_pvalue(sequence_index(out.tokens), exact)
  assert pvalue > SIGNIFICANCE, pvalue


@pytest.mark.parametrize("gamma,sampling", [CASES[0], CASES[4]])
def test_block_verification_sequences_follow_target_distribution(pair, gamma, sampling):
  """The same whole-sequence test with `block_verify` (Sun et al. 2025) as the verifier."""
  exact = exact_sequence_probs(pair[0], pair[1], sampling)
  out = sample_sequences(pair, gamma, sampling, verifier=block_verify, seed=4)
  assert chi_square_pvalue(sequence_index(out.tokens), exact) > SIGNIFICANCE


def test_vocabulary_subset_draft_follows_target_distribution(pair):
  """A draft whose head scores only tokens {0, 2, 3} (q(1) = 0 exactly): token 1 can
  only come from the residual, and sequences still follow the target."""
  target, tp, draft, _ = pair
  subset = draft.replace(tie_embeddings=False, head_tokens=(0, 2, 3))
  sp = tiny_model(subset, 11, factor=4.0)
  sampling = SamplingConfig(temperature=1.0)
  exact = exact_sequence_probs(target, tp, sampling)
  out = sample_sequences((target, tp, subset, sp), 3, sampling, seed=2)
  assert 0.2 < out.alpha() < 0.95
  assert (out.tokens == 1).any()
  assert chi_square_pvalue(sequence_index(out.tokens), exact) > SIGNIFICANCE


@pytest.fixture(scope="module")
def feature_pair(pair):
  """The same target with a feature draft (EAGLE-3 style) reading its layers 1 and 2."""
  return law_feature_pair(pair)


FEATURE_CASES = [
    (1, SamplingConfig(temperature=1.0)),
    (3, SamplingConfig(temperature=0.7, top_p=0.9)),
]


@pytest.mark.parametrize("gamma,sampling", FEATURE_CASES)
def test_feature_draft_sequences_follow_target_distribution(feature_pair, gamma, sampling):
  """The feature draft's q (re-read on true features, then its own hidden states) is what
  `verify` gets, so whole sequences still follow the target exactly."""
  exact = exact_sequence_probs(feature_pair[0], feature_pair[1], sampling)
  out = sample_sequences(feature_pair, gamma, sampling, seed=3)
  assert 0.2 < out.alpha() < 0.95
  assert chi_square_pvalue(sequence_index(out.tokens), exact) > SIGNIFICANCE


def assert_naive_verifier_fails(pair, seed: int) -> None:
  """The negative control: "correct from p" (resample from p, not the residual) at γ=3,
  T=1 gives sequences the chi-square test rejects at 1e-9."""
  sampling = SamplingConfig(temperature=1.0)
  exact = exact_sequence_probs(pair[0], pair[1], sampling)
  naive = functools.partial(verify, residual_fn=lambda p, q: p)
  out = sample_sequences(pair, 3, sampling, verifier=naive, seed=seed)
  assert chi_square_pvalue(sequence_index(out.tokens), exact) < 1e-9


def test_feature_draft_negative_control_fails(feature_pair):
  assert_naive_verifier_fails(feature_pair, seed=3)


def test_negative_control_naive_verifier_fails(pair):
  assert_naive_verifier_fails(pair, seed=0)


def test_autoregressive_follows_target_distribution(pair):
  """The baseline sampler passes the same test (it shares warp, cache and loop)."""
  target, tp, _, _ = pair
  sampling = SamplingConfig(temperature=1.0, top_p=0.9)
  exact = exact_sequence_probs(target, tp, sampling)
  out = autoregressive_generate(Model(target, tp), [PROMPT] * ROWS,
                                spec=DecodeSpec(NEW, sampling=sampling), seed=1)
  assert chi_square_pvalue(sequence_index(out.tokens), exact) > SIGNIFICANCE


def test_empirical_acceptance_matches_exact_alpha(pair):
  """Mean accepted fraction ~ mean Σ min(p,q) (both over the same drafted positions)."""
  out = sample_sequences(pair, 3, SamplingConfig(temperature=1.0), seed=5)
  assert abs(out.acceptance_rate() - out.alpha()) < 0.01
