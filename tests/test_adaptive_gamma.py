"""gamma='auto' (γ chosen per step and per row from a cost table) and lookups that
propose nothing: exactness, greedy equality, batch composition, one compiled loop,
the choice rule, the cost-table cache and bad input.

The whole-sequence tests reuse test_exactness's enumeration (vocabulary 4, 4 new
tokens, 40,000 rows) with an injected cost table (`SWITCHING`) under which rows move
between γ = 0 and γ_max = 3 within a sequence. False-failure rate: each chi-square
case fails for a correct sampler with probability SIGNIFICANCE = 1e-3 (one case in
`make test`, five more marked slow: at most 0.6% for the file); seeds are fixed, so the
outcome is deterministic. The naive "correct from p" verifier, the negative control,
must fail the same test. Each 40,000-row case compiles its own loop, so `make test`
runs one case and the control; the small tests share compiled loops (batch 5, 12
tokens).
"""

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import (SIGNIFICANCE, chi_square_pvalue, greedy_draft_pair, law_feature_pair,
                     law_pair, tiny_config, tiny_model)
from specdec_jax import (AutoGamma, DecodeSpec, FixedGamma, Model, SamplingConfig,
                         autoregressive_generate, speculative_generate)
from specdec_jax.bench import studies
from specdec_jax.decoding import loop, step as decode_step
from specdec_jax.decoding.results import finish
from specdec_jax.decoding.spec import make_proposer, prepare
from specdec_jax.drafts.feature import FEATURE_LAG
from specdec_jax.drafts.hybrid import HybridDraft
from specdec_jax.drafts.ngram import NgramDraft
from specdec_jax import config_proposer
from specdec_jax.gamma import adaptive, cost_cache, machine_costs
from specdec_jax.gamma.adaptive import CostTable
from specdec_jax.verification.verify import block_verify, verify
from test_exactness import ROWS, exact_sequence_probs, sequence_index

GAMMA_MAX = 3
# No draft cost and a flat v(k >= 2) = 1.92: γ = 3 is the best γ >= 1 at every α, and it
# beats a plain step (score 1) iff 1 + α + α² + α³ > 1.92, i.e. α̂ > 0.515. Rows start at
# the prior 0.5 with γ = 0, move to γ = 3 as the q_1 they observe match p_1, and back
# after rejections.
SWITCHING = CostTable(c=0.0, verify_costs=(1.0, 1.92, 1.92, 1.92))
# With a feature draft a γ = 0 row observes q_1 only every FEATURE_LAG-th plain step,
# which 4 new tokens never reach, so rows must start drafting to switch: a flat v(k >= 2) =
# 1.87 makes γ = 3 the best at the prior 0.5 (1 + α + α² + α³ > 1.87 iff α̂ > 0.498), and
# rows whose drafts then show β below that fall back to γ = 0 (at T = 1 without top-k this
# draft's β stays above it, and no row falls back: the T = 1 case takes top-k 2).
FEATURE_SWITCHING = CostTable(c=0.0, verify_costs=(1.0, 1.87, 1.87, 1.87))
# v(k) = 5 for k >= 2: no γ >= 1 pays at any α < 1 (E[tokens] <= 4).
NOTHING_PAYS = CostTable(c=0.0, verify_costs=(1.0, 5.0, 5.0, 5.0))
GREEDY = SamplingConfig(temperature=0.0)
PROMPT = [1, 3, 0]


@pytest.fixture(scope="module")
def pair():
  """test_exactness's pair (vocabulary 4)."""
  return law_pair(4)


@pytest.fixture(scope="module")
def feature_pair(pair):
  """law_feature_pair with room for the feature lag of gamma='auto': the prompt (3), 4 new
  tokens, γ_max (3) and `FEATURE_LAG` (8) need 18 positions, over its 16."""
  target, tp, draft, dp = law_feature_pair(pair)
  return target.replace(max_seq_len=32), tp, draft.replace(max_seq_len=32), dp


def auto_spec(costs, max_new_tokens, sampling=SamplingConfig(), verifier="block"):
  """The DecodeSpec of gamma='auto' with γ_max = GAMMA_MAX and the cost table `costs`."""
  return DecodeSpec(max_new_tokens, AutoGamma(costs, GAMMA_MAX), sampling=sampling,
                    verifier=verifier)


def auto_generate(pair, prompts, *, costs, max_new_tokens, sampling=SamplingConfig(),
                  verifier="block", **call):
  """speculative_generate under gamma='auto' (call: seed, row_ids)."""
  target, tp, draft, dp = pair
  return speculative_generate(Model(target, tp), Model(draft, dp), prompts,
                              spec=auto_spec(costs, max_new_tokens, sampling, verifier), **call)


def greedy_autoregressive(pair, prompts=None, max_new_tokens=12):
  target, tp = pair[:2]
  return autoregressive_generate(Model(target, tp), PROMPTS if prompts is None else prompts,
                                 spec=DecodeSpec(max_new_tokens, sampling=GREEDY))


def auto_sequences(pair, sampling, verifier, seed, costs=SWITCHING, rows=ROWS):
  out = auto_generate(pair, [PROMPT] * rows, costs=costs, max_new_tokens=4, sampling=sampling,
                      verifier=verifier, seed=seed)
  assert (out.lengths == 4).all()
  return out


def assert_switches(out) -> None:
  """Rows use both γ = 0 and γ = γ_max, some of them within one sequence."""
  g = out.gammas
  assert (g == 0).any() and (g == GAMMA_MAX).any()
  assert ((g == 0).any(axis=1) & (g == GAMMA_MAX).any(axis=1)).sum() > 100


AUTO_CASES = [
    pytest.param(SamplingConfig(temperature=1.0), verify, id="T1-token",
                 marks=pytest.mark.slow),
    pytest.param(SamplingConfig(temperature=0.7, top_p=0.9), block_verify, id="T0.7p0.9-block"),
    pytest.param(SamplingConfig(temperature=1.0), block_verify, id="T1-block",
                 marks=pytest.mark.slow),
    pytest.param(SamplingConfig(temperature=0.7, top_p=0.9), verify, id="T0.7p0.9-token",
                 marks=pytest.mark.slow),
]


@pytest.mark.parametrize("sampling,verifier", AUTO_CASES)
def test_auto_gamma_sequences_follow_target_distribution(pair, sampling, verifier):
  exact = exact_sequence_probs(pair[0], pair[1], sampling)
  out = auto_sequences(pair, sampling, verifier, seed=7)
  assert_switches(out)
  assert chi_square_pvalue(sequence_index(out.tokens), exact) > SIGNIFICANCE


@pytest.mark.parametrize("sampling,verifier", [
    pytest.param(SamplingConfig(temperature=1.0, top_k=2), block_verify, id="T1k2-block",
                 marks=pytest.mark.slow),
    pytest.param(SamplingConfig(temperature=0.7, top_p=0.9), verify, id="T0.7p0.9-token",
                 marks=pytest.mark.slow),
])
def test_auto_gamma_feature_draft_follows_target_distribution(feature_pair, sampling,
                                                              verifier):
  """The feature draft's re-read keeps width G+1 at every call width, and γ = 0 steps
  that skip it leave its cache and features those of the emitted tokens."""
  exact = exact_sequence_probs(feature_pair[0], feature_pair[1], sampling)
  out = auto_sequences(feature_pair, sampling, verifier, seed=8, costs=FEATURE_SWITCHING)
  assert_switches(out)
  assert chi_square_pvalue(sequence_index(out.tokens), exact) > SIGNIFICANCE


@pytest.mark.slow
def test_nothing_pays_follows_target_distribution(pair):
  """Every step γ = 0 (a width-1 call, y ~ p_1 from the verifier's resample key)."""
  sampling = SamplingConfig(temperature=1.0)
  exact = exact_sequence_probs(pair[0], pair[1], sampling)
  out = auto_sequences(pair, sampling, verify, seed=9, costs=NOTHING_PAYS)
  assert (out.gammas == 0).all()
  assert chi_square_pvalue(sequence_index(out.tokens), exact) > SIGNIFICANCE


def test_auto_gamma_negative_control_fails(pair):
  """The naive verifier ("correct from p") under the same switching table is rejected."""
  sampling = SamplingConfig(temperature=1.0)
  exact = exact_sequence_probs(pair[0], pair[1], sampling)
  naive = functools.partial(verify, residual_fn=lambda p, q: p)
  out = auto_sequences(pair, sampling, naive, seed=7)
  assert_switches(out)
  assert chi_square_pvalue(sequence_index(out.tokens), exact) < 1e-9


# ------------------------------------------------------------ greedy, batches, compiles

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13], [14, 15]]


@pytest.fixture(scope="module")
def greedy_pairs():
  """test_speculative's greedy pair (vocabulary 32) and a feature draft on its target."""
  target, tp, draft, dp = greedy_draft_pair()
  feature = tiny_config(vocab=32, layers=1, width=16, tie_embeddings=False,
                        feature_layers=(1, 2), feature_width=32)
  feature_params = tiny_model(feature, 1, factor=3.0)
  return dict(model=(target, tp, draft, dp), feature=(target, tp, feature, feature_params),
              ngram=(target, tp, NgramDraft(2), None),
              hybrid=(target, tp, HybridDraft(feature, 2, 2), feature_params))


# The greedy draws of β in {0, 1} move α̂ by about 0.05 near the prior 0.5 (weight 0.1):
# under this table a row takes γ = 0 below about 0.48, 1 up to about 0.55, 2 up to about
# 0.62, and 3 above.
GRADED = CostTable(c=0.05, verify_costs=(1.0, 1.50, 1.76, 1.98))


@pytest.mark.parametrize("kind", [
    "model", "feature",
    pytest.param("ngram", marks=pytest.mark.slow),
    pytest.param("hybrid", marks=pytest.mark.slow),
])
def test_greedy_auto_gamma_equals_greedy_autoregressive(greedy_pairs, kind):
  """T=0 (the step verifies greedily, whatever the spec's verifier)."""
  ar = greedy_autoregressive(greedy_pairs[kind])
  out = auto_generate(greedy_pairs[kind], PROMPTS, costs=GRADED, max_new_tokens=12,
                      sampling=GREEDY, verifier="block")
  np.testing.assert_array_equal(out.tokens, ar.tokens)
  live = out.gammas >= 0
  assert len(np.unique(out.gammas[live])) > 1  # the choice really varies
  assert (out.accepted[live] <= out.gammas[live]).all()


def test_nothing_pays_gives_plain_steps(greedy_pairs):
  """A table where no γ >= 1 pays: every step proposes nothing (a width-1 target call);
  greedy tokens are the autoregressive ones, one per step, and no position counts as
  drafted. (At T > 0 the token of a γ = 0 step comes from the verifier's resample key,
  not the autoregressive loop's step key: same law, other draws; the scripts decode
  with `autoregressive_generate` itself when `CostTable.drafting_pays` is False.)"""
  ar = greedy_autoregressive(greedy_pairs["model"])
  out = auto_generate(greedy_pairs["model"], PROMPTS, costs=NOTHING_PAYS, max_new_tokens=12,
                      sampling=GREEDY, verifier="block")
  np.testing.assert_array_equal(out.tokens, ar.tokens)
  assert (out.gammas[out.gammas >= 0] == 0).all() and out.tokens_per_step() == 1.0
  assert not out.reached().any() and np.isnan(out.alpha())
  assert not NOTHING_PAYS.drafting_pays() and SWITCHING.drafting_pays()


@pytest.mark.parametrize("kind,table,alone", [
    ("feature", "switching", False),
    pytest.param("model", "graded", True, marks=pytest.mark.slow)])
def test_auto_gamma_row_independent_of_batch(greedy_pairs, kind, table, alone):
  """Rows 0 and 3 (same prompts and row ids) give the same tokens and γ choices beside
  other neighbours, or alone, at T=1, though each step's call width follows the
  neighbours' choices. Batches of one shape share one compiled loop."""
  pair = greedy_pairs[kind]
  kw = dict(costs=dict(switching=SWITCHING, graded=GRADED)[table], max_new_tokens=12,
            sampling=SamplingConfig(1.0), seed=3)
  first = auto_generate(pair, PROMPTS, **kw)
  rows = (0, 3)
  if alone:
    seconds = [auto_generate(pair, [PROMPTS[b]], row_ids=[b], **kw) for b in rows]
    pairs = [(b, s, 0) for b, s in zip(rows, seconds)]
  else:
    others = [PROMPTS[0], [30, 29, 28, 27, 26], [25], PROMPTS[3], [24, 23]]
    second = auto_generate(pair, others, row_ids=[0, 10, 11, 3, 12], **kw)
    seconds, pairs = [second], [(b, second, b) for b in rows]
  for b, second, c in pairs:
    np.testing.assert_array_equal(first.tokens[b], second.tokens[c])
    steps = (first.gammas[b] >= 0).sum()
    np.testing.assert_array_equal(first.gammas[b, :steps], second.gammas[c, :steps])
  widths = first.gammas.max(axis=0)  # the batch's call widths - 1, step by step
  assert any((widths[:s.num_steps] != s.gammas.max(axis=0)[:widths.size]).any()
             for s in seconds)
  assert len(np.unique(first.gammas[first.gammas >= 0])) > 1


def test_skipped_feature_draft_catches_up_exactly(greedy_pairs):
  """Plain steps that skip the feature draft, then a drafting step, draw the drafts of a
  state freshly prefilled with the same tokens: its re-read covers the skipped positions
  with the target's true features (β = Σ min(p, q) equal to float rounding, T=1)."""
  target, tp, draft, dp = greedy_pairs["feature"]
  sampling = SamplingConfig(temperature=1.0)
  prepared = prepare(Model(target, tp), Model(draft, dp), PROMPTS[1:2],
                     auto_spec(SWITCHING, 8, sampling, block_verify), seed=5)
  spec, feature = prepared.spec, prepared.draft
  assert spec.lag(feature) == FEATURE_LAG
  costs = jnp.asarray(prepared.costs)
  step = jax.jit(functools.partial(decode_step.speculative_step_fn, target_config=target,
                                   draft=feature, spec=spec),
                 static_argnames=("width", "skip_draft"))
  init = functools.partial(loop.init_state_jit, target_config=target, draft=feature,
                           gamma=GAMMA_MAX, max_new_tokens=8, lag=FEATURE_LAG,
                           adaptive_gamma=True)
  state = init(tp, dp, prepared.tokens, prepared.prompt_len, prepared.row_keys)
  assert bool(decode_step.may_skip_draft(state, feature, jnp.zeros(1, jnp.int32)))
  for _ in range(3):
    state = step(tp, dp, state, costs, width=1, skip_draft=True)
  n = int(state.num_tokens[0])
  # ℓ_d stayed at the prompt
  assert n == 5 + 3 and int(state.draft_state.cache["length"][0]) == 4
  lagged = step(tp, dp, state, costs, width=GAMMA_MAX + 1)
  fresh = init(tp, dp, np.asarray(state.tokens[:, :n]), state.num_tokens, prepared.row_keys)
  fresh = step(tp, dp, fresh.replace(step=state.step, alpha_estimate=state.alpha_estimate,
                                     plain_run=state.plain_run), costs, width=GAMMA_MAX + 1)
  np.testing.assert_allclose(lagged.accept_prob[0, 3], fresh.accept_prob[0, 3], atol=1e-5)
  assert lagged.accept_prob[0, 3, 0] > 0
  np.testing.assert_array_equal(lagged.tokens[0, :int(lagged.num_tokens[0])],
                                fresh.tokens[0, :int(fresh.num_tokens[0])])


def test_feature_draft_skips_plain_steps_and_probes(greedy_pairs):
  """Under a table where nothing pays, a feature draft's rows take plain steps; the draft
  runs on every FEATURE_LAG-th of them only (its probes observe q_1), and the tokens stay
  those of greedy autoregressive decoding."""
  pair = greedy_pairs["feature"]
  out = auto_generate(pair, PROMPTS, costs=NOTHING_PAYS, max_new_tokens=12, sampling=GREEDY)
  ar = greedy_autoregressive(pair)
  np.testing.assert_array_equal(out.tokens, ar.tokens)
  assert (out.gammas[out.gammas >= 0] == 0).all()
  # At T=1 β_1 > 0 wherever the draft ran: on steps 4, 8, 12 of each row only.
  out = auto_generate(pair, PROMPTS, costs=NOTHING_PAYS, max_new_tokens=12,
                      sampling=SamplingConfig(temperature=1.0))
  ran = np.asarray(out.accept_prob)[:, :12, 0] > 0
  want = np.zeros(12, bool)
  want[FEATURE_LAG - 1::FEATURE_LAG] = True
  np.testing.assert_array_equal(ran, np.broadcast_to(want, ran.shape))


def test_auto_gamma_compiles_one_loop(greedy_pairs):
  """Tables are traced inputs: other tables and seeds reuse the one compiled decode loop
  (one inner loop per call width); the jitted step (a `lax.switch` over the widths)
  compiles once too, and stepping it to the end gives the loop's tokens and γ choices.
  After every step both caches hold exactly the emitted tokens: length = num_tokens - 1."""
  pair = greedy_pairs["model"]
  target, tp, draft, dp = pair
  kw = dict(max_new_tokens=12, sampling=GREEDY, verifier="block")
  auto_generate(pair, PROMPTS, costs=SWITCHING, **kw)  # compiled here or before
  before = loop.run_steps_jit._cache_size()
  for seed, table in enumerate((NOTHING_PAYS, CostTable(0.1, (1, 1.1, 1.2, 1.3)), SWITCHING)):
    out = auto_generate(pair, PROMPTS, costs=table, seed=seed, **kw)
  assert loop.run_steps_jit._cache_size() == before
  assert len(np.unique(out.gammas[out.gammas >= 0])) > 1

  prepared = prepare(Model(target, tp), Model(draft, dp), PROMPTS, auto_spec(SWITCHING, **kw),
                     seed=2)
  state = loop.prefill(Model(target, tp), dp, prepared)
  step_before = decode_step.speculative_step._cache_size()
  while not bool(state.done.all()):
    state = decode_step.speculative_step(tp, dp, state, prepared.costs, target_config=target,
                                         draft=prepared.draft, spec=prepared.spec)
    want = np.asarray(state.num_tokens) - 1
    np.testing.assert_array_equal(state.target_cache["length"], want)
    np.testing.assert_array_equal(state.draft_state["length"], want)
  assert decode_step.speculative_step._cache_size() == step_before + 1
  stepped = finish(state, 12, 0)
  np.testing.assert_array_equal(stepped.tokens, out.tokens)
  np.testing.assert_array_equal(stepped.gammas, out.gammas)


def test_lookup_without_a_match_proposes_nothing(greedy_pairs):
  """Fixed γ: a row whose trailing tokens never occurred before proposes nothing (γ_b = 0,
  no drafted position counted); rows with a match propose γ."""
  target, tp, _, _ = greedy_pairs["model"]
  prompts = [[1, 2, 3, 4], [5, 6, 5, 6, 5]]  # no earlier copy of 4 | "6 5" occurred before
  out = speculative_generate(Model(target, tp), Model(NgramDraft(2), None), prompts,
                             spec=DecodeSpec(1, FixedGamma(3), sampling=GREEDY))
  np.testing.assert_array_equal(out.gammas[:, 0], [0, 3])
  assert out.accepted[0, 0] == 0 and out.reached()[0].sum() == 0
  # Alone (batch 1), row 0's step is the width-1 branch: a plain target step.
  assert int(adaptive.width_index(adaptive.call_widths(3, False, True), out.gammas[:1, 0])) == 0


# ------------------------------------------------------------ the choice rule

def test_choose_gamma_is_the_argmax_of_the_prediction():
  table = CostTable(c=0.07, verify_costs=(1.0, 1.07, 1.20, 1.44, 1.50))
  alphas = np.linspace(0.0, 0.99, 34)
  got = np.asarray(adaptive.choose_gamma(np.asarray(alphas, np.float32),
                                         table.as_array(4)))
  for a, g in zip(alphas, got):
    # A γ = 0 step runs the draft once too (q_1 for the estimate): cost 1 + c.
    scores = [1.0 / (1.0 + table.c)] + [
        studies.predicted_speedup(a, k, table.c, table.verify_costs[k]) for k in range(1, 5)]
    assert scores[g] >= max(scores) - 1e-5, (a, g, scores)
  assert got[0] == 0 and got[-1] == 4 and (np.diff(got) >= 0).all()


def test_measured_step_costs_decide_the_choice():
  """With measured s(γ), the choice is the argmax of E(α, γ) / s(γ); here s(1) is so
  dear that γ = 1 is never taken, which the modelled table of the same c, v would take."""
  v = (1.0, 1.2, 1.3, 1.4)
  measured = CostTable(c=0.05, verify_costs=v, step_costs=(1.1, 3.0, 1.6, 1.7))
  modelled = CostTable(c=0.05, verify_costs=v)
  np.testing.assert_allclose(modelled.as_array(3), [1.05, 1.25, 1.40, 1.55], rtol=1e-6)
  np.testing.assert_allclose(measured.as_array(2), [1.1, 3.0, 1.6], rtol=1e-6)
  alphas = np.linspace(0.0, 0.99, 34)
  got = np.asarray(adaptive.choose_gamma(np.asarray(alphas, np.float32),
                                         measured.as_array(3)))
  for a, g in zip(alphas, got):
    scores = [sum(a ** j for j in range(k + 1)) / s
              for k, s in enumerate(measured.step_costs)]
    assert scores[g] >= max(scores) - 1e-5, (a, g, scores)
  assert 1 not in got and got[0] == 0 and got[-1] == 3
  assert 1 in [modelled.best_gamma(a) for a in alphas]
  # Drafting pays when some γ >= 1 beats a plain step (cost 1, one token) at α = 0.9.
  assert measured.drafting_pays() and measured.predicted_speedup(0.9, 3) > 1
  assert not CostTable(c=0.0, verify_costs=v, step_costs=(1.1, 4.0, 4.0, 4.0)).drafting_pays()


@pytest.mark.parametrize("steps,match", [
    ((1.0, float("inf")), "step_costs must be finite numbers > 0"),
    ((1.0, 0.0), "step_costs must be finite numbers > 0"),
    ((1.0, 1.2, 1.3), "step_costs has 3 entries"),
])
def test_bad_step_costs_raise(steps, match):
  with pytest.raises(ValueError, match=match):
    CostTable(c=0.1, verify_costs=(1.0, 1.2), step_costs=steps)


def test_measure_steps_of_a_lookup_after_a_one_token_prompt(greedy_pairs):
  """A prompt lookup's steps are timed on a text long enough to match, whatever the run's
  prompt: a one-token context (nothing earlier to match) used to stop the table with
  'a row proposed another count'."""
  target, tp = greedy_pairs["model"][:2]
  table = machine_costs.measure_steps(Model(target, tp), Model(NgramDraft(2), None),
                                      gamma_max=2, batch=1, sampling=GREEDY, context=1,
                                      max_new_tokens=8, repeats=1)
  assert len(table.step_costs) == 3 and all(np.isfinite(table.step_costs))


def test_measure_steps_times_every_width(greedy_pairs, tmp_path, monkeypatch):
  """On a tiny pair: s(0..G) finite and positive, one per width, stored and reloaded
  with the table (timings of a tiny model say nothing of a real one: no values checked).
  A first timing whose plain step reads 3x slow (s(0) far below 1) is timed again, and
  the plausible attempt is kept."""
  target, tp, draft, dp = greedy_pairs["feature"]
  timed, original = [], machine_costs.timing.interleaved_seconds

  def interleaved(fns, repeats):
    seconds, results = original(fns, repeats)
    if "plain" in seconds:  # the step loops (not v(k) and c)
      if not timed:  # the first attempt: the autoregressive loop disturbed
        seconds = {**seconds, "plain": 3 * seconds["plain"] + 1.0}
      timed.append(seconds)
    return seconds, results

  monkeypatch.setattr(machine_costs.timing, "interleaved_seconds", interleaved)
  table = machine_costs.measure_steps(Model(target, tp), Model(draft, dp), gamma_max=2,
                                      batch=2, sampling=GREEDY, context=8, max_new_tokens=4,
                                      repeats=2)
  assert 2 <= len(timed) <= machine_costs.TIMING_ATTEMPTS
  kept = [x[2] / x["plain"] for x in timed[1:]]  # not the disturbed attempt
  assert table.step_costs[1] in kept
  assert len(table.step_costs) == 3 and all(np.isfinite(table.step_costs))
  assert table.as_array(2).shape == (3,) and table.lookup_step_costs is None
  assert table.verify_costs is None and table.max_gamma == 2  # step costs alone
  assert cost_cache.describe(table).startswith("s(gamma) = 0:")
  key = cost_cache.cost_key(target, draft, batch=2, context=8, sampling=GREEDY,
                            verifier="block")
  assert key["steps"] and key != cost_cache.cost_key(
      target, draft, batch=2, context=8, sampling=SamplingConfig(temperature=1.0),
      verifier="block")
  stored, measured = cost_cache.load_or_measure(tmp_path, key, 2, lambda: table)
  again, measured_again = cost_cache.load_or_measure(tmp_path, key, 2, lambda: None)
  assert measured and not measured_again and again == table


@pytest.mark.parametrize("kind", ["hybrid", "ngram"])
def test_measure_steps_times_lookup_steps(greedy_pairs, kind):
  """A hybrid's table also holds s_lookup(0..G), its steps where every row's lookup
  matches, timed in the same compiled loop; an n-gram draft's steps are all lookup steps
  (it proposes nothing elsewhere). No values checked, as above; the harness itself
  raises if a row took another γ than the one it timed."""
  target, tp, draft, dp = greedy_pairs[kind]
  table = machine_costs.measure_steps(Model(target, tp), Model(draft, dp), gamma_max=2,
                                      batch=2, sampling=GREEDY, context=8, max_new_tokens=4,
                                      repeats=2)
  assert len(table.step_costs) == 3 and all(np.isfinite(table.step_costs))
  if kind == "ngram":
    assert table.lookup_step_costs is None
    return
  assert len(table.lookup_step_costs) == 3 and all(np.isfinite(table.lookup_step_costs))
  assert table.lookup_step_costs[0] == table.step_costs[0]
  assert table.loop_costs(2).shape == (2, 3)


def test_step_costs_are_timed_in_the_runs_own_loop(greedy_pairs, caplog):
  """Given a run's prompt width, max_new_tokens and eos_id, the table times the programs
  that run then decodes with: generating afterwards compiles no prefill and no loop.
  (Compiles are counted from JAX's log: the jit's dispatch cache may key a call anew, for
  example by its arguments' placement, without tracing or compiling anything.)"""
  pair = greedy_pairs["feature"]
  target, tp, draft, dp = pair
  table = machine_costs.measure_steps(
      Model(target, tp), Model(draft, dp), gamma_max=GAMMA_MAX, batch=len(PROMPTS),
      sampling=GREEDY, context=max(len(p) for p in PROMPTS), max_new_tokens=12, eos_id=None,
      repeats=1)
  def compile_probe(x):  # a program compiled here for sure: the log's text is read right
    return x * 2

  with jax.log_compiles(True), caplog.at_level(logging.WARNING):
    auto_generate(pair, PROMPTS, costs=table, max_new_tokens=12, sampling=GREEDY,
                  verifier="block")
    greedy_autoregressive(pair)
    jax.jit(compile_probe)(jnp.zeros((3, 5, 7), jnp.int8))
  compiled = [r.getMessage()[:40] for r in caplog.records
              if r.getMessage().startswith("Compiling jit(")]
  assert [m for m in compiled if "compile_probe" in m], compiled  # the positive control
  assert not [m for m in compiled if "run_steps" in m or "init_state" in m], compiled


def test_update_alpha_is_an_ema_over_observed_positions():
  beta = np.asarray([[1.0, 0.0, 1.0], [0.2, 0.9, 0.9]], np.float32)
  observed = np.asarray([[True, True, False], [False, False, False]])
  got = np.asarray(adaptive.update_alpha(np.asarray([0.5, 0.5], np.float32), beta, observed,
                                         weight=0.5))
  np.testing.assert_allclose(got, [0.375, 0.5])  # 0.5 -> 0.75 -> 0.375; row 1 unchanged


def test_alpha_and_gamma_per_source():
  """Each row's observed β update the α̂ of its step's source only, and γ is chosen on
  that α̂ and that source's step costs."""
  alpha = np.asarray(adaptive.initial_alpha(2))
  np.testing.assert_allclose(alpha, [adaptive.ALPHA_PRIOR] * 2)
  beta = np.asarray([[1.0, 1.0], [0.0, 1.0]], np.float32)
  observed = np.asarray([[True, False], [True, True]])
  source = np.asarray([adaptive.LOOKUP, adaptive.DRAFT], np.int32)
  got = np.asarray(adaptive.update_alpha(alpha, beta, observed, source, weight=0.5))
  lookup0, draft0 = adaptive.ALPHA_PRIOR[adaptive.LOOKUP], adaptive.ALPHA_PRIOR[adaptive.DRAFT]
  np.testing.assert_allclose(got, [[draft0, (lookup0 + 1) / 2],
                                   [((draft0 / 2) + 1) / 2, lookup0]])
  costs = np.asarray([[1.0, 9.0, 9.0], [1.0, 1.2, 1.3]], np.float32)
  chosen = adaptive.choose_gamma_by_source(
      np.asarray([[0.9, 0.9], [0.9, 0.9]], np.float32), costs,
      np.asarray([adaptive.DRAFT, adaptive.LOOKUP], np.int32))
  np.testing.assert_array_equal(chosen, [0, 2])
  table = CostTable(c=0.0, verify_costs=(1.0, 1.5, 2.0), step_costs=(1.0, 9.0, 9.0),
                    lookup_step_costs=(1.0, 1.2, 1.3))
  np.testing.assert_allclose(table.loop_costs(2), costs)
  np.testing.assert_allclose(CostTable(c=0.0, verify_costs=(1.0, 1.5, 2.0)).loop_costs(1),
                             [[0.0 + 1.0, 1.5]] * 2)
  with pytest.raises(ValueError, match="lookup_step_costs needs step_costs"):
    CostTable(c=0.0, verify_costs=(1.0, 1.5), lookup_step_costs=(1.0, 1.2))
  with pytest.raises(ValueError, match="lookup_step_costs has 1 entries"):
    CostTable(c=0.0, verify_costs=(1.0, 1.5), step_costs=(1.0, 1.2), lookup_step_costs=(1.0,))


def test_gamma_histogram_and_widths():
  assert adaptive.gamma_histogram(np.asarray([[0, 2, -1], [2, 2, 4]])) == {0: 1, 2: 3, 4: 1}
  assert adaptive.call_widths(3, True, False) == (1, 2, 3, 4)
  assert adaptive.call_widths(3, False, True) == (1, 4)
  assert adaptive.call_widths(3, False, False) == (4,)
  assert int(adaptive.width_index((1, 2, 3, 4), np.asarray([0, 2, 1]))) == 2


@pytest.mark.parametrize("change,match", [
    (dict(costs=None), "gamma='auto' needs a cost table"),
    (dict(gamma=2), "cost table is used with gamma='auto' only"),
    (dict(gamma_max=0), "gamma_max must be an int >= 1, got 0"),
    (dict(gamma_max=5), "gamma_max=5 needs v\\(k\\) up to k=6"),
])
def test_bad_auto_arguments_raise(greedy_pairs, change, match):
  """A config's gamma fields become the proposer (`make_proposer`, which refuses a table
  without gamma 'auto'); the rest are refused when the proposer is built or checked."""
  target, tp, draft, dp = greedy_pairs["model"]
  fields = {**dict(gamma="auto", gamma_max=GAMMA_MAX, costs=SWITCHING), **change}
  with pytest.raises(ValueError, match=match):
    speculative_generate(Model(target, tp), Model(draft, dp), PROMPTS,
                         spec=DecodeSpec(4, make_proposer(**fields)))


@pytest.mark.parametrize("c,v,match", [
    (-0.1, (1.0, 1.2), "c must be a finite number >= 0, got -0.1"),
    (0.1, (1.0, float("nan")), "verify_costs must be finite numbers > 0"),
    (0.1, (1.2, 1.3), "verify_costs\\[0\\] is v\\(1\\) and must be 1, got 1.2"),
    (0.1, (), "verify_costs must be finite numbers > 0, got \\(\\)"),
    (None, (1.0, 1.2), "c and verify_costs go together"),
    (None, None, "needs step_costs or c and verify_costs, got none"),
])
def test_bad_cost_table_raises(c, v, match):
  with pytest.raises(ValueError, match=match):
    CostTable(c=c, verify_costs=v)


# ------------------------------------------------------------ the cost-table cache

def test_cost_table_cache_writes_reloads_and_remeasures(tmp_path):
  """A fake measurement stands in for the timer: the first call measures and writes,
  the second reloads, a changed key or a larger γ_max measures again, and an unreadable
  file is replaced."""
  calls = []

  def fake(c):
    def measure():
      calls.append(c)
      return CostTable(c=c, verify_costs=(1.0, 1.25, 1.5, 1.75, 2.0))
    return measure

  key = dict(cpu="test cpu", isa=["avx2"], cores=2, jax="0", devices=[], models="abc",
             batch=1, context=96)
  table, measured = cost_cache.load_or_measure(tmp_path, key, 3, fake(0.1))
  assert measured and table.c == 0.1 and calls == [0.1]
  path = cost_cache.cache_path(tmp_path, key)
  assert path.exists()
  again, measured = cost_cache.load_or_measure(tmp_path, key, 3, fake(0.2))
  assert not measured and again == table and calls == [0.1]
  other = {**key, "isa": ["avx512f"]}  # another machine: another file, measured
  assert cost_cache.cache_path(tmp_path, other) != path
  table, measured = cost_cache.load_or_measure(tmp_path, other, 3, fake(0.3))
  assert measured and table.c == 0.3
  path.write_text(path.read_text().replace('"test cpu"', '"edited cpu"'))  # key mismatch
  table, measured = cost_cache.load_or_measure(tmp_path, key, 3, fake(0.4))
  assert measured and table.c == 0.4
  table, measured = cost_cache.load_or_measure(tmp_path, key, 4, fake(0.5))
  assert not measured  # 5 widths stored cover γ_max = 4
  path.write_text("{not json")
  table, measured = cost_cache.load_or_measure(tmp_path, key, 3, fake(0.6))
  assert measured and table.c == 0.6 and calls == [0.1, 0.3, 0.4, 0.6]


def test_cost_key_names_machine_and_models(greedy_pairs):
  target, _, draft, _ = greedy_pairs["model"]
  key = cost_cache.cost_key(target, draft, batch=2)
  assert {"cpu", "isa", "cores", "jax", "models", "batch", "context"} <= set(key)
  assert key != cost_cache.cost_key(target, draft.replace(num_layers=2), batch=2)
  assert key != cost_cache.cost_key(target, draft, batch=3)


@pytest.mark.parametrize("value,want", [("auto", "auto"), ("4", 4), (3, 3), (" 2 ", 2)])
def test_parse_gamma(value, want):
  assert config_proposer.parse_gamma(value) == want


@pytest.mark.parametrize("value", ["0", "-1", "two", 0, True, 2.5])
def test_parse_gamma_rejects(value):
  with pytest.raises(ValueError, match="gamma must be 'auto' or an int >= 1"):
    config_proposer.parse_gamma(value)


def test_config_proposer_decides_plain_decoding_where_drafting_does_not_pay(tmp_path):
  """gamma 'auto' over a pinned table in which no γ pays is an explicit decision
  (`config_proposer.PlainDecoding`, with the line the scripts print), not a None; a table
  in which drafting pays gives AutoGamma over it."""
  import json
  import types

  import ml_collections

  pair = types.SimpleNamespace(prompts=[[1, 2, 3]], tokenizer=types.SimpleNamespace(eos_id=0))
  got = {}
  for name, table in (("nothing", NOTHING_PAYS), ("switching", SWITCHING)):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(table.to_dict()))
    config = ml_collections.ConfigDict(dict(gamma="auto", gamma_max=3, costs=str(path),
                                            tree="", max_new_tokens=8))
    got[name] = config_proposer.config_proposer(config, pair, directory=tmp_path,
                                                log=lambda line: None)
  assert isinstance(got["nothing"], config_proposer.PlainDecoding)
  assert "drafting does not pay" in got["nothing"].line and got["nothing"].table == NOTHING_PAYS
  assert isinstance(got["switching"], AutoGamma) and got["switching"].costs == SWITCHING
