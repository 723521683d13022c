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
after a first call that compiles (its excess is time_compile_s).
"""

from __future__ import annotations

import csv
import itertools
import math
import pathlib
import time
from typing import Callable, Sequence

import flax
import jax
import numpy as np

from specdec_jax import loading

from specdec_jax.bench import prompt_sets, studies
from specdec_jax.loading import Models
from specdec_jax.io.atomic import atomic_write_json
from specdec_jax.io.machine import git_state, machine_stamp
from specdec_jax.models.sampling import SamplingConfig
from specdec_jax.decoding.speculative import (DEFAULT_VERIFIER, GenerationResult,
                                     autoregressive_generate, reached_positions,
                                     speculative_generate)

GRID_KEYS = ("draft_name", "temperature", "gamma")
BATCH_KEYS = ("draft_name", "temperature", "gamma", "batch")


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

  def _common(self, temperature: float, max_new_tokens: int) -> dict:
    sampling = SamplingConfig(temperature=float(temperature), top_k=int(self.config.top_k),
                              top_p=float(self.config.top_p))
    return dict(max_new_tokens=max_new_tokens, sampling=sampling, seed=self.config.seed,
                eos_id=self.eos_id, pad_id=0, vocab_size=self.models.vocab_size)

  def speculative(self, draft: str, groups, *, gamma: int, temperature: float,
                  max_new_tokens: int) -> Callable[[], list[GenerationResult]]:
    m = self.models
    _, cfg, params = m.drafts[draft]
    kw = self._common(temperature, max_new_tokens)
    return lambda: [speculative_generate(m.target_params, params, prompts,
                                         target_config=m.target_config, draft_config=cfg,
                                         gamma=gamma, row_ids=ids,
                                         verifier=self.config.get("verifier", None),
                                         **kw)
                    for ids, prompts in groups]

  def autoregressive(self, groups, *, temperature: float,
                     max_new_tokens: int) -> tuple[Callable, list[GenerationResult]]:
    """(fn, its results); the first request per setting pays the compile."""
    m = self.models
    kw = self._common(temperature, max_new_tokens)
    fn = lambda: [autoregressive_generate(m.target_params, prompts,  # noqa: E731
                                          target_config=m.target_config, row_ids=ids, **kw)
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
  t0 = time.perf_counter()
  results = sd_fn()
  first = time.perf_counter() - t0
  if repeats == 0:
    return results, {k: math.nan for k in ("time_ar_s", "time_sd_s", "time_ar_tokens_per_s",
                                          "time_sd_tokens_per_s", "time_speedup",
                                          "time_compile_s")}
  med, _ = studies.interleaved_seconds({"ar": ar_fn, "sd": sd_fn}, repeats)
  ar_tokens = sum(int(r.lengths.sum()) for r in ar_results)
  sd_tokens = sum(int(r.lengths.sum()) for r in results)
  ar_tps, sd_tps = ar_tokens / med["ar"], sd_tokens / med["sd"]
  return results, dict(time_ar_s=med["ar"], time_sd_s=med["sd"], time_ar_tokens_per_s=ar_tps,
                       time_sd_tokens_per_s=sd_tps, time_speedup=sd_tps / ar_tps,
                       time_compile_s=first - med["sd"])


def _predictions(stats: dict, gamma: int, c: float, v: float) -> dict:
  """Predicted speedups: from α (i.i.d.), from the measured and the padded tokens/step."""
  cost = gamma * c + v
  return dict(time_c=c, time_v=v,
              time_predicted_speedup=stats["predicted_tokens_per_step"] / cost,
              time_predicted_speedup_from_measured=stats["tokens_per_step"] / cost,
              time_predicted_speedup_padded=stats["tokens_per_loop_step"] / cost,
              time_leviathan_speedup=stats["predicted_tokens_per_step"] / (gamma * c + 1.0))


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
  with open(path, "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
      w.writerow([_fmt(row.get(c), is_timing(c)) for c in columns])


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
    fig.savefig(path, dpi=100, metadata={"Software": None})
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
