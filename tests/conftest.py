"""Shared fixtures: tiny random models (CPU, fixed seeds).

The tests compile hundreds of tiny programs and run each for milliseconds, so XLA's
backend optimisation is turned off for them, and fusions are emitted by XLA:CPU's older
loop emitters, not its MLIR fusion emitters, which compile tiny programs faster. Both
only change how fast the compiled code is and how long it takes to compile, never what
it computes; subprocesses inherit them from the environment. The scripts keep XLA's
defaults: on SmolLM2 the older emitters compile more slowly.

Every compiled XLA:CPU program keeps a few memory mappings for its code, and a process
may hold at most vm.max_map_count (65530 by default) of them: one pytest process that
keeps every program of the suite loaded ends in "LLVM ERROR: Unable to allocate section
memory". So the compiled programs are dropped after a test module once the process holds
MAPPING_BUDGET mappings (`release_compiled_programs`); one module adds up to about 12,000.
"""

import os

FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
for _flag in FAST_COMPILE:  # before JAX starts its backend
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}".strip()

import pathlib  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

from helpers import tiny_config, tiny_model  # noqa: E402

# Many modules compile the same tiny decode loops, and `release_compiled_programs` drops
# them between modules: a persistent compilation cache, shared by the xdist workers and
# kept between runs under .pytest_cache/ (ignored by git; a clean clone starts empty),
# compiles each program once. Keys include the program, the XLA flags and the versions.
COMPILE_CACHE = pathlib.Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax_compile"
jax.config.update("jax_compilation_cache_dir", str(COMPILE_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(scope="session")
def tiny_pair():
  """(target_config, target_params, draft_config, draft_params), vocabulary 32."""
  target = tiny_config(layers=2)
  draft = tiny_config(layers=1, width=16)
  return target, tiny_model(target, 0), draft, tiny_model(draft, 1)


# The memory mappings a process may hold before `release_compiled_programs` drops its
# compiled programs: well below vm.max_map_count (65530 by default).
MAPPING_BUDGET = 30_000


def _mappings() -> int | None:
  """The memory mappings this process holds (None where /proc is not readable)."""
  try:
    with open("/proc/self/maps") as maps:
      return sum(1 for _ in maps)
  except OSError:
    return None


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
  """jax.clear_caches() after a test module once the process holds MAPPING_BUDGET memory
  mappings (or where it cannot tell; see the module docstring). Until then later modules
  reuse the compiled programs (and traces) of earlier ones."""
  yield
  count = _mappings()
  if count is None or count > MAPPING_BUDGET:
    jax.clear_caches()


# `make test` runs the suite in pytest-xdist workers (Makefile); each worker collects and
# deselects, so the controller's summary line would not say how many tests `-m "not slow"`
# left out. The workers report the count and the controller adds it to its summary.
def pytest_deselected(items):
  config = items[0].config if items else None
  if config is not None and hasattr(config, "workeroutput"):  # an xdist worker
    config.workeroutput["deselected"] = config.workeroutput.get("deselected", 0) + len(items)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
  """Every worker deselects the same tests: the count of one worker goes to the summary."""
  reporter = node.config.pluginmanager.get_plugin("terminalreporter")
  count = getattr(node, "workeroutput", {}).get("deselected", 0)
  if reporter is not None and count and not getattr(node.config, "_deselected_reported", False):
    node.config._deselected_reported = True
    reporter.stats.setdefault("deselected", []).extend([None] * count)
