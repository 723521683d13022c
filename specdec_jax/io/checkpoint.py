"""Orbax checkpoints for training runs, and finished drafts for generation scripts.

A training checkpoint (`Checkpointer`) is one orbax step directory holding two items:

  state  the train state pytree (params, optimizer state, step, RNG key), saved with
         `StandardSave` and restored with `StandardRestore` into the run's own tree;
  meta   JSON: `identity` (the draft ModelConfig dict, the tokenizer identity and the
         target identity) and `extra` (the data position and whatever the loop adds).

Orbax writes each step into a temporary directory and renames it when complete, so a
killed process leaves either a whole checkpoint or none (its debris is cleaned up on the
next start). Restoring checks `identity` first and raises ValueError naming both sides
when the run's draft config, tokenizer or target differ from the checkpoint's.

A finished draft (`save_params` / `load_params`) is a directory with `params/` (orbax)
and `model.json` (the ModelConfig dict, the tokenizer identity, the params' sha256, the
sha256 of every file under `params/` and free-form extras). `load_params` checks the
files' hashes before orbax reads anything, so a truncated or replaced file is refused with
one ValueError, then checks the restored params' hash. (A failed orbax restore leaves
tensorstore callbacks running that report a closed event loop after the error; those
reports are dropped, `_drop_closed_loop_reports`.)
A draft meant to be shipped is saved with `params_dtype='float16'` (half the bytes):
model.json then records that dtype, and `load_params` restores float16 leaves and casts
them to the config's dtype; a file of another dtype than model.json says is refused.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import pathlib
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from specdec_jax.io.atomic import atomic_write_json, atomic_write_text, file_sha256
from specdec_jax.models.model import ModelConfig, init_params

PyTree = Any
IDENTITY_KEYS = ("draft_config", "tokenizer", "target")


# --------------------------------------------------------------------------- identities

def params_checksum(params: PyTree) -> str:
  """sha256 hex over every leaf's path, dtype, shape and bytes (path order)."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    arr = np.asarray(jax.device_get(leaf))
    h.update(f"{jax.tree_util.keystr(path)}|{arr.dtype}|{arr.shape}|".encode())
    h.update(np.ascontiguousarray(arr).tobytes())
  return h.hexdigest()


def config_hash(config: ModelConfig) -> str:
  blob = json.dumps(config.to_dict(), sort_keys=True)
  return hashlib.sha256(blob.encode()).hexdigest()


def target_identity(config: ModelConfig | None, params: PyTree | None) -> str:
  """'config:<16 hex>-params:<16 hex>' for a target; 'none' when there is no target."""
  if config is None:
    return "none"
  return f"config:{config_hash(config)[:16]}-params:{params_checksum(params)[:16]}"


def check_draft_target(meta: dict, target_config: ModelConfig, target_params: PyTree,
                       where: str = "the draft") -> None:
  """Raises ValueError unless the target identity a saved draft's model.json records
  (`meta['extra']['target']`, written by distillation and export) is this target's."""
  saved = (meta.get("extra") or {}).get("target")
  if not isinstance(saved, str):
    raise ValueError(f"{where} records no target identity in its model.json")
  current = target_identity(target_config, target_params)
  if saved != current:
    raise ValueError(f"{where} was trained against target {saved}, but this target is "
                     f"{current}")


def run_identity(draft_config: ModelConfig, tokenizer_identity: str,
                 target: str) -> dict[str, Any]:
  """The identity a checkpoint carries and a restore must match."""
  return {"draft_config": draft_config.to_dict(), "tokenizer": str(tokenizer_identity),
          "target": str(target)}


def _short(value) -> str:
  """repr, with long id lists (a subset head's head_tokens) as count and range."""
  if isinstance(value, (list, tuple)) and len(value) > 8:
    return f"{len(value)} ids {value[0]}..{value[-1]}"
  return repr(value)


def describe_mismatch(name: str, saved, current) -> str:
  """'<name> differs (<field>: checkpoint X vs run Y; ...)' for dicts, else both values."""
  if isinstance(saved, dict) and isinstance(current, dict):
    keys = sorted(set(saved) | set(current))
    diffs = [f"{k}: checkpoint {_short(saved.get(k))} vs run {_short(current.get(k))}"
             for k in keys if _as_list(saved.get(k)) != _as_list(current.get(k))]
    return f"{name} differs ({'; '.join(diffs)})"
  return f"{name} differs: checkpoint {saved!r} vs run {current!r}"


def _as_list(value):
  return list(value) if isinstance(value, tuple) else value


def check_identity(saved: dict, current: dict, where: str) -> None:
  """Raises ValueError listing every identity field where `saved` and `current` differ."""
  problems = [describe_mismatch(k, saved.get(k), current.get(k))
              for k in IDENTITY_KEYS if saved.get(k) != current.get(k)]
  if problems:
    raise ValueError(f"cannot restore {where}: " + "; ".join(problems)
                     + ". Use a fresh workdir or the original settings.")


def _abstract(tree: PyTree) -> PyTree:
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


# --------------------------------------------------------------------------- training

class Checkpointer:
  """A `CheckpointManager` for one run: save every `save_every` steps, keep the last `keep`.

  Saves are synchronous (a returned `save` is on disk) unless async_save=True.
  """

  def __init__(self, directory: str | os.PathLike, *, identity: dict[str, Any],
               save_every: int, keep: int, async_save: bool = False):
    if save_every < 1 or keep < 1:
      raise ValueError(f"save_every and keep must be >= 1, got {save_every}, {keep}")
    self.directory = pathlib.Path(directory).absolute()
    self.identity = json.loads(json.dumps(identity))  # as it reads back from JSON
    self.save_every = int(save_every)
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=save_every, max_to_keep=keep, create=True,
        cleanup_tmp_directories=True, enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: PyTree, *, extra: dict | None = None,
           force: bool = False) -> bool:
    """Saves `state` at `step` if step % save_every == 0 (or force). Returns whether it saved."""
    if not force and step % self.save_every:
      return False
    meta = {"identity": self.identity, "extra": dict(extra or {}), "step": int(step)}
    return self._manager.save(int(step), force=True, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))

  def read_meta(self, step: int) -> dict:
    return self._manager.restore(step, args=ocp.args.Composite(
        meta=ocp.args.JsonRestore()))["meta"]

  def restore_latest(self, like: PyTree) -> tuple[PyTree, dict] | None:
    """(state, extra) of the latest checkpoint, restored into the tree of `like`; or None.

    Raises ValueError if the checkpoint's identity differs from this run's.
    """
    step = self.latest_step()
    if step is None:
      return None
    meta = self.read_meta(step)
    check_identity(meta["identity"], self.identity, f"checkpoint {self.directory / str(step)}")
    state = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(_abstract(like))))["state"]
    return state, meta["extra"]

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def restore_latest(directory: str | os.PathLike, like: PyTree, *,
                   identity: dict[str, Any]) -> tuple[PyTree, dict] | None:
  """(state, extra) of the latest checkpoint in `directory`, or None if there is none."""
  if not pathlib.Path(directory).exists():
    return None
  with Checkpointer(directory, identity=identity, save_every=1, keep=2**31 - 1) as ckpt:
    return ckpt.restore_latest(like)


# --------------------------------------------------------------------------- finished drafts

_MODEL_JSON = "model.json"


def files_checksums(directory: str | os.PathLike) -> dict[str, str]:
  """{relative path: sha256 hex} of every file under `directory`, sorted by path."""
  directory = pathlib.Path(directory)
  return {p.relative_to(directory).as_posix(): file_sha256(p)
          for p in sorted(directory.rglob("*")) if p.is_file()}


def nonfinite_leaves(tree: PyTree) -> list[str]:
  """Paths of the floating leaves of `tree` holding NaN or ±inf (one host read per leaf)."""
  bad = []
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    x = np.asarray(jax.device_get(x))
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
      bad.append(jax.tree_util.keystr(path))
  return bad


def _cast_floats(params: PyTree, dtype) -> PyTree:
  """Every floating leaf of `params` as `dtype` (numpy, on the host); others unchanged."""
  def cast(x):
    x = np.asarray(jax.device_get(x))
    return x.astype(dtype) if np.issubdtype(x.dtype, np.floating) else x
  return jax.tree.map(cast, params)


def save_params(directory: str | os.PathLike, params: PyTree, config: ModelConfig, *,
                tokenizer_identity: str, extra: dict | None = None,
                params_dtype: str | None = None) -> pathlib.Path:
  """Writes `directory/params` (orbax) and `directory/model.json`; replaces an old save.

  model.json records the sha256 of each stored file; params_dtype ('float16', ...):
  floating leaves are stored in that dtype, and model.json records it (module docstring).
  """
  directory = pathlib.Path(directory).absolute()
  if params_dtype is not None:
    params = _cast_floats(params, np.dtype(params_dtype))
  if bad := nonfinite_leaves(params):  # before touching the directory: an old save survives
    raise ValueError(f"refusing to save non-finite params to {directory}: NaN or inf in "
                     f"{', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}")
  directory.mkdir(parents=True, exist_ok=True)
  (directory / _MODEL_JSON).unlink(missing_ok=True)  # no stale sidecar vouches for new params
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(directory / "params", params, force=True)
    ckptr.wait_until_finished()
  marker = directory / "params" / "commit_success.txt"  # orbax writes the absolute path
  if marker.exists():  # there; a saved draft is committed, so it names no machine's path
    atomic_write_text(marker, "Checkpoint commit was successful.")
  meta = {"config": config.to_dict(), "tokenizer": str(tokenizer_identity),
          "params_sha256": params_checksum(params), "extra": dict(extra or {}),
          "files_sha256": files_checksums(directory / "params")}
  if params_dtype is not None:
    meta["params_dtype"] = np.dtype(params_dtype).name
  atomic_write_json(directory / _MODEL_JSON, meta)
  return directory


class _UnretrievedFutures(logging.Filter):
  """Drops asyncio's "... exception was never retrieved" records (a failed orbax restore
  leaves such futures behind; the restore's error is already raised as one ValueError)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "exception was never retrieved" not in str(record.msg)


def _drop_closed_loop_reports() -> None:
  """When an orbax restore fails (files of other shapes than model.json's config, or a
  corrupt file that no recorded sha256 caught: a save older than files_sha256),
  tensorstore callbacks still in flight report RuntimeError('Event loop is closed')
  through `sys.unraisablehook`, during or after the one-line error, and so do orbax's
  read coroutines closed with the error: from the first restore on, drop exactly those
  reports (any other goes to the previous hook), and asyncio's log records of the
  restore's futures whose exception nobody retrieved."""
  asyncio_logger = logging.getLogger("asyncio")
  if not any(isinstance(f, _UnretrievedFutures) for f in asyncio_logger.filters):
    asyncio_logger.addFilter(_UnretrievedFutures())
  previous = sys.unraisablehook
  if getattr(previous, "drops_closed_loop", False):
    return

  def hook(unraisable):
    exc, source = unraisable.exc_value, unraisable.object
    closed_loop = isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
    orbax_read = inspect.iscoroutine(source) and "orbax" in source.cr_code.co_filename
    if not (closed_loop or orbax_read):
      previous(unraisable)
  hook.drops_closed_loop = True
  sys.unraisablehook = hook


def saved_config(directory: str | os.PathLike) -> ModelConfig:
  """The ModelConfig a `save_params` directory's model.json records (no params read)."""
  meta_path = pathlib.Path(directory).absolute() / _MODEL_JSON
  if not meta_path.exists():
    raise FileNotFoundError(f"{meta_path} not found: not a finished save_params directory")
  try:
    return ModelConfig(**json.loads(meta_path.read_text())["config"])
  except (ValueError, TypeError, KeyError) as e:
    raise ValueError(f"{meta_path} is not a valid model.json: {type(e).__name__}: {e}") from None


def load_params(directory: str | os.PathLike, *, tokenizer_identity: str | None = None,
                ) -> tuple[dict, ModelConfig, dict]:
  """(params, config, meta) of a `save_params` directory.

  Raises FileNotFoundError if it is incomplete, ValueError naming the file and the problem
  if `model.json` is unreadable or edited, the params are truncated, corrupt, of other
  shapes than its config (the params' sha256 in `model.json` is checked) or not finite
  (NaN / inf: such a draft could only waste target calls), or if
  `tokenizer_identity` is given and differs from the saved one.
  """
  directory = pathlib.Path(directory).absolute()
  meta_path = directory / _MODEL_JSON
  if not meta_path.exists():
    raise FileNotFoundError(f"{meta_path} not found: not a finished save_params directory")
  try:
    meta = json.loads(meta_path.read_text())
    saved_tokenizer, saved_sha = str(meta["tokenizer"]), str(meta["params_sha256"])
    config = ModelConfig(**meta["config"])
  except (ValueError, TypeError, KeyError) as e:  # JSONDecodeError is a ValueError
    raise ValueError(f"{meta_path} is not a valid model.json: {type(e).__name__}: {e}") from None
  if tokenizer_identity is not None and saved_tokenizer != str(tokenizer_identity):
    raise ValueError(f"{directory} was trained with tokenizer {saved_tokenizer[:16]}..., "
                     f"but this run uses {str(tokenizer_identity)[:16]}...")
  stored = meta.get("params_dtype")
  like = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))
  if stored is not None or "files_sha256" in meta:  # every file must be as recorded
    try:
      stored = None if stored is None else np.dtype(stored)
      recorded = dict(meta["files_sha256"])
    except (TypeError, KeyError, ValueError) as e:
      raise ValueError(f"{meta_path} holds no valid files_sha256 (params_dtype "
                       f"{meta.get('params_dtype')!r}; {type(e).__name__}: {e})") from None
    found = files_checksums(directory / "params")
    if found != recorded:
      bad = sorted(k for k in set(found) | set(recorded) if found.get(k) != recorded.get(k))
      raise ValueError(f"{directory / 'params'} differs from {meta_path.name} in {bad[:4]}: "
                       "the files were truncated, changed or replaced after saving")
  if stored is not None:
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, stored if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype), like)
  _drop_closed_loop_reports()
  held = _checked_metadata(directory / "params", like, meta_path.name)
  if stored is not None:  # orbax casts on restore: check the dtype the files hold
    dtypes = {str(np.dtype(m.dtype)) for m in jax.tree.leaves(held)
              if np.issubdtype(np.dtype(m.dtype), np.floating)}
    if dtypes != {stored.name}:
      raise ValueError(f"{directory / 'params'} holds {sorted(dtypes)} params, but "
                       f"{meta_path.name} says {stored.name}")
  try:
    with ocp.StandardCheckpointer() as ckptr:
      params = ckptr.restore(directory / "params", like)
  except Exception as e:  # orbax/tensorstore errors on missing, truncated or reshaped files
    first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    raise ValueError(f"{directory / 'params'} cannot be restored as the model of "
                     f"{meta_path.name} ({type(e).__name__}: {first})") from None
  if params_checksum(params) != saved_sha:
    raise ValueError(f"{directory / 'params'} do not match the sha256 in {meta_path.name}: "
                     "the params or model.json were changed after saving")
  if bad := nonfinite_leaves(params):
    raise ValueError(f"{directory / 'params'} holds NaN or inf in {', '.join(bad[:4])}"
                     f"{' ...' if len(bad) > 4 else ''}: refusing a model with non-finite "
                     "params")
  if stored is not None:
    params = jax.tree.map(lambda x: jnp.asarray(x, config.jnp_dtype)
                          if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
  return params, config, meta


def _checked_metadata(path: pathlib.Path, like: PyTree, meta_name: str) -> PyTree:
  """The stored array metadata (`_stored_metadata`), read before a restore; ValueError
  if it cannot be read or names arrays of other shapes than `like`'s (orbax's own
  failure there leaves its gathered futures unretrieved, which asyncio reports with a
  trace after the error)."""
  absl_logger = logging.getLogger("absl")  # orbax warns there of metadata it cannot read
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    held = _stored_metadata(path)
  except Exception as e:  # orbax/tensorstore errors on missing or corrupt metadata
    first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    raise ValueError(f"{path} cannot be restored as the model of {meta_name} (its metadata "
                     f"cannot be read: {type(e).__name__}: {first})") from None
  finally:
    absl_logger.setLevel(level)

  def shapes(tree):
    return {jax.tree_util.keystr(p): getattr(x, "shape", None)
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
  stored, want = shapes(held), shapes(like)
  stored = {k: None if v is None else tuple(v) for k, v in stored.items()}
  if not any(v is not None for v in stored.values()):
    raise ValueError(f"{path} cannot be restored as the model of {meta_name}: its metadata "
                     "cannot be read (truncated or missing files)")
  if stored != want:
    diff = sorted((k, stored.get(k), want.get(k)) for k in set(stored) | set(want)
                  if stored.get(k) != want.get(k))
    raise ValueError(f"{path} cannot be restored as the model of {meta_name}: arrays of "
                     f"other shapes (name, stored, config): {diff[:4]}")
  return held


def _stored_metadata(path: pathlib.Path) -> PyTree:
  """The tree of stored array metadata (shape, dtype) of an orbax params directory."""
  with ocp.StandardCheckpointer() as ckptr:
    meta = ckptr.metadata(path)
  meta = getattr(meta, "item_metadata", meta)
  return getattr(meta, "tree", meta)
