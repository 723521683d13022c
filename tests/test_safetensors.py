"""specdec_jax.io.safetensors: export/import identity, transformers-made checkpoints, errors."""

import json
import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from helpers import noise_params
from specdec_jax.io.safetensors import export_hf, load_hf, to_hf_tensors
from specdec_jax.models.model import ModelConfig, forward, init_cache, init_params

DATA = os.path.join(os.path.dirname(__file__), "data")
REF_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          ".venv-ref", "bin", "python")
TOKENS = [3, 17, 42, 5, 63, 0, 29, 11, 8, 50]
with open(os.path.join(DATA, "smollm2_golden.json")) as _f:
  TINY_HF = json.load(_f)["tiny_hf"]


def _config(arch="llama", tie=True, dtype="float32"):
  return ModelConfig(vocab_size=64, num_layers=2, embed_dim=32, mlp_dim=48, num_heads=4,
                     num_kv_heads=2, head_dim=16, max_seq_len=128, rope_theta=5000.0,
                     norm_eps=1e-6, tie_embeddings=tie, qkv_bias=arch == "qwen2", dtype=dtype)


def _random_params(cfg, seed=0):
  return noise_params(cfg, seed, scale=0.25)


def _logits(cfg, params, tokens=TOKENS):
  t = jnp.asarray([tokens], jnp.int32)
  logits, _ = forward(params, t, jnp.arange(len(tokens))[None], init_cache(cfg, 1, len(tokens)),
                      config=cfg)
  return np.asarray(logits[0])


def _assert_same(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
  assert jax.tree.structure(a) == jax.tree.structure(b)


def test_export_import_identity_init_params(tmp_path):
  cfg = _config()
  params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
  export_hf(params, cfg, tmp_path, arch="llama")
  got_cfg, got = load_hf(tmp_path, max_seq_len=cfg.max_seq_len)
  assert got_cfg == cfg
  _assert_same(got, params)


def test_export_refuses_a_vocabulary_subset_head(tmp_path):
  cfg = _config().replace(tie_embeddings=False, head_tokens=(0, 1, 2))
  with pytest.raises(ValueError, match="vocabulary-subset head"):
    export_hf({}, cfg, tmp_path)
  assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("arch,tie,dtype", [("llama", False, "float32"),
                                            ("llama", True, "bfloat16"),
                                            ("qwen2", False, "float32"),
                                            ("qwen2", True, "bfloat16")])
def test_export_import_identity(tmp_path, arch, tie, dtype):
  cfg = _config(arch, tie, dtype)
  params = _random_params(cfg)
  export_hf(params, cfg, tmp_path, arch=arch, bos_token_id=1)
  got_cfg, got = load_hf(tmp_path, dtype=dtype, max_seq_len=cfg.max_seq_len)
  assert got_cfg == cfg
  _assert_same(got, params)
  with open(tmp_path / "config.json") as f:
    hf = json.load(f)
  assert hf["model_type"] == arch and hf["tie_word_embeddings"] == tie and hf["bos_token_id"] == 1
  assert hf["rope_parameters"]["rope_theta"] == 5000.0 and hf["head_dim"] == 16


@pytest.mark.parametrize("with_index", [True, False])
def test_sharded_import(tmp_path, with_index):
  cfg = _config("qwen2", tie=False)
  params = _random_params(cfg)
  tensors = to_hf_tensors(params, cfg)
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[::2],
            "model-00002-of-00002.safetensors": names[1::2]}
  for file, part in shards.items():
    save_file({n: tensors[n] for n in part}, str(tmp_path / file), metadata={"format": "pt"})
  if with_index:
    weight_map = {n: file for file, part in shards.items() for n in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  export_dir = tmp_path / "cfg"
  export_hf(params, cfg, export_dir, arch="qwen2")
  (tmp_path / "config.json").write_text((export_dir / "config.json").read_text())
  _, got = load_hf(tmp_path, max_seq_len=cfg.max_seq_len)
  _assert_same(got, params)


def _write_tiny_hf(arch, folder):
  """The transformers-made tiny checkpoint of tests/data (npz + config.json) as safetensors."""
  ref = TINY_HF[arch]
  tensors = dict(np.load(os.path.join(DATA, ref["npz"])))
  os.makedirs(folder, exist_ok=True)
  save_file({k: v.astype(np.float32) for k, v in tensors.items()},
            os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(ref["config"], f)
  return ref


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_transformers_tiny_checkpoint(tmp_path, arch):
  """A random Llama (untied, head_dim 16 != D/N) / Qwen2 (tied, biases) saved by transformers."""
  ref = _write_tiny_hf(arch, tmp_path)
  cfg, params = load_hf(tmp_path, max_seq_len=128)
  assert (cfg.head_dim, cfg.rope_theta, cfg.norm_eps) == ((16 if arch == "llama" else 8),
                                                          5000.0, 1e-6)
  assert cfg.tie_embeddings == (arch == "qwen2") and cfg.qkv_bias == (arch == "qwen2")
  np.testing.assert_allclose(_logits(cfg, params, ref["tokens"]), ref["logits"], rtol=0, atol=1e-4)


def _transformers_logits_script(folders):
  return ("import json, sys, torch\n"
          "from transformers import AutoModelForCausalLM\n"
          "out = {}\n"
          f"for d in {[str(f) for f in folders]!r}:\n"
          "  m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()\n"
          "  with torch.no_grad():\n"
          f"    out[d] = m(torch.tensor([{TOKENS!r}])).logits[0].tolist()\n"
          "print(json.dumps(out))\n")


def _exported_pair(tmp_path):
  """Exports a tiny llama (untied) and qwen2 (tied); returns {folder: our logits}."""
  ours = {}
  for arch, tie in (("llama", False), ("qwen2", True)):
    cfg = _config(arch, tie)
    params = _random_params(cfg, seed=3)
    folder = export_hf(params, cfg, tmp_path / arch, arch=arch)
    ours[folder] = _logits(cfg, params)
  return ours


def test_transformers_live(tmp_path):
  """transformers in this venv: its random checkpoints import, our exports load in it."""
  torch = pytest.importorskip("torch", reason="no torch (see requirements-reference.txt)")
  transformers = pytest.importorskip("transformers", reason="transformers not installed")
  for arch in ("llama", "qwen2"):
    hf_cfg = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    model = (transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_cfg)) if arch == "llama"
             else transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**hf_cfg))).eval()
    model.save_pretrained(tmp_path / f"hf_{arch}")
    cfg, params = load_hf(tmp_path / f"hf_{arch}", max_seq_len=128)
    with torch.no_grad():
      want = model(torch.tensor([TOKENS])).logits[0].numpy()
    np.testing.assert_allclose(_logits(cfg, params), want, rtol=0, atol=1e-4)
  for folder, ours in _exported_pair(tmp_path).items():
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
      want = model(torch.tensor([TOKENS])).logits[0].numpy()
    np.testing.assert_allclose(ours, want, rtol=0, atol=1e-4)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(REF_PYTHON),
                    reason="no .venv-ref (see requirements-reference.txt)")
def test_exports_load_in_reference_venv(tmp_path):
  """Our exports load in transformers (the .venv-ref interpreter) with the same logits."""
  ours = _exported_pair(tmp_path)
  run = subprocess.run([REF_PYTHON, "-c", _transformers_logits_script(list(ours))],
                       capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
  assert run.returncode == 0, run.stderr[-2000:]
  theirs = json.loads(run.stdout.strip().splitlines()[-1])
  for folder, logits in ours.items():
    np.testing.assert_allclose(logits, theirs[str(folder)], rtol=0, atol=1e-4)


# --- errors ------------------------------------------------------------------------------


def test_missing_config(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json not found in .*"):
    load_hf(tmp_path / "nowhere")


def test_no_weights(tmp_path):
  _write_tiny_hf("llama", tmp_path)
  os.remove(tmp_path / "model.safetensors")
  with pytest.raises(FileNotFoundError, match="no \\*.safetensors files in"):
    load_hf(tmp_path)


def test_corrupt_weights(tmp_path):
  _write_tiny_hf("llama", tmp_path)
  (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
  with pytest.raises(ValueError, match="corrupt safetensors file .*model.safetensors"):
    load_hf(tmp_path)


def test_wrong_dtype(tmp_path):
  _write_tiny_hf("llama", tmp_path)
  path = str(tmp_path / "model.safetensors")
  tensors = load_file(path)
  name = "model.layers.0.mlp.up_proj.weight"
  save_file({**tensors, name: tensors[name].astype(np.int32)}, path)
  with pytest.raises(ValueError, match=f"tensor '{name}' in .* has dtype int32; weights must be"):
    load_hf(tmp_path)


def _edit_config(folder, **changes):
  path = os.path.join(folder, "config.json")
  with open(path) as f:
    hf = json.load(f)
  hf.update(changes)
  with open(path, "w") as f:
    json.dump(hf, f)


@pytest.mark.parametrize("changes,match", [
    ({"model_type": "mamba"}, "unsupported model_type 'mamba'"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "RoPE type 'llama3'"),
    ({"attention_bias": True}, "attention_bias=true"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"intermediate_size": 40}, r"'model.layers.0.mlp.gate_proj.weight'.* has shape \(48, 32\) "
                                r"but the config .* expects \(40, 32\)"),
    ({"tie_word_embeddings": True}, "lm_head.weight differs"),
])
def test_bad_config(tmp_path, changes, match):
  _write_tiny_hf("llama", tmp_path)
  _edit_config(tmp_path, **changes)
  with pytest.raises(ValueError, match=match):
    load_hf(tmp_path)


def test_missing_and_extra_tensors(tmp_path):
  cfg = _config()
  tensors = to_hf_tensors(_random_params(cfg), cfg)
  export_hf(_random_params(cfg), cfg, tmp_path)
  missing = {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}
  save_file(missing, str(tmp_path / "model.safetensors"))
  with pytest.raises(ValueError, match="'model.layers.1.mlp.up_proj.weight' is missing"):
    load_hf(tmp_path)
  save_file({**tensors, "model.layers.0.self_attn.o_proj.bias": np.zeros(32, np.float32)},
            str(tmp_path / "model.safetensors"))
  with pytest.raises(ValueError, match="unsupported tensors .*o_proj.bias"):
    load_hf(tmp_path)


def test_export_arch_mismatch(tmp_path):
  with pytest.raises(ValueError, match="export as 'qwen2'"):
    export_hf(_random_params(_config("qwen2")), _config("qwen2"), tmp_path, arch="llama")
  with pytest.raises(ValueError, match="qkv_bias=False"):
    export_hf(_random_params(_config()), _config(), tmp_path, arch="qwen2")
  with pytest.raises(ValueError, match="arch must be one of"):
    export_hf(_random_params(_config()), _config(), tmp_path, arch="gpt2")
