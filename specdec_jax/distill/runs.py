"""The runs behind the scripts: the training loop, checkpoints, reports.

`run_distillation` distils config.draft toward config.target and `run_pretraining`
trains models from scratch; both resume from the workdir's latest orbax checkpoint.
Their set-up from a config is `specdec_jax.distill.run_setup`'s.

Letters: N_train training-corpus tokens, N held-out windows, T = config.seq_len.
Training tokens are int32 [N_train]; held-out windows int32 [N, T+1]; a batch is
config.batch_size windows [B, T]. With config.mesh the train state and target are
sharded over the mesh and the batch over 'data' (`step.commit`); every process of a
`jax.distributed` run writes its shards of each checkpoint, process 0 the report.
"""

from __future__ import annotations

import functools
import math
import os
import pathlib
import signal
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import loading

from specdec_jax.io import token_data

from specdec_jax.models import sharding
from specdec_jax.distill.evaluation import evaluate
from specdec_jax.distill.feature_cache import build_feature_cache
from specdec_jax.distill.hyperparameters import check_hyperparameters
from specdec_jax.distill.initialization import init_draft_params, random_params
from specdec_jax.distill.run_setup import (_named_keys, _optim, load_corpus,
                                           setup_distillation)
from specdec_jax.distill.step import (TrainState, init_train_state, is_on_policy,
                                      lm_train_step, make_feature_train_step, make_train_step)
from specdec_jax.io import checkpoint as ckpt_lib
from specdec_jax.io.atomic import atomic_write_json
from specdec_jax.io.machine import command_line, git_state
from specdec_jax.io.machine import machine_stamp
from specdec_jax.models.model import param_count, param_shapes

Array = jax.Array
PyTree = Any


# --------------------------------------------------------------------------- training loop

def _mean_metrics(pending: list[dict]) -> dict[str, float]:
  pending = jax.device_get(pending)
  return {k: float(np.mean([m[k] for m in pending])) for k in pending[0]}


def _fmt(metrics: Mapping[str, float], keys=None) -> str:
  keys = keys or sorted(metrics)
  return " ".join(f"{k}={metrics[k]:.4g}" for k in keys if k in metrics)


def _log_default(msg: str) -> None:
  from tqdm import tqdm
  tqdm.write(msg)


def _first_nonfinite(pending: list[tuple[int, dict]]) -> tuple[int, dict] | None:
  """The first (step, metrics) whose loss or gradient norm is NaN or inf, or None."""
  for step, metrics in jax.device_get(pending):
    watched = {k: float(metrics[k]) for k in ("loss", "grad_norm") if k in metrics}
    if not all(math.isfinite(v) for v in watched.values()):
      return step, watched
  return None


@jax.jit
def _all_finite(tree: PyTree) -> Array:
  """bool []: every floating leaf of `tree` is finite (one replicated scalar, so it reads
  the same on every process of a sharded run)."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.floating)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def _stop_if_nonfinite(unchecked: list[tuple[int, dict]], state: TrainState, checkpointer,
                       desc: str) -> None:
  """Raises ValueError naming the first step with a non-finite loss or gradient (or params
  that are no longer finite); nothing is saved after it, so the last checkpoint is good."""
  bad = _first_nonfinite(unchecked)
  unchecked.clear()
  if bad is None and bool(_all_finite(state.params)):
    return
  latest = checkpointer.latest_step()
  kept = (f"the last good checkpoint (step {latest}) is kept in {checkpointer.directory}"
          if latest is not None else "no checkpoint was written")
  where = (f"at step {bad[0]} ({_fmt(bad[1])})" if bad is not None
           else f"in the params after step {int(state.step)}")
  raise ValueError(f"[{desc}] training diverged: non-finite values {where}; stopped, "
                   f"{kept}; lower config.lr or check the data")


def _fit(state: TrainState, *, step_fn, batch_fn, eval_fn, checkpointer, steps: int,
         log_every: int, eval_every: int, stop_after: int, extra: dict, log, desc: str):
  """The shared training loop: resume, step, log, evaluate, checkpoint. -> (state, extra).

  Every logged step and every checkpoint is preceded by a check that no loss or gradient
  norm since the last check was NaN or inf (`_stop_if_nonfinite`): a diverged run stops
  with an error naming the step and never writes a non-finite checkpoint.
  """
  from tqdm import tqdm
  start = int(state.step)
  clock = time.perf_counter()
  spent = float(extra.get("train_time_s", 0.0))
  pending: list[dict] = []
  unchecked: list[tuple[int, dict]] = []  # (1-based step, metrics) not yet checked
  with tqdm(total=steps, initial=start, desc=desc, dynamic_ncols=True) as bar:
    for step in range(start, steps):
      batch = batch_fn(step)
      state, metrics = step_fn(state, batch, jax.random.fold_in(state.rng, step))
      pending.append(metrics)
      done = step + 1
      unchecked.append((done, metrics))
      saves = done == steps or done % checkpointer.save_every == 0
      if done % log_every == 0 or saves:
        _stop_if_nonfinite(unchecked, state, checkpointer, desc)
      if done % log_every == 0 or done == steps:
        mean = _mean_metrics(pending)
        pending = []
        extra["last_metrics"] = {"step": done, **mean}
        bar.set_postfix(loss=f"{mean['loss']:.4g}")
        log(f"[{desc}] step {done}: {_fmt(mean)}")
      if eval_every and (done % eval_every == 0 or done == steps):
        result = eval_fn(state.params)
        extra.setdefault("evals", []).append({"step": done, **result})
        log(f"[{desc}] step {done} held-out: {_fmt(result)}")
      extra.update(data_step=done, train_time_s=spent + time.perf_counter() - clock)
      if checkpointer.save(done, state.to_dict(), extra=extra, force=done == steps):
        log(f"[{desc}] checkpoint saved at step {done}")
      bar.update(1)
      if stop_after and done == stop_after:  # a simulated crash: no cleanup at all
        log(f"[{desc}] stop_after={stop_after}: killing this process")
        os.kill(os.getpid(), signal.SIGKILL)
  checkpointer.close()
  return state, extra


def _final_eval(extra: dict, state: TrainState, eval_fn) -> dict:
  """The held-out measures of the final params: the loop's last evaluation if it ran at
  the final step, else a fresh one."""
  evals = extra.get("evals") or [{}]
  if evals[-1].get("step") == int(state.step):
    return {k: v for k, v in evals[-1].items() if k != "step"}
  return eval_fn(state.params)


# --------------------------------------------------------------------------- runs

def evaluate_sets(draft_params, *, eval_sets: dict[str, np.ndarray], **kwargs
                  ) -> dict[str, float]:
  """`evaluate` on each held-out set: one set 'all' gives its measures as they are;
  several (one per corpus) give '<corpus>/<measure>' for each and, unprefixed, their
  mean over all positions."""
  if list(eval_sets) == ["all"]:
    return evaluate(draft_params, windows=eval_sets["all"], **kwargs)
  per = {name: evaluate(draft_params, windows=w, **kwargs) for name, w in eval_sets.items()}
  total = sum(r["positions"] for r in per.values())
  out = {k: sum(r[k] * r["positions"] for r in per.values()) / total
         for k in next(iter(per.values())) if k != "positions"}
  out["positions"] = int(total)
  for name, r in per.items():
    out |= {f"{name}/{k}": v for k, v in r.items() if k != "positions"}
  return out


def run_distillation(config, workdir: str | os.PathLike, *, log=None) -> dict:
  """Distills config.draft toward config.target; resumes from workdir's latest checkpoint.

  Writes workdir/checkpoints/ (orbax), workdir/draft/ (`save_params`) and
  workdir/report.json, and returns the report.
  """
  check_hyperparameters(config)
  log = log or _log_default
  if jax.process_index() != 0:  # one process of a multi-process run logs and reports
    log = lambda msg: None  # noqa: E731
  workdir = pathlib.Path(workdir).absolute()
  workdir.mkdir(parents=True, exist_ok=True)
  setup = setup_distillation(config)
  mesh = setup.mesh
  tokenizer, draft_config = setup.tokenizer, setup.draft_config
  target_config, target_params = setup.target_config, setup.target_params
  settings, optim, keys = setup.settings, setup.optim, setup.keys
  identity = ckpt_lib.run_identity(draft_config, tokenizer.identity,
                                   ckpt_lib.target_identity(target_config, target_params))
  log(f"target {config.target}: {param_count(target_params):,} params; draft "
      f"{config.draft_init}: {draft_config}")

  evaluate_fn = functools.partial(
      evaluate_sets, target_params=target_params, eval_sets=setup.eval_sets,
      draft_config=draft_config, target_config=target_config,
      temperatures=tuple(sorted({0.0, 1.0, config.temperature})),
      batch_size=config.eval_batch_size, vocab_size=settings.vocab_size,
      depth=int(config.get("eval_depth", 1)))
  like = sharding.abstract(
      jax.eval_shape(lambda p: init_train_state(p, keys["train"], optim).to_dict(),
                     param_shapes(draft_config)), mesh)
  checkpointer = ckpt_lib.Checkpointer(workdir / "checkpoints", identity=identity,
                                       save_every=config.checkpoint_every, keep=config.keep)
  restored = checkpointer.restore_latest(like)
  if restored is None:
    params = init_draft_params(draft_config, keys["draft_init"], method=config.draft_init,
                               target_params=target_params, target_config=target_config,
                               tokenizer_identity=tokenizer.identity)
    state = init_train_state(params, keys["train"], optim, mesh)
    extra = {"eval_before": evaluate_fn(state.params), "resumed_from": []}
    log(f"before distillation: {_fmt(extra['eval_before'])}")
  else:
    state, extra = TrainState.from_dict(restored[0], mesh), restored[1]
    extra["resumed_from"] = extra.get("resumed_from", []) + [int(state.step)]
    log(f"resumed from step {int(state.step)} in {checkpointer.directory}")
  commit_id, dirty = git_state()  # each start or resume: the command and the code it ran
  extra["starts"] = extra.get("starts", []) + [dict(
      step=int(state.step), command=command_line(), git_commit=commit_id, git_dirty=dirty)]

  cache_seconds = 0.0
  if draft_config.reads_target_features:
    clock = time.perf_counter()
    cache = build_feature_cache(
        workdir / "feature_cache",
        setup.mixture.windows(config.feature_cache_windows, config.seq_len, config.seed),
        target_params=target_params, target_config=target_config, draft_config=draft_config,
        temperature=settings.temperature, greedy_temperature=settings.greedy_temperature,
        identity={"target": identity["target"], "tokenizer": tokenizer.identity}, log=log)
    cache_seconds = time.perf_counter() - clock
    step_fn = make_feature_train_step(target_params["embed"], draft_config=draft_config,
                                      settings=settings, optim=optim, mesh=mesh)

    def batch_fn(step):
      return cache.batch(step, config.batch_size, config.seed)
  else:
    step_fn = make_train_step(target_params, draft_config=draft_config,
                              target_config=target_config, settings=settings, optim=optim,
                              mesh=mesh)

    def batch_fn(step):
      tokens = setup.mixture.batch_at(config.batch_size, config.seq_len, config.seed, step)
      return {"tokens": tokens[:, :-1],
              "on_policy": np.bool_(is_on_policy(step, config.on_policy_fraction))}

  state, extra = _fit(state, step_fn=step_fn, batch_fn=batch_fn,
                      eval_fn=evaluate_fn, checkpointer=checkpointer,
                      steps=config.steps, log_every=config.log_every,
                      eval_every=config.eval_every, stop_after=config.stop_after,
                      extra=extra, log=log, desc=f"distill-{config.loss}")
  after = _final_eval(extra, state, evaluate_fn)
  draft_dir = ckpt_lib.save_params(
      workdir / "draft", sharding.gather(state.params), draft_config,
      tokenizer_identity=tokenizer.identity,
      extra={"target": identity["target"], "loss": config.loss,
             "temperature": config.temperature, "alpha_after": after})
  report = {
      "alpha_before": {k: v for k, v in extra["eval_before"].items() if k.startswith("alpha")},
      "alpha_after": {k: v for k, v in after.items() if k.startswith("alpha")},
      "eval_before": extra["eval_before"], "eval_after": after,
      "evals": extra.get("evals", []), "final_train_metrics": extra.get("last_metrics"),
      "loss": config.loss, "temperature": config.temperature,
      "training_time_s": extra.get("train_time_s"), "steps": int(state.step),
      "draft_kind": draft_config.kind, "feature_cache_s": cache_seconds,
      "resumed_from": extra.get("resumed_from", []), "starts": extra.get("starts", []),
      "seeds": {"seed": config.seed, "split_seed": config.split_seed,
                "target_seed": config.target_model.seed if config.target == "random_tiny"
                else None},
      "target": config.target, "target_identity": identity["target"],
      "tokenizer": tokenizer.identity, "draft_config": draft_config.to_dict(),
      "draft_params": param_count(state.params), "draft_dir": str(draft_dir),
      "config": config.to_dict(), "stamp": machine_stamp(),
  }
  if jax.process_index() == 0:
    atomic_write_json(workdir / "report.json", report, sort_keys=True, default=str)
  log(f"alpha before {report['alpha_before']} -> after {report['alpha_after']}")
  return report


def run_pretraining(config, workdir: str | os.PathLike, *, models=("target", "draft"),
                    log=None) -> dict:
  """Trains config.target_model and/or config.draft from scratch with cross-entropy.

  Each model gets workdir/<name>/checkpoints and workdir/<name>/model (`save_params`,
  usable as target 'saved:<dir>' or draft_init 'saved:<dir>'); returns a report per model.
  """
  check_hyperparameters(config)
  log = log or _log_default
  workdir = pathlib.Path(workdir).absolute()
  tokenizer = loading.load_tokenizer(config.tokenizer)
  train_tokens, held_tokens = load_corpus(config, tokenizer)
  pre = config.pretrain
  windows = token_data.heldout_windows(held_tokens, config.eval_windows, pre.seq_len,
                                       seed=config.split_seed)
  vocab = tokenizer.vocab_size
  reports = {}
  for name in models:
    dims = {"target": config.target_model, "draft": config.draft}[name]
    if dims.get("head_vocab") or dims.get("head_tokens"):
      raise ValueError(f"pretraining trains a full-vocabulary head (cross-entropy needs q > 0 "
                       f"on every label); set {name}.head_vocab=0, got "
                       f"{dims.get('head_vocab') or len(dims.get('head_tokens'))}")
    model_config = loading.model_config(dims, vocab)
    keys = _named_keys(config.seed, f"{name}_init", "train")
    optim = _optim(config, steps=pre.steps, lr=pre.lr, warmup=pre.warmup)
    identity = ckpt_lib.run_identity(model_config, tokenizer.identity, "none (pretraining)")
    checkpointer = ckpt_lib.Checkpointer(workdir / name / "checkpoints", identity=identity,
                                         save_every=config.checkpoint_every, keep=config.keep)
    like = jax.eval_shape(lambda p: init_train_state(p, keys["train"], optim).to_dict(),
                          param_shapes(model_config))
    restored = checkpointer.restore_latest(like)
    if restored is None:
      state = init_train_state(random_params(model_config, keys[f"{name}_init"]),
                               keys["train"], optim)
      extra = {"resumed_from": []}
    else:
      state, extra = TrainState.from_dict(restored[0]), restored[1]
      extra["resumed_from"] = extra.get("resumed_from", []) + [int(state.step)]
      log(f"[{name}] resumed from step {int(state.step)}")
    eval_fn = functools.partial(evaluate, target_params=None, windows=windows,
                                draft_config=model_config, target_config=None,
                                batch_size=config.eval_batch_size)
    step_fn = functools.partial(lm_train_step, config=model_config, optim=optim)
    state, extra = _fit(
        state, step_fn=step_fn,
        batch_fn=lambda s: token_data.batch_at(train_tokens, pre.batch_size, pre.seq_len,
                                               config.seed, s),
        eval_fn=eval_fn, checkpointer=checkpointer, steps=pre.steps,
        log_every=config.log_every, eval_every=config.eval_every,
        stop_after=config.stop_after, extra=extra, log=log, desc=f"pretrain-{name}")
    nll = _final_eval(extra, state, eval_fn)["draft_nll"]
    heldout = {"nll": nll, "ppl": math.exp(nll)}
    model_dir = ckpt_lib.save_params(workdir / name / "model", state.params, model_config,
                                     tokenizer_identity=tokenizer.identity,
                                     extra={"heldout": heldout})
    reports[name] = {"heldout": heldout, "model_dir": str(model_dir),
                     "training_time_s": extra.get("train_time_s"), "steps": int(state.step),
                     "params": param_count(state.params), "config": model_config.to_dict(),
                     "resumed_from": extra.get("resumed_from", [])}
  report = {"models": reports, "tokenizer": tokenizer.identity, "seed": config.seed,
            "config": config.to_dict(), "stamp": machine_stamp()}
  atomic_write_json(workdir / "pretrain_report.json", report, sort_keys=True, default=str)
  return report
