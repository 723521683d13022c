"""A Llama-family decoder-only transformer in Flax linen, with an explicit KV cache.

Einsum letters:
  B batch, T query length (tokens in this call), S cache slots (keys),
  L layers, D model width, F MLP width, N query heads, K kv heads,
  G query heads per kv head (N = K * G), H head dim, V vocabulary,
  C columns of a vocabulary-subset head (`ModelConfig.head_tokens`),
  E target width (the input width of a feature draft), F = E * len(feature_layers).

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

Serving layout (`layouts.serving_layout`; decoding scripts use it). Stored input-major (gate
[D,F]), a call over T tokens is x[T,D] @ W; on XLA:CPU that streams W at full bandwidth only
for T = 1, and a verify call over a few tokens costs more (measured v(k):
docs/design.md#verify-cost). Stored output-major (`gate_t` [F,D]), a call over
2..SKINNY_ROWS tokens on the CPU is a fused multiply-sum over rows of W^T that streams W
once (`matmul.out_major_matmul`; docs/background.md#cpu): the same products in another
memory order.

Hidden states. `forward(..., hidden_layers=(l_1, .., l_k))` also returns the residual
stream after l_i blocks (0 = the embedding, L = the last block, before the final norm),
concatenated: [B,T,k*D]. It only gathers values the forward computes anyway.

Feature drafts (EAGLE-3 style; `ModelConfig.feature_layers` non-empty). The same
Transformer, with a different input: at position i it reads the token x_i through the
*target's* embedding (passed as `input_embed` [V,E]; the draft owns no embedding) and a
context vector c_{i-1} [D]:

  x_in = in_proj([embed_norm(E[x_i]) ; context_norm(c_{i-1})])      [B,T,E+D] -> [B,T,D]
  c    = fuse(feature_norm(f_{i-1}))   from the target's features f [B,T,F] -> [B,T,D]
       | h_{i-1}                       the draft's own last hidden state [B,T,D]

`feature_norm` RMS-normalises each of the k gathered target layers on its own (no
gain: `fuse` is linear, so a per-feature gain would be redundant). The
draft's blocks, final norm and head are as for any model; its own hidden state h (the
residual after its last block, `hidden_layers=(num_layers,)`) is what it feeds itself
where the target's features do not exist yet (the 2nd..γ-th drafted token).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.models.matmul import out_major_matmul
from specdec_jax.models.subset_head import full_vocab_logits

Array = jax.Array
Cache = dict[str, Array]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class Model(NamedTuple):
  """A model as the generate functions take it: its static config (a `ModelConfig`, or a
  draft kind of `specdec_jax.drafts` for a draft) and its params pytree (None for a draft
  without weights, such as a prompt lookup)."""

  config: Any
  params: Any


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
  # A feature draft (see the module docstring): the target layer ids (residual after that
  # many blocks) it fuses, and the target width E. () = an ordinary, independent model.
  feature_layers: tuple[int, ...] = ()
  feature_width: int = 0

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
    layers = tuple(int(i) for i in self.feature_layers)
    object.__setattr__(self, "feature_layers", layers)
    if layers:
      if not isinstance(self.feature_width, int) or self.feature_width < 1:
        raise ValueError(f"a feature draft (feature_layers={layers}) needs feature_width = "
                         f"the target width > 0, got {self.feature_width!r}")
      if min(layers) < 0:
        raise ValueError(f"feature_layers must be target layer ids >= 0, got {layers}")
      if self.tie_embeddings and self.feature_width != self.embed_dim:
        raise ValueError(f"a tied feature draft reads the target's head, so embed_dim must "
                         f"equal feature_width; got {self.embed_dim} vs {self.feature_width}")
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
  def reads_target_features(self) -> bool:
    """True for a feature draft's architecture: it fuses the target's hidden states
    (`feature_layers`) and reads the target's embedding instead of owning one."""
    return bool(self.feature_layers)

  @property
  def kind(self) -> str:
    """'feature' or 'model': the architecture's name in records (model.json, reports)."""
    return "feature" if self.reads_target_features else "model"

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


def rms_normalize(x: Array, eps: float) -> Array:
  """x / RMS(x) over the last axis, computed in float32 (no gain)."""
  x32 = x.astype(jnp.float32)
  return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)


class RMSNorm(nn.Module):
  eps: float
  dtype: Any

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.dtype)
    return (rms_normalize(x, self.eps) * scale.astype(jnp.float32)).astype(self.dtype)


class Block(nn.Module):
  """Pre-norm attention + SwiGLU MLP of layer `layer`; carry (x[B,T,D], kv) -> (carry, None).

  The (carry, scanned input) signature is what `nn.scan` needs. Reads and writes the
  whole stacked cache kv = {'k','v': [L,B,S,K,H]} at index `layer` (a traced int under
  `nn.scan`, a Python int in the unrolled loop), so the cache is one buffer updated in
  place, never re-stacked.
  """

  config: ModelConfig
  emit_hidden: bool = False  # also return x (the residual after this block) as scan output

  @nn.compact
  def __call__(self, carry, layer, positions, write_start, mask):
    x, kv = carry
    cfg = self.config
    dt = cfg.jnp_dtype
    init = nn.initializers.normal(stddev=0.02)
    n, k, h, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.embed_dim
    b, t, _ = x.shape

    def dense(inp, name, shape):  # a 2-D matmul on a param of any rank (a free reshape)
      if self.has_variable("params", name + "_t"):  # the serving layout [out, in]
        size = inp.shape[-1]
        w_t = self.param(name + "_t", init, (functools.reduce(int.__mul__, shape) // size,
                                             size), dt)
        return out_major_matmul(inp, w_t)
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
    return (x, kv), (x if self.emit_hidden else None)


class Transformer(nn.Module):
  """Embedding, L blocks, final norm and (tied or own) head.

  unstacked=False: params['layers'] holds every block stacked on a leading L axis
    and the blocks run under `nn.scan` (fast to compile; the layout we store).
  unstacked=True: params['layers_0' .. 'layers_{L-1}'] and an unrolled loop
    (faster per token on a CPU, slower to compile: docs/background.md#cpu; see
    `unstack_layers`).
  """

  config: ModelConfig
  unstacked: bool = False

  @nn.compact
  def __call__(self, tokens, positions, cache, return_logits: bool = True,
               full_vocab: bool = True, hidden_layers: tuple[int, ...] = (),
               input_embed=None, target_features=None, context=None, attn_mask=None,
               logits_at=None):
    cfg = self.config
    dt = cfg.jnp_dtype
    if cfg.feature_layers:
      embed = input_embed  # the target's [V,E], never a param of the draft
      x = self._feature_input(jnp.take(embed, tokens, axis=0), target_features, context)
    else:
      embed = self.param("embed", nn.initializers.normal(stddev=0.02),
                         (cfg.vocab_size, cfg.embed_dim), dt)
      x = jnp.take(embed, tokens, axis=0)  # [B,T,D]
    slots = cache["k"].shape[2]
    if attn_mask is None:
      mask = jnp.arange(slots)[None, None, :] <= positions[:, :, None]  # [B,T,S]
    else:
      mask = attn_mask
    write_start = cache["length"]
    kv = {"k": cache["k"], "v": cache["v"]}
    emit = bool(hidden_layers)
    if emit and max(hidden_layers) > cfg.num_layers:
      raise ValueError(f"hidden_layers {hidden_layers} reach past the model's "
                       f"{cfg.num_layers} layers")

    residuals = [x]  # residuals[l]: the stream after l blocks
    if self.unstacked:
      for i in range(cfg.num_layers):
        (x, kv), _ = Block(cfg, name=f"layers_{i}")((x, kv), i, positions, write_start, mask)
        residuals.append(x)
    else:
      blocks = nn.scan(
          Block,
          variable_axes={"params": 0},
          split_rngs={"params": True},
          in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast),
          length=cfg.num_layers,
      )(cfg, emit_hidden=emit, name="layers")
      (x, kv), stacked = blocks((x, kv), jnp.arange(cfg.num_layers), positions, write_start,
                                mask)
      if emit:
        residuals += [stacked[i] for i in range(cfg.num_layers)]
    hidden = (jnp.concatenate([residuals[i] for i in hidden_layers], axis=-1)
              if emit else None)
    new_cache = {"k": kv["k"], "v": kv["v"], "length": cache["length"] + tokens.shape[1]}
    if not return_logits:
      return None, new_cache, hidden
    if logits_at is not None:  # [B,T'] indices into this call's T positions
      x = jnp.take_along_axis(x, logits_at[..., None], axis=1)
    x = RMSNorm(cfg.norm_eps, dt, name="final_norm")(x)
    if cfg.tie_embeddings:
      logits = out_major_matmul(x, embed).astype(jnp.float32)
    else:
      if self.has_variable("params", "head_t"):  # the serving layout [V|C, D]
        head_t = self.param("head_t", nn.initializers.normal(stddev=0.02),
                            (cfg.head_size, cfg.embed_dim), dt)
        logits = out_major_matmul(x, head_t).astype(jnp.float32)
      else:
        head = self.param("head", nn.initializers.normal(stddev=0.02),
                          (cfg.embed_dim, cfg.head_size), dt)
        logits = jnp.einsum("btd,dv->btv", x, head, preferred_element_type=jnp.float32)
      if cfg.head_tokens and full_vocab:
        logits = full_vocab_logits(logits, cfg.head_tokens, cfg.vocab_size)
    return logits, new_cache, hidden

  def _feature_input(self, embedded, target_features, context):
    """[B,T,E] embedded tokens + target features [B,T,F] or a context [B,T,D] -> [B,T,D]."""
    cfg = self.config
    dt = cfg.jnp_dtype
    init = nn.initializers.normal(stddev=0.02)
    k, e, d = len(cfg.feature_layers), cfg.feature_width, cfg.embed_dim
    if (target_features is None) == (context is None):
      raise ValueError("a feature draft needs exactly one of target_features [B,T,F] and "
                       "context [B,T,D]")
    if target_features is not None:
      if target_features.shape[-1] != k * e:
        raise ValueError(f"target_features have width {target_features.shape[-1]}, the draft "
                         f"fuses {k} layers of width {e} = {k * e}")
      f = target_features.reshape(target_features.shape[:-1] + (k, e))
      f = rms_normalize(f, cfg.norm_eps).astype(dt)  # each layer on its own; `fuse` scales
      fuse = self.param("fuse", init, (k * e, d), dt)
      context = jnp.dot(f.reshape(target_features.shape), fuse)
    y = jnp.concatenate([RMSNorm(cfg.norm_eps, dt, name="embed_norm")(embedded),
                         RMSNorm(cfg.norm_eps, dt, name="context_norm")(context)], axis=-1)
    return jnp.dot(y, self.param("in_proj", init, (e + d, d), dt))


@functools.partial(jax.jit, static_argnums=0)
def init_params(config: ModelConfig, key: Array) -> dict:
  """Random params (normal, std 0.02; norms at 1) for `config`. Jitted: one compile per config.

  A feature draft has no 'embed' (it reads the target's); it has 'fuse', 'in_proj' and
  the 'embed_norm' / 'context_norm' scales.
  """
  tokens = jnp.zeros((1, 1), jnp.int32)
  cache = init_cache(config, 1, 1)
  extra = {}
  if config.feature_layers:
    extra = dict(input_embed=jnp.zeros((config.vocab_size, config.feature_width),
                                       config.jnp_dtype),
                 target_features=jnp.zeros(
                     (1, 1, len(config.feature_layers) * config.feature_width),
                     config.jnp_dtype))
  return Transformer(config).init(key, tokens, tokens, cache, **extra)["params"]


def param_shapes(config: ModelConfig) -> dict:
  """The param tree of `config` as jax.ShapeDtypeStruct leaves (nothing is computed)."""
  return jax.eval_shape(functools.partial(init_params, config), jax.random.PRNGKey(0))


def is_unstacked(params) -> bool:
  return "layers" not in params


def forward(params, tokens: Array, positions: Array, cache: Cache, *,
            config: ModelConfig, return_logits: bool = True, full_vocab: bool = True,
            hidden_layers: tuple[int, ...] = (), input_embed: Array | None = None,
            target_features: Array | None = None, context: Array | None = None,
            attn_mask: Array | None = None, logits_at: Array | None = None):
  """(params, tokens[B,T], positions[B,T], cache) -> (logits[B,T,V] float32 | None, cache).

  params may be stacked or unstacked (see `Transformer`). With return_logits=False
  the final norm and head are skipped (a cache-only call). A vocabulary-subset head
  (`ModelConfig.head_tokens`) gives -inf outside its C tokens; full_vocab=False returns
  its C columns [B,T,C] instead (what distillation trains on).

  hidden_layers (static ids in 0..L): also return the residual stream after that many
  blocks, concatenated, as a third output [B,T,len*D].
  A feature draft (`config.feature_layers`) also needs input_embed (the target's
  embedding [V,E]) and exactly one of target_features [B,T,F] (fused here) and context
  [B,T,D] (its own hidden states); see the module docstring.
  attn_mask: bool [B,T,S] replacing the causal `slot <= position` mask (training-time
  test unrolls attend along a diagonal; see `distill`).
  logits_at: int [B,T'] indices into the T positions: logits [B,T',V] of those only (the
  head is the widest matmul of a small draft; the cache and hidden states cover all T).
  """
  if config.feature_layers and input_embed is None:
    raise ValueError("a feature draft needs input_embed (the target's embedding [V,E])")
  model = Transformer(config, unstacked=is_unstacked(params))
  logits, cache, hidden = model.apply(
      {"params": params}, tokens, positions, cache, return_logits=return_logits,
      full_vocab=full_vocab, hidden_layers=tuple(hidden_layers), input_embed=input_embed,
      target_features=target_features, context=context, attn_mask=attn_mask,
      logits_at=logits_at)
  if hidden_layers:
    return logits, cache, hidden
  return logits, cache


def check_params(params, config: ModelConfig, name: str) -> None:
  """Raises ValueError unless params is a dict whose embedding fits config (name: 'target'
  or 'draft', for the message)."""
  if not isinstance(params, dict):
    raise ValueError(f"{name} params must be a dict pytree, got {type(params).__name__}")
  embed = params.get("embed")
  if embed is None or embed.shape != (config.vocab_size, config.embed_dim):
    got = None if embed is None else embed.shape
    raise ValueError(f"{name} params do not match its config: embed is {got}, expected "
                     f"{(config.vocab_size, config.embed_dim)}")


def param_count(params) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))


def unrolled_feature_logits(params, tokens: Array, target_features: Array, *,
                            config: ModelConfig, input_embed: Array, depth: int,
                            full_vocab: bool = False) -> Array:
  """Training-time test of a feature draft: logits [K,B,T,C] of K = depth unrolled passes.

  tokens [B,T] and the target's features f [B,T,F] of one teacher-forced window. Pass 1
  reads (x_i, f_{i-1}) at every position i, as the decode loop's re-read does. Pass k
  reads (x_i, h^{k-1}_{i-1}), the previous pass's own hidden state, and its query at i
  attends to what the k-th drafted token attends to when decoding from ℓ = i-k+1: pass 1's
  keys at positions <= ℓ (true features) and pass m's key at position ℓ+m-1 for m = 2..k
  (the diagonal). So pass k at position i equals the decode loop's q_k when x_{ℓ+1..i}
  were drafted and accepted; rows i < k-1 have no such ℓ and should carry no loss.
  The passes share one cache of K*T slots (pass k writes slots (k-1)T .. kT-1).
  full_vocab: see `forward` (False: a subset head's own C columns).
  """
  if not config.reads_target_features:
    raise ValueError("unrolled_feature_logits needs a feature draft (config.feature_layers)")
  b, t = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  cache = init_cache(config.replace(max_seq_len=max(config.max_seq_len, depth * t)), b,
                     depth * t)
  query = jnp.arange(t)[:, None]  # [T,1]
  slot = jnp.arange(depth * t)[None, :]  # [1,K*T]
  pass_of, col = slot // t, slot % t

  def shift(x):  # x[:, i-1] at position i; zeros at 0
    return jnp.pad(x, ((0, 0), (1, 0), (0, 0)))[:, :t]

  inputs = {"target_features": shift(target_features)}
  out = []
  for k in range(1, depth + 1):
    mask = (pass_of == 0) & (col <= query - k + 1)
    for m in range(2, k + 1):
      mask = mask | ((pass_of == m - 1) & (col == query - k + m))
    cache = {**cache, "length": jnp.full((b,), (k - 1) * t, jnp.int32)}
    logits, cache, hidden = forward(
        params, tokens, positions, cache, config=config, full_vocab=full_vocab,
        hidden_layers=(config.num_layers,), input_embed=input_embed,
        attn_mask=jnp.broadcast_to(mask[None], (b, t, depth * t)), **inputs)
    out.append(logits)
    inputs = {"context": shift(hidden)}
  return jnp.stack(out)
