"""A new γ rule defined in this file alone, against the `GammaRule` protocol, runs through
the decode loop and the offline replay, and decodes exactly.

`ThresholdRule` is the simplest rule a study might try instead of the default belief: a
row drafts γ_max while the recent accepted fraction of its drafts stays at or above a
threshold, takes plain steps below it, and probes with γ = 1 after `patience` plain
steps. It ignores the cost table. It touches no library module: it is a frozen dataclass
with `init`, `choose`, `observe` and `call_widths` (`specdec_jax.gamma.adaptive.GammaRule`),
handed to `AutoGamma(costs, gamma_max, rule=...)` or to the replay's
`gamma_replay.Rule(gamma_rule=...)`. Its call widths are 1, 2 and γ_max + 1 only, so the
loop compiles those kinds and no others.

False-failure rate: each law case fails for a correct sampler with probability
SIGNIFICANCE = 1e-3 over seeds (two cases: at most 0.2% for the file); seeds are fixed, so
the outcome is deterministic. The power of the same enumeration against a wrong sampler
is shown by tests/test_custom_draft.py's negative control; a rule cannot break exactness
through this protocol, since it sees only each row's past.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from helpers import (GREEDY, SIGNIFICANCE, chi_square_pvalue, greedy_draft_pair,
                     law_feature_pair, law_of_continuations, law_pair, tiny_config, tiny_model)
from specdec_jax import (AutoGamma, DecodeSpec, Model, SamplingConfig, autoregressive_generate,
                         speculative_generate)
from specdec_jax.drafts.hybrid import HybridDraft
from specdec_jax.gamma import gamma_replay
from specdec_jax.gamma.adaptive import CostTable, gamma_histogram

GAMMA_MAX = 3
COSTS = CostTable(c=0.2, verify_costs=(1.0, 1.1, 1.2, 1.3))  # unused by the rule
VOCAB, NEW, ROWS = 4, 4, 40_000
PROMPT = [1, 3, 0]
T1 = SamplingConfig(temperature=1.0)


@dataclasses.dataclass(frozen=True)
class ThresholdRule:
  """γ_max while rate >= threshold, else 0, and 1 (a probe) after `patience` plain steps.
  State: rate float32 [B] (a running mean of accepted / proposed over drafting steps,
  weight `keep` on the past), quiet int32 [B] (steps since the row last drafted)."""

  threshold: float = 0.6
  keep: float = 0.5
  patience: int = 2

  def init(self, batch):
    return dict(rate=jnp.ones((batch,), jnp.float32), quiet=jnp.zeros((batch,), jnp.int32))

  def choose(self, state, costs, source):
    gamma_max = costs.shape[1] - 1
    probe = jnp.where(state["quiet"] >= self.patience, 1, 0)
    return jnp.where(state["rate"] >= self.threshold, gamma_max, probe).astype(jnp.int32)

  def observe(self, state, *, chosen, proposes, num_accepted, beta, source):
    drafted = proposes & (chosen > 0)
    fraction = num_accepted / jnp.maximum(chosen, 1)
    rate = jnp.where(drafted, self.keep * state["rate"] + (1 - self.keep) * fraction,
                     state["rate"])
    quiet = jnp.where(drafted, 0, state["quiet"] + 1)
    return dict(rate=rate.astype(jnp.float32), quiet=quiet.astype(jnp.int32))

  def call_widths(self, gamma_max):
    return (1, 2, gamma_max + 1)


def threshold_spec(max_new_tokens, sampling, **rule):
  return DecodeSpec(max_new_tokens, AutoGamma(COSTS, GAMMA_MAX, ThresholdRule(**rule)),
                    sampling=sampling)


def test_greedy_equals_autoregressive_and_keeps_its_widths():
  """Greedy decoding under the rule is greedy autoregressive decoding, and every step took
  one of the rule's γ (0, the probe 1 or γ_max), each of them somewhere."""
  target, tp, draft, dp = greedy_draft_pair()
  prompts = [[1, 2, 3, 4], [5, 6, 5, 6, 5], [7], [9, 3, 9, 3, 9, 3]]
  plain = autoregressive_generate(Model(target, tp), prompts, spec=DecodeSpec(
      24, sampling=GREEDY))
  out = speculative_generate(Model(target, tp), Model(draft, dp), prompts,
                             spec=threshold_spec(24, GREEDY, threshold=0.9))
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  assert set(gamma_histogram(out.gammas)) == {0, 1, GAMMA_MAX}


@pytest.mark.parametrize("kind", [  # make test: test_skipped_feature_draft_catches_up_exactly
    "independent", pytest.param("feature", marks=pytest.mark.slow)])
def test_sequences_follow_target_distribution(kind):
  """Whole sequences of 4 tokens at T=1 follow the target's exact law while the rule
  switches between plain steps, probes and γ_max (the draft skipped and caught up)."""
  pair = law_pair(VOCAB)
  target, tp, draft, dp = pair if kind == "independent" else law_feature_pair(pair)
  exact = law_of_continuations(target, tp, T1, PROMPT, VOCAB, NEW)
  out = speculative_generate(Model(target, tp), Model(draft, dp), [PROMPT] * ROWS,
                             spec=threshold_spec(NEW, T1), seed=7)
  assert (out.lengths == NEW).all()
  assert set(gamma_histogram(out.gammas)) == {0, 1, GAMMA_MAX}
  index = (out.tokens * VOCAB ** np.arange(NEW - 1, -1, -1)).sum(axis=1)
  assert chi_square_pvalue(index, exact) > SIGNIFICANCE


def test_replay_chooses_as_the_loop_does():
  """At T=0 the replay of a greedy trace under the rule takes the loop's γ, step for step,
  in order (test_gamma_replay's hybrid pair: a feature draft and a 2-token lookup)."""
  target = tiny_config(vocab=32, layers=3, width=32, max_seq_len=64)
  feature = tiny_config(vocab=32, layers=1, width=16, max_seq_len=64, tie_embeddings=False,
                        feature_layers=(1, 3), feature_width=32)
  tp, dp = tiny_model(target, 0, factor=6.0), tiny_model(feature, 1, factor=3.0)
  hybrid = HybridDraft(feature, 2, 2)
  rule = ThresholdRule(threshold=0.7)
  costs = COSTS.loop_costs(GAMMA_MAX)
  new = 20
  seen = set()
  for prompt in ([1, 2, 3, 1, 2], [4, 5, 6, 7, 8], [10, 11, 10, 11]):
    out = speculative_generate(Model(target, tp), Model(hybrid, dp), [prompt],
                               spec=DecodeSpec(new, AutoGamma(COSTS, GAMMA_MAX, rule),
                                               sampling=GREEDY))
    trace = gamma_replay.greedy_trace(tp, target, dp, hybrid, prompt, max_new_tokens=new,
                                      depth=GAMMA_MAX)
    got = gamma_replay.replay(trace, gamma_replay.Rule(gamma_rule=rule), costs,
                              max_new_tokens=new)
    assert got["sequence"] == out.gammas[0][out.gammas[0] >= 0].tolist(), prompt
    assert got["gammas"] == gamma_histogram(out.gammas), prompt
    seen |= set(got["gammas"])
  assert seen == {0, 1, GAMMA_MAX}


@dataclasses.dataclass(frozen=True)
class NarrowRule(ThresholdRule):
  """Widths that stop short of γ_max + 1: a γ_max choice would name no compiled width."""

  def call_widths(self, gamma_max):
    return (1, 2)


def test_a_rule_outside_the_protocol_is_refused():
  with pytest.raises(ValueError, match="lacks init, choose, observe, call_widths"):
    AutoGamma(COSTS, GAMMA_MAX, object())
  with pytest.raises(ValueError, match=r"call_widths\(3\) must be ascending"):
    AutoGamma(COSTS, GAMMA_MAX, NarrowRule())
