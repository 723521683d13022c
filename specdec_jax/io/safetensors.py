"""Hugging Face Llama / Qwen2 checkpoints (config.json + *.safetensors) <-> our param tree.

Einsum letters as in `specdec_jax.models.model`. HF stores `nn.Linear` weights (out, in):

    model.embed_tokens.weight                 [V,D]    <-> embed [V,D]
    model.layers.i.self_attn.q_proj.weight    [N*H,D]  <-> layers.q [L,D,N,H]
    model.layers.i.self_attn.{k,v}_proj.weight [K*H,D] <-> layers.{k,v} [L,D,K,H]
    model.layers.i.self_attn.o_proj.weight    [D,N*H]  <-> layers.o [L,N,H,D]
    model.layers.i.self_attn.{q,k,v}_proj.bias         <-> layers.{q,k,v}_bias (qwen2)
    model.layers.i.mlp.{gate,up}_proj.weight  [F,D]    <-> layers.{gate,up} [L,D,F]
    model.layers.i.mlp.down_proj.weight       [D,F]    <-> layers.down [L,F,D]
    model.layers.i.input_layernorm.weight     [D]      <-> layers.attn_norm.scale [L,D]
    model.layers.i.post_attention_layernorm.w [D]      <-> layers.mlp_norm.scale [L,D]
    model.norm.weight                         [D]      <-> final_norm.scale [D]
    lm_head.weight                            [V,D]    <-> head [D,V] (absent when tied)

HF Llama uses the same rotate_half RoPE as our model, so no Q/K permutation.
`export_hf` then `load_hf` is the identity.
"""

from __future__ import annotations

import glob
import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from specdec_jax.io.atomic import atomic_save, atomic_write_text
from specdec_jax.io.gguf import check_param_shapes
from specdec_jax.models.model import ModelConfig

SUPPORTED_ARCHS = ("llama", "qwen2")
_ARCH_CLASS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints carry


def _rope_theta(hf: dict, source: str) -> float:
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind != "default":
    raise ValueError(f"{source}: RoPE type {kind!r} is not supported (only 'default')")
  return float(rope.get("rope_theta", hf.get("rope_theta", 10_000.0)))


def config_from_hf(hf: dict, *, dtype: str = "float32", max_seq_len: int = 2048,
                   source: str = "config.json") -> ModelConfig:
  """A ModelConfig from a Hugging Face Llama/Qwen2 `config.json` dict."""
  arch = hf.get("model_type")
  if arch not in SUPPORTED_ARCHS:
    raise ValueError(f"{source}: unsupported model_type {arch!r}; "
                     f"supported: {', '.join(SUPPORTED_ARCHS)}")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"{source}: hidden_act {hf['hidden_act']!r} is not supported (only silu)")
  if hf.get("mlp_bias"):
    raise ValueError(f"{source}: mlp_bias=true is not supported")
  if arch == "llama" and hf.get("attention_bias"):
    raise ValueError(f"{source}: llama attention_bias=true (biases on q, k, v and o) "
                     "is not supported")
  if arch == "qwen2" and hf.get("use_sliding_window"):
    raise ValueError(f"{source}: use_sliding_window=true is not supported")
  try:
    d, n = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    return ModelConfig(
        vocab_size=int(hf["vocab_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        embed_dim=d,
        mlp_dim=int(hf["intermediate_size"]),
        num_heads=n,
        num_kv_heads=int(hf.get("num_key_value_heads") or n),
        head_dim=int(hf.get("head_dim") or d // n),
        max_seq_len=max_seq_len,
        rope_theta=_rope_theta(hf, source),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=arch == "qwen2",
        dtype=dtype,
    )
  except KeyError as e:
    raise ValueError(f"{source}: missing key {e.args[0]!r}") from e


def _layer_names(i: int, qkv_bias: bool) -> dict[str, str]:
  """Our layer leaf -> HF tensor name of layer i."""
  p = f"model.layers.{i}."
  names = {
      "attn_norm": p + "input_layernorm.weight", "mlp_norm": p + "post_attention_layernorm.weight",
      "q": p + "self_attn.q_proj.weight", "k": p + "self_attn.k_proj.weight",
      "v": p + "self_attn.v_proj.weight", "o": p + "self_attn.o_proj.weight",
      "gate": p + "mlp.gate_proj.weight", "up": p + "mlp.up_proj.weight",
      "down": p + "mlp.down_proj.weight",
  }
  if qkv_bias:
    names.update({"q_bias": p + "self_attn.q_proj.bias", "k_bias": p + "self_attn.k_proj.bias",
                  "v_bias": p + "self_attn.v_proj.bias"})
  return names


def _check_exportable(config: ModelConfig) -> None:
  if config.head_tokens:
    raise ValueError(f"a vocabulary-subset head ({len(config.head_tokens)} of "
                     f"{config.vocab_size} tokens) has no Hugging Face layout: lm_head "
                     "cannot give the other tokens logit -inf")


def to_hf_tensors(params, config: ModelConfig) -> dict[str, np.ndarray]:
  """Our params -> {HF name: numpy array (out, in)} in the params' dtype."""
  _check_exportable(config)
  cfg = config
  d, n, k, h = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  lay = jax.tree.map(np.asarray, params["layers"])
  out = {"model.embed_tokens.weight": np.asarray(params["embed"]),
         "model.norm.weight": np.asarray(params["final_norm"]["scale"])}
  if not cfg.tie_embeddings:
    out["lm_head.weight"] = np.asarray(params["head"]).T
  for i in range(cfg.num_layers):
    names = _layer_names(i, cfg.qkv_bias)
    out[names["attn_norm"]] = lay["attn_norm"]["scale"][i]
    out[names["mlp_norm"]] = lay["mlp_norm"]["scale"][i]
    out[names["q"]] = lay["q"][i].reshape(d, n * h).T
    out[names["k"]] = lay["k"][i].reshape(d, k * h).T
    out[names["v"]] = lay["v"][i].reshape(d, k * h).T
    out[names["o"]] = lay["o"][i].reshape(n * h, d).T
    out[names["gate"]] = lay["gate"][i].T
    out[names["up"]] = lay["up"][i].T
    out[names["down"]] = lay["down"][i].T
    if cfg.qkv_bias:
      for leaf in ("q_bias", "k_bias", "v_bias"):
        out[names[leaf]] = lay[leaf][i].reshape(-1)
  return {name: np.ascontiguousarray(x) for name, x in out.items()}


def from_hf_tensors(get, names: set[str], config: ModelConfig, source: str = "checkpoint"):
  """HF tensors -> our params (numpy, config.dtype). get(name) returns a numpy array."""
  cfg = config
  d, n, k, h, f, v = (cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                      cfg.mlp_dim, cfg.vocab_size)
  np_dtype = _NP_DTYPES[cfg.dtype]
  used = set()

  def read(name, shape):
    if name not in names:
      raise ValueError(f"tensor {name!r} is missing from {source}")
    used.add(name)
    x = get(name)
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
      raise ValueError(f"tensor {name!r} in {source} has dtype {x.dtype}; weights must be "
                       "float16, bfloat16, float32 or float64")
    if tuple(x.shape) != tuple(shape):
      raise ValueError(f"tensor {name!r} in {source} has shape {tuple(x.shape)} but the config "
                       f"(D={d}, F={f}, N={n}, K={k}, H={h}, V={v}) expects {tuple(shape)}")
    return np.asarray(x, np.float32)

  shapes = {"attn_norm": (d,), "mlp_norm": (d,), "q": (n * h, d), "k": (k * h, d),
            "v": (k * h, d), "o": (d, n * h), "gate": (f, d), "up": (f, d), "down": (d, f),
            "q_bias": (n * h,), "k_bias": (k * h,), "v_bias": (k * h,)}
  to_ours = {  # HF (out, in) -> our per-layer shape
      "attn_norm": lambda w: w, "mlp_norm": lambda w: w,
      "q": lambda w: w.T.reshape(d, n, h), "k": lambda w: w.T.reshape(d, k, h),
      "v": lambda w: w.T.reshape(d, k, h), "o": lambda w: w.T.reshape(n, h, d),
      "gate": lambda w: w.T, "up": lambda w: w.T, "down": lambda w: w.T,
      "q_bias": lambda w: w.reshape(n, h), "k_bias": lambda w: w.reshape(k, h),
      "v_bias": lambda w: w.reshape(k, h),
  }
  per_layer = {leaf: [] for leaf in _layer_names(0, cfg.qkv_bias)}
  for i in range(cfg.num_layers):
    for leaf, name in _layer_names(i, cfg.qkv_bias).items():
      per_layer[leaf].append(to_ours[leaf](read(name, shapes[leaf])).astype(np_dtype))
  layers = {leaf: np.stack(ws) for leaf, ws in per_layer.items()}
  for norm in ("attn_norm", "mlp_norm"):
    layers[norm] = {"scale": layers[norm]}
  embed = read("model.embed_tokens.weight", (v, d))
  params = {"embed": embed.astype(np_dtype), "layers": layers,
            "final_norm": {"scale": read("model.norm.weight", (d,)).astype(np_dtype)}}
  if cfg.tie_embeddings:
    if "lm_head.weight" in names and not np.array_equal(read("lm_head.weight", (v, d)), embed):
      raise ValueError(f"{source}: tie_word_embeddings is true but lm_head.weight differs "
                       "from model.embed_tokens.weight")
  else:
    if "lm_head.weight" not in names:
      raise ValueError(f"tensor 'lm_head.weight' is missing from {source} and "
                       "tie_word_embeddings is false")
    params["head"] = read("lm_head.weight", (v, d)).T.astype(np_dtype)
  extra = sorted(x for x in names - used if not x.endswith(_IGNORED_SUFFIXES))
  if extra:
    raise ValueError(f"unsupported tensors in {source}: {extra[:8]}"
                     f"{' ...' if len(extra) > 8 else ''}")
  check_param_shapes(params, cfg, source=source)
  return params


def _shard_files(model_dir: str) -> list[str]:
  index = os.path.join(model_dir, "model.safetensors.index.json")
  if os.path.isfile(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    files = [os.path.join(model_dir, name) for name in sorted(set(weight_map.values()))]
    missing = [p for p in files if not os.path.isfile(p)]
    if missing:
      raise FileNotFoundError(f"shards listed in {index} are missing: {missing}")
    return files
  files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
  if not files:
    raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
  return files


def load_hf(model_dir: str | os.PathLike, dtype: str = "float32",
            max_seq_len: int = 2048) -> tuple[ModelConfig, dict]:
  """Reads an HF Llama/Qwen2 checkpoint folder (possibly sharded). Returns (config, params).

  Tensors of any float dtype are read through float32 and cast to `dtype`.
  """
  model_dir = os.fspath(model_dir)
  config_path = os.path.join(model_dir, "config.json")
  if not os.path.isfile(config_path):
    raise FileNotFoundError(f"config.json not found in {model_dir}")
  try:
    with open(config_path) as f:
      hf = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{config_path} is not valid JSON: {e}") from e
  cfg = config_from_hf(hf, dtype=dtype, max_seq_len=max_seq_len, source=config_path)
  where: dict[str, str] = {}
  for path in _shard_files(model_dir):
    try:
      with safe_open(path, framework="numpy") as f:
        for name in f.keys():
          if name in where:
            raise ValueError(f"tensor {name!r} appears in both {where[name]} and {path}")
          where[name] = path
    except ValueError:
      raise
    except Exception as e:
      raise ValueError(f"corrupt safetensors file {path}: {type(e).__name__}: {e}") from e

  def get(name):
    with safe_open(where[name], framework="numpy") as f:
      return f.get_tensor(name)

  params = from_hf_tensors(get, set(where), cfg, source=model_dir)
  return cfg, jax.tree.map(jnp.asarray, params)


def hf_config(config: ModelConfig, arch: str = "llama", **extra) -> dict:
  """The config.json dict transformers needs to rebuild `config` as `arch`."""
  _check_exportable(config)
  if arch not in SUPPORTED_ARCHS:
    raise ValueError(f"arch must be one of {SUPPORTED_ARCHS}, got {arch!r}")
  if arch == "llama" and config.qkv_bias:
    raise ValueError("HF llama cannot hold q/k/v biases without an o bias; export as 'qwen2'")
  if arch == "qwen2" and not config.qkv_bias:
    raise ValueError("HF qwen2 always has q/k/v biases; this config has qkv_bias=False")
  hf = {
      "architectures": [_ARCH_CLASS[arch]],
      "model_type": arch,
      "vocab_size": config.vocab_size,
      "hidden_size": config.embed_dim,
      "intermediate_size": config.mlp_dim,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.head_dim,
      "hidden_act": "silu",
      "max_position_embeddings": config.max_seq_len,
      "rms_norm_eps": config.norm_eps,
      "rope_theta": config.rope_theta,  # transformers < 5
      "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
      "tie_word_embeddings": config.tie_embeddings,
      "torch_dtype": config.dtype,
      "dtype": config.dtype,
  }
  if arch == "llama":
    hf.update(attention_bias=False, mlp_bias=False)
  else:
    hf.update(use_sliding_window=False, sliding_window=None)
  hf.update(extra)
  return hf


def export_hf(params, config: ModelConfig, out_dir: str | os.PathLike, arch: str = "llama",
              **extra_config) -> str:
  """Writes out_dir/config.json and out_dir/model.safetensors (HF layout). Returns out_dir.

  extra_config (e.g. bos_token_id=1, eos_token_id=2) is merged into config.json.
  """
  out_dir = os.fspath(out_dir)
  hf = hf_config(config, arch, **extra_config)
  check_param_shapes(params, config)
  os.makedirs(out_dir, exist_ok=True)
  tensors = to_hf_tensors(params, config)
  atomic_save(os.path.join(out_dir, "model.safetensors"),
              lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
  atomic_write_text(os.path.join(out_dir, "config.json"), json.dumps(hf, indent=2))
  return out_dir
