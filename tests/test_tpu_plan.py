"""The compile plan (`bench.compile_plan`, scripts/tpu_plan.py) and its roofline
(`bench.roofline`).

The plan compiles from shapes alone, so its shapes must be the loaded models' own: the
configs read from headers equal the loaders' and their param trees have the loaded
params' shapes and dtypes. The roofline's arithmetic is checked on hand-made costs (a
memory-bound and a compute-bound program; the step-cost formula at γ = 0 and γ > 0).
The slow test compiles the tiny pair's speculative loop for a v5e topology and checks
the plan's fields; it needs libtpu (`make tpu-plan`'s .venv-tpu) and skips without it.
"""

import importlib.util
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import loading
from specdec_jax.bench import compile_plan, roofline
from specdec_jax.io import wheel_parts
from specdec_jax.models.model import param_shapes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = "saved:drafts/smollm2_feature_v1"


def shapes_of(tree):
  return jax.tree.map(lambda x: (tuple(x.shape), str(jnp.dtype(x.dtype))), tree)


@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=pytest.mark.slow),
                                   "bfloat16"])  # the plan's default dtype in make test
def test_plan_shapes_are_the_loaded_models_own(dtype):
  tokenizer = loading.load_tokenizer("smollm2")
  cfg, params = loading.load_target("smollm2", tokenizer, dtype=dtype, max_seq_len=512)
  assert loading.model_config_of("smollm2", dtype=dtype, max_seq_len=512) == cfg
  assert shapes_of(param_shapes(cfg)) == shapes_of(params)
  draft_cfg, draft_params = loading.load_draft(SHIPPED, tokenizer, cfg, params)
  planned, has_params = loading.draft_config_of(SHIPPED, cfg)
  assert has_params and planned == draft_cfg and draft_cfg.dtype == dtype
  assert shapes_of(param_shapes(planned)) == shapes_of(draft_params)
  hybrid, has_params = loading.draft_config_of("hybrid:3", cfg, feature_draft=SHIPPED)
  assert has_params and hybrid.model_config == draft_cfg
  assert loading.draft_config_of("ngram:3", cfg) == (loading.registry.make("ngram:3"), False)


@pytest.mark.parametrize("name", sorted(wheel_parts.QWEN_NAMES))
def test_pinned_qwen_headers_match_the_gguf(name):
  path = wheel_parts.gguf_path(name)
  if not path.exists():
    pytest.skip(f"{name} is not fetched (`make qwen`); its pinned header is used")
  from specdec_jax.io.gguf import config_from_gguf, open_gguf
  header = config_from_gguf(open_gguf(str(path)))
  pinned = loading.ModelConfig(**wheel_parts.HEADER_CONFIGS[wheel_parts.QWEN_NAMES[name]])
  assert header == pinned


def test_plan_models_names_every_draft_kind_of_a_config():
  from configs import qwen25_coder, smollm2_135m
  _, drafts = compile_plan.plan_models(smollm2_135m.get_config())
  assert [label.split()[0] for label in drafts] == ["hybrid", "feature", "lookup"]
  config = qwen25_coder.get_config()
  config.draft = "random"  # the Qwen pair's shape of config without its files
  _, drafts = compile_plan.plan_models(config)
  assert [label.split()[0] for label in drafts] == ["independent", "lookup", "hybrid"]


def test_a_side_by_side_file_predicts_from_the_configs_column_alone():
  """`--from` a file of several γ columns: the rows of the config's γ and verifier, each
  prompt once (all columns pooled would count every prompt once per column); a file
  without that column is one line, exit 2, before any compile."""
  doc = {"rows": [
      {"gamma": g, "verifier": "block",
       "prompts": [{"id": f"p{i}", "gamma": g, "alpha": a, "tokens_per_step": 1.5}
                   for i, a in enumerate((0.2, 0.8))]} for g in ("auto", 1, 3)]}
  rows = roofline.prompt_rows(doc, gamma=3, verifier="block")
  assert [(r["id"], r["gamma"]) for r in rows] == [("p0", 3), ("p1", 3)]
  assert [r["gamma"] for r in roofline.prompt_rows(doc, gamma="auto", verifier="block")] == [
      "auto", "auto"]
  one = {"rows": doc["rows"][:1]}  # one column: its rows, whatever the config's γ
  assert len(roofline.prompt_rows(one, gamma=2, verifier="token")) == 2
  with pytest.raises(ValueError, match="not one of them is gamma 2 block"):
    roofline.prompt_rows(doc, gamma=2, verifier="block")
  with pytest.raises(ValueError, match="alpha and tokens_per_step"):
    roofline.prompt_rows({"rows": [{"prompts": [{"id": "x"}]}]}, gamma=2, verifier="block")
  out = _plan("--config=configs/tiny.py", "--config.gamma=5", "--topology=local",
              "--from=docs/results/benchmark_heldout_smollm2.json")
  assert out.returncode == 2 and out.stderr.strip().startswith("error: --from=")
  assert "gamma auto block" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_roofline_is_the_larger_of_memory_and_compute_time():
  chip = roofline.Chip("test", ("test",), 1e9, 1e9, 1e12, "none")
  assert chip.seconds(dict(bytes=2e9, flops=1e12)) == pytest.approx(2.0)  # memory-bound
  assert chip.seconds(dict(bytes=1e9, flops=3e12)) == pytest.approx(3.0)  # compute-bound
  assert chip.seconds(dict(bytes=1e9, flops=0.0), 0.5) == pytest.approx(1.5)


def test_step_model_and_prediction_follow_the_cost_formula():
  chip = roofline.Chip("test", ("test",), 1e9, 1e9, 1e15, "none")
  pieces = dict(target={k: dict(bytes=1e9 + 1e8 * (k - 1), flops=0.0) for k in range(1, 6)},
                draft=dict(bytes=2e8, flops=0.0),
                verify={g: dict(bytes=1e7, flops=0.0) for g in range(1, 5)})
  model = roofline.step_model(pieces, chip)
  assert model["v"][1] == 1.0 and model["v"][4] == pytest.approx(1.3)
  assert model["c"] == pytest.approx(0.2) and model["bound"] == "memory"
  # s(γ) = γ c + v(γ+1) + verify(γ): s(0) = 1 (a plain step skips the draft)
  assert model["step_costs"][0] == pytest.approx(1.0)
  assert model["step_costs"][3] == pytest.approx(3 * 0.2 + 1.3 + 0.01)
  rows = [dict(id="a", alpha=1.0, tokens_per_step=4.0, gamma=3, speedup=1.5),
          dict(id="b", alpha=0.0, tokens_per_step=1.0, gamma=3, speedup=0.8)]
  predicted = roofline.predict(model, rows, gamma_max=4)
  a, b = predicted["rows"]
  assert a["fixed"] == pytest.approx(4.0 / 1.91) and b["fixed"] == pytest.approx(1 / 1.91)
  assert a["auto_gamma"] == 4 and a["auto"] == pytest.approx(5 / (4 * 0.2 + 1.4 + 0.01))
  assert b["auto_gamma"] == 0 and b["auto"] == pytest.approx(1.0)
  assert predicted["geomean"]["cpu_speedup"] == pytest.approx(np.sqrt(1.5 * 0.8))


def test_cache_copies_counts_copies_of_a_cache_shape_per_step_and_per_call():
  hlo = "\n".join([
      "%body.1 (p: (bf16[2,1,64,3,8])) -> (bf16[2,1,64,3,8]) {",
      "  %copy.1 = bf16[2,1,64,3,8]{4,3,2,1,0} copy(bf16[2,1,64,3,8]{4,3,2,1,0} %p)",
      "  %f = f32[1,64]{1,0} fusion(%x), kind=kLoop, calls=%fused.2",
      "}",
      "%fused.2 (x: f32[1,64]) -> f32[1,64] {",
      "  %copy.2 = f32[1,64]{1,0} copy(f32[1,64]{1,0} %x)",
      "}",
      "%cond.3 (p: (bf16[2,1,64,3,8])) -> pred[] {",
      "  ROOT %c = pred[] constant(true)",
      "}",
      "ENTRY %main.4 (a: bf16[2,1,64,3,8]) -> bf16[2,1,64,3,8] {",
      "  %copy.5 = bf16[2,1,64,3,8]{2,4,3,1,0} copy(%a)",
      "  %dus = bf16[2,1,64,3,8]{4,3,2,1,0} dynamic-update-slice(%a, %b, %c)",
      "  %w = (bf16[2,1,64,3,8]) while(%t), condition=%cond.3, body=%body.1",
      "}"])
  assert compile_plan.cache_copies(hlo, [(2, 1, 64, 3, 8)]) == (1, 1, 0)
  assert compile_plan.cache_copies(hlo, [(1, 64)]) == (1, 0, 0)  # inside a fusion of the body
  assert compile_plan.cache_copies(hlo, [(9, 9)]) == (0, 0, 0)
  # the same body with its cache in the alternate memory (S(1)): relaid out on chip, no
  # HBM copy; from HBM into it, a copy per step
  on_chip = hlo.replace("{4,3,2,1,0} copy(bf16[2,1,64,3,8]{4,3,2,1,0} %p)",
                        "{4,3,2,1,0:T(8,128)S(1)} copy(bf16[2,1,64,3,8]{4,3,2,1,0:S(1)} %p)")
  assert compile_plan.cache_copies(on_chip, [(2, 1, 64, 3, 8)]) == (0, 1, 1)
  prefetch = hlo.replace("{4,3,2,1,0} copy(bf16", "{4,3,2,1,0:T(8,128)S(1)} copy(bf16")
  assert compile_plan.cache_copies(prefetch, [(2, 1, 64, 3, 8)]) == (1, 1, 0)
  # a copy inside a fusion lands where the fusion's result does
  fused = hlo.replace("f32[1,64]{1,0} copy(f32[1,64]{1,0} %x)",
                      "f32[1,64]{1,0} copy(f32[1,64]{1,0:S(1)} %x)\n"
                      "  ROOT %b = f32[1,64]{1,0:S(1)} bitcast(%copy.2)")
  assert compile_plan.cache_copies(fused, [(1, 64)]) == (0, 0, 1)
  assert compile_plan.largest_copies(hlo) == [dict(shape="bf16[2,1,64,3,8]", bytes=6144)]


def test_a_loop_that_copies_its_cache_is_flagged():
  """Negative control of `in_place`: a loop body that keeps the old cache alive beside the
  updated one needs a second cache-sized buffer, and the record says so."""
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  cache = jax.ShapeDtypeStruct((2, 1, 4096, 2, 64), jnp.float32, sharding=one)

  def in_place(c):
    return jax.lax.fori_loop(0, 8, lambda i, c: c.at[:, :, i].set(1.0), c)

  def copies(c):
    def body(i, carry):
      c, acc = carry
      new = c.at[:, :, i].set(1.0)
      return new, acc + (c * 2.0)[:, :, :1].sum() + new[:, :, -1:].sum()
    return jax.lax.fori_loop(0, 8, body, (c, 0.0))

  size = int(np.prod(cache.shape)) * 4
  kept, copied = (compile_plan.compile_program(name, jax.jit(fn, donate_argnums=0), cache,
                                               cache_shapes=dict(target=[cache.shape]))
                  for name, fn in (("in place", in_place), ("copies", copies)))
  assert kept["temp_bytes"] < size <= copied["temp_bytes"]
  assert kept["target_cache_copies"] == 0 < copied["target_cache_copies"]


def _plan(*args, env=None):
  return subprocess.run([sys.executable, "scripts/tpu_plan.py", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=1200, env=env)


def test_bad_topology_and_missing_libtpu_are_one_line():
  out = _plan("--config=configs/tiny.py", "--topology=v5e-2x2")
  assert out.returncode == 2 and out.stderr.strip().startswith("error: --topology")
  assert len(out.stderr.strip().splitlines()) == 1
  if importlib.util.find_spec("libtpu") is None:
    out = _plan("--config=configs/tiny.py", "--topology=v5e:2x2")
    assert out.returncode == 2 and "make tpu-plan" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_tiny_pair_compiles_for_a_v5e_topology(tmp_path):
  if importlib.util.find_spec("libtpu") is None:
    pytest.skip("libtpu is not installed: run with .venv-tpu (`make tpu-plan`)")
  out_file = tmp_path / "plan.json"
  # a 2-layer draft: XLA:TPU relayouts a 1-layer draft's cache inside the step (the plan
  # reports those copies; docs/tpu_plan.md)
  out = _plan("--config=configs/tiny.py", "--config.draft=truncate:2", "--topology=v5e:2x2",
              "--only=gamma=3",
              "--max_tokens=5", f"--out={out_file}",
              "--from=docs/results/benchmark_tiny.json")
  assert out.returncode == 0, out.stderr[-2000:]
  plan = json.loads(out_file.read_text())
  assert plan["meta"]["chip"] == "TPU v5e" and plan["meta"]["devices"] == 4
  assert not plan["failures"]
  loops = [p for p in plan["programs"] if p["name"].endswith(": loop")]
  assert loops and all(p["fits"] and p["in_place"] for p in loops)
  assert any("mesh" in p["name"] for p in plan["programs"])
  for chip in ("v5e", "v5p", "v6e", "h200"):
    entry = plan["roofline"][chip]
    assert entry["v"]["1"] == 1.0 and entry["c"] > 0 and len(entry["step_costs"]) == 5
    assert entry["predicted"]["geomean"]["auto"] > 0


def test_bfloat16_decodes_every_draft_kind(tmp_path):
  """`--config.dtype=bfloat16` decodes every draft kind at bfloat16: the target, drafts
  from the target ('truncate'), from dims ('random'), a saved feature draft stored in
  float16, a lookup and a hybrid; every cache the loop keeps is bfloat16."""
  from configs import tiny
  from specdec_jax import DecodeSpec, FixedGamma, Model, SamplingConfig, speculative_generate
  from specdec_jax.decoding import loop
  from specdec_jax.drafts import registry
  from specdec_jax.io.checkpoint import save_params
  from specdec_jax.models.model import ModelConfig, init_params
  feature = ModelConfig(vocab_size=257, num_layers=1, embed_dim=128, mlp_dim=256, num_heads=4,
                        num_kv_heads=2, head_dim=32, max_seq_len=512, feature_layers=(2, 4),
                        feature_width=128)
  save_params(tmp_path / "feature", init_params(feature, jax.random.PRNGKey(3)), feature,
              tokenizer_identity="bytes-v1", params_dtype="float16")
  config = tiny.get_config()
  config.dtype, config.unstacked, config.feature_draft = "bfloat16", False, "truncate:1"
  drafts = [("truncate", "truncate:1"), ("random", "random"),
            ("saved", f"saved:{tmp_path / 'feature'}"), ("lookup", "ngram:3"),
            ("hybrid", "hybrid:3")]
  models = loading.load_models(config, drafts)
  floats = lambda tree: {str(x.dtype) for x in jax.tree.leaves(tree)
                         if jnp.issubdtype(x.dtype, jnp.floating)}
  assert models.target_config.dtype == "bfloat16" and floats(models.target_params) == {"bfloat16"}
  target = Model(models.target_config, models.target_params)
  spec = DecodeSpec(4, FixedGamma(2), sampling=SamplingConfig(temperature=1.0), eos_id=256,
                    vocab_size=257)
  prompts = [list(b"abcabc")]
  for name, (_, cfg, params) in models.drafts.items():
    draft = Model(registry.as_draft(cfg), params)
    if params is not None:
      assert draft.config.model_config.dtype == "bfloat16", name
      assert floats(params) == {"bfloat16"}, name
    prepared = loop.prepare(target, draft, prompts, spec)
    state = loop.prefill(target, params, prepared)
    caches = [x for x in jax.tree.leaves((state.target_cache, state.draft_state)) if x.ndim == 5]
    assert caches and {str(x.dtype) for x in caches} == {"bfloat16"}, name
    out = speculative_generate(target, draft, prompts, spec=spec)
    assert out.lengths.tolist() == [4], name


def test_a_shapes_only_script_checks_its_config_without_this_machine():
  """tpu_plan.py plans the Qwen pair before `make qwen` and a 4-chip mesh on a machine of
  one device; generate.py, which runs them here, refuses both in one line."""
  sys.path.insert(0, os.path.join(ROOT, "scripts"))
  import _bootstrap
  qwen = ["--config=configs/qwen25_coder.py"]
  mesh = ["--config=configs/llama_1b_mesh.py"]
  for script, argv in (("tpu_plan.py", qwen), ("tpu_plan.py", mesh)):
    family, reads = _bootstrap.declarations()[script]
    _bootstrap.check_config_args(argv, script, family, reads)
  family, reads = _bootstrap.declarations()["generate.py"]
  if not wheel_parts.gguf_path("qwen2.5-coder-1.5b").exists():
    with pytest.raises(ValueError, match="make qwen"):
      _bootstrap.check_config_args(qwen, "generate.py", family, reads)
  if jax.device_count() != 4:
    with pytest.raises(ValueError, match="needs 4 devices"):
      _bootstrap.check_config_args(mesh, "generate.py", family, reads)


def test_the_serving_layout_is_applied_on_cpu_only(monkeypatch):
  """config.unstacked loads the CPU serving layout on XLA:CPU; on another backend the
  params stay stacked as stored (the plans' `layouts` entries hold the evidence)."""
  from configs import tiny
  from specdec_jax.models.model import is_unstacked
  config = tiny.get_config()
  assert config.unstacked
  on_cpu = loading.load_models(config, [("draft", "truncate:1")])
  assert is_unstacked(on_cpu.target_params) and "head_t" not in on_cpu.target_params
  assert any(k.endswith("_t") for k in on_cpu.target_params["layers_0"])
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  on_tpu = loading.load_models(config, [("draft", "truncate:1")])
  assert not is_unstacked(on_tpu.target_params)
  assert not is_unstacked(on_tpu.drafts["draft"][2])
