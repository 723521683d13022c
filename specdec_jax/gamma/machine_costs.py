"""This machine's step costs for gamma='auto': the one harness that times them.

Letters: B batch, G = γ_max.

`measure_steps` times the step costs of a `adaptive.CostTable`: s(γ) = t(speculative
step of width γ+1) / t(plain step), each timed as `STEPS_PER_CALL` steps of the compiled
decode loop itself (`decoding.loop.run_steps_jit`, the program a run decodes with), called
on a prefilled state that many steps before its end, with step costs that make every row
propose γ (`forcing_costs`); the plain step is the autoregressive loop's. Each is the
median of `repeats` rounds divided by the steps run, the widths and the plain step
interleaved in each round (timed again where s(0) < `PLAUSIBLE_PLAIN_COST`, which only a
disturbed timing of the plain step gives). s(0) and the plain step are timed over
`PLAIN_STEPS_PER_CALL` steps, so a draft that is skipped on them (`Draft.skip_lag` > 0)
and catches up when its buffer fills (a feature draft, every L skipped steps) has its
catch-up calls in s(0). With a draft whose
`cost_sources` include a lookup the same compiled loop also times s_lookup(γ), steps in
which every row takes the lookup (a context that repeats itself, so every row's lookup
matches). Given the shapes of the run about to decode (`config_proposer`), the table
compiles nothing of its own: the loops it times are the run's, compiled once for both
(docs/results_archive.md#step-timing). The model's c (draft step / target step, one token
each) and v(k) = t(k tokens) / t(1 token) are the benchmark's to time and report
(`studies.cost_coefficient`, `studies.verify_cost_curve`); a table of them
(`CostTable(c, verify_costs)`) is what tests inject.

`table_for` and `run_table` give a run its table: pinned by config.costs, else cached on
disk (`cost_cache`, keyed by machine, models, batch, sampling and verifier) and measured
here once. Step costs are timed at the first run's prompt width and generation length
and serve every later run of the same key (the cost of a step changes little with the
context).
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np

from specdec_jax.bench import timing
from specdec_jax.drafts.registry import as_draft
from specdec_jax.gamma.adaptive import DEFAULT_RULE, CostTable
from specdec_jax.gamma.cost_cache import (MEASURE_CONTEXT, cache_path, cost_key,
                                          load_or_measure, load_pinned_table)

# The shortest context a lookup source's steps are timed at: a text that repeats with
# period min(16, context // 2), so trailing matches of up to 15 tokens exist from the first
# step. A run's shorter prompt (a one-token prompt has nothing earlier to match) times every
# step at this context instead, a program of its own.
LOOKUP_CONTEXT = 32


STEP_REPEATS = 5
# Loop steps per timed call. A call's fixed cost (entering the compiled loop with its
# state) is a noticeable fraction of one step, so one step per call overstates s(γ); over
# eight steps it is small (docs/results_archive.md#step-timing). The γ = 0 and plain calls
# run more, to span a few of a skipped draft's catch-up cycles.
STEPS_PER_CALL = 8
PLAIN_STEPS_PER_CALL = 32
# The generation length the steps are timed under when a caller gives none (it sizes the
# token buffer and caches of the timed loop, as in a run of that many new tokens).
MEASURE_NEW_TOKENS = 64
PLAUSIBLE_PLAIN_COST = 0.95
TIMING_ATTEMPTS = 3


def steps_from(target, draft_params, prepared, state, steps: int, costs=None):
  """A timed call: () -> the state after the run's compiled loop (`loop.run_prepared`) ran
  from `state` with its step index `steps` below the end (at most that many steps). costs:
  float32 [2,G+1] in place of the prepared table, or None. The loop consumes (donates) its
  state: each call runs on a fresh copy, whose few dispatches and cache copy are timed with
  the steps."""
  import jax
  import jax.numpy as jnp

  from specdec_jax.decoding import loop

  state = state.replace(step=jnp.full_like(state.step, prepared.spec.max_new_tokens - steps))
  costs = None if costs is None else jnp.asarray(costs)

  def call():
    fresh = jax.tree.map(jnp.copy, state)
    return jax.block_until_ready(loop.run_prepared(target, draft_params, fresh, prepared, costs))
  return call


def forcing_costs(gamma: int, gamma_max: int) -> np.ndarray:
  """float32 [2,G+1]: step costs under which every row of either source chooses γ = gamma
  (s(gamma) = 1, every other s = 1e3; E(α, γ) <= G+1 < 1e3)."""
  costs = np.full((2, gamma_max + 1), 1e3, np.float32)
  costs[:, gamma] = 1.0
  return costs


def measure_steps(target, draft, *, gamma_max: int, batch: int, sampling,
                  verifier: str = "block", context: int = MEASURE_CONTEXT,
                  max_new_tokens: int = MEASURE_NEW_TOKENS, eos_id: int | None = None,
                  rule=DEFAULT_RULE, repeats: int = STEP_REPEATS) -> CostTable:
  """The measured step costs s(0..gamma_max) (and s_lookup(0..gamma_max) for a draft with
  a lookup source) of target and draft (`Model`s); the table holds no c and v(k)
  (`studies.cost_coefficient` and `studies.verify_cost_curve` time those).

  Each step is timed in the compiled loop of a run (`decoding.loop.run_steps_jit`) with
  prompts of `context` tokens, max_new_tokens, eos_id and γ rule (a static of the loop):
  given a run's own values (`config_proposer`), the run then reuses the programs timed
  here, and the table compiles nothing of its own. The rule's constants leave the costs
  as they are (its choice and observation are a few operations per row), so the table's
  key leaves the rule out. A timed call runs min(STEPS_PER_CALL, max_new_tokens)
  steps (min(PLAIN_STEPS_PER_CALL, max_new_tokens) for the plain step and γ = 0) from a
  state prefilled with `context` tokens (its step index that many below
  max_new_tokens), with costs (`forcing_costs`) under which every row takes the width
  timed, and its time is divided by the steps the loop ran (fewer where every row is
  done first); the plain step is the autoregressive loop's. Each of
  the draft's `cost_sources` is timed on its own text.
  """
  from specdec_jax.decoding import loop
  from specdec_jax.decoding.spec import AutoGamma, DecodeSpec, prepare, resolve_vocab

  drafter = as_draft(draft.config)
  if "lookup" in drafter.cost_sources:
    context = max(context, LOOKUP_CONTEXT)
  placeholder = CostTable(c=None, verify_costs=None, step_costs=(1.0,) * (gamma_max + 1))
  vocab = resolve_vocab(target.config, drafter, None)
  distinct = (np.arange(batch * context, dtype=np.int64).reshape(batch, context) * 7919) % vocab
  # a context that repeats itself with this period: every row's lookup matches
  period = max(1, min(16, context // 2))
  periodic = np.tile(distinct[:, :period], (1, -(-context // period)))[:, :context]
  texts = dict(draft=distinct, lookup=periodic)
  plain_spec = DecodeSpec(max_new_tokens, sampling=sampling, eos_id=eos_id)
  auto_spec = DecodeSpec(max_new_tokens, AutoGamma(placeholder, gamma_max, rule),
                         sampling=sampling, verifier=verifier, eos_id=eos_id)
  steps = min(STEPS_PER_CALL, max_new_tokens)
  plain_steps = min(PLAIN_STEPS_PER_CALL, max_new_tokens)

  def run_from(params, prepared, state, costs, n):
    return steps_from(target, params, prepared, state, n, costs)

  def took_forced(result, gamma, n) -> int:
    """The leading steps of the last n in which every live row proposed gamma (a plain
    step records 0)."""
    took = np.asarray(result.gammas)[:, max_new_tokens - n:]
    ok = ((took == gamma) | (took < 0)).all(axis=0) & (took >= 0).any(axis=0)
    return int(np.cumprod(ok).sum())

  fns, ran, forced = {}, {}, {}  # name -> timed call, loop steps it runs, γ of every step

  def add(key, params, prepared, state, costs, gamma):
    """Times `key` over the leading steps (at most `steps`, `plain_steps` at γ = 0) in
    which every live row takes gamma: a lookup step's row proposes only while its lookup
    matches, and a row is done at EOS. These calls compile the loop (nothing new where a
    run compiled it)."""
    n = plain_steps if gamma == 0 else steps
    while (good := took_forced(run_from(params, prepared, state, costs, n)(), gamma, n)) < n \
        and good > 0:
      n = good
    if good == 0:
      raise RuntimeError(f"step-cost timing {key!r} meant every row to propose {gamma} "
                         f"tokens, but a row proposed another count")
    fns[key], ran[key], forced[key] = run_from(params, prepared, state, costs, n), n, gamma

  plain = prepare(target, None, distinct.astype(np.int32), plain_spec)
  add("plain", None, plain, loop.prefill(target, None, plain), None, 0)
  sources = drafter.cost_sources
  starts = {}
  for name in sources:
    prepared = prepare(target, draft, texts[name].astype(np.int32), auto_spec)
    starts[name] = (prepared, loop.prefill(target, draft.params, prepared))
  for width in range(1, gamma_max + 2):
    costs = forcing_costs(width - 1, gamma_max)
    for name, (prepared, state) in starts.items():
      if width == 1 and name == "lookup" and "draft" in starts:
        continue  # s_lookup(0) = s(0): nothing proposed
      key = width if (name == "draft" or len(sources) == 1) else ("lookup", width)
      add(key, draft.params, prepared, state, costs, width - 1)

  def step_costs_of(seconds):
    return [float(seconds[k] / seconds["plain"]) for k in range(1, gamma_max + 2)]

  # A plain step of the speculative loop does an autoregressive step's work and more, so
  # s(0) below PLAUSIBLE_PLAIN_COST means the autoregressive loop, every ratio's
  # denominator, was timed slow (docs/results_archive.md#step-timing): the rounds are
  # timed again, at most TIMING_ATTEMPTS times in all, and the attempt with the largest
  # s(0) is kept.
  attempts = []
  for _ in range(TIMING_ATTEMPTS):
    seconds, results = timing.interleaved_seconds(fns, repeats)
    attempts.append({key: seconds[key] / ran[key] for key in seconds})
    if step_costs_of(attempts[-1])[0] >= PLAUSIBLE_PLAIN_COST:
      break
  for key, gamma in forced.items():  # the harness timed the width it meant to
    if took_forced(results[key], gamma, ran[key]) != ran[key]:
      took = np.asarray(results[key].gammas)[:, max_new_tokens - ran[key]:]
      raise RuntimeError(f"step-cost timing {key!r} meant every row to propose {gamma} "
                         f"tokens on each step, but they proposed {took.tolist()}")
  seconds = max(attempts, key=lambda x: step_costs_of(x)[0])
  step_costs = step_costs_of(seconds)
  lookup_costs = None
  if len(sources) > 1:
    lookup_costs = tuple(step_costs[:1] + [float(seconds[("lookup", k)] / seconds["plain"])
                                           for k in range(2, gamma_max + 2)])
  return CostTable(c=None, verify_costs=None, step_costs=tuple(step_costs),
                   lookup_step_costs=lookup_costs)


def run_table(config, pair, *, gamma_max: int, directory: str | os.PathLike,
              batch: int | None = None, run: dict | None = None,
              log: Callable[[str], None] = print) -> CostTable:
  """The table a run's gamma 'auto' chooses from: the one config.costs pins, else this
  machine's (`table_for`, measured once and cached)."""
  pinned = str(config.get("costs", "") or "")
  if pinned:
    table = load_pinned_table(pinned, gamma_max=gamma_max)
    log(f"gamma auto: the cost table pinned by {pinned}")
    return table
  return table_for(pair, gamma_max=gamma_max, directory=directory, batch=batch, run=run,
                   log=log)


def table_for(pair, *, gamma_max: int, directory: str | os.PathLike, batch: int | None = None,
              run: dict | None = None, log: Callable[[str], None] = print) -> CostTable:
  """The cost table of a `loading.Pair` on this machine at `batch` rows (default: its
  prompts), with step costs at its sampling rules and verifier (`measure_steps`), cached.
  run: dict(context=, max_new_tokens=, eos_id=, rule=) of the run about to decode at
  `batch` rows: where the table is measured, its steps are timed in that run's own
  compiled loop (shared with the run). The key leaves these out: a table measured for
  one run serves every later one."""
  batch = len(pair.prompts) if batch is None else batch
  key = cost_key(pair.target_config, pair.draft_config, batch=batch, sampling=pair.sampling,
                 verifier=pair.verifier)
  path = cache_path(directory, key)
  if not path.exists():
    log(f"measuring this machine's step costs once (cached in {path.name} "
        f"under {os.path.basename(os.fspath(directory))}/) ...")
  table, _ = load_or_measure(directory, key, gamma_max, lambda: measure_steps(
      pair.target, pair.draft, gamma_max=gamma_max, batch=batch, sampling=pair.sampling,
      verifier=pair.verifier, **(run or {})))
  return table


