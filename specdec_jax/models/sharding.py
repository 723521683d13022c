"""Partition specs for a ('data', 'model') device mesh: the one place they are decided.

Letters as in `model`: L layers, B batch, S cache slots, D width, F MLP width,
N query heads, K kv heads, H head dim, V vocabulary.

Megatron-style tensor parallelism over 'model', data parallelism over 'data':

  q [D,N,H], k/v [D,K,H]       column split: heads over 'model'   (None, 'model', None)
  q/k/v_bias [N|K,H]            heads over 'model'                  ('model', None)
  o [N,H,D]                     row split (XLA all-reduces the sum) ('model', None, None)
  gate/up [D,F]                 column split                        (None, 'model')
  down [F,D]                    row split                           ('model', None)
  embed [V,D], head [D,V]       replicated, or the vocabulary over 'model' (shard_vocab)
  <name>_t [out,in]             the serving layout: the same splits, transposed
  norms, fuse, in_proj          replicated
  KV cache k/v [L,B,S,K,H]      batch over 'data', kv heads over 'model'
  tokens, lengths, keys [B,..]  batch over 'data'

Stacked layers (a leading L axis) get a leading None. A dimension that the 'model'
axis does not divide (SmolLM2 has 9 heads and 3 kv heads) stays replicated, so
every model runs on every mesh; `describe` says what was split. The specs are
chosen by a leaf's name and rank, so the same rules place params, optimizer states
(Adam's mu/nu mirror the params) and train states.

`put` builds global arrays from host values that every process holds in full
(`jax.make_array_from_callback`: each process supplies only its own shards), so one
code path serves one device, a mesh of local devices and several processes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ("data", "model")
_M = "model"

# leaf name -> spec of its unstacked (per-layer) rank
_RULES = {
    "q": (None, _M, None), "k": (None, _M, None), "v": (None, _M, None),
    "q_bias": (_M, None), "k_bias": (_M, None), "v_bias": (_M, None),
    "o": (_M, None, None),
    "gate": (None, _M), "up": (None, _M), "down": (_M, None),
    # the serving layout (`layouts.serving_layout`): the same splits, [out, in]
    "q_t": (_M, None), "k_t": (_M, None), "v_t": (_M, None), "o_t": (None, _M),
    "gate_t": (_M, None), "up_t": (_M, None), "down_t": (None, _M),
}
_VOCAB_RULES = {"embed": (_M, None), "head": (None, _M), "head_t": (_M, None)}


def parse_mesh_shape(shape) -> tuple[int, int]:
  """'2,2' | '(2, 2)' | (2, 2) -> (data, model); ValueError names a bad value."""
  if isinstance(shape, str):
    parts = [p for p in shape.strip().strip("()").replace(" ", "").split(",") if p]
  else:
    parts = list(shape)
  try:
    dims = tuple(int(p) for p in parts)
  except (TypeError, ValueError):
    raise ValueError(f"mesh must be 'data,model' (two ints >= 1), got {shape!r}") from None
  if len(dims) != 2 or min(dims) < 1:
    raise ValueError(f"mesh must be 'data,model' (two ints >= 1), got {shape!r}")
  return dims


def make_mesh(shape, devices=None) -> Mesh:
  """A ('data', 'model') mesh over `devices` (default: all global devices, every process)."""
  data, model = parse_mesh_shape(shape)
  devices = list(jax.devices() if devices is None else devices)
  if data * model != len(devices):
    raise ValueError(f"mesh {data}x{model} needs {data * model} devices, {len(devices)} are "
                     f"available (CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N)")
  return Mesh(np.asarray(devices).reshape(data, model), AXES)


def _leaf_name(path) -> str:
  for entry in reversed(path):
    if isinstance(entry, jax.tree_util.DictKey):
      return str(entry.key)
    if isinstance(entry, jax.tree_util.GetAttrKey):
      return entry.name
  return ""


def _fit(spec: tuple, shape: tuple[int, ...], mesh: Mesh) -> P:
  """spec with every axis the mesh does not divide evenly dropped (replicated)."""
  out = tuple(a if a is None or shape[i] % mesh.shape[a] == 0 else None
              for i, a in enumerate(spec))
  return P(*out)


def param_spec(path, shape: tuple[int, ...], mesh: Mesh, *, shard_vocab: bool = False) -> P:
  """The PartitionSpec of one param-like leaf (a param, Adam's mu/nu, ...)."""
  name = _leaf_name(path)
  rules = {**_RULES, **(_VOCAB_RULES if shard_vocab else {})}
  rule = rules.get(name)
  if rule is None or len(shape) not in (len(rule), len(rule) + 1):
    return P()
  if len(shape) == len(rule) + 1:  # stacked layers [L, ...]
    rule = (None,) + rule
  return _fit(rule, shape, mesh)


def param_shardings(tree, mesh: Mesh, *, shard_vocab: bool = False):
  """NamedShardings for a params / optimizer-state / train-state tree (rules above)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: NamedSharding(mesh, param_spec(path, np.shape(x), mesh,
                                                     shard_vocab=shard_vocab)), tree)


def cache_sharding(shape: tuple[int, ...], mesh: Mesh) -> NamedSharding:
  """k/v [L,B,S,K,H]: batch over 'data', kv heads over 'model' (where they divide)."""
  return NamedSharding(mesh, _fit((None, "data", None, _M, None), shape, mesh))


def constrain_cache(cache: dict, mesh: Mesh) -> dict:
  """A freshly built cache pinned to `cache_sharding` (inside jit)."""
  out = {n: jax.lax.with_sharding_constraint(cache[n], cache_sharding(cache[n].shape, mesh))
         for n in ("k", "v")}
  length = jax.lax.with_sharding_constraint(cache["length"], batch_sharding((1,), mesh))
  return {**cache, **out, "length": length}


def batch_sharding(shape: tuple[int, ...], mesh: Mesh) -> NamedSharding:
  """[B, ...]: rows over 'data' (B must be a multiple of the data axis)."""
  return NamedSharding(mesh, P("data", *([None] * (len(shape) - 1))))


def put(value, sharding: NamedSharding) -> jax.Array:
  """A global array with `sharding` from a host value every process holds in full."""
  value = np.asarray(value)
  return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def _placed(x, s: NamedSharding):
  if isinstance(x, jax.Array):
    if x.sharding.is_equivalent_to(s, x.ndim):
      return x  # already there: no copy
    if not x.is_fully_addressable:  # another process holds part of it: reshard on devices
      return jax.device_put(x, s)
  return put(jax.device_get(x), s)


def place(tree, mesh: Mesh, kind: str = "params", *, shard_vocab: bool = False):
  """tree as global arrays on `mesh`; leaves already placed so are kept as they are.

  kind 'params': `param_shardings` (params, optimizer and train states);
  'batch': rows over 'data' (scalars replicated); 'replicated': a copy on every device.
  """
  if kind == "params":
    shardings = param_shardings(tree, mesh, shard_vocab=shard_vocab)
  elif kind == "batch":
    shardings = jax.tree.map(lambda x: batch_sharding(np.shape(x), mesh) if np.ndim(x)
                             else replicated(mesh), tree)
  elif kind == "replicated":
    shardings = jax.tree.map(lambda x: replicated(mesh), tree)
  else:
    raise ValueError(f"kind must be 'params', 'batch' or 'replicated', got {kind!r}")
  return jax.tree.map(_placed, tree, shardings)


def shard_params(params, mesh: Mesh, *, shard_vocab: bool = False):
  """params placed on `mesh` by `param_shardings` (`place(params, mesh, 'params')`)."""
  return place(params, mesh, "params", shard_vocab=shard_vocab)


def abstract(tree, mesh: Mesh | None):
  """ShapeDtypeStructs of tree carrying `param_shardings` on mesh, or the default device
  with mesh None: an orbax restore target that lands there, whatever mesh or number of
  processes the checkpoint was saved from."""
  if mesh is None:  # one device: say so, or orbax refuses a checkpoint saved on a mesh
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=one),
                        tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s),
                      tree, param_shardings(tree, mesh))


def gather(tree):
  """Host numpy copies of (possibly multi-process) global arrays, in every process."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils
  return multihost_utils.process_allgather(tree, tiled=True)


def describe(params, mesh: Mesh, *, shard_vocab: bool = False) -> dict[str, Any]:
  """{'split': [leaf names split over 'model'], 'replicated_bytes', 'split_bytes'}."""
  split, rep_bytes, split_bytes = set(), 0, 0

  def visit(path, x):
    nonlocal rep_bytes, split_bytes
    spec = param_spec(path, np.shape(x), mesh, shard_vocab=shard_vocab)
    nbytes = math.prod(np.shape(x)) * np.dtype(x.dtype).itemsize
    if any(a is not None for a in spec):
      split.add(_leaf_name(path))
      split_bytes += nbytes
    else:
      rep_bytes += nbytes
  jax.tree_util.tree_map_with_path(visit, params)
  return dict(split=sorted(split), replicated_bytes=rep_bytes, split_bytes=split_bytes)


@dataclasses.dataclass(frozen=True)
class DistributedSpec:
  """Where this process sits in a multi-process run (`jax.distributed.initialize`)."""

  coordinator: str | None = None  # 'host:port'; None with auto=True
  num_processes: int | None = None
  process_id: int | None = None
  auto: bool = False  # TPU pods, SLURM, ...: JAX detects all three


def parse_distributed(spec: str) -> DistributedSpec | None:
  """'' -> None (one process); 'auto'; or 'host:port,num_processes,process_id'."""
  spec = (spec or "").strip()
  if not spec:
    return None
  if spec == "auto":
    return DistributedSpec(auto=True)
  parts = spec.split(",")
  try:
    coordinator, num, pid = parts[0], int(parts[1]), int(parts[2])
  except (IndexError, ValueError):
    raise ValueError(f"distributed must be '', 'auto' or 'host:port,num_processes,process_id',"
                     f" got {spec!r}") from None
  if len(parts) != 3 or ":" not in coordinator or num < 1 or not 0 <= pid < num:
    raise ValueError(f"distributed must be 'host:port,num_processes,process_id' with "
                     f"0 <= process_id < num_processes, got {spec!r}")
  return DistributedSpec(coordinator, num, pid)


def initialize_distributed(spec: str) -> DistributedSpec | None:
  """Calls `jax.distributed.initialize` for a non-empty spec; call before any other JAX use.

  On CPU the cross-process collectives use gloo.
  """
  parsed = parse_distributed(spec)
  if parsed is None:
    return None
  jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU backend only
  if parsed.auto:
    jax.distributed.initialize()
  else:
    jax.distributed.initialize(parsed.coordinator, num_processes=parsed.num_processes,
                               process_id=parsed.process_id)
  return parsed
