"""Cost tables on disk: this machine's cached tables and the tables a config pins.

`load_or_measure` keeps a table in `<directory>/<key hash>.json` (scripts use runs/costs/,
ignored by git) under a key of everything that changes it (`cost_key`):
  machine     CPU model, ISA flags, logical cores, JAX version, devices (`io.machine`)
  models      sha256 of the target and draft configs (reprs)
  batch
  sampling, verifier   for step costs (a step samples and verifies at the run's settings);
                       context for the modelled c and v(k)
A stored table whose key differs, or that covers fewer than G+1 widths, is measured
again and replaced (written with `io.atomic`). The tables are timings of the machine
they were taken on: never commit them. A table pinned by a file (`load_pinned_table`:
config.costs) makes gamma 'auto' choose the same γ on any machine. The timing itself is
`machine_costs.measure_steps`.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Callable

from specdec_jax.gamma.adaptive import CostTable
from specdec_jax.io import machine
from specdec_jax.io.atomic import atomic_write_json

# Context (cached tokens) steps are timed at when no run gives its prompt width: a short
# prompt plus half a generation (`machine_costs.measure_steps`).
MEASURE_CONTEXT = 96


def cost_key(target_config, draft_config, *, batch: int, context: int = MEASURE_CONTEXT,
             sampling=None, verifier: str | None = None) -> dict:
  """The identity of a cost table: this machine, the two models and batch; for step costs
  (`measure_steps`) the sampling rules and verifier, else (a modelled table of c and v(k),
  `studies`) the context."""
  import jax

  model, isa = machine.cpu_info()
  models = hashlib.sha256(f"{target_config!r}|{draft_config!r}".encode()).hexdigest()
  key = dict(cpu=model, isa=isa, cores=machine.cores(), jax=jax.__version__,
             devices=machine.devices(), models=models, batch=int(batch))
  if sampling is None:
    key.update(context=int(context))
  else:
    # steps: the step-cost harness's version (5: implausible s(0) re-timed; 6: steps timed
    # in a run's own compiled loop, v(k) and c no longer timed; 7: STEPS_PER_CALL steps per
    # timed call; 8: γ = 0 steps skip the draft, timed over PLAIN_STEPS_PER_CALL; 9: the
    # CPU's few-row products behind barriers, `models.matmul`, which changed every call of
    # 2 to 4 tokens; 10: those products up to 8 rows, which changed every call of 5 to 8
    # tokens), so older tables re-measure
    key.update(sampling=repr(sampling), verifier=str(verifier), steps=10)
  return key


def cache_path(directory: str | os.PathLike, key: dict) -> pathlib.Path:
  """<directory>/<sha256 of the key, 16 hex digits>.json."""
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
  return pathlib.Path(directory) / f"{digest}.json"


def load_or_measure(directory: str | os.PathLike, key: dict, gamma_max: int,
                    measure_fn: Callable[[], CostTable]) -> tuple[CostTable, bool]:
  """(table, measured now): the cached table of `key` if it covers γ_max, else
  measure_fn() written to `cache_path(directory, key)`."""
  path = cache_path(directory, key)
  try:
    stored = json.loads(path.read_text())
    table = CostTable.from_dict(stored)
    if stored.get("key") == key and table.max_gamma >= gamma_max:
      return table, False
  except (OSError, ValueError, KeyError, TypeError):
    pass  # missing, unreadable or another table: measure
  table = measure_fn()
  path.parent.mkdir(parents=True, exist_ok=True)
  atomic_write_json(path, dict(key=key, **table.to_dict()))
  return table, True


def load_pinned_table(path: str | os.PathLike, gamma_max: int | None = None) -> CostTable:
  """A cost table pinned by a file (config.costs): a cached table of runs/costs/, or a
  result that recorded the table its gamma 'auto' chose from (a JSON object holding it
  under 'cost_table', or under meta.auto_cost_table as the benchmark writes it). With
  a pinned table, gamma 'auto' chooses the same γ on any machine: the same seed gives
  the same tokens. gamma_max: refuse a table that stops below it."""
  try:
    stored = json.loads(pathlib.Path(path).read_text())
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
    raise ValueError(f"cost table {os.fspath(path)!r} is not readable JSON: "
                     f"{str(exc).splitlines()[0]}") from None
  if isinstance(stored, dict):
    for holder in (stored.get("meta"), stored):
      if isinstance(holder, dict):
        for name in ("auto_cost_table", "cost_table"):
          if isinstance(holder.get(name), dict):
            stored = holder[name]
            break
  if not isinstance(stored, dict) or not any(stored.get(k) is not None for k in (
      "step_costs", "verify_costs")):
    raise ValueError(f"{os.fspath(path)!r} holds no cost table (step_costs or c and "
                     f"verify_costs; a result file of a gamma 'auto' run holds one)")
  try:
    table = CostTable.from_dict(stored)
  except ValueError as exc:
    raise ValueError(f"cost table {os.fspath(path)!r}: {str(exc).splitlines()[0]}") from None
  if gamma_max is not None and table.max_gamma < gamma_max:
    raise ValueError(f"cost table {os.fspath(path)!r} holds step costs up to gamma "
                     f"{table.max_gamma}, below gamma_max {gamma_max}")
  return table


def describe(table: CostTable) -> str:
  """One line: the step costs s(γ) where measured, c and v(k) where the table holds them."""
  parts = []
  if table.verify_costs is not None:
    parts.append(f"c = {table.c:.3f}  v(k) = " + " ".join(
        f"{k}:{x:.2f}" for k, x in enumerate(table.verify_costs, start=1)))
  if table.step_costs is not None:
    parts.append("s(gamma) = " + " ".join(f"{g}:{x:.2f}"
                                          for g, x in enumerate(table.step_costs)))
  line = "  ".join(parts)
  if table.lookup_step_costs is not None:
    line += "  lookup s(gamma) = " + " ".join(
        f"{g}:{x:.2f}" for g, x in enumerate(table.lookup_step_costs))
  return line
