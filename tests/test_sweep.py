"""The γ sweep: reproducible non-timing columns, separate timing columns, formulas, plots."""

import csv
import json

import numpy as np
import pytest

from configs import sweep_tiny
from specdec_jax.bench import studies, sweep, sweep_tables
from specdec_jax.decoding.results import GenerationResult


def small_config():
  c = sweep_tiny.get_config()
  c.drafts = (("trunc2", "truncate:2"),)
  c.gammas = (1, 2)
  c.temperatures = (0.0, 1.0)
  c.max_new_tokens = 12
  c.repeats = 1
  c.cost_repeats = 2
  c.batch_sizes = (4,)  # the grid's call (T=1, γ=2, 4 prompts): no extra compile
  c.batch_gamma = 2
  c.lock()
  return c


def read_csv(path):
  with open(path, newline="") as f:
    rows = list(csv.reader(f))
  return rows[0], rows[1:]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
  config = small_config()
  dirs = [tmp_path_factory.mktemp(name) for name in ("a", "b")]
  return [sweep.run_sweep(config, d, progress=False) for d in dirs], dirs


@pytest.mark.slow  # two whole sweeps, end to end (make test-all)
def test_non_timing_columns_are_byte_identical(two_runs):
  _, (a, b) = two_runs
  for name in ("results.csv", "batch.csv"):
    assert (a / name).read_bytes() == (b / name).read_bytes(), name
  ja, jb = (json.loads((d / "results.json").read_text()) for d in (a, b))
  for key in ("grid", "batch"):
    det = sweep_tables.deterministic
    assert [det(r) for r in ja[key]] == [det(r) for r in jb[key]]


@pytest.mark.slow  # two whole sweeps, end to end (make test-all)
def test_timing_columns_are_separate(two_runs):
  results, (a, _) = two_runs
  header, rows = read_csv(a / "results.csv")
  assert len(rows) == 1 * 2 * 2
  assert not [c for c in header if c.startswith("time_")]
  for col in ("seed", "gamma", "temperature", "draft", "jax_version", "flax_version",
              "numpy_version", "git_commit", "alpha", "tokens_per_step",
              "predicted_tokens_per_step", "accept_pos_1", "accept_pos_2"):
    assert col in header, col
  theader, trows = read_csv(a / "results_timing.csv")
  assert theader[:3] == list(sweep_tables.GRID_KEYS) and len(trows) == len(rows)
  assert all(c.startswith("time_") for c in theader[3:])
  for col in ("time_speedup", "time_predicted_speedup", "time_c", "time_v", "time_sd_s",
              "time_ar_s"):
    assert col in theader, col
  bheader, _ = read_csv(a / "batch_timing.csv")
  assert "time_speedup" in bheader
  gheader, _ = read_csv(a / "best_gamma.csv")
  assert gheader[:4] == ["draft_name", "temperature", "alpha_pooled", "steps"]
  assert all(c.startswith("time_") for c in gheader[4:])
  assert all(r["time_speedup"] > 0 for r in results[0]["grid"])


def test_predicted_tokens_per_step_formula():
  assert studies.expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)
  assert studies.expected_tokens_per_step(0.0, 4) == pytest.approx(1.0)
  assert studies.expected_tokens_per_step(1.0, 4) == 5.0
  assert studies.expected_tokens_per_step(0.8, 3) == pytest.approx(2.952)
  assert studies.expected_tokens_total(0.5, {0: 2, 2: 3}) == pytest.approx(2 + 3 * 1.75)
  assert studies.expected_tokens_total(float("nan"), {0: 4}) == 4.0  # nothing drafted
  # E / (γ c + v(γ+1)), and a plain step (γ = 0) costs v(1) = 1 whatever c
  assert studies.predicted_speedup(0.5, 2, c=0.25, verify_cost=1.25) == pytest.approx(1.0)
  assert studies.predicted_speedup(0.9, 0, c=0.5) == 1.0


@pytest.mark.slow  # two whole sweeps, end to end (make test-all)
def test_sweep_rows_predict_with_the_formula(two_runs):
  for row in two_runs[0][0]["grid"]:
    assert row["predicted_tokens_per_step"] == pytest.approx(
        (1 - row["alpha"] ** (row["gamma"] + 1)) / (1 - row["alpha"]))


def test_stats_by_position():
  # Row 0: a step accepting both drafts, then one rejecting the first; row 1 idles once.
  accepted = np.array([[2, 0], [1, -1]], np.int32)
  beta = np.array([[[0.9, 0.8], [0.1, 0.7]], [[0.6, 0.5], [0.0, 0.0]]], np.float32)
  result = GenerationResult(tokens=np.zeros((2, 5), np.int32), lengths=np.array([4, 2]),
                            num_steps=2, accepted=accepted, accept_prob=beta)
  s = sweep_tables.generation_stats([result], gamma=2)
  assert s["reached_by_position"] == [3, 2]
  assert s["accept_by_position"] == pytest.approx([2 / 3, 1 / 2])
  assert s["beta_by_position"] == pytest.approx([(0.9 + 0.1 + 0.6) / 3, (0.8 + 0.5) / 2])
  assert s["alpha"] == pytest.approx(result.alpha())
  assert s["acceptance_rate"] == pytest.approx(result.acceptance_rate())
  assert s["idle_fraction"] == pytest.approx(1 / 4)
  assert s["tokens_per_step"] == pytest.approx(6 / 3)
  assert s["tokens_per_step_uncut"] == pytest.approx((3 + 1 + 2) / 3)
  assert s["tokens_per_row_step"] == pytest.approx((4 / 2 + 2 / 1) / 2)
  assert s["tokens_per_loop_step"] == pytest.approx(6 / 4)


@pytest.mark.slow  # two whole sweeps, end to end (make test-all)
def test_plots_written(two_runs):
  results, (a, _) = two_runs
  for name in ("tokens_per_step.png", "speedup.png", "accept_by_position.png"):
    assert (a / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
  assert sorted(results[0]["plots"]) == sorted(str(a / n) for n in (
      "tokens_per_step.png", "speedup.png", "accept_by_position.png"))
