"""Mesh sharding, pmap and jax.distributed: the same tokens on every layout.

The multi-device cases run in subprocesses (`multidevice_worker.py`): one with 4
forced CPU devices (pmap, the (1,4) and (2,2) meshes, sharded distillation and a
checkpoint restored on another mesh) and two processes with 2 devices each on
loopback (`jax.distributed`, gloo). Each is compared with the one-device reference
computed here. Tokens must be identical; losses and params after 3 distillation
steps agree to float tolerance (sums over sharded axes change the rounding order).
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import multidevice_worker as worker
from helpers import tiny_config, tiny_model
from specdec_jax.models import sharding
from specdec_jax.distill import OptimizerSettings, init_train_state

REPO = pathlib.Path(__file__).resolve().parent.parent
WORKER = str(REPO / "tests" / "multidevice_worker.py")


def _env(devices: int) -> dict:
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
  return {**os.environ, "XLA_FLAGS": flags.strip(), "PYTHONPATH": str(REPO),
          "JAX_PLATFORMS": "cpu"}


def _last_json(stdout: str) -> dict:
  return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reference():
  """One device, this process: tokens of every sampling, and 3 distillation steps."""
  state, losses = worker.distill_steps(None)
  return dict(generate=worker.generate_cases(None), losses=losses,
              params=worker._lists(state.params))


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("local")
  proc = subprocess.run([sys.executable, WORKER, "local", str(workdir)], cwd=REPO, env=_env(4),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return _last_json(proc.stdout)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def distributed_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("distributed")
  coordinator = f"127.0.0.1:{_free_port()}"
  procs = [subprocess.Popen([sys.executable, WORKER, "distributed", str(workdir), coordinator,
                             "2", str(i)], cwd=REPO, env=_env(2), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(2)]
  outs = []
  for proc in procs:
    try:
      outs.append(proc.communicate(timeout=600))
    except subprocess.TimeoutExpired:
      for p in procs:
        p.kill()
      raise
  for proc, (_, err) in zip(procs, outs):
    assert proc.returncode == 0, err[-3000:]
  return _last_json(outs[0][0]), workdir


def assert_params_close(a, b, rtol=1e-4, atol=1e-5):
  leaves_a, leaves_b = (sorted(_flat(t).items()) for t in (a, b))
  assert [k for k, _ in leaves_a] == [k for k, _ in leaves_b]
  for (name, x), (_, y) in zip(leaves_a, leaves_b):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol, err_msg=name)


def _flat(tree, prefix=""):
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(_flat(v, f"{prefix}/{k}"))
    return out
  return {prefix: tree}


# ------------------------------------------------------------------ one process, 4 devices

@pytest.mark.parametrize("shape", ["1,4", "2,2"])
def test_mesh_tokens_equal_one_device(reference, local_run, shape):
  assert local_run[f"mesh_{shape}"]  # every sampling on (2,2), the sampled one on (1,4)
  for name in local_run[f"mesh_{shape}"]:
    assert local_run[f"mesh_{shape}"][name] == reference["generate"][name], (shape, name)


def test_pmap_tokens_equal_one_device(reference, local_run):
  assert local_run["pmap"]["tokens"] == reference["generate"]["t1_top_p"]["tokens"]
  accepted = np.asarray(reference["generate"]["t1_top_p"]["accepted"])
  assert local_run["pmap"]["stats"]["accepted"] == int(accepted[accepted >= 0].sum())


def test_params_are_really_split(local_run):
  n_heads = local_run["q_shape"][2]  # stacked q [L,D,N,H]
  assert local_run["q_shard_shape"][2] * 4 == n_heads


def test_sharded_distillation_equals_one_device(reference, local_run):
  got = local_run["distill"]
  np.testing.assert_allclose(got["mesh_losses"], reference["losses"], rtol=1e-5)
  assert_params_close(got["mesh_params"], reference["params"])


def test_checkpoint_saved_on_one_mesh_restores_on_another(local_run):
  restore = local_run["restore"]
  assert restore["equal"], "params restored on (1,4) differ from those saved on (2,2)"
  assert restore["mesh"] == {"data": 1, "model": 4}
  assert "model" in restore["spec"]


# ------------------------------------------------------------------ two processes

def test_two_processes_equal_one_device(reference, distributed_run):
  out, _ = distributed_run
  assert out["processes"] == 2
  assert list(out["mesh_2,2"]) == ["t1_top_p"]  # the sampled case only
  assert out["mesh_2,2"]["t1_top_p"] == reference["generate"]["t1_top_p"]
  np.testing.assert_allclose(out["distill"]["mesh_losses"], reference["losses"], rtol=1e-5)
  assert_params_close(out["distill"]["mesh_params"], reference["params"])


def test_checkpoint_written_by_two_processes_restores_on_one_device(distributed_run):
  out, workdir = distributed_run
  _, _, draft, dp, _, optim, _ = worker.distill_setup()
  like = init_train_state(dp, np.zeros(2, np.uint32), optim)
  restored = worker.restore_state(workdir / "ckpt", like, {"test": "mesh"}, None)
  assert_params_close(worker._lists(restored["params"]), out["distill"]["mesh_params"],
                      rtol=0, atol=0)


# ------------------------------------------------------------------ specs and errors

def test_partition_specs_follow_the_rules():
  mesh = sharding.make_mesh("1,1")
  cfg = tiny_config(layers=2)
  params = tiny_model(cfg, 0)
  specs = sharding.param_shardings(params, mesh)
  layer = specs["layers"]
  assert layer["q"].spec == P(None, None, "model", None)  # stacked [L,D,N,H]
  assert layer["o"].spec == P(None, "model", None, None)
  assert layer["gate"].spec == P(None, None, "model")
  assert layer["down"].spec == P(None, "model", None)
  assert layer["attn_norm"]["scale"].spec == P()
  assert specs["embed"].spec == P()
  vocab = sharding.param_shardings(params, mesh, shard_vocab=True)
  assert vocab["embed"].spec == P("model", None)
  # Adam's moments mirror the params and get the same specs.
  state = init_train_state(params, np.zeros(2, np.uint32), OptimizerSettings())
  state_specs = sharding.param_shardings(state, mesh)
  mu = state_specs.opt_state[1][0].mu
  assert mu["layers"]["q"].spec == layer["q"].spec
  assert state_specs.step.spec == P()


def test_mesh_and_distributed_errors():
  with pytest.raises(ValueError, match=r"mesh 2x2 needs 4 devices, 1 are available"):
    sharding.make_mesh("2,2")
  for bad in ("2", "a,b", "0,1", "1,2,3"):
    with pytest.raises(ValueError, match="mesh must be 'data,model'"):
      sharding.parse_mesh_shape(bad)
  assert sharding.parse_mesh_shape("(2, 2)") == (2, 2)
  assert sharding.parse_distributed("") is None
  assert sharding.parse_distributed("auto").auto
  spec = sharding.parse_distributed("10.0.0.1:1234,4,3")
  assert (spec.coordinator, spec.num_processes, spec.process_id) == ("10.0.0.1:1234", 4, 3)
  for bad in ("host:1,2", "host,2,0", "host:1,2,2", "host:1,x,0"):
    with pytest.raises(ValueError, match="distributed must be"):
      sharding.parse_distributed(bad)
