"""Training refuses what cannot work: out-of-range hyperparameters before any work, a
non-finite loss or gradient at the step it happens (the last good checkpoint kept, no NaN
one written), non-finite params on save and on load; and the scripts' remaining user
mistakes (missing --config file, unwritable --workdir) end with one line and exit 2."""

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import distill_tiny
from helpers import tiny_config, tiny_model
from specdec_jax.distill import runs
from specdec_jax.distill.hyperparameters import check_hyperparameters
from specdec_jax.distill.step import OptimizerSettings, init_train_state
from specdec_jax.io import checkpoint as ckpt_lib

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import _bootstrap  # noqa: E402


# --------------------------------------------------------------- hyperparameters

@pytest.mark.parametrize("field,value", [
    ("lr", float("nan")), ("lr", float("inf")), ("lr", 0.0), ("lr", -1e-3),
    ("warmup", -1), ("steps", -1), ("steps", 0), ("batch_size", 0), ("eval_batch_size", -2),
    ("temperature", float("nan")), ("temperature", -0.5), ("greedy_temperature", 0.0),
    ("clip", float("inf")), ("clip", 0.0), ("unroll", 0), ("weight_decay", float("nan")),
    ("on_policy_fraction", 1.5), ("seq_len", 1), ("checkpoint_every", 0), ("keep", 0),
    ("heldout_fraction", 1.5), ("heldout_fraction", 0.0), ("steps", True),
])
def test_bad_hyperparameter_is_named(field, value):
  config = distill_tiny.get_config()
  config[field] = value
  with pytest.raises(ValueError, match=f"config.{field} must"):
    check_hyperparameters(config)


@pytest.mark.parametrize("field,value", [("lr", float("nan")), ("steps", 0), ("warmup", -5)])
def test_bad_pretrain_hyperparameter_is_named(field, value):
  config = distill_tiny.get_config()
  config.pretrain[field] = value
  with pytest.raises(ValueError, match=f"config.pretrain.{field} must"):
    check_hyperparameters(config)


def test_shipped_configs_pass_the_check():
  for path in sorted((REPO / "configs").glob("distill_*.py")):
    module = {}
    exec(compile(path.read_text(), str(path), "exec"), module)  # noqa: S102
    check_hyperparameters(module["get_config"]())


# --------------------------------------------------------------- non-finite training

def _fake_fit(tmp_path, nan_at: int, steps: int = 10, save_every: int = 2, log_every: int = 3):
  """runs._fit with a fake step that returns a NaN loss at step nan_at (1-based)."""
  config = tiny_config(vocab=8, layers=1, width=8, max_seq_len=8)
  state = init_train_state(tiny_model(config, 0), jax.random.PRNGKey(0),
                           OptimizerSettings(lr=1e-3, warmup=1, steps=steps))

  def step_fn(state, batch, key):
    del batch, key
    done = int(state.step) + 1
    loss = jnp.float32(np.nan if done == nan_at else 1.0 / done)
    return state.replace(step=state.step + 1), {"loss": loss, "grad_norm": jnp.float32(1.0)}

  checkpointer = ckpt_lib.Checkpointer(tmp_path / "checkpoints", identity={"run": "fake"},
                                       save_every=save_every, keep=100)
  return checkpointer, lambda: runs._fit(
      state, step_fn=step_fn, batch_fn=lambda step: None, eval_fn=lambda p: {},
      checkpointer=checkpointer, steps=steps, log_every=log_every, eval_every=0,
      stop_after=0, extra={}, log=lambda msg: None, desc="fake")


def test_nonfinite_loss_stops_at_its_step_and_keeps_the_last_good_checkpoint(tmp_path):
  checkpointer, fit = _fake_fit(tmp_path, nan_at=5)
  with pytest.raises(ValueError, match=r"non-finite values at step 5 .*last good checkpoint "
                                       r"\(step 4\)"):
    fit()
  checkpointer.wait()
  assert checkpointer.all_steps() == [2, 4]  # step 6 would have been the next save


def test_finite_run_saves_every_checkpoint(tmp_path):
  checkpointer, fit = _fake_fit(tmp_path, nan_at=-1)
  fit()
  assert checkpointer.all_steps() == [2, 4, 6, 8, 10]


def test_nonfinite_params_are_never_saved_and_never_loaded(tmp_path, monkeypatch):
  config = tiny_config(vocab=8, layers=1, width=8, max_seq_len=8)
  params = tiny_model(config, 0)
  good = ckpt_lib.save_params(tmp_path / "draft", params, config, tokenizer_identity="t")
  before = (good / "model.json").read_text()
  broken = {**params, "embed": params["embed"].at[0, 0].set(jnp.nan)}
  with pytest.raises(ValueError, match=r"refusing to save non-finite params .*\['embed'\]"):
    ckpt_lib.save_params(good, broken, config, tokenizer_identity="t")
  assert (good / "model.json").read_text() == before  # the old save is untouched
  ckpt_lib.load_params(good)
  # A file written past the check (an older version, another tool) is refused on load.
  monkeypatch.setattr(ckpt_lib, "nonfinite_leaves", lambda tree: [])
  bad = ckpt_lib.save_params(tmp_path / "nan_draft", broken, config, tokenizer_identity="t")
  monkeypatch.undo()
  with pytest.raises(ValueError, match=r"nan_draft.params holds NaN or inf in \['embed'\]"):
    ckpt_lib.load_params(bad)


# --------------------------------------------------------------- the scripts

def _script(name, *flags, cwd=REPO):
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, str(REPO / "scripts" / name), *flags], cwd=cwd,
                        env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flags,message", [
    (("--config=configs/distill_tiny.py", "--config.lr=nan", "--config.steps=2"),
     "error: config.lr must be a finite number, got nan"),
    (("--config=configs/distill_tiny.py", "--config.steps=-1"),
     "error: config.steps must lie in [1, inf), got -1"),
    (("--config=configs/no_such_config.py",), "error: --config file 'configs/no_such_config.py' "
                                               "not found"),
])
def test_distill_refuses_bad_runs_before_any_work(tmp_path, flags, message):
  workdir = tmp_path / "run"
  proc = _script("distill.py", *flags, f"--workdir={workdir}")
  assert proc.returncode == _bootstrap.USAGE_ERROR, proc.stderr[-2000:]
  assert proc.stderr.strip() == message
  assert not any(workdir.rglob("*")) if workdir.exists() else True


def test_unwritable_workdir_is_one_line():
  proc = _script("sweep.py", "--config=configs/sweep_tiny.py", "--workdir=/proc/specdec_x")
  assert proc.returncode == _bootstrap.USAGE_ERROR, proc.stderr[-2000:]
  assert proc.stderr.strip().startswith("error: --workdir '/proc/specdec_x' cannot be created")
  assert len(proc.stderr.strip().splitlines()) == 1


def test_path_flags_check_without_running(tmp_path):
  assert _bootstrap.check_path_flags(["--config=configs/tiny.py:x", f"--workdir={tmp_path}"]) \
      is None
  assert "not found" in _bootstrap.check_path_flags(["--config", "nope.py"])
  assert "--out" in _bootstrap.check_path_flags(["--out=/proc/specdec_x/r.json"])
