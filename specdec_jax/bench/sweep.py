"""Reproducible studies of acceptance and speed against γ (Leviathan et al. §3).

One sweep = a grid (draft × temperature × γ) on held-out prompts plus a batch
study, all from one config (see configs/sweep_tiny.py, configs/sweep_smollm2.py):

  per cell            acceptance rate, α = mean Σ min(p, q), tokens/step measured
                      (emitted, and uncut = mean n + 1 before the max_new_tokens / EOS
                      cut) and predicted (1 - α^(γ+1)) / (1 - α), P(accept j | reached j) and
                      mean β at each position j of the block, measured speedup over
                      autoregressive decoding, predicted speedup E / (γ c + v(γ+1))
  per draft           c = draft step / target step; per target: v(k) (measured once)
  per (draft, T)      best γ measured and predicted
  per domain          with config.prompt_set (a JSON of prompts with domains,
                      `prompt_sets`): per cell and domain and over all prompts, α as the
                      mean over prompts and speedup as the geometric mean over prompts
                      (each prompt then runs and is timed alone at batch 1), each with
                      its 95% Student-t interval over prompts: results.json "domains",
                      per prompt "per_prompt"
  per batch size      tokens/s, speedup, idle row-steps (a finished row while the loop
                      still runs), tokens/step per row vs per loop step

Everything not prefixed `time_` is a pure function of (config, seed, code, machine):
two runs write byte-identical results.csv / batch.csv. Wall-clock quantities (and all
that depend on them: c, v, speedups, best γ) carry the `time_` prefix and live in
results_timing.csv / batch_timing.csv / best_gamma.csv. results.json holds both.
Timings are medians of `repeats` calls, autoregressive and speculative interleaved,
after a first call that compiles (its excess is time_compile_s). The statistics, files
and tables are `specdec_jax.bench.sweep_tables`'s.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Callable

import flax
import jax
import numpy as np

from specdec_jax import loading

from specdec_jax.bench import prompt_sets, studies
from specdec_jax.gamma import adaptive
from specdec_jax.bench.sweep_tables import (_prompt_alphas, best_gammas, generation_stats,
                                            plot, write_outputs)
from specdec_jax.bench.timing import interleaved_seconds, timed_call
from specdec_jax.loading import Models
from specdec_jax.io.machine import git_state, machine_stamp
from specdec_jax.models.sampling import SamplingConfig
from specdec_jax.decoding.loop import autoregressive_generate, speculative_generate
from specdec_jax.decoding.results import GenerationResult
from specdec_jax.decoding.spec import DEFAULT_VERIFIER, DecodeSpec, FixedGamma
from specdec_jax.models.model import Model


# --------------------------------------------------------------------------- set-up

def environment() -> dict:
  """Package versions and the git commit (`git rev-parse HEAD`, else 'unknown')."""
  commit = git_state()[0] or "unknown"
  return dict(jax_version=jax.__version__, flax_version=flax.__version__,
              numpy_version=np.__version__, git_commit=commit)


def load_models(config) -> Models:
  """Tokenizer, target and every draft of config.drafts ((name, spec) pairs), by
  `loading.load_models`; a sweep needs at least one draft and no 'none'."""
  if not config.drafts:
    raise ValueError(f"config.drafts needs (name, spec) pairs, got {config.drafts!r}")
  models = loading.load_models(config, [tuple(d) for d in config.drafts])
  for name, (spec, cfg, _) in models.drafts.items():
    if cfg is None:
      raise ValueError(f"draft {name!r}: a sweep needs a draft, got {spec!r}")
  return models


def heldout_prompts(tokenizer, corpus: str, *, num: int, prompt_tokens: int,
                    heldout_fraction: float = 0.1, split_seed: int = 0,
                    seed: int = 0) -> list[list[int]]:
  """`num` prompts of exactly `prompt_tokens` tokens, each starting at a line of a
  held-out document (the same document split as distillation: corpora.split_documents)."""
  from specdec_jax.io import corpora
  _, held = corpora.split_documents(corpora.load_documents(corpus), heldout_fraction,
                                    seed=split_seed)
  rng = np.random.default_rng(seed)
  out = []
  while len(out) < num:
    text = held[int(rng.integers(len(held)))].text
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    start = starts[int(rng.integers(len(starts)))]
    ids = tokenizer.encode(text[start:start + 16 * prompt_tokens])
    if len(ids) >= prompt_tokens:
      out.append(list(ids[:prompt_tokens]))
  return out


def prompt_set(config) -> list[prompt_sets.Prompt] | None:
  """The prompts of config.prompt_set (a JSON file), None where it is '' or absent."""
  path = str(config.get("prompt_set", ""))
  return prompt_sets.load_prompt_set(path) if path else None


def load_prompts(config, tokenizer) -> list[list[int]]:
  """config.prompt_set if set (each prompt templated as it says), else config.prompt_source:
  'config' (config.prompts) or 'heldout:<corpus>'."""
  records = prompt_set(config)
  if records is not None:
    return prompt_sets.encode(tokenizer, records)
  source = config.prompt_source
  if source == "config":
    return loading.encode_prompts(tokenizer, config.prompts, chat=bool(config.chat))
  if source.startswith("heldout:"):
    corpora = source[len("heldout:"):].split("+")
    num = int(config.num_prompts)
    if num % len(corpora):
      raise ValueError(f"num_prompts={num} does not split evenly over {corpora}")
    return [p for corpus in corpora
            for p in heldout_prompts(tokenizer, corpus, num=num // len(corpora),
                                     prompt_tokens=config.prompt_tokens,
                                     heldout_fraction=config.heldout_fraction,
                                     split_seed=config.split_seed, seed=config.seed)]
  raise ValueError(f"unknown prompt_source {source!r}: expected 'config' or "
                   "'heldout:<corpus>[+<corpus>...]'")


# --------------------------------------------------------------------------- timing

def measure_costs(models: Models, *, batch: int, context: int, max_tokens: int,
                  repeats: int) -> dict:
  """time_target_call_s, v(k) for k = 1..max_tokens, and each draft's c (one token)."""
  call = _caller(models, batch=batch, context=context, repeats=repeats)
  t1 = call(models.target_params, models.target_config, 1)
  v = {k: (1.0 if k == 1 else call(models.target_params, models.target_config, k) / t1)
       for k in range(1, max_tokens + 1)}
  c = {name: call(params, cfg, 1) / t1 for name, (_, cfg, params) in models.drafts.items()}
  return dict(time_target_call_s=t1, time_v=v, time_c=c, batch=batch, context=context)


def _caller(models: Models, *, batch: int, context: int, repeats: int):
  """call(params, config, tokens) -> median seconds of one cached forward (a feature draft
  reads the target's embedding)."""
  def call(params, config, tokens):
    return studies.call_seconds(params, config, batch=batch, tokens=tokens, context=context,
                                repeats=repeats, input_embed=models.target_params["embed"])
  return call


# --------------------------------------------------------------------------- runs

def _groups(prompts: list, size: int) -> list[tuple[np.ndarray, list]]:
  """(row_ids, prompts) per generate call of `size` rows (0 = one call)."""
  size = size or len(prompts)
  return [(np.arange(i, min(i + size, len(prompts))), prompts[i:i + size])
          for i in range(0, len(prompts), size)]


class _Runner:
  """Builds the generate closures of a cell; warms the autoregressive ones once."""

  def __init__(self, models: Models, config):
    self.models = models
    self.config = config
    self.eos_id = models.tokenizer.eos_id if config.stop_at_eos else None
    self.env = environment()
    self._ar_warm = {}
    self.records = prompt_set(config)  # None, or the prompt set: per-domain rows below
    self.domain_rows, self.prompt_rows = [], []

  def _spec(self, temperature: float, max_new_tokens: int, proposer=None) -> DecodeSpec:
    sampling = SamplingConfig(temperature=float(temperature), top_k=int(self.config.top_k),
                              top_p=float(self.config.top_p))
    return DecodeSpec(max_new_tokens, proposer, sampling=sampling,
                      verifier=self.config.get("verifier", None) or DEFAULT_VERIFIER,
                      eos_id=self.eos_id, vocab_size=self.models.vocab_size)

  def speculative(self, draft: str, groups, *, gamma: int, temperature: float,
                  max_new_tokens: int) -> Callable[[], list[GenerationResult]]:
    m = self.models
    _, cfg, params = m.drafts[draft]
    spec = self._spec(temperature, max_new_tokens, FixedGamma(gamma))
    target = Model(m.target_config, m.target_params)
    return lambda: [speculative_generate(target, Model(cfg, params), prompts, spec=spec,
                                         seed=self.config.seed, row_ids=ids)
                    for ids, prompts in groups]

  def autoregressive(self, groups, *, temperature: float,
                     max_new_tokens: int) -> tuple[Callable, list[GenerationResult]]:
    """(fn, its results); the first request per setting pays the compile."""
    m = self.models
    spec, target = self._spec(temperature, max_new_tokens), Model(m.target_config, m.target_params)
    fn = lambda: [autoregressive_generate(target, prompts, spec=spec,  # noqa: E731
                                          seed=self.config.seed, row_ids=ids)
                  for ids, prompts in groups]
    # Keyed by the rows' ids and tokens: calls of one shape may hold other prompts.
    key = (float(temperature), max_new_tokens,
           tuple((tuple(map(int, ids)), tuple(map(tuple, p))) for ids, p in groups))
    if key not in self._ar_warm:
      self._ar_warm[key] = fn()
    return fn, self._ar_warm[key]


def _timed(sd_fn, ar_fn, ar_results, repeats: int) -> tuple[list[GenerationResult], dict]:
  """The first (compiling) speculative call's results, then interleaved medians.

  repeats = 0 measures acceptance only: every time_ field is NaN.
  """
  first, results = timed_call(sd_fn)
  if repeats == 0:
    return results, {k: math.nan for k in ("time_ar_s", "time_sd_s", "time_ar_tokens_per_s",
                                          "time_sd_tokens_per_s", "time_speedup",
                                          "time_compile_s")}
  med, _ = interleaved_seconds({"ar": ar_fn, "sd": sd_fn}, repeats)
  ar_tokens = sum(int(r.lengths.sum()) for r in ar_results)
  sd_tokens = sum(int(r.lengths.sum()) for r in results)
  ar_tps, sd_tps = ar_tokens / med["ar"], sd_tokens / med["sd"]
  return results, dict(time_ar_s=med["ar"], time_sd_s=med["sd"], time_ar_tokens_per_s=ar_tps,
                       time_sd_tokens_per_s=sd_tps, time_speedup=sd_tps / ar_tps,
                       time_compile_s=first - med["sd"])


def _predictions(stats: dict, gamma: int, c: float, v: float) -> dict:
  """Predicted speedups: from α (i.i.d.), from the measured and the padded tokens/step."""
  cost = adaptive.step_cost(adaptive.draft_calls(gamma), c, v)
  return dict(time_c=c, time_v=v,
              time_predicted_speedup=stats["predicted_tokens_per_step"] / cost,
              time_predicted_speedup_from_measured=stats["tokens_per_step"] / cost,
              time_predicted_speedup_padded=stats["tokens_per_loop_step"] / cost,
              time_leviathan_speedup=stats["predicted_tokens_per_step"] / adaptive.step_cost(
                  adaptive.draft_calls(gamma), c, 1.0))


def _expand_positions(stats: dict, width: int) -> dict:
  """Lists by position -> columns accept_pos_j, beta_pos_j, reached_pos_j (j = 1..width)."""
  out = {k: v for k, v in stats.items() if not k.endswith("_by_position")}
  for name in ("accept", "beta", "reached"):
    values = stats[f"{name}_by_position"]
    for j in range(width):
      out[f"{name}_pos_{j + 1}"] = values[j] if j < len(values) else None
  return out


def _run_cell(runner: _Runner, name: str, groups, gamma: int, temperature: float, config):
  """(speculative results, time_ fields) of one draft/γ/T on `groups`, both samplers timed."""
  ar_fn, ar_results = runner.autoregressive(groups, temperature=temperature,
                                            max_new_tokens=config.max_new_tokens)
  sd_fn = runner.speculative(name, groups, gamma=gamma, temperature=temperature,
                             max_new_tokens=config.max_new_tokens)
  return _timed(sd_fn, ar_fn, ar_results, int(config.repeats))


def _measure_cell(runner: _Runner, name: str, groups, gamma: int, temperature: float, config):
  """(pooled statistics, time_ fields) of one draft/γ/T on `groups`, both samplers timed."""
  results, timing = _run_cell(runner, name, groups, gamma, temperature, config)
  return generation_stats(results, gamma), timing


def _timed_per_prompt(config) -> bool:
  """A prompt set with timing: every prompt runs and is timed alone (batch 1)."""
  return bool(config.get("prompt_set", "")) and int(config.repeats) > 0


def _measure_prompts(runner: _Runner, name: str, groups, gamma: int, temperature: float,
                     config) -> tuple[dict, dict]:
  """`_measure_cell` over a prompt set; adds this cell's rows to runner.prompt_rows (per
  prompt: α, time_speedup) and runner.domain_rows (`prompt_sets.domain_summary`, the
  speedup fields prefixed time_). Timed: each prompt alone, the pooled time_ fields from
  the sums of seconds and tokens."""
  prompts = [p for _, ps in groups for p in ps]
  if _timed_per_prompt(config):
    cells = [_run_cell(runner, name, [(np.array([i]), [p])], gamma, temperature, config)
             for i, p in enumerate(prompts)]
    results = [r for rs, _ in cells for r in rs]
    speedups = [t["time_speedup"] for _, t in cells]
    ar_s, sd_s = (sum(t[k] for _, t in cells) for k in ("time_ar_s", "time_sd_s"))
    ar_tokens = sum(t["time_ar_tokens_per_s"] * t["time_ar_s"] for _, t in cells)
    sd_tokens = sum(t["time_sd_tokens_per_s"] * t["time_sd_s"] for _, t in cells)
    timing = dict(time_ar_s=ar_s, time_sd_s=sd_s, time_ar_tokens_per_s=ar_tokens / ar_s,
                  time_sd_tokens_per_s=sd_tokens / sd_s,
                  time_speedup=(sd_tokens / sd_s) / (ar_tokens / ar_s),
                  time_compile_s=sum(t["time_compile_s"] for _, t in cells))
  else:
    results, timing = _run_cell(runner, name, groups, gamma, temperature, config)
    speedups = None
  alphas = _prompt_alphas(results)
  cell = dict(draft_name=name, temperature=float(temperature), gamma=int(gamma))
  for i, rec in enumerate(runner.records):
    runner.prompt_rows.append(dict(**cell, id=rec.id, domain=rec.domain, chat=rec.chat,
                                   prompt_tokens=len(prompts[i]), alpha=float(alphas[i]),
                                   time_speedup=speedups[i] if speedups else math.nan))
  summary = prompt_sets.domain_summary([r.domain for r in runner.records], speedup=speedups,
                                       alpha=alphas)
  runner.domain_rows += [{**cell, **{("time_" + k if k.startswith("speedup") else k): v
                                     for k, v in row.items()}} for row in summary]
  return generation_stats(results, gamma), timing


def run_grid(models: Models, config, prompts, costs: dict, runner: _Runner, bar=None) -> list:
  """One row per (draft, temperature, γ) cell; deterministic fields, then time_ fields."""
  batch = 1 if _timed_per_prompt(config) else int(config.grid_batch) or len(prompts)
  groups = _groups(prompts, batch)
  width = max(config.gammas)
  measure = _measure_cell if runner.records is None else _measure_prompts
  rows = []
  for name, temperature, gamma in itertools.product(models.drafts, config.temperatures,
                                                    config.gammas):
    stats, timing = measure(runner, name, groups, gamma, temperature, config)
    row = dict(kind="grid", draft_name=name, draft=models.drafts[name][0],
               temperature=float(temperature), gamma=int(gamma),
               **_cell_config(config, runner.env), num_prompts=len(prompts),
               batch=batch, **_expand_positions(stats, width))
    row.update(timing)
    row.update(_predictions(stats, gamma, costs["time_c"][name], costs["time_v"][gamma + 1]))
    rows.append(row)
    if bar is not None:
      bar.update(1)
  return rows


def run_batch_study(models: Models, config, prompts, runner: _Runner, bar=None) -> list:
  """Speculative vs autoregressive at each of config.batch_sizes (prompts cycled)."""
  name, gamma = config.batch_draft or next(iter(models.drafts)), int(config.batch_gamma)
  temperature = float(config.batch_temperature)
  if name not in models.drafts:
    raise ValueError(f"batch_draft {name!r} is not one of config.drafts {list(models.drafts)}")
  context = _context(prompts, config.max_new_tokens)
  _, draft_cfg, draft_params = models.drafts[name]
  rows = []
  for batch in config.batch_sizes:
    ids = np.arange(int(batch))
    groups = [(ids, [prompts[i % len(prompts)] for i in ids])]
    stats, timing = _measure_cell(runner, name, groups, gamma, temperature, config)
    call = _caller(models, batch=int(batch), context=context,
                   repeats=int(config.cost_repeats))
    t1 = call(models.target_params, models.target_config, 1)
    c = call(draft_params, draft_cfg, 1) / t1
    v = call(models.target_params, models.target_config, gamma + 1) / t1
    row = dict(kind="batch", draft_name=name, draft=models.drafts[name][0],
               temperature=temperature, gamma=gamma, batch=int(batch),
               **_cell_config(config, runner.env), num_prompts=len(prompts),
               **_expand_positions(stats, gamma))
    row.update(timing)
    row.update(_predictions(stats, gamma, c, v))
    rows.append(row)
    if bar is not None:
      bar.update(1)
  return rows


def _cell_config(config, env: dict) -> dict:
  """The settings every row carries besides its cell's own."""
  return dict(target=config.target, tokenizer=config.tokenizer, top_k=int(config.top_k),
              top_p=float(config.top_p), max_new_tokens=int(config.max_new_tokens),
              prompt_source=config.prompt_source,
              prompt_set=str(config.get("prompt_set", "")), stop_at_eos=bool(config.stop_at_eos),
              dtype=config.dtype, seed=int(config.seed),
              verifier=str(config.get("verifier", DEFAULT_VERIFIER)), **env)


def _context(prompts, max_new_tokens: int) -> int:
  return int(np.mean([len(p) for p in prompts])) + max_new_tokens // 2


# --------------------------------------------------------------------------- entry

def run_sweep(config, workdir, *, progress: bool = True) -> dict:
  """Runs the grid and the batch study of `config`, writes workdir/*; returns the results."""
  from tqdm import tqdm

  t_start = time.perf_counter()
  if int(config.repeats) < 0:
    raise ValueError(f"repeats must be >= 0 (0 = acceptance only), got {config.repeats}")
  models = load_models(config)
  prompts = load_prompts(config, models.tokenizer)
  grid_batch = 1 if _timed_per_prompt(config) else int(config.grid_batch) or len(prompts)
  context = _context(prompts, config.max_new_tokens)
  costs = measure_costs(models, batch=grid_batch, context=context,
                        max_tokens=max(config.gammas) + 1, repeats=int(config.cost_repeats))
  runner = _Runner(models, config)
  total = len(models.drafts) * len(config.temperatures) * len(config.gammas)
  total += len(config.batch_sizes)
  with tqdm(total=total, desc="sweep", disable=not progress) as bar:
    grid = run_grid(models, config, prompts, costs, runner, bar)
    batch = run_batch_study(models, config, prompts, runner, bar)
  results = dict(grid=grid, batch=batch, best_gamma=best_gammas(grid, costs), costs=costs,
                 meta=dict(config=config.to_dict(), prompts=prompts, **runner.env,
                           stamp=machine_stamp()))
  if runner.records is not None:
    results.update(domains=runner.domain_rows, per_prompt=runner.prompt_rows)
  write_outputs(workdir, results)
  if config.plots:
    results["plots"] = plot(workdir, grid)
  results["time_wall_s"] = time.perf_counter() - t_start
  return results
