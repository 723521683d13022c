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

import dataclasses
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
# A belief quick to change its mind (a light prior, a narrow bound, evidence halved by each
# quiet step), so that rows switch within the 4 new tokens of the enumeration; the loop
# runs the rule it is given (`AutoGamma.rule`), and these tests pin its constants.
TEST_RULE = adaptive.BeliefRule(prior_weight=0.25, optimism=0.5, forget=0.5)
# No draft cost and a flat v(k >= 2) = 3.4: γ = 3 is the best γ >= 1 at every α, and it
# beats a plain step (score 1) iff 1 + α + α² + α³ > 3.4, i.e. α > 0.89. A fresh row's
# bound (0.85 + ...) clears it and drafts; rows whose β fall short stop (γ = 0), and some
# draft again once their evidence has faded.
SWITCHING = CostTable(c=0.0, verify_costs=(1.0, 3.4, 3.4, 3.4))
# The feature draft's β sit lower: a flat v(k >= 2) = 3.0 (α > 0.81) switches its rows.
FEATURE_SWITCHING = CostTable(c=0.0, verify_costs=(1.0, 3.0, 3.0, 3.0))
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
  tokens, γ_max (3) and `FEATURE_LAG` (8) need 18 positions."""
  target, tp, draft, dp = law_feature_pair(pair)
  return target.replace(max_seq_len=32), tp, draft.replace(max_seq_len=32), dp


def auto_spec(costs, max_new_tokens, sampling=SamplingConfig(), verifier="block",
              rule=TEST_RULE):
  """The DecodeSpec of gamma='auto' with γ_max = GAMMA_MAX, the cost table `costs` and
  the belief's constants `rule`."""
  return DecodeSpec(max_new_tokens, AutoGamma(costs, GAMMA_MAX, rule), sampling=sampling,
                    verifier=verifier)


def auto_generate(pair, prompts, *, costs, max_new_tokens, sampling=SamplingConfig(),
                  verifier="block", rule=TEST_RULE, **call):
  """speculative_generate under gamma='auto' (call: seed, row_ids)."""
  target, tp, draft, dp = pair
  return speculative_generate(Model(target, tp), Model(draft, dp), prompts,
                              spec=auto_spec(costs, max_new_tokens, sampling, verifier, rule),
                              **call)


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


# Under this table and TEST_RULE the greedy pairs' rows take γ = 0, 2 and 3 within 12
# tokens (their greedy β in {0, 1} move the belief fast).
GRADED = CostTable(c=0.05, verify_costs=(1.0, 1.7, 2.2, 2.6))


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
    ("feature", "graded", False),
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


def jitted_step_and_init(pair, prepared, max_new_tokens):
  """(the jitted speculative step, the prefill) under a prepared call's spec and draft:
  step(tp, dp, state, costs, width) plans (`step_plan`) and takes one step of that static
  width (or SKIP), as the loop runs them."""
  target = pair[0]
  spec, drafter = prepared.spec, prepared.draft

  def planned(tp, dp, state, costs, width):
    plan = decode_step.step_plan(state, drafter, spec, costs)
    return decode_step.speculative_step_fn(tp, dp, state, plan, target_config=target,
                                           draft=drafter, spec=spec, width=width)

  step = jax.jit(planned, static_argnames=("width",))
  init = functools.partial(loop.init_state_jit, target_config=target, draft=drafter,
                           gamma=GAMMA_MAX, max_new_tokens=max_new_tokens,
                           lag=spec.lag(drafter), proposer=spec.proposer)
  return step, init


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
  step, init = jitted_step_and_init(greedy_pairs["feature"], prepared, 8)
  state = init(tp, dp, prepared.tokens, prepared.prompt_len, prepared.row_keys)
  assert bool(decode_step.may_skip_draft(state, feature, jnp.zeros(1, jnp.int32)))
  for _ in range(3):
    state = step(tp, dp, state, costs, width=decode_step.SKIP)
  n = int(state.num_tokens[0])
  # ℓ_d stayed at the prompt
  assert n == 5 + 3 and int(state.draft_state.cache["length"][0]) == 4
  lagged = step(tp, dp, state, costs, width=GAMMA_MAX + 1)
  fresh = init(tp, dp, np.asarray(state.tokens[:, :n]), state.num_tokens, prepared.row_keys)
  fresh = step(tp, dp, fresh.replace(step=state.step, rule_state=state.rule_state), costs,
               width=GAMMA_MAX + 1)
  np.testing.assert_allclose(lagged.accept_prob[0, 3], fresh.accept_prob[0, 3], atol=1e-5)
  assert lagged.accept_prob[0, 3, 0] > 0
  np.testing.assert_array_equal(lagged.tokens[0, :int(lagged.num_tokens[0])],
                                fresh.tokens[0, :int(fresh.num_tokens[0])])


def final_state(pair, prompts, costs, max_new_tokens, sampling, rule=TEST_RULE):
  """The decode loop's last DecodeState of gamma 'auto' (its draft state included)."""
  target, tp, draft, dp = pair
  prepared = prepare(Model(target, tp), Model(draft, dp), prompts,
                     auto_spec(costs, max_new_tokens, sampling, rule=rule), seed=4)
  state = loop.prefill(Model(target, tp), dp, prepared)
  return loop.run_prepared(Model(target, tp), dp, state, prepared)


@pytest.mark.parametrize("kind", ["model", "feature"])
def test_plain_steps_never_run_the_draft(greedy_pairs, kind):
  """Under a table where nothing pays every step is a plain step that skips the draft:
  the tokens are greedy autoregressive decoding's, no position is drafted, and at T=1 no
  β was ever computed (β_1 > 0 wherever a draft runs). The independent draft's cache
  stays at the prompt (nothing needed it caught up); the feature draft's buffer fills
  every FEATURE_LAG skipped steps and is caught up, never running its head."""
  pair = greedy_pairs[kind]
  out = auto_generate(pair, PROMPTS, costs=NOTHING_PAYS, max_new_tokens=12, sampling=GREEDY)
  np.testing.assert_array_equal(out.tokens, greedy_autoregressive(pair).tokens)
  assert (out.gammas[out.gammas >= 0] == 0).all()
  state = final_state(pair, PROMPTS, NOTHING_PAYS, 12, SamplingConfig(temperature=1.0))
  assert not np.asarray(state.accept_prob).any()
  prompt_len = np.asarray([len(p) for p in PROMPTS])
  length = state.num_tokens - 1
  if kind == "model":
    np.testing.assert_array_equal(state.draft_state["length"], prompt_len - 1)
  else:
    behind = np.asarray(length - state.draft_state.cache["length"])
    assert (behind <= state.draft_state.features.shape[1] - 2).all()
    assert (np.asarray(state.draft_state.cache["length"]) > prompt_len - 1).all()


@pytest.mark.parametrize("kind,kinds", [
    ("model", (decode_step.SKIP, decode_step.CATCH_UP, 2, 3, 4)),
    ("feature", (decode_step.SKIP, decode_step.CATCH_UP, 2, 3, 4)),
    ("hybrid", (decode_step.SKIP, decode_step.CATCH_UP, 2, 3, 4)),
    ("ngram", (1, 2, 3, 4))])
def test_a_draft_that_falls_behind_compiles_no_width_one_step(greedy_pairs, kind, kinds):
  """Under gamma 'auto' the loop compiles one inner loop per kind (`step.step_kinds`). A
  draft with a skip lag (independent, feature, hybrid) takes SKIP (after a CATCH_UP where
  needed) on every step in which no live row proposes, so no width-1 step that runs the
  draft is compiled; a lookup (no lag) keeps width 1. A step whose widest row proposes
  k - 1 tokens takes width k."""
  target, tp, draft, dp = greedy_pairs[kind]
  prepared = prepare(Model(target, tp), Model(draft, dp), PROMPTS, auto_spec(SWITCHING, 12))
  spec, drafter = prepared.spec, prepared.draft
  assert decode_step.step_kinds(drafter, spec) == kinds
  state = loop.prefill(Model(target, tp), dp, prepared)
  rows = len(PROMPTS)
  for top, want in ((1, 2), (2, 3), (3, 4)):
    chosen = jnp.asarray([0] * (rows - 1) + [top], jnp.int32)
    plan = decode_step.step_plan(state, drafter, spec, jnp.asarray(prepared.costs))
    index = decode_step.kind_index(state, plan.replace(chosen=chosen), drafter, spec)
    assert kinds[int(index)] == want


def test_skipped_independent_draft_catches_up_exactly(greedy_pairs):
  """An independent draft skipped for more steps than one catch-up call covers is caught
  up by the loop's calls to a cache that drafts what a freshly prefilled one drafts: the
  next step's β and tokens match at T=1 (to float rounding)."""
  from specdec_jax.drafts.independent import CATCH_UP_WIDTH
  target, tp, draft, dp = greedy_pairs["model"]
  sampling = SamplingConfig(temperature=1.0)
  skipped = CATCH_UP_WIDTH + 3
  prepared = prepare(Model(target, tp), Model(draft, dp), PROMPTS[1:2],
                     auto_spec(SWITCHING, skipped + 2, sampling, block_verify), seed=5)
  spec, model_draft = prepared.spec, prepared.draft
  assert spec.lag(model_draft) == CATCH_UP_WIDTH
  costs = jnp.asarray(prepared.costs)
  step, init = jitted_step_and_init(greedy_pairs["model"], prepared, skipped + 2)
  catch_up = jax.jit(lambda s: s.replace(draft_state=model_draft.catch_up(dp, tp, s)))
  state = init(tp, dp, prepared.tokens, prepared.prompt_len, prepared.row_keys)
  for _ in range(skipped):
    state = step(tp, dp, state, costs, width=decode_step.SKIP)
  n = int(state.num_tokens[0])
  assert int(state.draft_state["length"][0]) == 4  # ℓ_d stayed at the prompt
  none = jnp.zeros(1, jnp.int32)
  drafting = jnp.full(1, GAMMA_MAX, jnp.int32)
  assert not bool(decode_step.catch_up_needed(state, model_draft, none))  # skipping: room
  calls = 0
  while bool(decode_step.catch_up_needed(state, model_draft, drafting)):
    state, calls = catch_up(state), calls + 1
  assert calls == 2 and int(state.draft_state["length"][0]) == n - 1
  lagged = step(tp, dp, state, costs, width=GAMMA_MAX + 1)
  fresh = init(tp, dp, np.asarray(state.tokens[:, :n]), state.num_tokens, prepared.row_keys)
  fresh = step(tp, dp, fresh.replace(step=state.step, rule_state=state.rule_state), costs,
               width=GAMMA_MAX + 1)
  at = skipped
  np.testing.assert_allclose(lagged.accept_prob[0, at], fresh.accept_prob[0, at], atol=1e-5)
  assert lagged.accept_prob[0, at, 0] > 0
  np.testing.assert_array_equal(lagged.tokens[0, :int(lagged.num_tokens[0])],
                                fresh.tokens[0, :int(fresh.num_tokens[0])])


def test_auto_gamma_compiles_one_loop(greedy_pairs):
  """Tables are traced inputs: other tables and seeds reuse the one compiled decode loop
  (one inner loop per call width); the jitted step (a `lax.switch` over the widths)
  compiles once too, and stepping it to the end gives the loop's tokens and γ choices.
  After every step the target cache holds exactly the emitted tokens (length =
  num_tokens - 1) and the draft's at most one fewer: the last accepted draft token, never
  fed, waits for the next step's first call."""
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
    behind = want - np.asarray(state.draft_state["length"])
    assert ((behind == 0) | (behind == 1)).all(), behind
  assert decode_step.speculative_step._cache_size() <= step_before + 1
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
  assert out.accepted[0, 0] == 0
  # Alone (batch 1), row 0's step is a plain target step: its greedy token, nothing drafted.
  alone = speculative_generate(Model(target, tp), Model(NgramDraft(2), None), prompts[:1],
                               spec=DecodeSpec(1, FixedGamma(3), sampling=GREEDY))
  assert alone.gammas[0, 0] == 0
  np.testing.assert_array_equal(alone.tokens, greedy_autoregressive(
      greedy_pairs["model"], prompts[:1], max_new_tokens=1).tokens)
  np.testing.assert_array_equal(alone.tokens[0], out.tokens[0])


def test_never_drafting_floor_counts_both_prefills_and_the_probe():
  """A free draft (no prefill, a probe as cheap as a plain step) loses nothing; the draft's
  prefill and the probe's extra cost are paid once, so they weigh less over more tokens."""
  assert studies.never_drafting_floor(10.0, 0.0, 48, 1.0) == pytest.approx(1.0)
  # P = 10, D = 3, N = 48, s = 2: 58 plain steps of work against 62
  assert studies.never_drafting_floor(10.0, 3.0, 48, 2.0) == pytest.approx(58 / 62)
  floors = [studies.never_drafting_floor(10.0, 3.0, n, 2.0) for n in (48, 480, 4800)]
  assert floors[0] < floors[1] < floors[2] < 1.0


# ------------------------------------------------------------ the choice rule

def test_choose_gamma_is_the_argmax_of_the_prediction():
  table = CostTable(c=0.07, verify_costs=(1.0, 1.07, 1.20, 1.44, 1.50))
  alphas = np.linspace(0.0, 0.99, 34)
  got = np.asarray(adaptive.choose_gamma(np.asarray(alphas, np.float32),
                                         table.as_array(4)))
  for a, g in zip(alphas, got):
    # A γ = 0 step skips the draft: a plain step, cost 1.
    scores = [1.0] + [
        studies.predicted_speedup(a, k, table.c, table.verify_costs[k]) for k in range(1, 5)]
    assert scores[g] >= max(scores) - 1e-5, (a, g, scores)
  assert got[0] == 0 and got[-1] == 4 and (np.diff(got) >= 0).all()


def test_measured_step_costs_decide_the_choice():
  """With measured s(γ), the choice is the argmax of E(α, γ) / s(γ); here s(1) is so
  dear that γ = 1 is never taken, which the modelled table of the same c, v would take."""
  v = (1.0, 1.2, 1.3, 1.4)
  measured = CostTable(c=0.05, verify_costs=v, step_costs=(1.1, 3.0, 1.6, 1.7))
  modelled = CostTable(c=0.05, verify_costs=v)
  np.testing.assert_allclose(modelled.as_array(3), [1.0, 1.25, 1.40, 1.55], rtol=1e-6)
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
def test_measure_steps_times_lookup_steps(greedy_pairs, kind, monkeypatch):
  """A hybrid's table also holds s_lookup(0..G), its steps where every row's lookup
  matches, timed in the same compiled loop; an n-gram draft's steps are all lookup steps
  (it proposes nothing elsewhere). The lookup steps' seconds are inflated 10^4-fold as
  they are timed: s_lookup(1..G) must come from those timings (a table that copied the
  draft's steps, or timed no lookup step, fails), and s_lookup(0) is s(0) (nothing is
  proposed). The harness itself raises if a row took another γ than the one it timed."""
  target, tp, draft, dp = greedy_pairs[kind]
  timed, original = [], machine_costs.timing.interleaved_seconds

  def interleaved(fns, repeats):
    seconds, results = original(fns, repeats)
    timed.append(set(seconds))
    return {k: x * (1e4 if isinstance(k, tuple) else 1.0) for k, x in seconds.items()}, results

  monkeypatch.setattr(machine_costs.timing, "interleaved_seconds", interleaved)
  table = machine_costs.measure_steps(Model(target, tp), Model(draft, dp), gamma_max=2,
                                      batch=2, sampling=GREEDY, context=8, max_new_tokens=4,
                                      repeats=2)
  assert len(table.step_costs) == 3 and all(np.isfinite(table.step_costs))
  if kind == "ngram":
    assert table.lookup_step_costs is None and timed[-1] == {"plain", 1, 2, 3}
    return
  assert timed[-1] == {"plain", 1, 2, 3, ("lookup", 2), ("lookup", 3)}
  assert len(table.lookup_step_costs) == 3 and all(np.isfinite(table.lookup_step_costs))
  assert table.lookup_step_costs[0] == table.step_costs[0]
  # 10^4 over at most STEPS_PER_CALL-fold fewer steps, and a real lookup/draft ratio
  assert all(lookup > 100 * draft for lookup, draft
             in zip(table.lookup_step_costs[1:], table.step_costs[1:]))
  assert table.loop_costs(2).shape == (2, 3)


def test_step_costs_are_timed_in_the_runs_own_loop(greedy_pairs, caplog):
  """Given a run's prompt width, max_new_tokens, eos_id and γ rule, the table times the
  programs that run then decodes with: generating afterwards compiles no prefill and no
  loop. max_new_tokens = 13 is this test's alone, so no other test has compiled these
  programs first. (Compiles are counted from JAX's log: the jit's dispatch cache may key
  a call anew, for example by its arguments' placement, without tracing or compiling
  anything.)"""
  pair = greedy_pairs["feature"]
  target, tp, draft, dp = pair
  table = machine_costs.measure_steps(
      Model(target, tp), Model(draft, dp), gamma_max=GAMMA_MAX, batch=len(PROMPTS),
      sampling=GREEDY, context=max(len(p) for p in PROMPTS), max_new_tokens=13, eos_id=None,
      rule=TEST_RULE, repeats=1)
  def compile_probe(x):  # a program compiled here for sure: the log's text is read right
    return x * 2

  with jax.log_compiles(True), caplog.at_level(logging.WARNING):
    auto_generate(pair, PROMPTS, costs=table, max_new_tokens=13, sampling=GREEDY,
                  verifier="block", rule=TEST_RULE)
    greedy_autoregressive(pair, max_new_tokens=13)
    jax.jit(compile_probe)(jnp.zeros((3, 5, 7), jnp.int8))
  compiled = [r.getMessage()[:40] for r in caplog.records
              if r.getMessage().startswith("Compiling jit(")]
  assert [m for m in compiled if "compile_probe" in m], compiled  # the positive control
  assert not [m for m in compiled if "run_steps" in m or "init_state" in m], compiled


def observe(belief, rule=adaptive.DEFAULT_RULE, *, chosen, accepted, beta, source=None):
  """rule.observe for rows that all propose (source: DRAFT unless given)."""
  rows = len(chosen)
  source = np.zeros(rows, np.int32) if source is None else np.asarray(source, np.int32)
  return rule.observe(belief, chosen=jnp.asarray(chosen), proposes=jnp.ones(rows, bool),
                      num_accepted=jnp.asarray(accepted),
                      beta=jnp.asarray(beta, jnp.float32), source=jnp.asarray(source))


def decode_rows(rule, costs, draws, rng):
  """rule.choose then rule.observe over steps, each draft accepted with probability β:
  draws float [steps,B,G] (β of each row's drafted positions per step), costs float32
  [2,G+1], every row of the DRAFT source -> (γ_b per step int [steps,B], the belief)."""
  rows, gamma_max = draws.shape[1], draws.shape[2]
  source = jnp.zeros(rows, jnp.int32)
  belief, history = adaptive.initial_belief(rows), []
  for beta in draws:
    chosen = np.asarray(rule.choose(belief, costs, source))
    history.append(chosen)
    accepted = np.cumprod(rng.random((rows, gamma_max)) < beta, axis=1).sum(axis=1)
    belief = observe(belief, rule, chosen=chosen, accepted=np.minimum(accepted, chosen),
                     beta=beta)
  return np.asarray(history), belief


def test_belief_takes_observed_positions_in_order_and_fades():
  """Row 0 proposed 3 and accepted 1: positions 1 and 2 are observed (S = 0.9·1 + 0,
  n = 0.9 + 1, the prior's weight 0.9², the bound's count m = 0.98 + 1), position 3 not;
  row 1 proposed nothing: every column fades by FORGET, which leaves its mean where it
  was and widens its bound."""
  rule = adaptive.BeliefRule(keep=0.9, forget=0.5, evidence_keep=0.98)
  start = adaptive.Belief(beta_sum=jnp.asarray([[0.0, 0.0], [1.0, 2.0]]),
                          square_sum=jnp.asarray([[0.0, 0.0], [0.8, 1.6]]),
                          count=jnp.asarray([[0.0, 0.0], [2.0, 4.0]]),
                          prior=jnp.asarray([[1.0, 1.0], [0.5, 0.5]]),
                          evidence=jnp.asarray([[0.0, 0.0], [3.0, 5.0]]))
  got = observe(start, rule, chosen=[3, 0], accepted=[1, 0],
                beta=[[1.0, 0.0, 1.0], [0.9, 0.9, 0.9]])
  np.testing.assert_allclose(got.beta_sum, [[0.9, 0.0], [0.5, 1.0]], rtol=1e-6)
  np.testing.assert_allclose(got.square_sum, [[0.9, 0.0], [0.4, 0.8]], rtol=1e-6)
  np.testing.assert_allclose(got.count, [[1.9, 0.0], [1.0, 2.0]], rtol=1e-6)
  np.testing.assert_allclose(got.prior, [[0.81, 0.5], [0.25, 0.25]], rtol=1e-6)
  np.testing.assert_allclose(got.evidence, [[1.98, 0.0], [1.5, 2.5]], rtol=1e-6)
  n0, a0 = rule.prior_weight, rule.prior[0]
  np.testing.assert_allclose(rule.mean(got)[0, 0], (0.9 + 0.81 * n0 * a0) / (1.9 + 0.81 * n0),
                             rtol=1e-6)
  np.testing.assert_allclose(rule.mean(got)[1], rule.mean(start)[1], rtol=1e-6)
  assert (rule.bound(got)[1] > rule.bound(start)[1]).all()
  mean = rule.mean(got)[0, 0]
  np.testing.assert_allclose(  # the width stands on m, not on n
      rule.bound(got)[0, 0], mean + np.sqrt(mean * (1 - mean) / (1.98 + 0.81 * n0)), rtol=1e-5)


def test_fresh_rows_draft_and_rejected_rows_stop_then_probe_again():
  """Under a table whose threshold (α > 0.72 for γ = 3) is above the prior mean 0.5, a
  fresh row drafts on its bound; a row whose drafts are all rejected stops within a few
  steps, and probes again once its evidence has faded (FORGET); a row whose drafts are
  accepted keeps drafting. With no optimism a fresh row never drafts at all (the negative
  control of the first claim)."""
  costs = jnp.asarray(CostTable(c=0.0, verify_costs=(1.0, 2.7, 2.7, 2.7)).loop_costs(3))
  source = jnp.zeros(2, jnp.int32)
  rule = adaptive.DEFAULT_RULE
  belief = adaptive.initial_belief(2)
  first = rule.choose(belief, costs, source)
  np.testing.assert_array_equal(first, [3, 3])
  assert int(adaptive.BeliefRule(optimism=0.0).choose(belief, costs, source)[0]) == 0
  history = []
  for _ in range(200):
    chosen = rule.choose(belief, costs, source)
    history.append(np.asarray(chosen))
    accepted = np.where(np.asarray(chosen) > 0, [0, 3], 0)
    beta = np.asarray([[0.1, 0.1, 0.1], [0.95, 0.95, 0.95]])
    belief = observe(belief, rule, chosen=np.asarray(chosen), accepted=accepted, beta=beta)
  history = np.asarray(history)  # [steps, 2]
  rejected, accepted_row = history[:, 0], history[:, 1]
  assert (accepted_row == 3).all()
  stop = int(np.argmax(rejected == 0))
  assert 0 < stop <= 5
  probes = np.flatnonzero((rejected[1:] > 0) & (rejected[:-1] == 0))
  assert len(probes) >= 1  # it drafts again
  assert probes[0] >= stop + 10  # but rarely: long plain runs between probes
  assert (np.diff(probes) >= 10).all()


def test_rows_near_the_threshold_stop_once_their_evidence_builds():
  """The bound's width stands on evidence discounted by EVIDENCE_KEEP (about the last 50
  positions), not on the mean's count (about the last 10 here: keep = 0.9, the mean's
  memory fixed): under this table no γ pays
  below α ≈ 0.62, and a row whose every position has β = 0.5 probes while its evidence is
  thin, then stops, probing again only now and then as its evidence fades (FORGET). The
  negative control takes the width from the mean's own count (evidence_keep = keep): that
  count never passes 1 / (1 - KEEP) = 10, the bound stays near 0.66, and the row probes
  γ = 3 on every step at a loss (docs/background.md#gamma). A row at β = 0.3 stops under
  both. β = 0.5 at every position stands for Bernoulli draws of mean 0.5 here (T = 0's
  β are 0 or 1): the width takes α̂(1 - α̂) (observed_spread=False), whose observed spread
  a constant β would not have (`test_bound_width_from_the_observed_spread`)."""
  table = CostTable(c=None, verify_costs=None, step_costs=(1.0, 1.66, 2.0, 2.2, 3.4))
  costs = jnp.asarray(table.loop_costs(4))
  assert table.best_gamma(0.5) == 0 and table.best_gamma(0.6) == 0
  assert table.best_gamma(0.65) > 0
  source = jnp.zeros(2, jnp.int32)
  beta = np.asarray([[0.5] * 4, [0.3] * 4])

  def run(rule, steps=100):
    belief = adaptive.initial_belief(2)
    history = []
    for _ in range(steps):
      chosen = rule.choose(belief, costs, source)
      history.append(np.asarray(chosen))
      belief = observe(belief, rule, chosen=np.asarray(chosen),
                       accepted=np.minimum(np.asarray(chosen), 2), beta=beta)
    return np.asarray(history), belief  # [steps, 2]

  # the mean over the last 10 positions whatever the spread (keep 0.9, noise_memory off)
  rule = adaptive.BeliefRule(observed_spread=False, keep=0.9, noise_memory=False)
  history, belief = run(rule)
  stop = int(np.argmax(history[:, 0] == 0))
  assert 0 < stop <= 15  # it stops
  assert (history[stop:, 0] > 0).mean() <= 0.2  # probing again now and then
  assert (history[-50:, 1] > 0).mean() <= 0.1
  assert np.asarray(rule.bound_weight(belief))[0, 0] <= 1 / (1 - rule.evidence_keep) + 1e-4
  capped = dataclasses.replace(rule, evidence_keep=rule.keep)
  history, belief = run(capped)
  assert (history[:, 0] == 3).all()  # never stops
  assert (history[-50:, 1] > 0).mean() <= 0.1
  assert np.asarray(capped.bound_weight(belief))[0, 0] <= 1 / (1 - capped.keep) + 1e-4
  mean = np.asarray(capped.mean(belief))[0, 0]
  assert np.asarray(capped.bound(belief))[0, 0] >= mean + np.sqrt(
      mean * (1 - mean) * (1 - capped.keep)) - 1e-4


def test_bound_width_from_the_observed_spread():
  """The bound's width takes σ̂², the spread of the observed β about their mean. Where
  every β is 0 or 1 (T = 0) that is α̂(1 - α̂), so the rule chooses as the Bernoulli width
  does (observed_spread=False), step for step. Where β is a probability that hardly varies
  (T > 0; here uniform on [0.35, 0.45]), σ̂² falls far below α̂(1 - α̂): a row below the
  threshold (no γ pays below α ≈ 0.62) stops probing after fewer drafting steps than under
  the Bernoulli width, which is the negative control."""
  table = CostTable(c=None, verify_costs=None, step_costs=(1.0, 1.66, 2.0, 2.2, 3.4))
  costs = jnp.asarray(table.loop_costs(4))
  bernoulli = adaptive.BeliefRule(observed_spread=False)
  rng = np.random.default_rng(0)

  def run(rule, draw, steps=60):
    return decode_rows(rule, costs, draw(steps), rng)

  rows = np.asarray([0.3, 0.5, 0.7, 0.9])[:, None]
  coins = rng.random((60, 4, 4)) < rows  # T = 0: every β is 0 or 1
  a, belief_a = run(adaptive.DEFAULT_RULE, lambda n: coins.astype(np.float32))
  rng = np.random.default_rng(0)
  b, belief_b = run(bernoulli, lambda n: coins.astype(np.float32))
  np.testing.assert_array_equal(a, b)
  mean = np.asarray(adaptive.DEFAULT_RULE.mean(belief_a))
  np.testing.assert_allclose(adaptive.DEFAULT_RULE.variance(belief_a), mean * (1 - mean),
                             atol=1e-5)
  close = rng.uniform(0.35, 0.45, (60, 4, 4)).astype(np.float32)
  a, belief_a = run(adaptive.DEFAULT_RULE, lambda n: close)
  b, belief_b = run(bernoulli, lambda n: close)
  mean = np.asarray(adaptive.DEFAULT_RULE.mean(belief_a))[:, 0]
  assert (np.asarray(adaptive.DEFAULT_RULE.variance(belief_a))[:, 0]
          < 0.35 * mean * (1 - mean)).all()
  drafted, drafted_bernoulli = (a > 0).sum(), (b > 0).sum()
  assert 0 < drafted < 0.6 * drafted_bernoulli
  assert (a[-30:] > 0).mean() <= 0.1  # it has stopped, bar a probe now and then


def test_spread_within_beta_from_observed_positions_alone():
  """σ̂² = α̂(1 - α̂) less the spread within each observed β (β(1 - β), 0 for a 0/1 draw),
  averaged over the observed positions alone: the prior's pseudo-positions carry a mean,
  not a spread. After 3 positions at β = 0.4 exactly, nothing varies but the prior's pull
  on the mean, so σ̂² is near 0; with the prior counted as 0/1 draws (the negative control,
  evidence_spread=False) it keeps a third of the Bernoulli spread. At T = 0 the two are
  the same rule, step for step; at T > 0, under step costs where no γ pays below α ≈ 0.49,
  rows at α 0.3..0.45 stop probing sooner."""
  prior_spread = adaptive.BeliefRule(evidence_spread=False)
  belief = adaptive.initial_belief(1)
  for _ in range(3):
    belief = observe(belief, chosen=[1], accepted=[0], beta=[[0.4]])
  mean = float(adaptive.DEFAULT_RULE.mean(belief)[0, 0])
  assert 0.4 < mean < 0.5
  bernoulli = mean * (1 - mean)
  assert float(adaptive.DEFAULT_RULE.observed_variance(belief)[0, 0]) < 0.05 * bernoulli  # 0.02
  assert float(prior_spread.observed_variance(belief)[0, 0]) > 0.3 * bernoulli  # 0.38
  costs = jnp.asarray([[1.01, 1.51, 1.73, 1.82, 2.29]] * 2, jnp.float32)

  def run(rule, draws):
    return decode_rows(rule, costs, draws, np.random.default_rng(1))[0]

  rng = np.random.default_rng(0)
  coins = (rng.random((40, 4, 4)) < np.asarray([0.3, 0.5, 0.7, 0.9])[:, None])
  np.testing.assert_array_equal(run(adaptive.DEFAULT_RULE, coins.astype(np.float32)),
                                run(prior_spread, coins.astype(np.float32)))
  sampled = (rng.uniform(-0.05, 0.05, (40, 4, 4))
             + np.asarray([0.3, 0.35, 0.4, 0.45])[:, None]).astype(np.float32)
  drafted = (run(adaptive.DEFAULT_RULE, sampled) > 0).sum()
  drafted_prior_spread = (run(prior_spread, sampled) > 0).sum()
  assert 4 <= drafted < 0.8 * drafted_prior_spread  # 14 against 28


def test_mean_memory_from_the_observed_spread():
  """The mean's discount k = 1 - MEMORY_GAIN / sqrt(ρ), ρ the observed spread of β against
  Bernoulli draws of its mean (docs/background.md#gamma). At T = 0 (β 0 or 1) ρ = 1 and k
  is KEEP, about the last 20 positions. Where β hardly varies (T > 0), ρ is small and the
  mean follows a change of level faster: after 30 positions at β near 0.8 and then 8 near
  0.4, it has moved further towards 0.4 than under a memory fixed at KEEP (the negative
  control, noise_memory=False)."""
  rng = np.random.default_rng(0)
  coins = (rng.random((40, 1)) < 0.7).astype(np.float32)
  belief = adaptive.initial_belief(1)
  for beta in coins:
    belief = observe(belief, chosen=[1], accepted=[int(beta[0])], beta=[beta])
  np.testing.assert_allclose(adaptive.DEFAULT_RULE.mean_keep(belief)[0, 0], adaptive.KEEP,
                             rtol=1e-5)
  levels = np.concatenate([rng.uniform(0.75, 0.85, 30), rng.uniform(0.35, 0.45, 8)])
  fixed = adaptive.BeliefRule(noise_memory=False)
  means = {}
  for rule in (adaptive.DEFAULT_RULE, fixed):
    belief = adaptive.initial_belief(1)
    for beta in levels:
      belief = observe(belief, rule, chosen=[1], accepted=[0], beta=[[beta]])
    means[rule.noise_memory] = float(rule.mean(belief)[0, 0])
    if rule.noise_memory:
      keep = float(rule.mean_keep(belief)[0, 0])
      assert keep == pytest.approx(1 - (1 - adaptive.KEEP) / np.sqrt(adaptive.MIN_SPREAD))
    else:
      assert float(rule.mean_keep(belief)[0, 0]) == pytest.approx(adaptive.KEEP)
  assert means[True] < means[False] - 0.04
  assert 0.4 < means[True] < 0.65


def test_a_probe_that_cannot_pay_is_not_taken():
  """Under step costs where drafting pays only at α near 1 (γ = 4 needs α > 0.9), a row
  whose prior has faded to f = 0.7 over plain steps has a bound (0.92) at which a probe of
  γ = 4 pays, but even a perfect probe would leave its mean at 0.89, below the threshold:
  the rule takes a plain step where the bound alone would probe (the negative control,
  lookahead=False). Once the prior has faded away, the same probe could make the row
  draft, and the rule probes again."""
  costs = jnp.asarray([[1.0, 3.7, 3.15, 3.6, 4.13]] * 2, jnp.float32)
  source = jnp.zeros(1, jnp.int32)

  def faded_to(f):
    return adaptive.Belief(beta_sum=jnp.zeros((1, 2)), square_sum=jnp.zeros((1, 2)),
                           count=jnp.zeros((1, 2)),
                           evidence=jnp.zeros((1, 2)),
                           prior=jnp.full((1, 2), f))
  assert int(adaptive.DEFAULT_RULE.choose(faded_to(0.7), costs, source)[0]) == 0
  assert int(adaptive.BeliefRule(lookahead=False).choose(faded_to(0.7), costs, source)[0]) == 4
  assert int(adaptive.DEFAULT_RULE.choose(faded_to(1e-3), costs, source)[0]) == 4
  # where drafting pays at the prior's mean already, nothing changes: a fresh row drafts
  cheap = jnp.asarray([[1.0, 1.1, 1.2, 1.3, 1.4]] * 2, jnp.float32)
  assert int(adaptive.DEFAULT_RULE.choose(adaptive.initial_belief(1), cheap, source)[0]) > 0


def test_gamma_per_source():
  """Each row's observed β go to its step's source column only, and γ is chosen on that
  column and that source's step costs."""
  belief = adaptive.initial_belief(2)
  np.testing.assert_allclose(adaptive.DEFAULT_RULE.mean(belief), [adaptive.ALPHA_PRIOR] * 2)
  got = observe(belief, chosen=[1, 2], accepted=[0, 1], beta=[[1.0, 1.0], [0.0, 1.0]],
                source=[adaptive.LOOKUP, adaptive.DRAFT])
  np.testing.assert_allclose(got.count[0], [0.0, 1.0])
  np.testing.assert_allclose(got.count[1], [1 + adaptive.KEEP, 0.0], rtol=1e-6)
  np.testing.assert_allclose(got.beta_sum[1], [1.0, 0.0], rtol=1e-6)
  costs = np.asarray([[1.0, 9.0, 9.0], [1.0, 1.2, 1.3]], np.float32)
  sure = adaptive.Belief(beta_sum=jnp.full((2, 2), 90.0), square_sum=jnp.full((2, 2), 90.0),
                         count=jnp.full((2, 2), 100.0),
                         evidence=jnp.full((2, 2), 100.0),
                         prior=jnp.zeros((2, 2)))
  chosen = adaptive.DEFAULT_RULE.choose(sure, costs, jnp.asarray([adaptive.DRAFT,
                                                                  adaptive.LOOKUP]))
  np.testing.assert_array_equal(chosen, [0, 2])
  table = CostTable(c=0.0, verify_costs=(1.0, 1.5, 2.0), step_costs=(1.0, 9.0, 9.0),
                    lookup_step_costs=(1.0, 1.2, 1.3))
  np.testing.assert_allclose(table.loop_costs(2), costs)
  np.testing.assert_allclose(CostTable(c=0.0, verify_costs=(1.0, 1.5, 2.0)).loop_costs(1),
                             [[1.0, 1.5]] * 2)
  with pytest.raises(ValueError, match="lookup_step_costs needs step_costs"):
    CostTable(c=0.0, verify_costs=(1.0, 1.5), lookup_step_costs=(1.0, 1.2))
  with pytest.raises(ValueError, match="lookup_step_costs has 1 entries"):
    CostTable(c=0.0, verify_costs=(1.0, 1.5), step_costs=(1.0, 1.2), lookup_step_costs=(1.0,))


def test_gamma_histogram_and_widths():
  assert adaptive.gamma_histogram(np.asarray([[0, 2, -1], [2, 2, 4]])) == {0: 1, 2: 3, 4: 1}
  assert AutoGamma(SWITCHING, 3).call_widths(False) == (1, 2, 3, 4)
  assert FixedGamma(3).call_widths(True) == (1, 4)
  assert FixedGamma(3).call_widths(False) == (4,)
  assert int(adaptive.width_index((1, 2, 3, 4), np.asarray([0, 2, 1]))) == 2


@pytest.mark.parametrize("change,match", [
    (dict(costs=None), "gamma='auto' needs a cost table"),
    (dict(gamma=2), "a cost table and a gamma rule are used with gamma='auto' only"),
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


def test_config_rule_takes_the_configs_prior_for_the_draft_source():
  """config.gamma_prior replaces the default rule's prior mean of the draft source (0 keeps
  the default), and a row under a high prior keeps drafting through two early rejections
  where the default rule stops: the pair-level prior's whole purpose."""
  import ml_collections

  from specdec_jax.gamma.adaptive import ALPHA_PRIOR, DEFAULT_RULE, DRAFT, LOOKUP

  assert config_proposer.config_rule(ml_collections.ConfigDict(dict(gamma="auto"))) \
      is DEFAULT_RULE
  assert config_proposer.config_rule(ml_collections.ConfigDict(dict(gamma_prior=0.0))) \
      is DEFAULT_RULE
  rule = config_proposer.config_rule(ml_collections.ConfigDict(dict(gamma_prior=0.8)))
  assert rule.prior[DRAFT] == 0.8 and rule.prior[LOOKUP] == ALPHA_PRIOR[LOOKUP]
  assert rule.keep == DEFAULT_RULE.keep and rule.forget == DEFAULT_RULE.forget
  costs = jnp.asarray(np.stack([[1.0, 1.5, 1.8, 2.07], [1.0, 1.5, 1.8, 2.07]]), jnp.float32)
  source = jnp.zeros((1,), jnp.int32)
  chosen = {}
  for name, r in (("default", DEFAULT_RULE), ("prior", rule)):
    state = r.init(1)
    for _ in range(2):  # two steps, each rejecting its first draft
      g = r.choose(state, costs, source)
      state = r.observe(state, chosen=g, proposes=g > 0, num_accepted=jnp.zeros_like(g),
                        beta=jnp.zeros((1, 3), jnp.float32), source=source)
    chosen[name] = int(r.choose(state, costs, source)[0])
  assert chosen["default"] == 0 and chosen["prior"] > 0, chosen


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
