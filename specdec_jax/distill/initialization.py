"""Initial draft params: random, SVD of the target's embedding, copied blocks, or saved.

Letters: V vocabulary, D target width, d draft width, C subset-head columns.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.io import checkpoint as ckpt_lib
from specdec_jax.models.model import ModelConfig, param_shapes

Array = jax.Array
PyTree = Any

DRAFT_INITS = ("random", "svd", "copy", "saved:<dir>")


# --------------------------------------------------------------------------- draft init

def embedding_projection(target_params, dim: int) -> np.ndarray:
  """W [D,d]: the top-d right singular vectors of the target embedding E [V,D].

  Computed from the eigenvectors of Eᵀ E (float64), i.e. an uncentred PCA: the
  target's logits are E·y with no offset, so directions are kept through the origin.
  """
  embed = np.asarray(jax.device_get(target_params["embed"]), np.float64)
  if dim > embed.shape[1]:
    raise ValueError(f"draft width {dim} exceeds the target width {embed.shape[1]}")
  eigvals, eigvecs = np.linalg.eigh(embed.T @ embed)
  return eigvecs[:, np.argsort(eigvals)[::-1][:dim]]


def random_params(config: ModelConfig, key: Array) -> PyTree:
  """Params distributed as `init_params` (normal std 0.02, norm scales 1, biases 0).

  Drawn with numpy on the tree of `param_shapes` (an abstract trace): no model forward
  and no threefry kernel is compiled (each costs seconds on CPU; this takes
  milliseconds for a tiny model). Leaf i is drawn from
  `np.random.default_rng([*key_data(key), i])`, in tree order.
  """
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  seed = [int(x) for x in np.asarray(key, np.uint32).ravel()]

  def make(i, path, leaf):
    name = jax.tree_util.keystr(path)
    if "norm" in name:
      return jnp.ones(leaf.shape, leaf.dtype)
    if "bias" in name:
      return jnp.zeros(leaf.shape, leaf.dtype)
    values = np.random.default_rng([*seed, i]).standard_normal(leaf.shape, np.float32)
    return jnp.asarray(0.02 * values, leaf.dtype)

  leaves, treedef = jax.tree_util.tree_flatten_with_path(param_shapes(config))
  return jax.tree_util.tree_unflatten(
      treedef, [make(i, path, leaf) for i, (path, leaf) in enumerate(leaves)])


def _rescale(x: np.ndarray, rms: float = 0.02) -> np.ndarray:
  """x scaled to the element RMS of `init_params` (normal, std 0.02)."""
  return x * (rms / np.sqrt(np.mean(x * x)))


def init_draft_params(draft_config: ModelConfig, key: Array, *, method: str = "random",
                      target_params=None, target_config: ModelConfig | None = None,
                      tokenizer_identity: str | None = None) -> PyTree:
  """Initial draft params. method (see `DRAFT_INITS`):

  'random'       `random_params(draft_config, key)` (distributed as `init_params`).
  'svd'          random blocks; embedding E·W [V,d] where W [D,d] is
                 `embedding_projection` of the target's embedding E [V,D]; an own draft
                 head Wᵀ·diag(g)·head_target [d,V] with g the target's final-norm gain
                 (= (diag(g)·E·W)ᵀ for a tied target): the target's effective head
                 restricted to the kept subspace (and to the head_tokens columns of a
                 vocabulary-subset head). Both are rescaled to the element RMS
                 of a random init (0.02), keeping the geometry, not the magnitude:
                 at the target's magnitude (~10x larger) Adam's fixed-size steps move
                 them 10x more slowly, and the initial logits (~|e|²·sqrt(d) for the
                 current token) are far too confident.
  'copy'         the target's embedding, head (its head_tokens columns for a subset head),
                 final norm and first k = draft num_layers blocks (needs equal widths:
                 D, F, N, K, H, and k <= target layers).
  'saved:<dir>'  a `save_params` directory (its config must equal draft_config).

  A feature draft (`draft_config.reads_target_features`) has no embedding of its own; 'copy'
  gives it the target's *last* k blocks (they map late residual streams, which is what it
  reads), final norm and head, with `fuse` and `in_proj` random; 'svd' is not defined.
  """
  params = random_params(draft_config, key)
  if method == "random":
    return params
  if method.startswith("saved:"):
    saved, cfg, _ = ckpt_lib.load_params(method[len("saved:"):],
                                         tokenizer_identity=tokenizer_identity)
    if cfg != draft_config:
      raise ValueError(ckpt_lib.describe_mismatch("saved draft config", cfg.to_dict(),
                                                  draft_config.to_dict()))
    return saved
  if target_params is None or target_config is None:
    raise ValueError(f"draft init {method!r} needs the target params and config")
  if target_config.vocab_size != draft_config.vocab_size:
    raise ValueError(f"draft vocab {draft_config.vocab_size} != target vocab "
                     f"{target_config.vocab_size}")
  dt = draft_config.jnp_dtype
  if draft_config.reads_target_features and method == "svd":
    raise ValueError("draft init 'svd' is for independent drafts; a feature draft takes "
                     "'random', 'copy' or 'saved:<dir>'")
  if method == "svd":
    w = embedding_projection(target_params, draft_config.embed_dim)  # [D,d]
    embed_t = np.asarray(jax.device_get(target_params["embed"]), np.float64)
    params = dict(params, embed=jnp.asarray(_rescale(embed_t @ w), dt))
    if not draft_config.tie_embeddings:
      head_t = (embed_t.T if target_config.tie_embeddings
                else np.asarray(jax.device_get(target_params["head"]), np.float64))
      gain = np.asarray(jax.device_get(target_params["final_norm"]["scale"]), np.float64)
      head = w.T @ (gain[:, None] * head_t)  # [d,V]
      if draft_config.head_tokens:
        head = head[:, list(draft_config.head_tokens)]
      params["head"] = jnp.asarray(_rescale(head), dt)
    return params
  if method == "copy":
    fields = ("embed_dim", "mlp_dim", "num_heads", "num_kv_heads", "head_dim", "qkv_bias")
    diff = {f: (getattr(draft_config, f), getattr(target_config, f)) for f in fields
            if getattr(draft_config, f) != getattr(target_config, f)}
    if diff:
      raise ValueError(f"draft init 'copy' needs equal widths; (draft, target) differ: {diff}")
    k = draft_config.num_layers
    if k > target_config.num_layers:
      raise ValueError(f"draft has {k} layers, the target only {target_config.num_layers}")
    if draft_config.reads_target_features:
      first = target_config.num_layers - k
      params = dict(params, final_norm=target_params["final_norm"],
                    layers=jax.tree.map(lambda x: x[first:], target_params["layers"]))
    else:
      params = {
          "embed": target_params["embed"],
          "final_norm": target_params["final_norm"],
          "layers": jax.tree.map(lambda x: x[:k], target_params["layers"]),
      }
    if not draft_config.tie_embeddings:
      head = (target_params["embed"].T if target_config.tie_embeddings
              else target_params["head"])
      params["head"] = (head[:, jnp.asarray(draft_config.head_tokens)]
                        if draft_config.head_tokens else head)
    return jax.tree.map(lambda x: jnp.asarray(x, dt), params)
  raise ValueError(f"unknown draft init {method!r}; expected one of {DRAFT_INITS}")
