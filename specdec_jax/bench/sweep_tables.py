"""The sweep's statistics, result files and text tables (`specdec_jax.bench.sweep`).

Statistics: `generation_stats` of speculative results (α, acceptance, tokens/step,
per-position acceptance), `best_gammas` per (draft, T). Files: results.csv /
batch.csv (every column not prefixed `time_`: byte-identical across runs),
results_timing.csv / batch_timing.csv / best_gamma.csv (the `time_` columns, keyed by
`GRID_KEYS` / `BATCH_KEYS`), results.json (both) and the plots. Tables: `summary_table`
(one line per cell), `domain_tables` (per prompt-set domain).
"""

from __future__ import annotations

import itertools
import math
import pathlib
from typing import Sequence

import numpy as np

from specdec_jax.bench import prompt_sets, studies
from specdec_jax.io.atomic import atomic_save, atomic_write_csv, atomic_write_json
from specdec_jax.decoding.results import GenerationResult, reached_positions

GRID_KEYS = ("draft_name", "temperature", "gamma")
BATCH_KEYS = ("draft_name", "temperature", "gamma", "batch")


# --------------------------------------------------------------------------- statistics

def position_stats(accepted: np.ndarray, accept_prob: np.ndarray, gamma: int,
                   gammas: np.ndarray | None = None) -> dict:
  """Per block position j (0-based), over live steps: how often it was proposed and
  reached (j < γ_b, n >= j), accepted (n > j), and Σβ where reached.

  accepted [B,steps] (-1 where idle), accept_prob [B,steps,G], gammas [B,steps] (the γ_b
  each step proposed; None: every step proposed G).
  """
  reached = reached_positions(accepted, gamma, gammas)
  took = reached & (np.arange(gamma) < accepted[..., None])
  return dict(reached=reached.sum((0, 1)), accepted=took.sum((0, 1)),
              beta=np.where(reached, accept_prob, 0.0).sum((0, 1), dtype=np.float64))


def generation_stats(results: Sequence[GenerationResult], gamma: int) -> dict:
  """Deterministic statistics of one or more speculative calls (rows pooled)."""
  lengths = np.concatenate([r.lengths for r in results])
  row_steps = sum(int(r.steps_per_row.sum()) for r in results)
  loop_row_steps = sum(r.accepted.size for r in results)
  idle = sum(int((r.accepted < 0).sum()) for r in results)
  pos = [position_stats(r.accepted, r.accept_prob, gamma, r.gammas) for r in results]
  reached = sum(p["reached"] for p in pos)
  accepted = sum(p["accepted"] for p in pos)
  beta = sum(p["beta"] for p in pos)
  total_reached = int(reached.sum())
  alpha = float(beta.sum() / total_reached) if total_reached else math.nan
  tokens = int(lengths.sum())
  uncut = sum(int((r.accepted[r.accepted >= 0] + 1).sum()) for r in results)  # Σ (n + 1)
  per_row = [int(l) / int(s) for r in results for l, s in zip(r.lengths, r.steps_per_row) if s]
  row_alpha = _prompt_alphas(results)
  with np.errstate(invalid="ignore", divide="ignore"):
    return dict(
        rows=int(lengths.size), tokens=tokens,
        loop_steps=sum(r.num_steps for r in results), row_steps=row_steps,
        idle_fraction=idle / loop_row_steps if loop_row_steps else math.nan,
        acceptance_rate=int(accepted.sum()) / total_reached if total_reached else math.nan,
        alpha=alpha,
        alpha_ci95=_ci95(row_alpha[~np.isnan(row_alpha)]),
        tokens_per_step=tokens / row_steps if row_steps else math.nan,
        tokens_per_step_uncut=uncut / row_steps if row_steps else math.nan,
        predicted_tokens_per_step=studies.expected_tokens_per_step(alpha, gamma),
        tokens_per_row_step=float(np.mean(per_row)) if per_row else math.nan,
        tokens_per_loop_step=tokens / loop_row_steps if loop_row_steps else math.nan,
        accept_by_position=(accepted / reached).tolist(),
        beta_by_position=(beta / reached).tolist(),
        reached_by_position=reached.tolist())


def _prompt_alphas(results: Sequence[GenerationResult]) -> np.ndarray:
  """float [rows]: each row's (prompt's) mean β over its reached drafted positions, NaN
  where it reached none."""
  out = []
  for r in results:
    reached = r.reached()
    counts = reached.sum(axis=(1, 2))
    sums = np.where(reached, r.accept_prob, 0.0).sum(axis=(1, 2), dtype=np.float64)
    out.append(np.where(counts > 0, sums / np.maximum(counts, 1), np.nan))
  return np.concatenate(out)


def _ci95(values) -> float:
  """Half-width of the normal 95% interval of the mean of per-window values (windows are
  the independent units; positions within one window are not)."""
  values = np.asarray(values, np.float64)
  if values.size < 2:
    return math.nan
  return float(1.96 * values.std(ddof=1) / math.sqrt(values.size))


def best_gammas(grid: list[dict], costs: dict) -> list[dict]:
  """Per (draft, temperature): γ with the best measured and predicted speedup."""
  out = []
  keyfn = lambda r: (r["draft_name"], r["temperature"])  # noqa: E731
  for (name, temperature), cells in itertools.groupby(sorted(grid, key=keyfn), key=keyfn):
    cells = sorted(cells, key=lambda r: r["gamma"])
    meas = max(cells, key=lambda r: r["time_speedup"])
    pred = max(cells, key=lambda r: r["time_predicted_speedup"])
    steps = sum(r["reached_pos_1"] for r in cells)  # every live step reaches position 1
    drafted = sum(r[f"reached_pos_{j + 1}"] for r in cells for j in range(r["gamma"]))
    beta = sum(r[f"beta_pos_{j + 1}"] * r[f"reached_pos_{j + 1}"]
               for r in cells for j in range(r["gamma"]) if r[f"reached_pos_{j + 1}"])
    alpha = float(beta / drafted) if drafted else math.nan
    g_theory, s_theory = studies.best_gamma(
        alpha, costs["time_c"][name], costs["time_v"], max_gamma=max(costs["time_v"]) - 1)
    out.append(dict(draft_name=name, temperature=temperature, alpha_pooled=alpha,
                    steps=steps, time_best_gamma_measured=meas["gamma"],
                    time_best_speedup_measured=meas["time_speedup"],
                    time_best_gamma_predicted=pred["gamma"],
                    time_best_speedup_predicted=pred["time_predicted_speedup"],
                    time_best_gamma_theory=g_theory, time_best_speedup_theory=s_theory))
  return out


# --------------------------------------------------------------------------- output

def _fmt(value, timing: bool) -> str:
  """CSV text: fixed precision (timing: 6 significant digits), '' for None."""
  if value is None:
    return ""
  if isinstance(value, (bool, np.bool_)):
    return str(bool(value))
  if isinstance(value, (int, np.integer)):
    return str(int(value))
  if isinstance(value, (float, np.floating)):
    if math.isnan(value):
      return "nan"
    return f"{value:.6g}" if timing else f"{value:.6f}"
  return str(value)


def _json_value(value, timing: bool):
  """JSON-ready value at the CSV's precision; NaN -> null."""
  if isinstance(value, dict):
    return {str(k): _json_value(v, timing) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_json_value(v, timing) for v in value]
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if isinstance(value, (int, np.integer)):
    return int(value)
  if isinstance(value, (float, np.floating)):
    return None if math.isnan(value) else float(_fmt(float(value), timing))
  return value


def is_timing(column: str) -> bool:
  """Timing columns (wall-clock, not reproducible) carry the time_ prefix."""
  return column.startswith("time_")


def deterministic(row: dict) -> dict:
  """The row without its time_ fields."""
  return {k: v for k, v in row.items() if not is_timing(k)}


def write_csv(path, rows: list[dict], columns: Sequence[str]) -> None:
  """One line per row, `columns` in order, values through `_fmt`."""
  atomic_write_csv(path, [list(columns)]
                   + [[_fmt(row.get(c), is_timing(c)) for c in columns] for row in rows],
                   lineterminator="\n")


def write_outputs(workdir, results: dict) -> None:
  """results.json/.csv, results_timing.csv, batch.csv, batch_timing.csv, best_gamma.csv."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  for name, keys in (("results", GRID_KEYS), ("batch", BATCH_KEYS)):
    rows = results["grid" if name == "results" else "batch"]
    if not rows:
      continue
    columns = list(rows[0])
    write_csv(workdir / f"{name}.csv", rows, [c for c in columns if not is_timing(c)])
    write_csv(workdir / f"{name}_timing.csv", rows,
              list(keys) + [c for c in columns if is_timing(c)])
  if results["best_gamma"]:
    write_csv(workdir / "best_gamma.csv", results["best_gamma"], list(results["best_gamma"][0]))
  doc = {k: [{c: _json_value(v, is_timing(c)) for c, v in row.items()} for row in rows]
         for k, rows in results.items() if isinstance(rows, list)}
  doc["meta"] = _json_value(results["meta"], False)
  doc["costs"] = _json_value(results["costs"], True)
  atomic_write_json(workdir / "results.json", doc, sort_keys=True)


def plot(workdir, grid: list[dict]) -> list[str]:
  """tokens_per_step.png, speedup.png, accept_by_position.png; returns their paths."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  workdir = pathlib.Path(workdir)
  drafts = sorted({r["draft_name"] for r in grid})
  temps = sorted({r["temperature"] for r in grid})
  colors = {t: f"C{i}" for i, t in enumerate(temps)}

  def cells(name, t):
    return sorted((r for r in grid if r["draft_name"] == name and r["temperature"] == t),
                  key=lambda r: r["gamma"])

  def figure(measured, predicted, ylabel, fname, xlabel="γ (drafted tokens per step)",
             xs=None, baseline=None, labels=("measured", "predicted")):
    fig, axes = plt.subplots(1, len(drafts), figsize=(4.5 * len(drafts), 3.6), squeeze=False)
    for ax, name in zip(axes[0], drafts):
      for t in temps:
        rs = cells(name, t)
        x = xs(rs) if xs else [r["gamma"] for r in rs]
        ax.plot(x, measured(rs), "o-", color=colors[t], label=f"T={t:g} {labels[0]}")
        ax.plot(x, predicted(rs), "x--", color=colors[t], label=f"T={t:g} {labels[1]}")
        ax.set_xticks(x)
      if baseline is not None:
        ax.axhline(baseline, color="gray", lw=0.8)
      ax.set_title(f"draft {name} ({rs[0]['draft']})", fontsize=9)
      ax.set_xlabel(xlabel)
      ax.set_ylabel(ylabel)
      ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    path = workdir / fname
    atomic_save(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100,
                                              metadata={"Software": None}))
    plt.close(fig)
    return str(path)

  paths = [
      figure(lambda rs: [r["tokens_per_step_uncut"] for r in rs],
             lambda rs: [r["predicted_tokens_per_step"] for r in rs],
             "tokens / step  (measured: mean n + 1)", "tokens_per_step.png"),
      figure(lambda rs: [r["time_speedup"] for r in rs],
             lambda rs: [r["time_predicted_speedup"] for r in rs],
             "speedup over autoregressive", "speedup.png", baseline=1.0),
  ]
  # Acceptance by position, at each (draft, T)'s largest γ: i.i.d. acceptance is flat.
  width = max(r["gamma"] for r in grid)
  pos = lambda rs, k: [rs[-1][f"{k}_pos_{j + 1}"] for j in range(rs[-1]["gamma"])]  # noqa
  paths.append(figure(
      lambda rs: pos(rs, "accept"), lambda rs: pos(rs, "beta"),
      "P(accept j | reached j)", "accept_by_position.png", labels=("measured", "mean β"),
      xlabel=f"position j in the block (largest γ ≤ {width})",
      xs=lambda rs: list(range(1, rs[-1]["gamma"] + 1))))
  return paths


# --------------------------------------------------------------------------- tables

def summary_table(grid: list[dict]) -> str:
  """One line per cell: draft, γ, T, α, acceptance, tokens/step and speedup (meas / pred)."""
  lines = ["draft    T    γ  alpha ± 95%     accept  tok/step emitted uncut pred  "
           "speedup meas/pred"]
  for r in grid:
    lines.append(f"{r['draft_name']:<8} {r['temperature']:<4g} {r['gamma']:<2d} "
                 f"{r['alpha']:.3f} ± {r['alpha_ci95']:.3f}  {r['acceptance_rate']:.3f}   "
                 f"{r['tokens_per_step']:.2f}  {r['tokens_per_step_uncut']:.2f}  "
                 f"{r['predicted_tokens_per_step']:.2f}          "
                 f"{r['time_speedup']:.2f} / {r['time_predicted_speedup']:.2f}")
  return "\n".join(lines)


def domain_tables(rows: list[dict]) -> str:
  """results["domains"] as one `prompt_sets.format_summary` table per cell."""
  lines = []
  keyfn = lambda r: (r["draft_name"], r["temperature"], r["gamma"])  # noqa: E731
  for (name, temperature, gamma), cell in itertools.groupby(rows, key=keyfn):
    lines.append(f"draft {name}  T={temperature:g}  γ={gamma}")
    lines.append(prompt_sets.format_summary(
        [{k.removeprefix("time_"): v for k, v in r.items()} for r in cell]))
  return "\n".join(lines)
