"""The timing harness: wall-clock seconds of calls, compile excluded, interleaved repeats.

Every timed call's result is blocked on (`jax.block_until_ready`; a no-op on host
values), so a time covers the device work, not only its dispatch. A warm-up call first
keeps compile time out of the repeats (`repeated_seconds` returns its seconds: compile
plus first-run overhead). Several functions are timed interleaved (`interleaved_seconds`):
each round calls each once, in turn, so a drift in machine load hits all alike; a
function's figure is the median of its `repeats` calls (or their minimum, for a peak
such as a memory bandwidth).

It imports nothing from specdec_jax, so every layer that times calls may use it.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Hashable, Mapping, TypeVar

import jax
import numpy as np

K = TypeVar("K", bound=Hashable)

# How the seconds of the repeated calls of one function are summarised.
STATISTICS = {"median": np.median, "min": np.min}


def _statistic(name: str):
  if name not in STATISTICS:
    raise ValueError(f"statistic must be one of {sorted(STATISTICS)}, got {name!r}")
  return STATISTICS[name]


def timed_call(fn: Callable[[], object]) -> tuple[float, object]:
  """(wall seconds, result) of one call of fn, its result blocked on."""
  t0 = time.perf_counter()
  result = jax.block_until_ready(fn())
  return time.perf_counter() - t0, result


def interleaved_seconds(fns: Mapping[K, Callable[[], object]], repeats: int, *,
                        warmup: bool = False, statistic: str = "median"
                        ) -> tuple[dict[K, float], dict[K, object]]:
  """({name: median seconds of fn over `repeats` rounds}, {name: fn's last result}).

  Each round calls every fn once, in order, each result blocked on. warmup: call each fn
  once, untimed, before the rounds (compile excluded); False where the caller has
  already called each one (to keep that first call's seconds or result, `timed_call`).
  statistic: 'median', or 'min' (the fastest call).
  """
  reduce = _statistic(statistic)
  if warmup:
    for fn in fns.values():
      timed_call(fn)
  times = {name: [] for name in fns}
  results = {}
  for _ in range(repeats):
    for name, fn in fns.items():
      seconds, results[name] = timed_call(fn)
      times[name].append(seconds)
  return {name: float(reduce(t)) for name, t in times.items()}, results


def repeated_seconds(fn: Callable[[], object], repeats: int, *, warmup: bool = True,
                     statistic: str = "median") -> tuple[float, float]:
  """(seconds of a first, warm-up call, median seconds of `repeats` further calls) of fn.

  warmup False: no first call (NaN in its place), for code with nothing to compile
  that has run already (numpy). statistic as `interleaved_seconds`.
  """
  _statistic(statistic)  # a bad name fails before any call
  first = timed_call(fn)[0] if warmup else math.nan
  seconds, _ = interleaved_seconds({"fn": fn}, repeats, statistic=statistic)
  return first, seconds["fn"]
