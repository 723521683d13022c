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

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models import sharding
from specdec_jax.models.model import ModelConfig
from specdec_jax.models.sampling import SamplingConfig
from specdec_jax.decoding.speculative import (
    DecodeState,
    DraftConfig,
    GenerationResult,
    Verifier,
    _check_params,
    _finish,
    decode_loop,
    decode_loop_jit,
    prepare_generate,
)

AXIS = "batch"


def _loop_and_stats(target_params, draft_params, tokens, prompt_len, row_keys, real, *,
                    statics):
  """decode_loop on this device's rows; real[b] is False for batch-padding rows."""
  state = decode_loop(target_params, draft_params, tokens, prompt_len, row_keys,
                      axis_name=AXIS, **statics)
  live = (state.accepted >= 0) & real[:, None]
  stats = {
      "steps_taken": jax.lax.psum(jnp.sum(live), AXIS),
      "accepted": jax.lax.psum(jnp.sum(jnp.where(live, state.accepted, 0)), AXIS),
      "generated": jax.lax.psum(jnp.sum(jnp.where(real, state.num_tokens - state.prompt_len, 0)),
                                AXIS),
  }
  return state.replace(target_cache=None, draft_cache=None), stats


def _checked_args(target_params, draft_params, prompts, *, draft_config, **kw):
  """Both models' params against their configs, then `prepare_generate` (row ids 0..B-1)."""
  _check_params(target_params, kw["target_config"], "target")
  if draft_config is not None:
    _check_params(draft_params, draft_config, "draft")
  return prepare_generate(prompts, draft_config=draft_config, row_ids=None, **kw)


@functools.lru_cache(maxsize=32)
def _pmapped(statics_items: tuple, devices: tuple):
  fn = functools.partial(_loop_and_stats, statics=dict(statics_items))
  return jax.pmap(fn, axis_name=AXIS, in_axes=(None, None, 0, 0, 0, 0), devices=list(devices))


def pmap_generate(target_params, draft_params, prompts, *, target_config: ModelConfig,
                  draft_config: DraftConfig | None, gamma: int = 0, max_new_tokens: int,
                  sampling: SamplingConfig | None = None, seed=0, eos_id: int | None = None,
                  pad_id: int = 0, vocab_size: int | None = None,
                  verifier: Verifier | None = None, devices=None):
  """Speculative (or, with draft_config None, autoregressive) decoding on D devices.

  Returns (GenerationResult, stats) where stats holds psum-reduced totals:
  steps_taken (row-steps), accepted (drafts accepted) and generated (tokens).
  The batch is padded with copies of the last prompt up to a multiple of D; the
  padding rows are dropped from the result.
  """
  devices = tuple(jax.local_devices() if devices is None else devices)
  num_dev = len(devices)
  args = _checked_args(target_params, draft_params, prompts, target_config=target_config,
                       draft_config=draft_config, gamma=gamma, max_new_tokens=max_new_tokens,
                       sampling=sampling, seed=seed, eos_id=eos_id, pad_id=pad_id,
                       vocab_size=vocab_size, verifier=verifier)
  batch = args.tokens.shape[0]
  padded = _padded_rows(batch, num_dev)

  def shard(x):
    return _pad_rows(x, padded).reshape((num_dev, padded // num_dev) + x.shape[1:])

  fn = _pmapped(tuple(sorted(args.statics.items(), key=lambda kv: kv[0])), devices)
  state, stats = fn(target_params, draft_params, shard(args.tokens), shard(args.prompt_len),
                    shard(args.row_keys), shard(np.arange(padded) < batch))
  state = jax.device_get(state)
  merged: DecodeState = jax.tree_util.tree_map(
      lambda x: x.reshape((padded,) + x.shape[2:])[:batch] if x.ndim >= 2 else x[0], state)
  result: GenerationResult = _finish(merged, max_new_tokens, pad_id)
  stats = {k: int(np.asarray(v)[0]) for k, v in jax.device_get(stats).items()}
  return result, stats


def _padded_rows(batch: int, devices: int) -> int:
  """The batch rounded up to a multiple of the devices it is split over."""
  return -(-batch // devices) * devices


def _pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
  """x [B,...] with copies of its last row appended up to `rows` rows."""
  return np.concatenate([x, np.repeat(x[-1:], rows - len(x), axis=0)]) if rows > len(x) else x


def mesh_generate(target_params, draft_params, prompts, *, mesh, target_config: ModelConfig,
                  draft_config: DraftConfig | None, gamma: int = 0, max_new_tokens: int,
                  sampling: SamplingConfig | None = None, seed=0, eos_id: int | None = None,
                  pad_id: int = 0, vocab_size: int | None = None,
                  verifier: Verifier | str | None = None,
                  shard_vocab: bool = False) -> GenerationResult:
  """Speculative (draft_config None: autoregressive) decoding on a ('data', 'model') mesh.

  mesh: `sharding.make_mesh('data,model')`. Params may be host arrays or already placed
  with `sharding.shard_params(params, mesh)` (do that once when calling repeatedly).
  The batch is padded with copies of the last prompt to a multiple of the data axis;
  padding rows are dropped. Every process must pass the same arguments.
  """
  args = _checked_args(target_params, draft_params, prompts, target_config=target_config,
                       draft_config=draft_config, gamma=gamma, max_new_tokens=max_new_tokens,
                       sampling=sampling, seed=seed, eos_id=eos_id, pad_id=pad_id,
                       vocab_size=vocab_size, verifier=verifier)
  batch = args.tokens.shape[0]
  padded = _padded_rows(batch, mesh.shape["data"])
  inputs = [_pad_rows(x, padded) for x in (args.tokens, args.prompt_len, args.row_keys)]
  inputs = [sharding.put(x, sharding.batch_sharding(x.shape, mesh)) for x in inputs]
  state = decode_loop_jit(sharding.shard_params(target_params, mesh, shard_vocab=shard_vocab),
                          sharding.shard_params(draft_params, mesh, shard_vocab=shard_vocab),
                          *inputs, mesh=mesh, **args.statics)
  state = state.replace(target_cache=None, draft_cache=None, features=None)
  state = sharding.gather(state)  # numpy, in every process
  state = jax.tree.map(lambda x: x[:batch] if np.ndim(x) and len(x) == padded else x, state)
  return _finish(state, max_new_tokens, pad_id)
