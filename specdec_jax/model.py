"""A Llama-family decoder-only transformer in Flax linen, with an explicit KV cache.

Einsum letters:
  B batch, T query length (tokens in this call), S cache slots (keys),
  L layers, D model width, F MLP width, N query heads, K kv heads,
  G query heads per kv head (N = K * G), H head dim, V vocabulary.

The model is a pure function

    forward(params, tokens[B,T], positions[B,T], cache, config=...) -> (logits[B,T,V], cache)

Cache layout (one layout for every caller): a plain dict pytree

    {'k': [L,B,S,K,H], 'v': [L,B,S,K,H], 'length': int32[B]}

Slot s of row b holds the key/value of the token at position s (slot == position).
A call writes its T new keys/values at slots `length[b] .. length[b]+T-1` of row b
and returns `length + T`; query (b, t) attends to slots `s <= positions[b, t]`.
Callers therefore pass `positions[b] = length[b] + arange(T)`. Rolling back
rejected tokens is setting `length` smaller; stale slots are never attended
(they sit above every later query's position until overwritten).

Prompts of different lengths are right-padded: row b's prompt occupies positions
0..P_b-1 and padding positions are written but lie above the row's length, so
no real query ever attends them once `length` is set to the true prompt length.

Layers are stacked along a leading L axis (`nn.scan`), so params and caches are
plain pytrees of arrays that can carry `jax.sharding` shardings.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
Cache = dict[str, Array]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of one Llama/Qwen2-style decoder. Hashable (a jit static)."""

  vocab_size: int
  num_layers: int
  embed_dim: int  # D
  mlp_dim: int  # F
  num_heads: int  # N
  num_kv_heads: int  # K
  head_dim: int  # H
  max_seq_len: int = 2048  # cache slots S available to generation
  rope_theta: float = 10_000.0
  norm_eps: float = 1e-5
  tie_embeddings: bool = True
  qkv_bias: bool = False  # Qwen2 has biases on q, k and v
  dtype: str = "float32"  # params, activations and cache
  scan_unroll: int = 1  # lax.scan unroll factor over layers (L = fully unrolled)

  def __post_init__(self):
    for name in ("vocab_size", "num_layers", "embed_dim", "mlp_dim", "num_heads",
                 "num_kv_heads", "head_dim", "max_seq_len"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
    if self.dtype not in _DTYPES:
      raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

  @property
  def jnp_dtype(self):
    return _DTYPES[self.dtype]

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def init_cache(config: ModelConfig, batch_size: int, num_slots: int | None = None) -> Cache:
  """An empty cache: zeros of [L,B,S,K,H] for k and v, and length 0 for every row."""
  slots = config.max_seq_len if num_slots is None else num_slots
  if slots > config.max_seq_len:
    raise ValueError(f"cache of {slots} slots exceeds max_seq_len={config.max_seq_len}")
  shape = (config.num_layers, batch_size, slots, config.num_kv_heads, config.head_dim)
  return {
      "k": jnp.zeros(shape, config.jnp_dtype),
      "v": jnp.zeros(shape, config.jnp_dtype),
      "length": jnp.zeros((batch_size,), jnp.int32),
  }


def rope(x: Array, positions: Array, theta: float) -> Array:
  """Rotary embedding in the Hugging Face rotate_half convention. x: [B,T,*,H]."""
  head_dim = x.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B,T,H/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B,T,1,H]
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return (x32 * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)


class RMSNorm(nn.Module):
  eps: float
  dtype: Any

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.dtype)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (normed * scale.astype(jnp.float32)).astype(self.dtype)


def _write_rows(cache_slab: Array, new: Array, start: Array) -> Array:
  """Writes new[b] ([T,K,H]) into cache_slab[b] ([S,K,H]) at slot start[b]."""
  def one(slab, block, s):
    return jax.lax.dynamic_update_slice(slab, block.astype(slab.dtype), (s, 0, 0))
  return jax.vmap(one)(cache_slab, new, start)


class Block(nn.Module):
  """Pre-norm attention + SwiGLU MLP. Scanned over layers; carry is x[B,T,D]."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x, layer_kv, positions, write_start, mask):
    cfg = self.config
    dt = cfg.jnp_dtype
    init = nn.initializers.normal(stddev=0.02)
    n, k, h, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.embed_dim

    y = RMSNorm(cfg.norm_eps, dt, name="attn_norm")(x)
    q = jnp.einsum("btd,dnh->btnh", y, self.param("q", init, (d, n, h), dt))
    kk = jnp.einsum("btd,dkh->btkh", y, self.param("k", init, (d, k, h), dt))
    vv = jnp.einsum("btd,dkh->btkh", y, self.param("v", init, (d, k, h), dt))
    if cfg.qkv_bias:
      q = q + self.param("q_bias", nn.initializers.zeros, (n, h), dt)
      kk = kk + self.param("k_bias", nn.initializers.zeros, (k, h), dt)
      vv = vv + self.param("v_bias", nn.initializers.zeros, (k, h), dt)
    q = rope(q, positions, cfg.rope_theta)
    kk = rope(kk, positions, cfg.rope_theta)

    cache_k = _write_rows(layer_kv["k"], kk, write_start)  # [B,S,K,H]
    cache_v = _write_rows(layer_kv["v"], vv, write_start)

    b, t = q.shape[:2]
    qg = q.reshape(b, t, k, n // k, h)  # [B,T,K,G,H]
    scores = jnp.einsum("btkgh,bskh->bkgts", qg, cache_k,
                        preferred_element_type=jnp.float32) * (h ** -0.5)
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(dt)
    attn = jnp.einsum("bkgts,bskh->btkgh", weights, cache_v).reshape(b, t, n, h)
    x = x + jnp.einsum("btnh,nhd->btd", attn, self.param("o", init, (n, h, d), dt))

    y = RMSNorm(cfg.norm_eps, dt, name="mlp_norm")(x)
    gate = jnp.einsum("btd,df->btf", y, self.param("gate", init, (d, cfg.mlp_dim), dt))
    up = jnp.einsum("btd,df->btf", y, self.param("up", init, (d, cfg.mlp_dim), dt))
    x = x + jnp.einsum("btf,fd->btd", nn.silu(gate) * up,
                       self.param("down", init, (cfg.mlp_dim, d), dt))
    return x, {"k": cache_k, "v": cache_v}


class Transformer(nn.Module):
  """Embedding, L scanned blocks, final norm and (tied or own) head."""

  config: ModelConfig

  @nn.compact
  def __call__(self, tokens, positions, cache, return_logits: bool = True):
    cfg = self.config
    dt = cfg.jnp_dtype
    embed = self.param("embed", nn.initializers.normal(stddev=0.02),
                       (cfg.vocab_size, cfg.embed_dim), dt)
    x = jnp.take(embed, tokens, axis=0)  # [B,T,D]
    slots = cache["k"].shape[2]
    mask = jnp.arange(slots)[None, None, :] <= positions[:, :, None]  # [B,T,S]
    write_start = cache["length"]

    blocks = nn.scan(
        Block,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast),
        length=cfg.num_layers,
        unroll=cfg.scan_unroll,
    )(cfg, name="layers")
    x, kv = blocks(x, {"k": cache["k"], "v": cache["v"]}, positions, write_start, mask)
    new_cache = {"k": kv["k"], "v": kv["v"], "length": cache["length"] + tokens.shape[1]}
    if not return_logits:
      return None, new_cache
    x = RMSNorm(cfg.norm_eps, dt, name="final_norm")(x)
    if cfg.tie_embeddings:
      logits = jnp.einsum("btd,vd->btv", x, embed, preferred_element_type=jnp.float32)
    else:
      head = self.param("head", nn.initializers.normal(stddev=0.02),
                        (cfg.embed_dim, cfg.vocab_size), dt)
      logits = jnp.einsum("btd,dv->btv", x, head, preferred_element_type=jnp.float32)
    return logits, new_cache


@functools.partial(jax.jit, static_argnums=0)
def init_params(config: ModelConfig, key: Array) -> dict:
  """Random params (normal, std 0.02; norms at 1) for `config`. Jitted: one compile per config."""
  tokens = jnp.zeros((1, 1), jnp.int32)
  cache = init_cache(config, 1, 1)
  return Transformer(config).init(key, tokens, tokens, cache)["params"]


def param_shapes(config: ModelConfig) -> dict:
  """The param tree of `config` as jax.ShapeDtypeStruct leaves (nothing is computed)."""
  return jax.eval_shape(init_params, config, jax.random.PRNGKey(0))


def forward(params, tokens: Array, positions: Array, cache: Cache, *,
            config: ModelConfig, return_logits: bool = True):
  """(params, tokens[B,T], positions[B,T], cache) -> (logits[B,T,V] float32 | None, cache).

  With return_logits=False the final norm and head are skipped (a cache-only call).
  """
  return Transformer(config).apply({"params": params}, tokens, positions, cache,
                                   return_logits=return_logits)


def param_count(params) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
