"""Decoding on many devices: `mesh_generate` (a sharded mesh, one or many processes) and
`pmap_generate` (data parallel over local devices with `jax.pmap`).

Letters: D devices, B global batch, b = B/D rows per device.

mesh_generate runs the same jitted `decode_loop` on global arrays: params sharded
Megatron-style over the mesh's 'model' axis and rows over 'data' (`sharding`), with
XLA inserting the collectives. Every process calls it with the same prompts and
params (the multi-controller model of `jax.distributed`); each supplies only its own
shards, and every process gets the whole result back. Row keys depend on the row id
only, so tokens equal those of one device on any mesh.

pmap_generate:

The batch is split into D shards of b rows; params are replicated. Every device
runs the same `decode_loop` (prefill + while_loop of steps) on its rows, with the
loop condition reduced by `lax.pmax` over the axis so all devices take the same
number of steps, and the run statistics reduced with `lax.psum`. A row keeps its
global row id, so its key stream, and therefore its output, is the same on one
device or many.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.decoding.loop import decode_loop, decode_loop_jit
from specdec_jax.decoding.results import GenerationResult, finish
from specdec_jax.decoding.spec import DecodeSpec, Prepared, prepare
from specdec_jax.decoding.state import DecodeState
from specdec_jax.models import sharding
from specdec_jax.models.model import Model

AXIS = "batch"


def _loop_and_stats(target_params, draft_params, tokens, prompt_len, row_keys, real, costs, *,
                    statics):
  """decode_loop on this device's rows; real[b] is False for batch-padding rows."""
  state = decode_loop(target_params, draft_params, tokens, prompt_len, row_keys, costs,
                      axis_name=AXIS, **statics)
  live = (state.accepted >= 0) & real[:, None]
  stats = {
      "steps_taken": jax.lax.psum(jnp.sum(live), AXIS),
      "accepted": jax.lax.psum(jnp.sum(jnp.where(live, state.accepted, 0)), AXIS),
      "generated": jax.lax.psum(jnp.sum(jnp.where(real, state.num_tokens - state.prompt_len, 0)),
                                AXIS),
  }
  return state.replace(target_cache=None, draft_state=None), stats


def _prepared(target: Model, draft: Model | None, prompts, spec: DecodeSpec, seed,
              pad_id: int) -> Prepared:
  """`prepare` with row ids 0..B-1 (a spec without a proposer when draft is None)."""
  if draft is None and spec.proposer is not None:
    spec = dataclasses.replace(spec, proposer=None)
  return prepare(target, draft, prompts, spec, seed=seed, pad_id=pad_id)


def _statics(target: Model, prepared: Prepared) -> dict:
  return dict(target_config=target.config, draft=prepared.draft, spec=prepared.spec)


@functools.lru_cache(maxsize=32)
def _pmapped(statics_items: tuple, devices: tuple):
  fn = functools.partial(_loop_and_stats, statics=dict(statics_items))
  return jax.pmap(fn, axis_name=AXIS, in_axes=(None, None, 0, 0, 0, 0, None),
                  devices=list(devices))


def pmapped_loop(target_config, draft, spec: DecodeSpec, devices):
  """The pmapped decode loop `pmap_generate` runs (compiled once per statics and devices):
  fn(target_params, draft_params, tokens[D,b,P], prompt_len[D,b], row_keys[D,b,2],
  real[D,b], costs) -> (state, stats)."""
  return _pmapped(tuple(sorted(dict(target_config=target_config, draft=draft,
                                    spec=spec).items())), tuple(devices))


def pmap_generate(target: Model, draft: Model | None, prompts, *, spec: DecodeSpec, seed=0,
                  pad_id: int = 0, devices=None) -> tuple[GenerationResult, dict]:
  """Speculative (or, with draft None, autoregressive) decoding on D devices.

  Returns (GenerationResult, stats) where stats holds psum-reduced totals:
  steps_taken (row-steps), accepted (drafts accepted) and generated (tokens).
  The batch is padded with copies of the last prompt up to a multiple of D; the
  padding rows are dropped from the result.
  """
  devices = tuple(jax.local_devices() if devices is None else devices)
  num_dev = len(devices)
  prepared = _prepared(target, draft, prompts, spec, seed, pad_id)
  batch = prepared.tokens.shape[0]
  padded = _padded_rows(batch, num_dev)

  def shard(x):
    return _pad_rows(x, padded).reshape((num_dev, padded // num_dev) + x.shape[1:])

  fn = _pmapped(tuple(sorted(_statics(target, prepared).items())), devices)
  state, stats = fn(target.params, None if draft is None else draft.params,
                    shard(prepared.tokens), shard(prepared.prompt_len), shard(prepared.row_keys),
                    shard(np.arange(padded) < batch), prepared.costs)
  state = jax.device_get(state)
  merged: DecodeState = jax.tree_util.tree_map(
      lambda x: x.reshape((padded,) + x.shape[2:])[:batch] if x.ndim >= 2 else x[0], state)
  result = finish(merged, spec.max_new_tokens, pad_id)
  stats = {k: int(np.asarray(v)[0]) for k, v in jax.device_get(stats).items()}
  return result, stats


def _padded_rows(batch: int, devices: int) -> int:
  """The batch rounded up to a multiple of the devices it is split over."""
  return -(-batch // devices) * devices


def _pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
  """x [B,...] with copies of its last row appended up to `rows` rows."""
  return np.concatenate([x, np.repeat(x[-1:], rows - len(x), axis=0)]) if rows > len(x) else x


def mesh_generate(target: Model, draft: Model | None, prompts, *, mesh, spec: DecodeSpec,
                  seed=0, pad_id: int = 0, shard_vocab: bool = False) -> GenerationResult:
  """Speculative (draft None: autoregressive) decoding on a ('data', 'model') mesh.

  mesh: `sharding.make_mesh('data,model')`. Params may be host arrays or already placed
  with `sharding.shard_params(params, mesh)` (do that once when calling repeatedly).
  The batch is padded with copies of the last prompt to a multiple of the data axis;
  padding rows are dropped. Every process must pass the same arguments.
  """
  prepared = _prepared(target, draft, prompts, spec, seed, pad_id)
  batch = prepared.tokens.shape[0]
  padded = _padded_rows(batch, mesh.shape["data"])
  inputs = [_pad_rows(x, padded) for x in (prepared.tokens, prepared.prompt_len,
                                           prepared.row_keys)]
  inputs = [sharding.put(x, sharding.batch_sharding(x.shape, mesh)) for x in inputs]
  draft_params = None if draft is None else draft.params
  state = decode_loop_jit(sharding.shard_params(target.params, mesh, shard_vocab=shard_vocab),
                          sharding.shard_params(draft_params, mesh, shard_vocab=shard_vocab),
                          *inputs, prepared.costs, mesh=mesh, **_statics(target, prepared))
  state = state.replace(target_cache=None, draft_state=None)
  state = sharding.gather(state)  # numpy, in every process
  state = jax.tree.map(lambda x: x[:batch] if np.ndim(x) and len(x) == padded else x, state)
  return finish(state, spec.max_new_tokens, pad_id)
