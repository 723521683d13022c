"""Runs the multi-device cases of test_mesh.py in a process of its own; prints one JSON line.

  python tests/multidevice_worker.py local WORKDIR
      (XLA_FLAGS=--xla_force_host_platform_device_count=4): pmap, the (2,2) mesh greedy
      and sampled, the (1,4) mesh sampled, 3 distillation steps on (2,2), a checkpoint
      saved on (2,2) and restored on (1,4).
  python tests/multidevice_worker.py distributed WORKDIR HOST:PORT NUM_PROCESSES ID
      (2 forced devices per process): the (2,2) mesh across processes, sampled, and a train
      state checkpoint written by every process for its shards.

Every case uses the tiny pair and prompts of `CASE` below, so the test can compute the
one-device reference in its own process.
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from specdec_jax.models import sharding  # noqa: E402

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13], [14, 15], [3, 3], [7]]
SAMPLINGS = {"greedy": dict(temperature=0.0), "t1_top_p": dict(temperature=1.0, top_p=0.9)}
GAMMA, NEW, SEED = 3, 12, 11
DISTILL_STEPS = 3


def tiny_pair():
  from helpers import tiny_config, tiny_model
  target = tiny_config(layers=2)
  draft = tiny_config(layers=1, width=16)
  return target, tiny_model(target, 0), draft, tiny_model(draft, 1)


def decode_spec(name: str):
  """The DecodeSpec of every case: γ = GAMMA, NEW tokens, the sampling SAMPLINGS[name]."""
  from specdec_jax import DecodeSpec, FixedGamma, SamplingConfig
  return DecodeSpec(NEW, FixedGamma(GAMMA), sampling=SamplingConfig(**SAMPLINGS[name]))


def generate_cases(mesh, names=tuple(SAMPLINGS)) -> dict:
  """{sampling name: tokens} of mesh_generate (None: one device, speculative_generate) for
  the SAMPLINGS named."""
  from specdec_jax import Model, speculative_generate
  from specdec_jax.decoding.parallel import mesh_generate
  target, tp, draft, dp = tiny_pair()
  out = {}
  for name in names:
    common = dict(spec=decode_spec(name), seed=SEED)
    if mesh is None:
      res = speculative_generate(Model(target, tp), Model(draft, dp), PROMPTS, **common)
    else:
      res = mesh_generate(Model(target, tp), Model(draft, dp), PROMPTS, mesh=mesh, **common)
    out[name] = dict(tokens=res.tokens.tolist(), accepted=res.accepted.tolist())
  return out


def distill_setup():
  from specdec_jax.distill import DistillSettings, OptimizerSettings
  from specdec_jax.models.model import init_params
  target, tp, draft, _ = tiny_pair()
  dp = init_params(draft, jax.random.PRNGKey(5))
  settings = DistillSettings(loss="fkl", temperature=1.0)
  optim = OptimizerSettings(lr=1e-2, warmup=1, steps=DISTILL_STEPS)
  tokens = np.random.default_rng(0).integers(0, target.vocab_size, (8, 16)).astype(np.int32)
  return target, tp, draft, dp, settings, optim, tokens


def distill_steps(mesh) -> tuple[dict, list[float]]:
  """(params as nested lists, loss per step) after DISTILL_STEPS steps."""
  from specdec_jax.distill import init_train_state, make_train_step
  target, tp, draft, dp, settings, optim, tokens = distill_setup()
  step = make_train_step(tp, draft_config=draft, target_config=target, settings=settings,
                         optim=optim, mesh=mesh)
  state = init_train_state(dp, jax.random.PRNGKey(1), optim, mesh)
  losses = []
  for s in range(DISTILL_STEPS):
    state, metrics = step(state, {"tokens": tokens, "on_policy": np.bool_(False)},
                          jax.random.PRNGKey(s))
    losses.append(float(metrics["loss"]))
  return state, losses


def _lists(tree):
  return jax.tree.map(lambda x: np.asarray(x).tolist(), sharding.gather(tree))


def save_state(state, directory, identity) -> None:
  from specdec_jax.io.checkpoint import Checkpointer
  with Checkpointer(directory, identity=identity, save_every=1, keep=1) as ckpt:
    ckpt.save(DISTILL_STEPS, state.to_dict(), force=True)


def restore_state(directory, like_state, identity, mesh):
  from specdec_jax.io.checkpoint import Checkpointer
  like = sharding.abstract(jax.eval_shape(lambda s: s, like_state.to_dict()), mesh)
  with Checkpointer(directory, identity=identity, save_every=1, keep=1) as ckpt:
    return ckpt.restore_latest(like)[0]


def local(workdir: pathlib.Path) -> dict:
  from specdec_jax import Model
  from specdec_jax.decoding.parallel import pmap_generate
  assert jax.device_count() == 4, jax.devices()
  target, tp, draft, dp = tiny_pair()
  pmapped, stats = pmap_generate(Model(target, tp), Model(draft, dp), PROMPTS,
                                 spec=decode_spec("t1_top_p"), seed=SEED)
  out = {"pmap": dict(tokens=pmapped.tokens.tolist(), stats=stats)}
  # (2,2) every sampling; (1,4) the sampled one only (its keys are what a layout could
  # change; each case compiles a sharded loop)
  for shape, names in (("1,4", ("t1_top_p",)), ("2,2", tuple(SAMPLINGS))):
    out[f"mesh_{shape}"] = generate_cases(sharding.make_mesh(shape), names)
  mesh14 = sharding.make_mesh("1,4")
  placed = sharding.shard_params(tp, mesh14)
  out["q_shard_shape"] = list(placed["layers"]["q"].addressable_shards[0].data.shape)
  out["q_shape"] = list(tp["layers"]["q"].shape)

  mesh_state, mesh_losses = distill_steps(sharding.make_mesh("2,2"))
  out["distill"] = dict(mesh_losses=mesh_losses, mesh_params=_lists(mesh_state.params))
  identity = {"test": "mesh"}
  save_state(mesh_state, workdir / "ckpt", identity)
  restored = restore_state(workdir / "ckpt", mesh_state, identity, mesh14)
  q = restored["params"]["layers"]["q"]
  out["restore"] = dict(
      equal=all(np.array_equal(a, b) for a, b in zip(
          jax.tree.leaves(sharding.gather(restored["params"])),
          jax.tree.leaves(sharding.gather(mesh_state.params)))),
      mesh=dict(q.sharding.mesh.shape), spec=str(q.sharding.spec))
  return out


def distributed(workdir: pathlib.Path, coordinator: str, num: int, pid: int) -> dict:
  sharding.initialize_distributed(f"{coordinator},{num},{pid}")
  assert jax.process_count() == num and jax.device_count() == 2 * num
  mesh = sharding.make_mesh(f"2,{num}")
  out = {"mesh_2,2": generate_cases(mesh, ("t1_top_p",)), "processes": jax.process_count()}
  state, losses = distill_steps(mesh)
  save_state(state, workdir / "ckpt", {"test": "mesh"})
  out["distill"] = dict(mesh_losses=losses, mesh_params=_lists(state.params))
  return out


if __name__ == "__main__":
  mode, workdir = sys.argv[1], pathlib.Path(sys.argv[2])
  if mode == "local":
    result = local(workdir)
  else:
    result = distributed(workdir, sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
  if jax.process_index() == 0:
    print(json.dumps(result))
