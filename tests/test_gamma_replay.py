"""Offline replay of γ rules (`gamma_replay`): the greedy trace agrees with the decode
loop's own accepted counts, and the replay's arithmetic on hand-made traces."""

import dataclasses
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from helpers import GREEDY, noise_params, speculative, tiny_config, tiny_model
from specdec_jax.drafts.hybrid import HybridDraft
from specdec_jax.decoding.spec import DecodeSpec, FixedGamma
from specdec_jax.gamma import adaptive, gamma_replay
from specdec_jax.models.model import Model
from specdec_jax.models.sampling import SamplingConfig

PROMPTS = [[1, 2, 3, 1, 2], [4, 5, 6, 7, 8], [10, 11, 10, 11]]


@pytest.fixture(scope="module")
def pair():
  """test_hybrid's greedy pair: a 3-layer target whose greedy text loops, a 1-layer
  feature draft, a 2-token lookup."""
  target = tiny_config(vocab=32, layers=3, width=32, max_seq_len=64)
  feature = tiny_config(vocab=32, layers=1, width=16, max_seq_len=64, tie_embeddings=False,
                        feature_layers=(1, 3), feature_width=32)
  return (target, tiny_model(target, 0, factor=6.0), HybridDraft(feature, 2, 2),
          tiny_model(feature, 1, factor=3.0))


@pytest.mark.parametrize("kind", ["hybrid", "independent",
                                  pytest.param("feature", marks=pytest.mark.slow)])
def test_trace_depths_are_the_loops_accepted_counts(pair, kind):
  """Greedy decoding with a fixed γ accepts min(depth[ℓ], γ) at each step's start ℓ."""
  target, tp, hybrid, dp = pair
  draft = hybrid if kind == "hybrid" else hybrid.inner.config  # the feature ModelConfig
  if kind == "independent":  # the target's config with its weights perturbed: some misses
    draft = target
    dp = jax.tree_util.tree_map(lambda x, n: x + 0.02 * n, tp, noise_params(target, 3, 1.0))
  gamma, new = 3, 16
  hits = misses = lookups = 0
  for prompt in PROMPTS:
    trace = gamma_replay.greedy_trace(tp, target, dp, draft, prompt, max_new_tokens=new,
                                      depth=gamma)
    out = speculative((target, tp, draft, dp), [prompt], gamma=gamma, max_new_tokens=new,
                      sampling=GREEDY)
    at = 0
    for accepted in out.accepted[0][out.accepted[0] >= 0]:
      if at + accepted + 1 >= new:  # the last step may be cut at max_new_tokens
        break
      assert accepted == min(trace.depth[at], gamma), (prompt, at)
      at += accepted + 1
    hits += int(trace.hit.sum())
    misses += int((~trace.hit).sum())
    lookups += int(trace.lookup.sum())
  assert hits > 0 and misses > 0
  assert (lookups > 0) == (kind == "hybrid")


def test_replay_arithmetic():
  hit = np.asarray([[1, 1, 0], [0, 0, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0],
                    [0, 0, 0], [0, 0, 0]], bool)
  trace = gamma_replay.GreedyTrace(hit=hit, lookup=np.zeros(7, bool))
  np.testing.assert_array_equal(trace.depth, [2, 0, 3, 1, 0, 0, 0])
  costs = np.asarray([[1.0, 1.5, 2.0, 2.5]] * 2)
  # fixed γ = 2 from start 0: accepts 2 (3 tokens, at 3), then 1 (2 tokens, at 5),
  # then 0 (1 token, at 6), then 0 (1 token): 7 tokens for 4 steps of cost 2
  got = gamma_replay.replay(trace, gamma_replay.Rule(fixed=2), costs)
  assert got["tokens"] == 7 and got["steps"] == 4 and got["cost"] == 8.0
  assert got["speedup"] == pytest.approx(7 / 8)
  # nothing pays: every step plain, one token per unit cost
  flat = np.asarray([[1.0, 5.0, 5.0, 5.0]] * 2)
  got = gamma_replay.replay(trace, gamma_replay.Rule(), flat)
  assert got["gammas"] == {0: 7} and got["speedup"] == 1.0
  # the oracle takes γ = depth where drafting pays: 3 tokens for 2.0, 4 for 2.5, 2 for 1.5
  got = gamma_replay.replay(trace, gamma_replay.Rule(oracle=True), costs)
  assert got["gammas"] == {2: 1, 1: 1, 0: 2} and got["tokens"] == 7
  with pytest.raises(ValueError, match="costs cover gamma up to 4"):
    gamma_replay.replay(trace, gamma_replay.Rule(), np.ones((2, 5)))


@dataclasses.dataclass(frozen=True)
class DraftsAfter:
  """A γ rule for the test: γ = 2 from the row's `wait`-th step on, where s(2) < 2 plain
  steps in the costs it is shown, else 0 (its state counts the row's steps)."""

  wait: int = 9

  def init(self, batch):
    return jnp.zeros((batch,), jnp.int32)

  def choose(self, state, costs, source):
    return jnp.where((state >= self.wait) & (jnp.asarray(costs)[source, 2] < 2.0), 2, 0)

  def observe(self, state, **step):
    return state + 1

  def call_widths(self, gamma_max):
    return tuple(range(1, gamma_max + 2))


def test_catch_up_is_charged_when_the_draft_resumes():
  """An independent draft skipped for b tokens feeds them in ceil(b / W) calls before it
  next drafts: the replay adds their cost to that step, and a catch-up-aware rule is shown
  it. A fixed γ never skips, so it owes nothing (the negative control)."""
  hit = np.zeros((12, 2), bool)
  hit[9:] = True  # from the last three starts both drafts hit
  trace = gamma_replay.GreedyTrace(hit=hit, lookup=np.zeros(12, bool))
  catch_up = gamma_replay.CatchUp(width=4, cost=0.5)
  assert [catch_up.owed(b) for b in (0, 1, 4, 5, 9)] == [0.0, 0.5, 0.5, 1.0, 1.5]
  costs = np.asarray([[1.0, 1.4, 1.6]] * 2)
  fixed = gamma_replay.replay(trace, gamma_replay.Rule(fixed=2), costs, catch_up=catch_up)
  assert fixed["catch_up"] == 0.0
  assert fixed["cost"] == gamma_replay.replay(trace, gamma_replay.Rule(fixed=2), costs)["cost"]
  # 9 plain steps, then γ = 2 after 9 skipped tokens: ceil(9 / 4) = 3 calls of 0.5
  rule = gamma_replay.Rule(DraftsAfter())
  uncounted = gamma_replay.replay(trace, rule, costs)
  counted = gamma_replay.replay(trace, rule, costs, catch_up=catch_up)
  assert uncounted["sequence"] == counted["sequence"] == [0] * 9 + [2]
  assert uncounted["cost"] == pytest.approx(9 * 1.0 + 1.6)
  assert counted["catch_up"] == 1.5
  assert counted["cost"] == pytest.approx(9 * 1.0 + 1.6 + 1.5)
  # shown s(2) + 1.5 = 3.1, the aware rule stays plain; so does the oracle, which knows
  # the true costs (3 tokens for 3.1 against 1 for 1.0)
  aware = gamma_replay.replay(trace, dataclasses.replace(rule, catch_up_aware=True), costs,
                              catch_up=catch_up)
  assert aware["sequence"] == [0] * 12 and aware["catch_up"] == 0.0
  oracle = gamma_replay.replay(trace, gamma_replay.Rule(oracle=True), costs, catch_up=catch_up)
  assert oracle["sequence"] == [0] * 12
  assert gamma_replay.replay(trace, gamma_replay.Rule(oracle=True), costs)["sequence"] == (
      [0] * 9 + [2])


def test_lookup_rows_use_their_own_costs_and_estimate():
  """A row whose lookup matches chooses on the lookup's α̂ and step costs."""
  hit = np.ones((6, 3), bool)
  trace = gamma_replay.GreedyTrace(hit=hit, lookup=np.ones(6, bool))
  costs = np.asarray([[1.0, 9.0, 9.0, 9.0], [1.0, 1.2, 1.3, 1.4]])
  assert gamma_replay.replay(trace, gamma_replay.Rule(), costs)["gammas"] == {3: 2}
  assert gamma_replay.replay(trace, gamma_replay.Rule(), costs[::-1])["gammas"] == {0: 6}


def test_sampled_replay_accepts_with_probability_beta():
  """A fixed γ walked over a trace whose every β is 0.6 gives E(0.6, γ) / s(γ) tokens per
  plain-step cost (Leviathan et al. §3), 1.96 / 1.8 at γ = 2; with β = 1 every draft is
  accepted, 3 / 1.8 (what a walk that ignored β would give at 0.6: the negative control).
  Over 4 × 200 replicates of 400 tokens the estimate's standard error is about 0.1%; 2% is
  some 20 of them away (false failures: none in practice; the seed is fixed)."""
  costs = np.asarray([[1.0, 1.5, 1.8]] * 2)
  traces = [gamma_replay.SampledTrace(beta=np.full(50, 0.6)) for _ in range(4)]
  got = gamma_replay.replay_sampled(traces, gamma_replay.Rule(fixed=2), costs,
                                    max_new_tokens=400, replicates=200)
  for row in got:
    assert row["speedup"] == pytest.approx(1.96 / 1.8, rel=0.02)
    assert row["drafting_steps"] == row["steps"]
  sure = gamma_replay.replay_sampled([gamma_replay.SampledTrace(beta=np.ones(9))],
                                     gamma_replay.Rule(fixed=2), costs, max_new_tokens=300,
                                     replicates=2)
  assert sure[0]["speedup"] == pytest.approx(3 / 1.8)
  with pytest.raises(ValueError, match="no oracle"):
    gamma_replay.replay_sampled(traces, gamma_replay.Rule(oracle=True), costs,
                                max_new_tokens=10, replicates=1)


def test_sampled_replay_of_rows_below_the_threshold():
  """No γ pays below α ≈ 0.62 under this table. Rows whose β hardly varies about 0.4 (a
  sampled decode's) take few drafting steps under the default rule, whose bound's width
  takes the observed spread, and decode at nearly a plain step's cost; under the
  Bernoulli width (the negative control) they probe for longer. A trace of 0s and 1s has
  the Bernoulli spread, 1; a constant one, 0."""
  costs = np.asarray([[1.0, 1.66, 2.0, 2.2, 3.4]] * 2)
  rng = np.random.default_rng(0)
  traces = [gamma_replay.SampledTrace(beta=rng.uniform(0.35, 0.45, 60)) for _ in range(3)]
  spread = dict(replicates=32, max_new_tokens=64)
  auto = gamma_replay.replay_sampled(traces, gamma_replay.Rule(), costs, **spread)
  wide = gamma_replay.replay_sampled(
      traces, gamma_replay.Rule(adaptive.BeliefRule(observed_spread=False)), costs, **spread)
  for a, b in zip(auto, wide):
    assert 0 < a["drafting_steps"] < 0.7 * b["drafting_steps"]
    assert a["speedup"] > b["speedup"]
  assert gamma_replay.SampledTrace(beta=np.asarray([0.0, 1.0] * 5)).spread == pytest.approx(1.0)
  assert gamma_replay.SampledTrace(beta=np.full(8, 0.4)).spread == pytest.approx(0.0, abs=1e-9)


def test_sampled_trace_is_the_loops_beta_at_reached_positions(pair):
  """`sampled_trace` keeps the loop's own β of every position a fixed-γ decode reached,
  in order: as many as the steps' min(accepted + 1, γ)."""
  target, tp, hybrid, dp = pair
  feature = hybrid.inner.config
  sampling = SamplingConfig(temperature=1.0)
  spec = DecodeSpec(12, FixedGamma(3), sampling=sampling)
  trace = gamma_replay.sampled_trace(Model(target, tp), Model(feature, dp), PROMPTS[1],
                                     spec=spec, seed=3)
  out = speculative((target, tp, feature, dp), [PROMPTS[1]], gamma=3, max_new_tokens=12,
                    sampling=sampling, seed=3)
  accepted = out.accepted[0][out.accepted[0] >= 0]
  assert trace.beta.size == int(np.minimum(accepted + 1, 3).sum())
  np.testing.assert_allclose(trace.beta, out.accept_prob[0][out.reached()[0]])
  assert ((trace.beta >= 0) & (trace.beta <= 1 + 1e-6)).all()


STUDY_RULES = """
import numpy as np
import gamma_policy_study as study
from specdec_jax.gamma import gamma_replay
hit = np.tile(np.asarray([[1, 1, 1], [0, 0, 0], [1, 0, 0], [0, 0, 0]], bool), (6, 1))
trace = gamma_replay.GreedyTrace(hit=hit, lookup=np.arange(24) % 3 == 0)
costs = np.asarray([[1.0, 1.6, 1.9, 2.2]] * 2)
for name, (rule, _) in study.rules(3).items():
  got = gamma_replay.replay(trace, rule, costs)
  print(name, got["tokens"], got["steps"], round(got["cost"], 6), sorted(got["gammas"]))
"""


def test_every_rule_of_the_policy_study_replays():
  """scripts/gamma_policy_study.py's rules, each replayed on a hand-made trace (in a
  process of its own: the script defines its command-line flags on import). Its probe-1
  rule, a rule defined in the script, probes with one draft where the default rule
  drafts three."""
  repo = pathlib.Path(__file__).resolve().parent.parent
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "scripts")]),
         "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-c", STUDY_RULES], cwd=repo, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  got = {line.split()[0]: line.split()[1:] for line in proc.stdout.strip().splitlines()}
  assert {"auto", "short-width", "probe-1", "probe-2", "fixed-3", "oracle"} <= set(got)
  # every 4th start is a run of 3 hits, the others miss at once or after one: γ = 3 from
  # start 0 lands on such a run every time, 4 tokens for s(3) = 2.2, and so does the
  # oracle (4 / 2.2 beats 3 / 1.9, 2 / 1.6 and 1 / 1)
  for name in ("fixed-3", "oracle"):
    assert got[name][:3] == ["24", "6", "13.2"], (name, got[name])
  def gammas(name):
    return {int(g.strip("[],")) for g in got[name][3:]}
  assert gammas("fixed-3") == gammas("oracle") == {3}
  assert min(gammas("auto")) == 3 and 1 in gammas("probe-1")
