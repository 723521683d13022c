"""A roofline of one decode step per chip, from compiled programs' flops and bytes.

A program's time on a chip is modelled as max(bytes / HBM bandwidth, flops / bf16 peak)
plus a fixed per-call term (Williams, Waterman and Patterson, "Roofline", CACM 2009).
The flops are XLA's `cost_analysis()`, and the bytes the HBM traffic of
`memory_analysis()` (`compile_plan.hbm_traffic`: every buffer touched once), of the
pieces of a step compiled as programs of their own (`compile_plan.step_pieces`): one target call over k tokens with
a full cache, one draft call, the verifier. (A loop's cost analysis counts one iteration
of each `while_loop`, so a whole decode loop cannot give these figures.)

From the pieces' times t_target(k), t_draft and t_verify(γ) a chip's cost model is
  v(k) = t_target(k) / t_target(1),   c = t_draft / t_target(1),
  s(γ) = γ c + v(γ + 1) + t_verify(γ) / t_target(1)      (s(0) = 1: a γ = 0 step skips the draft),
the step costs in plain steps that `adaptive.CostTable` holds and gamma 'auto' chooses
from (`adaptive.step_cost` of `adaptive.draft_calls(γ)`, the loop's own count). What it
leaves out: on-chip latency per fused op and per `while_loop` iteration (the per-call
term, a parameter with default 0), the host, and on a mesh the collectives.

CHIPS holds each chip's HBM capacity, bandwidth and dense bf16 peak with its source.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from specdec_jax.bench import studies
from specdec_jax.gamma import adaptive
from specdec_jax.gamma.adaptive import CostTable


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator's published figures (per chip)."""

  name: str
  device_kinds: tuple[str, ...]  # jax `device_kind` strings of this chip
  hbm_bytes: float  # capacity, decimal bytes as published
  hbm_bytes_per_s: float  # HBM bandwidth
  bf16_flops_per_s: float  # dense bf16 matmul peak
  source: str  # where the three figures are published

  def seconds(self, cost: dict, call_overhead_s: float = 0.0) -> float:
    """The roofline time of a program of cost {'flops', 'bytes'} on this chip."""
    return max(cost["bytes"] / self.hbm_bytes_per_s,
               cost["flops"] / self.bf16_flops_per_s) + call_overhead_s


CHIPS: dict[str, Chip] = {
    "v5e": Chip("TPU v5e", ("TPU v5 lite", "TPU v5e"), 16e9, 819e9, 197e12,
                "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("TPU v5p", ("TPU v5", "TPU v5p"), 95e9, 2765e9, 459e12,
                "https://cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("TPU v6e", ("TPU v6 lite", "TPU v6e"), 32e9, 1638e9, 918e12,
                "https://cloud.google.com/tpu/docs/v6e"),
    "v4": Chip("TPU v4", ("TPU v4",), 34.4e9, 1200e9, 275e12,
               "https://cloud.google.com/tpu/docs/v4"),
    # 989 TFLOP/s is the dense figure (NVIDIA publishes 1,979 with 2:4 sparsity)
    "h200": Chip("NVIDIA H200 SXM", ("NVIDIA H200",), 141e9, 4.8e12, 989e12,
                 "https://www.nvidia.com/en-us/data-center/h200/"),
}


def chip_of(device_kind: str) -> Chip | None:
  """The chip whose `device_kinds` holds device_kind (jax's name for it), or None."""
  for chip in CHIPS.values():
    if device_kind in chip.device_kinds:
      return chip
  return None


def step_model(pieces: dict, chip: Chip, call_overhead_s: float = 0.0) -> dict:
  """A chip's v(k), c, s(0..G) and seconds per piece from `step_pieces`' costs.

  pieces: {'target': {k: cost}, 'draft': cost | None, 'verify': {γ: cost}} with each cost
  {'flops', 'bytes'}. Returns {'target_seconds', 'v', 'c', 'step_costs', 'bound'}.
  """
  target = {int(k): chip.seconds(cost, call_overhead_s) for k, cost in pieces["target"].items()}
  t1 = target[1]
  draft = pieces.get("draft")
  c = 0.0 if draft is None else chip.seconds(draft, call_overhead_s) / t1
  v = {k: target[k] / t1 for k in sorted(target)}
  verify = {int(g): chip.seconds(cost, call_overhead_s) / t1
            for g, cost in pieces["verify"].items()}
  gamma_max = min(max(verify), max(v) - 1)
  steps = [adaptive.step_cost(adaptive.draft_calls(g), c, v[g + 1],
                              verify.get(g, 0.0) if g else 0.0)
           for g in range(gamma_max + 1)]
  cost1 = pieces["target"][1]
  bound = ("memory" if cost1["bytes"] / chip.hbm_bytes_per_s
           >= cost1["flops"] / chip.bf16_flops_per_s else "compute")
  return dict(target_seconds=target[1], v=v, c=c, step_costs=steps, bound=bound)


def prompt_rows(doc: dict, *, gamma, verifier: str) -> list[dict]:
  """The per-prompt rows of a benchmark result file to predict at.

  A file of one column gives its rows. A file of several columns side by side
  (`benchmark.py --gammas=...`) gives those of the column run at `gamma` ('auto' or a
  number) with `verifier`; mixing columns would count each prompt once per column.
  ValueError, one line, if there is no such column or a row lacks α or tokens per step.
  """
  try:
    columns = list(doc["rows"])
    labels = [f"gamma {c.get('gamma')} {c.get('verifier')}" for c in columns]
  except (KeyError, TypeError, AttributeError) as e:
    raise ValueError(f"not a benchmark result file (no rows; {type(e).__name__}: {e})") from None
  if len(columns) > 1:
    columns = [c for c in columns
               if str(c.get("gamma")) == str(gamma) and c.get("verifier") == verifier]
    if len(columns) != 1:
      raise ValueError(f"holds the columns {', '.join(labels)}; not one of them is "
                       f"gamma {gamma} {verifier}, the config's")
  try:
    rows = [p for column in columns for p in (column.get("prompts") or [column])]
    for p in rows:
      float(p["alpha"]), float(p["tokens_per_step"])
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise ValueError(f"not a benchmark result file (rows with alpha and tokens_per_step; "
                     f"{type(e).__name__}: {e})") from None
  return rows


def predict(model: dict, rows: list[dict], gamma_max: int) -> dict:
  """Predicted speedups over plain decoding on a chip, per stored prompt row.

  rows: a result file's per-prompt rows ({'id', 'alpha', 'tokens_per_step', 'gamma',
  'speedup'}). Per row: 'fixed' (the row's own γ, from its measured tokens per step
  when γ is a number), 'by_gamma' (E(α, γ) / s(γ) for γ = 1..G) and 'auto' (the γ the
  chip's cost table picks at the row's α, and its E / s). Geometric means over rows
  beside the file's measured (CPU) speedup.
  """
  table = CostTable(c=None, verify_costs=None, step_costs=tuple(model["step_costs"]))
  g_max = min(gamma_max, table.max_gamma)
  out = []
  for row in rows:
    alpha = float(row["alpha"])
    by_gamma = {g: studies.expected_tokens_per_step(alpha, g) / table.as_array(g)[g]
                for g in range(1, g_max + 1)}
    auto = table.best_gamma(alpha, g_max)
    auto_speedup = 1.0 / table.as_array(0)[0] if auto == 0 else by_gamma[auto]
    gamma = row.get("gamma")
    fixed = None
    if isinstance(gamma, int) and 1 <= gamma <= table.max_gamma:
      fixed = float(row["tokens_per_step"]) / float(table.as_array(gamma)[gamma])
    out.append(dict(id=row.get("id"), alpha=alpha, cpu_speedup=row.get("speedup"),
                    fixed=fixed, by_gamma={str(g): float(s) for g, s in by_gamma.items()},
                    auto_gamma=int(auto), auto=float(auto_speedup)))

  def geomean(values):
    values = [v for v in values if v is not None]
    return float(math.exp(np.mean(np.log(values)))) if values else None

  summary = dict(cpu_speedup=geomean([r["cpu_speedup"] for r in out]),
                 fixed=geomean([r["fixed"] for r in out]),
                 auto=geomean([r["auto"] for r in out]),
                 by_gamma={str(g): geomean([r["by_gamma"][str(g)] for r in out])
                           for g in range(1, g_max + 1)})
  return dict(rows=out, geomean=summary)
