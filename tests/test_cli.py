"""Scripts: bad user input ends with one line and exit status 2; atomic writes."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from specdec_jax.bench import studies
from specdec_jax.io.atomic import atomic_save, atomic_write, atomic_write_json

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import _bootstrap  # noqa: E402


def _generate(*flags, env=None):
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", **(env or {})}
  return subprocess.run([sys.executable, str(REPO / "scripts" / "generate.py"),
                         "--config=configs/tiny.py", "--prompt=abc", *flags], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flags,message", [
    (["--config.mesh=3,3"], "error: config.mesh '3,3' needs 9 devices, 1 are available"),
    (["--config.draft=ngram:0"], "error: config.draft ngram draft name must be 'ngram:<n>' "
     "with n >= 1"),
    # refused before the models load and the cost table is measured
    (["--config.mesh=1,1", "--config.gamma=auto"], "error: gamma 'auto' and trees run on one "
     "device"),
])
def test_bad_input_exits_2_with_one_line(flags, message, tmp_path):
  costs = tmp_path / "costs"  # an empty cost-table cache: a table measured first lands here
  proc = _generate(*flags, env={"SPECDEC_COSTS_DIR": str(costs)})
  assert proc.returncode == _bootstrap.USAGE_ERROR, proc.stderr[-2000:]
  assert message in proc.stderr
  assert "Traceback" not in proc.stderr
  assert "step costs" not in proc.stdout  # no cost table was measured first
  assert not costs.exists() or not list(costs.iterdir())


def test_only_our_own_value_errors_are_user_errors():
  def ours():
    raise ValueError("bad value 3")
  with pytest.raises(ValueError) as raised:
    ours()
  assert not _bootstrap.is_user_error(raised.value)  # raised in tests/: not an input check
  from specdec_jax.models.sharding import parse_mesh_shape
  with pytest.raises(ValueError) as raised:
    parse_mesh_shape("x")
  assert _bootstrap.is_user_error(raised.value)
  assert not _bootstrap.is_user_error(RuntimeError("a bug"))


def test_atomic_writes_keep_the_old_file_when_a_write_fails(tmp_path):
  path = tmp_path / "report.json"
  atomic_write_json(path, {"step": 1})

  def broken(f):
    f.write(b'{"step": 2')
    raise OSError("disk full")
  with pytest.raises(OSError, match="disk full"):
    atomic_write(path, broken)
  assert json.loads(path.read_text()) == {"step": 1}
  assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]

  def broken_save(tmp):  # a writer that takes a path (safetensors, savefig)
    pathlib.Path(tmp).write_bytes(b'{"step": 2')
    raise OSError("disk full")
  with pytest.raises(OSError, match="disk full"):
    atomic_save(path, broken_save)
  assert json.loads(path.read_text()) == {"step": 1}
  assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
  atomic_save(path, lambda tmp: pathlib.Path(tmp).write_text('{"step": 3}'))
  assert json.loads(path.read_text()) == {"step": 3}
  assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


@pytest.mark.parametrize("where", ["env", "flag"])
def test_fetch_qwen_with_an_unwritable_cache_exits_2_with_one_line(tmp_path, where):
  """`make qwen` with a cache directory that cannot be created: one line before any
  download."""
  bad = "/proc/specdec_no_such_dir"
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  args = [sys.executable, str(REPO / "scripts" / "fetch_qwen.py")]
  if where == "env":
    env["SPECDEC_CACHE"] = bad
  else:
    args.append(f"--cache_dir={bad}")
  proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == _bootstrap.USAGE_ERROR, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines() == [
      f"error: cache directory {bad} ({'$SPECDEC_CACHE' if where == 'env' else '--cache_dir'})"
      " cannot be created: No such file or directory"]


def test_profile_step_splits_the_chain_step_into_its_pieces(tmp_path):
  """scripts/profile_step.py on the tiny pair: both loops ran the steps they were meant to
  (it raises otherwise), the split adds up to the chain step in plain steps, and a bad flag
  is one line before anything loads."""
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}

  def profile(*flags):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "profile_step.py"),
                           "--config=configs/tiny.py", *flags], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)

  out = tmp_path / "profile.json"
  proc = profile("--gamma=2", "--steps=2", "--repeats=1", f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  doc = json.loads(out.read_text())
  assert doc["plain_steps"]["plain step"] == 1.0 and doc["gamma"] == 2
  assert sum(doc["split"].values()) == pytest.approx(doc["plain_steps"]["chain step"])
  assert doc["modelled_step"] == pytest.approx(2 * doc["c"] + doc["v"])  # γc + v(γ+1)
  assert {"cpu", "git_commit", "command"} <= set(doc["stamp"])
  unit, prefill = doc["plain_steps"], doc["prefill"]
  width = prefill["width"]
  assert width >= doc["context"] and width % studies.PROMPT_BUCKET == 0
  assert prefill["draft"] == pytest.approx(
      unit[f"target and draft prefill, {width} tokens"] - unit[f"target prefill, {width} tokens"])
  assert prefill["never_drafting_floor"] == pytest.approx(studies.never_drafting_floor(
      prefill["target"], prefill["draft"], prefill["new_tokens"], unit["chain step"]))
  bad = profile("--steps=0")
  assert bad.returncode == 2
  assert bad.stderr.strip().splitlines()[-1] == "error: --steps must be an int >= 1, got 0"
