"""The target's outputs for feature-draft training, computed once and kept on disk.

Letters: N cached windows, T window length, F = (fused target layers) x (target width),
C columns of the draft's head (its subset, or the whole vocabulary).

On a CPU the target's forward pass dominates a training step that runs it, and its outputs
for a window do not depend on the draft, so they are computed once and a feature draft
learns from them for several epochs (docs/background.md#feature-drafts; α against
training steps: docs/results.md#distill). So one target forward per window
writes, under `directory`:

  tokens.npy        int32   [N,T]    the windows (distinct, non-overlapping corpus spans)
  features.npy      float16 [N,T,F]  residual streams at the draft's feature_layers
  target_logp.npy   float16 [N,T,C]  log p at the training temperature on the head's
                                     columns, normalised over the full vocabulary
  target_argmax.npy int32   [N,T]    the target's argmax over the full vocabulary
  progress.json     {"identity": ..., "done": windows written}

— exactly what `step.feature_loss_fn` reads, so FKL/RKL/JSD on the restricted p and TVD
= 1 - β stay exact (float16 log-probabilities aside). The arrays are preallocated
`.npy` memmaps; after each chunk they are flushed and then `progress.json` is replaced
atomically, so a killed build resumes at its last whole chunk. The identity (target,
tokenizer, draft columns, layers, temperature, windows) must match on resume; anything
else raises ValueError naming the file. Nothing is unpickled (`allow_pickle=False`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.distill.divergences import training_temperature
from specdec_jax.io.atomic import atomic_write_json
from specdec_jax.models.model import ModelConfig, forward, init_cache

_ARRAYS = ("tokens", "features", "target_logp", "target_argmax")


@functools.partial(jax.jit, static_argnames=("target_config", "layers", "temperature"))
def _target_outputs(target_params, tokens, columns, *, target_config: ModelConfig,
                    layers: tuple[int, ...], temperature: float):
  b, t = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  logits, _, features = forward(target_params, tokens, positions,
                                init_cache(target_config, b, t), config=target_config,
                                hidden_layers=layers)
  logp = jax.nn.log_softmax(logits / temperature, axis=-1)
  return (features.astype(jnp.float16), logp[..., columns].astype(jnp.float16),
          jnp.argmax(logits, axis=-1).astype(jnp.int32))


@dataclasses.dataclass
class FeatureCache:
  """Read-only views of a finished cache (memmaps) and its batch schedule."""

  directory: pathlib.Path
  arrays: dict[str, np.ndarray]

  @property
  def num_windows(self) -> int:
    return self.arrays["tokens"].shape[0]

  def batch(self, step: int, batch_size: int, seed: int) -> dict[str, np.ndarray]:
    """Training batch `step`: epoch e = step // (N // batch_size) visits the windows in the
    order of a permutation drawn from (seed, e); a pure function of step (resumable)."""
    per_epoch = self.num_windows // batch_size
    if per_epoch < 1:
      raise ValueError(f"the cache holds {self.num_windows} windows, fewer than one batch "
                       f"of {batch_size}")
    epoch, i = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(self.num_windows)
    rows = np.sort(order[i * batch_size:(i + 1) * batch_size])  # sorted: memmap-friendly
    return {name: np.asarray(a[rows]) for name, a in self.arrays.items()}


def _open(path: pathlib.Path, mode: str, shape=None, dtype=None) -> np.ndarray:
  try:
    if mode == "w+":
      return np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    arr = np.load(path, mmap_mode=mode, allow_pickle=False)
  except (OSError, ValueError) as e:
    raise ValueError(f"feature cache file {path} is unreadable ({e}); delete "
                     f"{path.parent} to rebuild it") from None
  if shape is not None and (arr.shape != tuple(shape) or arr.dtype != np.dtype(dtype)):
    raise ValueError(f"feature cache file {path} holds {arr.dtype} {arr.shape}, expected "
                     f"{np.dtype(dtype)} {tuple(shape)}; delete {path.parent} to rebuild it")
  return arr


def build_feature_cache(directory: str | os.PathLike, windows: np.ndarray, *, target_params,
                        target_config: ModelConfig, draft_config: ModelConfig,
                        temperature: float, greedy_temperature: float, identity: dict[str, Any],
                        chunk: int = 8, log: Callable[[str], None] = print) -> FeatureCache:
  """Computes (or resumes, or reuses) the cache of windows int32 [N,T] under directory."""
  if not draft_config.reads_target_features:
    raise ValueError("a feature cache is for feature drafts (draft feature_layers)")
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  windows = np.asarray(windows, np.int32)
  n, t = windows.shape
  tau = training_temperature(temperature, greedy_temperature)
  identity = json.loads(json.dumps({
      **identity, "layers": list(draft_config.feature_layers), "temperature": tau,
      "columns": len(draft_config.head_tokens) or draft_config.vocab_size,
      "windows_sha": _sha(windows)}))
  feat = len(draft_config.feature_layers) * target_config.embed_dim
  cols = draft_config.head_size
  specs = {"tokens": ((n, t), np.int32), "features": ((n, t, feat), np.float16),
           "target_logp": ((n, t, cols), np.float16), "target_argmax": ((n, t), np.int32)}
  progress_path = directory / "progress.json"
  done = 0
  if progress_path.exists():
    try:
      progress = json.loads(progress_path.read_text())
      saved_identity, done = progress["identity"], int(progress["done"])
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"feature cache file {progress_path} is unreadable ({e}); delete "
                       f"{directory} to rebuild it") from None
    if saved_identity != identity:
      diff = sorted(k for k in set(identity) | set(saved_identity)
                    if identity.get(k) != saved_identity.get(k))
      raise ValueError(f"feature cache {directory} was built for other settings (differs "
                       f"in {diff}); delete it or use another workdir")
    arrays = {k: _open(directory / f"{k}.npy", "r+", *specs[k]) for k in _ARRAYS}
  else:
    arrays = {k: _open(directory / f"{k}.npy", "w+", *specs[k]) for k in _ARRAYS}
    atomic_write_json(progress_path, {"identity": identity, "done": 0}, sort_keys=True)
  if done < n:
    from tqdm import tqdm
    if done:
      log(f"feature cache: resuming at window {done} of {n}")
    columns = jnp.asarray(draft_config.head_tokens or np.arange(draft_config.vocab_size),
                          jnp.int32)
    with tqdm(total=n, initial=done, desc="target features", dynamic_ncols=True) as bar:
      for start in range(done, n, chunk):
        tokens = windows[start:start + chunk]
        rows = tokens.shape[0]
        if rows < chunk:  # one compiled shape
          tokens = np.concatenate([tokens, np.zeros((chunk - rows, t), np.int32)])
        out = jax.device_get(_target_outputs(
            target_params, tokens, columns, target_config=target_config,
            layers=draft_config.feature_layers, temperature=float(tau)))
        for name, value in zip(("features", "target_logp", "target_argmax"), out):
          arrays[name][start:start + rows] = value[:rows]
        arrays["tokens"][start:start + rows] = tokens[:rows]
        for a in arrays.values():
          a.flush()
        atomic_write_json(progress_path, {"identity": identity, "done": start + rows},
                          sort_keys=True)
        bar.update(rows)
  arrays = {k: _open(directory / f"{k}.npy", "r", *specs[k]) for k in _ARRAYS}
  return FeatureCache(directory, arrays)


def _sha(windows: np.ndarray) -> str:
  import hashlib
  return hashlib.sha256(np.ascontiguousarray(windows).tobytes()).hexdigest()[:16]
