"""A Llama-family decoder-only transformer in Flax linen, with an explicit KV cache.

Einsum letters:
  B batch, T query length (tokens in this call), S cache slots (keys),
  L layers, D model width, F MLP width, N query heads, K kv heads,
  G query heads per kv head (N = K * G), H head dim, V vocabulary,
  C columns of a vocabulary-subset head (`ModelConfig.head_tokens`).

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
  # A vocabulary-subset head: the C sorted token ids the own head [D,C] scores; every
  # other token gets logit -inf (probability exactly 0). () = the full vocabulary.
  head_tokens: tuple[int, ...] = dataclasses.field(default=(), repr=False)

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
    tokens = tuple(int(t) for t in self.head_tokens)  # a list from JSON -> hashable tuple
    object.__setattr__(self, "head_tokens", tokens)
    if tokens:
      if self.tie_embeddings:
        raise ValueError("head_tokens (a vocabulary-subset head) needs tie_embeddings=False")
      if tokens[0] < 0 or tokens[-1] >= self.vocab_size or any(
          a >= b for a, b in zip(tokens, tokens[1:])):
        raise ValueError(f"head_tokens must be strictly increasing ids in [0, "
                         f"{self.vocab_size}), got {len(tokens)} ids from {tokens[0]} to "
                         f"{tokens[-1]}")

  @property
  def head_size(self) -> int:
    """Columns of the head: C = len(head_tokens) for a subset head, else V."""
    return len(self.head_tokens) or self.vocab_size

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


class Block(nn.Module):
  """Pre-norm attention + SwiGLU MLP of layer `layer`; carry (x[B,T,D], kv) -> (carry, None).

  The (carry, scanned input) signature is what `nn.scan` needs. Reads and writes the whole stacked cache kv = {'k','v': [L,B,S,K,H]} at index
  `layer` (a traced int under `nn.scan`, a Python int in the unrolled loop), so
  the cache is one buffer updated in place, never re-stacked.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, carry, layer, positions, write_start, mask):
    x, kv = carry
    cfg = self.config
    dt = cfg.jnp_dtype
    init = nn.initializers.normal(stddev=0.02)
    n, k, h, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.embed_dim
    b, t, _ = x.shape

    def dense(inp, name, shape):  # a 2-D matmul on a param of any rank (a free reshape)
      w = self.param(name, init, shape, dt)
      return jnp.dot(inp, w.reshape(inp.shape[-1], -1))

    y = RMSNorm(cfg.norm_eps, dt, name="attn_norm")(x)
    q = dense(y, "q", (d, n, h)).reshape(b, t, n, h)
    kk = dense(y, "k", (d, k, h)).reshape(b, t, k, h)
    vv = dense(y, "v", (d, k, h)).reshape(b, t, k, h)
    if cfg.qkv_bias:
      q = q + self.param("q_bias", nn.initializers.zeros, (n, h), dt)
      kk = kk + self.param("k_bias", nn.initializers.zeros, (k, h), dt)
      vv = vv + self.param("v_bias", nn.initializers.zeros, (k, h), dt)
    q = rope(q, positions, cfg.rope_theta)
    kk = rope(kk, positions, cfg.rope_theta)

    rows = jnp.arange(b)[:, None]
    slots = write_start[:, None] + jnp.arange(t)[None, :]  # [B,T]
    kv = {"k": kv["k"].at[layer, rows, slots].set(kk.astype(kv["k"].dtype)),
          "v": kv["v"].at[layer, rows, slots].set(vv.astype(kv["v"].dtype))}
    cache_k, cache_v = kv["k"][layer], kv["v"][layer]  # [B,S,K,H]

    qg = q.reshape(b, t, k, n // k, h)  # [B,T,K,G,H]
    scores = jnp.einsum("btkgh,bskh->bkgts", qg, cache_k,
                        preferred_element_type=jnp.float32) * (h ** -0.5)
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(dt)
    attn = jnp.einsum("bkgts,bskh->btkgh", weights, cache_v).reshape(b, t, n * h)
    x = x + dense(attn, "o", (n, h, d))

    y = RMSNorm(cfg.norm_eps, dt, name="mlp_norm")(x)
    hidden = nn.silu(dense(y, "gate", (d, cfg.mlp_dim))) * dense(y, "up", (d, cfg.mlp_dim))
    x = x + dense(hidden, "down", (cfg.mlp_dim, d))
    return (x, kv), None


class Transformer(nn.Module):
  """Embedding, L blocks, final norm and (tied or own) head.

  unstacked=False: params['layers'] holds every block stacked on a leading L axis
    and the blocks run under `nn.scan` (fast to compile; the layout we store).
  unstacked=True: params['layers_0' .. 'layers_{L-1}'] and an unrolled loop
    (16.1 vs 19.4 ms/token for SmolLM2 on 2 CPU cores; see `unstack_layers`).
  """

  config: ModelConfig
  unstacked: bool = False

  @nn.compact
  def __call__(self, tokens, positions, cache, return_logits: bool = True,
               full_vocab: bool = True):
    cfg = self.config
    dt = cfg.jnp_dtype
    embed = self.param("embed", nn.initializers.normal(stddev=0.02),
                       (cfg.vocab_size, cfg.embed_dim), dt)
    x = jnp.take(embed, tokens, axis=0)  # [B,T,D]
    slots = cache["k"].shape[2]
    mask = jnp.arange(slots)[None, None, :] <= positions[:, :, None]  # [B,T,S]
    write_start = cache["length"]
    kv = {"k": cache["k"], "v": cache["v"]}

    if self.unstacked:
      for i in range(cfg.num_layers):
        (x, kv), _ = Block(cfg, name=f"layers_{i}")((x, kv), i, positions, write_start, mask)
    else:
      blocks = nn.scan(
          Block,
          variable_axes={"params": 0},
          split_rngs={"params": True},
          in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast),
          length=cfg.num_layers,
      )(cfg, name="layers")
      (x, kv), _ = blocks((x, kv), jnp.arange(cfg.num_layers), positions, write_start, mask)
    new_cache = {"k": kv["k"], "v": kv["v"], "length": cache["length"] + tokens.shape[1]}
    if not return_logits:
      return None, new_cache
    x = RMSNorm(cfg.norm_eps, dt, name="final_norm")(x)
    if cfg.tie_embeddings:
      logits = jnp.einsum("btd,vd->btv", x, embed, preferred_element_type=jnp.float32)
    else:
      head = self.param("head", nn.initializers.normal(stddev=0.02),
                        (cfg.embed_dim, cfg.head_size), dt)
      logits = jnp.einsum("btd,dv->btv", x, head, preferred_element_type=jnp.float32)
      if cfg.head_tokens and full_vocab:
        full = jnp.full(logits.shape[:-1] + (cfg.vocab_size,), -jnp.inf, logits.dtype)
        logits = full.at[..., jnp.asarray(cfg.head_tokens, jnp.int32)].set(logits)
    return logits, new_cache


def init_params(config: ModelConfig, key: Array) -> dict:
  """Random params (normal, std 0.02; norms at 1) for `config`. Jitted: one compile per config."""
  tokens = jnp.zeros((1, 1), jnp.int32)
  cache = init_cache(config, 1, 1)
  return Transformer(config).init(key, tokens, tokens, cache)["params"]


def param_shapes(config: ModelConfig) -> dict:
  """The param tree of `config` as jax.ShapeDtypeStruct leaves (nothing is computed)."""
  return jax.eval_shape(functools.partial(init_params, config), jax.random.PRNGKey(0))


def is_unstacked(params) -> bool:
  return "layers" not in params


def unstack_layers(params) -> dict:
  """Stacked params (`layers` [L,...]) -> per-layer `layers_i` (for the unrolled loop)."""
  if is_unstacked(params):
    return params
  out = {k: v for k, v in params.items() if k != "layers"}
  num_layers = jax.tree_util.tree_leaves(params["layers"])[0].shape[0]
  for i in range(num_layers):
    out[f"layers_{i}"] = jax.tree_util.tree_map(lambda x: x[i], params["layers"])
  return out


def stack_layers(params) -> dict:
  """The inverse of `unstack_layers`: the layout params are stored and trained in."""
  if not is_unstacked(params):
    return params
  names = sorted((k for k in params if k.startswith("layers_")), key=lambda k: int(k[7:]))
  out = {k: v for k, v in params.items() if not k.startswith("layers_")}
  out["layers"] = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[params[k] for k in names])
  return out


def forward(params, tokens: Array, positions: Array, cache: Cache, *,
            config: ModelConfig, return_logits: bool = True, full_vocab: bool = True):
  """(params, tokens[B,T], positions[B,T], cache) -> (logits[B,T,V] float32 | None, cache).

  params may be stacked or unstacked (see `Transformer`). With return_logits=False
  the final norm and head are skipped (a cache-only call). A vocabulary-subset head
  (`ModelConfig.head_tokens`) gives -inf outside its C tokens; full_vocab=False returns
  its C columns [B,T,C] instead (what distillation trains on).
  """
  model = Transformer(config, unstacked=is_unstacked(params))
  return model.apply({"params": params}, tokens, positions, cache, return_logits=return_logits,
                     full_vocab=full_vocab)


def param_count(params) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
