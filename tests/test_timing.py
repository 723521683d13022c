"""The timing harness (`specdec_jax.bench.timing`): call order, warm-up, statistics."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.bench import timing


def _recorder():
  calls = []

  def make(name):
    def fn():
      calls.append(name)
      return len(calls)
    return fn
  return calls, make


def test_interleaved_calls_each_fn_once_per_round_after_an_optional_warm_up():
  calls, make = _recorder()
  seconds, results = timing.interleaved_seconds({"a": make("a"), "b": make("b")}, 3)
  assert calls == ["a", "b"] * 3 and results == {"a": 5, "b": 6}
  assert set(seconds) == {"a", "b"} and all(s >= 0 for s in seconds.values())
  calls.clear()
  timing.interleaved_seconds({"a": make("a"), "b": make("b")}, 2, warmup=True)
  assert calls == ["a", "b"] * 3  # one untimed warm-up round, then two timed


def _clock(monkeypatch, *seconds):
  """timing.timed_call reads these durations, in order, for the calls it makes."""
  durations = iter(seconds)
  monkeypatch.setattr(timing, "timed_call", lambda fn: (next(durations), fn()))


def test_interleaved_seconds_are_each_fns_own_median(monkeypatch):
  """Each name gets the median of its own calls' seconds: the warm-up round's are left
  out, and the rounds' are not mixed across names."""
  _clock(monkeypatch, 50.0, 60.0,  # warm-up round: a, b
         1.0, 10.0, 3.0, 30.0, 2.0, 20.0)  # three rounds: a, b
  seconds, _ = timing.interleaved_seconds({"a": lambda: 0, "b": lambda: 0}, 3, warmup=True)
  assert seconds == {"a": 2.0, "b": 20.0}


def test_repeated_seconds_warm_up_and_statistics(monkeypatch):
  calls, make = _recorder()
  _clock(monkeypatch, 9.0, 4.0, 1.0, 3.0, 2.0)  # the warm-up call, then four repeats
  first, median = timing.repeated_seconds(make("f"), 4)
  assert len(calls) == 5 and first == 9.0 and median == 2.5  # the warm-up's own seconds
  calls.clear()
  _clock(monkeypatch, 4.0, 1.0, 3.0, 2.0)
  first, median = timing.repeated_seconds(make("f"), 4, warmup=False)
  assert len(calls) == 4 and math.isnan(first) and median == 2.5
  _clock(monkeypatch, 3.0, 1.0, 2.0)
  assert timing.repeated_seconds(lambda: None, 3, warmup=False, statistic="min")[1] == 1.0
  with pytest.raises(ValueError, match="statistic"):
    timing.repeated_seconds(lambda: None, 1, statistic="mean")


def test_timed_call_blocks_on_device_results():
  seconds, result = timing.timed_call(lambda: jnp.ones((64, 64)) @ jnp.ones((64, 64)))
  assert seconds > 0 and np.asarray(result)[0, 0] == 64.0
  assert timing.timed_call(lambda: {"host": np.zeros(2)})[1]["host"].shape == (2,)
