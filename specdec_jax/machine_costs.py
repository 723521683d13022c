"""This machine's cost table for gamma='auto': measured once, cached per machine and models.

Letters: B batch, G = γ_max, R steps per timed loop.

A `adaptive.CostTable` holds c (draft step / target step, one token each) and v(k) =
t(k tokens) / t(1 token) of the target for k = 1..G+1, timed with `studies.call_seconds`
at batch B and a fixed context (`measure`), and, from `measure_steps`, the step costs
s(γ) = t(speculative step of width γ+1) / t(plain step), each timed as R steps of the
decode loop's own step function in one compiled `fori_loop` that rewinds the state to the
same context before each step (so no step pays a copy of the caches), the median of
`repeats` rounds, the widths and the plain step interleaved in each round (timed again
where s(0) < `PLAUSIBLE_PLAIN_COST`, which only a disturbed timing of the plain step
gives). With a feature draft (which skips plain steps, `speculative.FEATURE_LAG`), s(0)
is the mean over a row's probe cycle: FEATURE_LAG - 1 steps that skip the draft and one
that runs it. With a hybrid draft the same compiled loops also time s_lookup(γ), steps
in which every row takes the lookup (a context that repeats itself, so every row's lookup
matches). Timing takes two to four minutes on 2 cores (half of it compiling one loop per
width), so `load_or_measure` keeps the table in `<directory>/<key hash>.json` (scripts
use runs/costs/, ignored by git) under a key of everything that changes it:
  machine     CPU model, ISA flags, logical cores, JAX version, devices (`io.machine`)
  models      sha256 of the target and draft configs (reprs)
  batch, context
  sampling, verifier   for step costs (a step samples and verifies at the run's settings)
A stored table whose key differs, or that covers fewer than G+1 widths, is measured
again and replaced (written with `io.atomic`). The tables are timings of the machine
they were taken on: never commit them.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Callable

from specdec_jax import studies
from specdec_jax.adaptive import CostTable
from specdec_jax.io import machine
from specdec_jax.io.atomic import atomic_write_json

# Context (cached tokens) the calls are timed at: a short prompt plus half a generation.
MEASURE_CONTEXT = 96
MEASURE_REPEATS = 10


def cost_key(target_config, draft_config, *, batch: int, context: int = MEASURE_CONTEXT,
             sampling=None, verifier: str | None = None) -> dict:
  """The identity of a cost table: this machine, the two models, batch and context, and
  for step costs the sampling rules and verifier."""
  import jax

  model, isa = machine.cpu_info()
  models = hashlib.sha256(f"{target_config!r}|{draft_config!r}".encode()).hexdigest()
  key = dict(cpu=model, isa=isa, cores=machine.cores(), jax=jax.__version__,
             devices=machine.devices(), models=models, batch=int(batch), context=int(context))
  if sampling is not None:
    # steps: the step-cost harness's version (5: implausible s(0) re-timed), so older tables
    # re-measure
    key.update(sampling=repr(sampling), verifier=str(verifier), steps=5)
  return key


def cache_path(directory: str | os.PathLike, key: dict) -> pathlib.Path:
  """<directory>/<sha256 of the key, 16 hex digits>.json."""
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
  return pathlib.Path(directory) / f"{digest}.json"


def measure(target_params, target_config, draft_params, draft_config, *, gamma_max: int,
            batch: int, context: int = MEASURE_CONTEXT,
            repeats: int = MEASURE_REPEATS) -> CostTable:
  """Times c and v(1..gamma_max+1) on this machine (`studies`; compile excluded)."""
  v = studies.verify_cost_curve(target_params, target_config, batch=batch, context=context,
                                max_tokens=gamma_max + 1, repeats=repeats)
  c = studies.cost_coefficient(target_params, target_config, draft_params, draft_config,
                               batch=batch, context=context, repeats=repeats)
  return CostTable(c=float(c), verify_costs=tuple(float(v[k]) for k in sorted(v)))


STEP_REPEATS = 7
STEPS_PER_LOOP = 6
PLAUSIBLE_PLAIN_COST = 0.95
TIMING_ATTEMPTS = 3


def measure_steps(target_params, target_config, draft_params, draft_config, *, gamma_max: int,
                  batch: int, sampling, verifier: str = "block", context: int = MEASURE_CONTEXT,
                  repeats: int = STEP_REPEATS, steps: int = STEPS_PER_LOOP) -> CostTable:
  """The modelled table (`measure`) plus the measured step costs s(0..gamma_max) (and
  s_lookup(0..gamma_max) for a hybrid draft)."""
  import jax
  import numpy as np

  from specdec_jax import speculative
  from specdec_jax.drafting import with_length

  table = measure(target_params, target_config, draft_params, draft_config,
                  gamma_max=gamma_max, batch=batch, context=context)
  vocab = speculative.resolve_vocab(target_config, draft_config, None)
  tokens = (np.arange(batch * context, dtype=np.int32).reshape(batch, context) * 7919) % vocab
  prompt_len = np.full((batch,), context, np.int32)
  row_keys = speculative._row_keys(0, np.arange(batch))
  common = dict(target_config=target_config, sampling=sampling, vocab_size=vocab,
                eos_id=None, max_new_tokens=steps * (gamma_max + 1))
  # γ_b >= 2 on every row: no drafting width is timed on the hybrid's shallow path unless
  # every row's lookup matches (the lookup timing)
  costs = table.loop_costs(gamma_max)
  costs[:, :2] = 1e3

  def rewound(state, start):
    """state with the progress of `start` (the buffers, caches included, kept)."""
    draft_cache = state.draft_cache
    if draft_cache is not None:
      draft_cache = with_length(draft_cache, start.draft_cache["length"])
    return state.replace(num_tokens=start.num_tokens, done=start.done, step=start.step,
                         alpha_estimate=start.alpha_estimate, plain_run=start.plain_run,
                         features=start.features,
                         target_cache=with_length(state.target_cache,
                                                  start.target_cache["length"]),
                         draft_cache=draft_cache)

  def timed_loop(step, start, *more):
    # params are arguments, as in the decode loop (closed over, XLA folds them as constants).
    # The loop returns the whole state: returning the tokens alone let XLA drop a plain
    # step's draft call (its q_1 feeds only α̂ and the draft cache, not the tokens), and
    # such a probe step then timed as a skipped one (0.98 plain steps, not 1.17).
    loop = jax.jit(lambda tp, dp, s: jax.lax.fori_loop(
        0, steps, lambda i, x: step(tp, dp, rewound(x, s)), s))
    return [lambda s=s: jax.block_until_ready(loop(target_params, draft_params, s))
            for s in (start, *more)]

  fns = {}
  plain = speculative.init_state_jit(target_params, None, tokens, prompt_len, row_keys,
                                     target_config=target_config, draft_config=None, gamma=0,
                                     max_new_tokens=common["max_new_tokens"])
  fns["plain"], = timed_loop(lambda tp, dp, x: speculative.autoregressive_step_fn(
      tp, x, **common), plain)
  starts = [tokens]
  hybrid = getattr(draft_config, "kind", None) == "hybrid"
  if hybrid:  # a context of period 16: every row's lookup matches
    starts.append(np.tile(tokens[:, :16], (1, -(-context // 16)))[:, :context])
  starts = [speculative.init_state_jit(
      target_params, draft_params, t, prompt_len, row_keys, target_config=target_config,
      draft_config=draft_config, gamma=gamma_max, max_new_tokens=common["max_new_tokens"],
      adaptive_gamma=True) for t in starts]
  verify_fn = speculative.resolve_verifier(verifier)
  for width in range(1, gamma_max + 2):
    timed = timed_loop(lambda tp, dp, x, width=width: speculative.speculative_step_fn(
        tp, dp, x, draft_config=draft_config, gamma=gamma_max,
        verifier=verify_fn, costs=costs, width=width, **common), *starts)
    fns[width] = timed[0]
    if hybrid and width > 1:
      fns[("lookup", width)] = timed[1]
  lag = speculative.feature_lag(draft_config, True)
  if lag:  # the plain step that skips the feature draft
    fns["skip"], = timed_loop(lambda tp, dp, x: speculative.speculative_step_fn(
        tp, dp, x, draft_config=draft_config, gamma=gamma_max, verifier=verify_fn,
        costs=costs, width=1, skip_draft=True, **common), starts[0])
  for fn in fns.values():  # compile
    fn()

  def step_costs_of(seconds):
    step_costs = [float(seconds[k] / seconds["plain"]) for k in range(1, gamma_max + 2)]
    if lag:  # a γ = 0 row probes (runs the draft) on one plain step in FEATURE_LAG
      skip = seconds["skip"] / seconds["plain"]
      probes = speculative.FEATURE_LAG
      step_costs[0] = ((probes - 1) * skip + step_costs[0]) / probes
    return step_costs

  # A plain step of the speculative loop does an autoregressive step's work and more, so
  # s(0) below PLAUSIBLE_PLAIN_COST means the autoregressive loop, every ratio's
  # denominator, was timed slow (one table read s(0) = 0.90 and every s(γ) 15-25% below
  # tables of the same machine timed before and after it): the rounds are timed again, at most
  # TIMING_ATTEMPTS times in all, and the attempt with the largest s(0) is kept.
  attempts = []
  for _ in range(TIMING_ATTEMPTS):
    seconds, _ = studies.interleaved_seconds(fns, repeats)
    attempts.append(seconds)
    if step_costs_of(seconds)[0] >= PLAUSIBLE_PLAIN_COST:
      break
  seconds = max(attempts, key=lambda x: step_costs_of(x)[0])
  step_costs = step_costs_of(seconds)
  lookup_costs = None
  if hybrid:
    lookup_costs = tuple(step_costs[:1] + [float(seconds[("lookup", k)] / seconds["plain"])
                                           for k in range(2, gamma_max + 2)])
  return CostTable(c=table.c, verify_costs=table.verify_costs, step_costs=tuple(step_costs),
                   lookup_step_costs=lookup_costs)


def load_or_measure(directory: str | os.PathLike, key: dict, gamma_max: int,
                    measure_fn: Callable[[], CostTable]) -> tuple[CostTable, bool]:
  """(table, measured now): the cached table of `key` if it covers γ_max, else
  measure_fn() written to `cache_path(directory, key)`."""
  path = cache_path(directory, key)
  try:
    stored = json.loads(path.read_text())
    if stored.get("key") == key and len(stored["verify_costs"]) >= gamma_max + 1:
      steps, lookup = stored.get("step_costs"), stored.get("lookup_step_costs")
      return CostTable(c=float(stored["c"]),
                       verify_costs=tuple(float(x) for x in stored["verify_costs"]),
                       step_costs=None if steps is None else tuple(float(x) for x in steps),
                       lookup_step_costs=None if lookup is None
                       else tuple(float(x) for x in lookup)), False
  except (OSError, ValueError, KeyError, TypeError):
    pass  # missing, unreadable or another table: measure
  table = measure_fn()
  path.parent.mkdir(parents=True, exist_ok=True)
  atomic_write_json(path, dict(key=key, c=table.c, verify_costs=list(table.verify_costs),
                               step_costs=None if table.step_costs is None
                               else list(table.step_costs),
                               lookup_step_costs=None if table.lookup_step_costs is None
                               else list(table.lookup_step_costs)))
  return table, True


def table_for(pair, *, gamma_max: int, directory: str | os.PathLike, batch: int | None = None,
              log: Callable[[str], None] = print) -> CostTable:
  """The cost table of a `loading.Pair` on this machine at `batch` rows (default: its
  prompts), with step costs at its sampling rules and verifier (`measure_steps`), cached."""
  batch = len(pair.prompts) if batch is None else batch
  key = cost_key(pair.target_config, pair.draft_config, batch=batch, sampling=pair.sampling,
                 verifier=pair.verifier)
  path = cache_path(directory, key)
  if not path.exists():
    log(f"measuring this machine's step costs once (a few minutes; cached in {path.name} "
        f"under {os.path.basename(os.fspath(directory))}/) ...")
  table, _ = load_or_measure(directory, key, gamma_max, lambda: measure_steps(
      pair.target_params, pair.target_config, pair.draft_params, pair.draft_config,
      gamma_max=gamma_max, batch=batch, sampling=pair.sampling, verifier=pair.verifier))
  return table


def describe(table: CostTable) -> str:
  """One line: c and v(k), and the step costs s(γ) where measured."""
  line = f"c = {table.c:.3f}  v(k) = " + " ".join(
      f"{k}:{x:.2f}" for k, x in enumerate(table.verify_costs, start=1))
  if table.step_costs is not None:
    line += "  s(gamma) = " + " ".join(f"{g}:{x:.2f}" for g, x in enumerate(table.step_costs))
  if table.lookup_step_costs is not None:
    line += "  lookup s(gamma) = " + " ".join(
        f"{g}:{x:.2f}" for g, x in enumerate(table.lookup_step_costs))
  return line


def parse_gamma(value) -> int | str:
  """A config's gamma -> 'auto' or an int >= 1 (configs hold it as a string: 'auto', '4')."""
  if isinstance(value, str) and value.strip() == "auto":
    return "auto"
  if isinstance(value, str) and value.strip().isdigit():
    value = int(value.strip())
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"gamma must be 'auto' or an int >= 1, got {value!r}")
  return value


def gamma_arguments(config, pair, *, directory: str | os.PathLike,
                    log: Callable[[str], None] = print) -> dict | None:
  """speculative_generate's gamma keywords for a run config and `loading.Pair`:
  {'gamma': γ} for a fixed config.gamma; {'gamma': 'auto', 'gamma_max', 'costs'} for
  'auto' (the table from `table_for`); None when the table says no γ >= 1 pays even at
  α = `adaptive.PAYS_AT_ALPHA` (one line says so: decode with autoregressive_generate)."""
  from specdec_jax.adaptive import DEFAULT_GAMMA_MAX, PAYS_AT_ALPHA

  gamma = parse_gamma(config.gamma)
  if gamma != "auto":
    return dict(gamma=gamma)
  gamma_max = int(config.get("gamma_max", DEFAULT_GAMMA_MAX))
  table = table_for(pair, gamma_max=gamma_max, directory=directory, log=log)
  if not table.drafting_pays(gamma_max):
    log(f"gamma=auto: drafting does not pay on this machine ({describe(table)}: no gamma "
        f"<= {gamma_max} beats a plain step even at alpha {PAYS_AT_ALPHA}); decoding is "
        f"plain autoregressive")
    return None
  return dict(gamma="auto", gamma_max=gamma_max, costs=table)
