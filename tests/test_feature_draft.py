"""Feature drafts (EAGLE-3 style): hidden states, decode == training-time test, greedy
equality, batch composition, training, the feature cache and bad input.

The exactness of sampling with a feature draft (whole-sequence enumeration, with the
naive verifier as negative control) is in test_exactness.py.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import (GREEDY, assert_greedy_equals_autoregressive, speculative, tiny_config,
                     tiny_model)
from specdec_jax import DecodeSpec, Model, SamplingConfig, autoregressive_generate, warp
from specdec_jax import distill
from specdec_jax.distill import feature_cache as fc
from specdec_jax.drafts.feature import FeatureDraft
from specdec_jax.io import checkpoint as ckpt_lib
from specdec_jax.models.layouts import unstack_layers
from specdec_jax.models.model import forward, init_cache, init_params, unrolled_feature_logits

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13], [14, 15]]


@pytest.fixture(scope="module")
def feature_pair():
  """A 3-layer target and a 1-layer feature draft reading its layers 1 and 3."""
  target = tiny_config(vocab=32, layers=3, width=32)
  tp = tiny_model(target, 0, factor=6.0)
  draft = tiny_config(vocab=32, layers=1, width=16, tie_embeddings=False,
                      feature_layers=(1, 3), feature_width=32)
  return target, tp, draft, tiny_model(draft, 1, factor=3.0)


def generate(pair, prompts=PROMPTS, gamma=3, max_new_tokens=16, **kw):
  return speculative(pair, prompts, gamma=gamma, max_new_tokens=max_new_tokens, **kw)


def test_hidden_layers_are_the_residual_stream(feature_pair):
  """Layer 0 is the embedding; stacked (nn.scan) and unrolled layouts agree; the last
  layer's stream through the final norm and tied head gives the logits."""
  target, tp = feature_pair[:2]
  tokens = jnp.asarray([[3, 1, 4, 1, 5]])
  pos = jnp.arange(5)[None]
  logits, _, hidden = forward(tp, tokens, pos, init_cache(target, 1, 5), config=target,
                              hidden_layers=(0, 2, 3))
  _, _, unrolled = forward(unstack_layers(tp), tokens, pos, init_cache(target, 1, 5),
                           config=target, hidden_layers=(0, 2, 3))
  assert hidden.shape == (1, 5, 96)
  np.testing.assert_allclose(hidden, unrolled, atol=1e-4)
  np.testing.assert_allclose(hidden[..., :32], tp["embed"][tokens], atol=0)
  last = hidden[..., 64:]
  normed = last * jax.lax.rsqrt(jnp.mean(last * last, -1, keepdims=True) + target.norm_eps)
  np.testing.assert_allclose(
      (normed * tp["final_norm"]["scale"]) @ tp["embed"].T, logits, atol=1e-3)


@pytest.mark.parametrize("gamma", [pytest.param(1, marks=pytest.mark.slow), 3])
def test_decode_equals_training_time_test_unroll(feature_pair, gamma):
  """Every drafted position's exact β = Σ min(p, q_k) recorded by the decode loop equals
  the one computed offline from `unrolled_feature_logits` pass k over the final sequence
  (where the drafts before it were accepted, so its inputs are the emitted tokens). This
  pins the re-read, the own-hidden context, the KV layout and the training mask."""
  target, tp, draft, dp = feature_pair
  prompt = [1, 2, 3, 4, 5]
  out = generate(feature_pair, prompts=[prompt], gamma=gamma, max_new_tokens=30,
                 sampling=SamplingConfig(1.0), seed=3)
  seq = jnp.asarray([prompt + out.row(0)])
  t = seq.shape[1]
  logits, _, feats = forward(tp, seq, jnp.arange(t)[None], init_cache(target, 1, t),
                             config=target, hidden_layers=draft.feature_layers)
  p = warp(logits, 1.0)
  q = jax.nn.softmax(unrolled_feature_logits(dp, seq, feats, config=draft,
                                             input_embed=tp["embed"], depth=gamma,
                                             full_vocab=True), -1)
  ell, checked = len(prompt) - 1, 0
  for step, n in enumerate(out.accepted[0]):
    for k in range(1, min(n, gamma - 1) + 2):  # positions whose inputs were all emitted
      i = ell + k - 1
      if i < t - 1:
        offline = float(jnp.minimum(p[0, i], q[k - 1, 0, i]).sum())
        assert abs(offline - out.accept_prob[0, step, k - 1]) < 1e-4, (step, k)
        checked += 1
    ell += n + 1
  assert checked >= out.num_steps


@pytest.mark.parametrize("gamma", [pytest.param(1, marks=pytest.mark.slow), 2,
                                   pytest.param(4, marks=pytest.mark.slow)])
def test_greedy_feature_speculative_equals_greedy_autoregressive(feature_pair, gamma):
  sp = assert_greedy_equals_autoregressive(feature_pair, PROMPTS, gamma=gamma)
  np.testing.assert_array_equal(sp.lengths, [16] * len(PROMPTS))


def test_greedy_equality_with_an_accepting_draft(feature_pair):
  """A draft trained to agree (tiny distillation below) accepts often; greedy output is
  still the target's, token for token, on rows that accept different counts."""
  target, tp, draft, _ = feature_pair
  sp = assert_greedy_equals_autoregressive((target, tp, draft, _trained_draft(feature_pair)),
                                           PROMPTS)
  assert sp.acceptance_rate() > 0.5
  per_row = {tuple(r[r >= 0]) for r in sp.accepted}
  assert len(per_row) > 1


def test_row_output_independent_of_batch_composition(feature_pair):
  prompts8 = [[1, 2, 3, 4]] + [[i, i + 1, 2, 5, 7][: 2 + i % 4] for i in range(7)]
  one = generate(feature_pair, prompts=prompts8[:1], sampling=SamplingConfig(1.0), seed=3)
  eight = generate(feature_pair, prompts=prompts8, sampling=SamplingConfig(1.0), seed=3)
  assert one.row(0) == eight.row(0)
  np.testing.assert_array_equal(one.accepted[0], eight.accepted[0][: one.num_steps])
  swapped = generate(feature_pair, prompts=prompts8[::-1], sampling=SamplingConfig(1.0),
                     seed=3, row_ids=list(range(8))[::-1])
  assert swapped.row(7) == eight.row(0)


def test_feature_draft_checks(feature_pair):
  target, tp, draft, dp = feature_pair
  with pytest.raises(ValueError, match="feature_width"):
    tiny_config(layers=1, feature_layers=(1,), feature_width=0)
  with pytest.raises(ValueError, match="target width 16"):
    FeatureDraft(draft.replace(feature_width=16)).check(dp, target)
  with pytest.raises(ValueError, match=r"fuses target layers \(1, 4\)"):
    generate((target, tp, draft.replace(feature_layers=(1, 4)), dp))
  with pytest.raises(ValueError, match="fuse is"):
    generate((target, tp, draft, {**dp, "fuse": dp["fuse"][:32]}))
  with pytest.raises(ValueError, match="input_embed"):
    forward(dp, jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32),
            init_cache(draft, 1, 4), config=draft, context=jnp.zeros((1, 1, 16)))


def test_saved_feature_draft_roundtrip_and_mismatch(feature_pair, tmp_path):
  """The saved config carries the kind and the fused layer ids; a mismatch raises."""
  draft, dp = feature_pair[2:]
  ckpt_lib.save_params(tmp_path / "d", dp, draft, tokenizer_identity="tok")
  params, cfg, _ = ckpt_lib.load_params(tmp_path / "d", tokenizer_identity="tok")
  assert cfg == draft and cfg.kind == "feature" and "embed" not in params
  assert json.loads((tmp_path / "d" / "model.json").read_text())["config"]["feature_layers"] \
      == [1, 3]
  other = draft.replace(feature_layers=(2, 3))
  with pytest.raises(ValueError, match="feature_layers: checkpoint"):
    distill.init_draft_params(other, jax.random.PRNGKey(0), method=f"saved:{tmp_path / 'd'}",
                              tokenizer_identity="tok")


# ------------------------------------------------------------------ training

def _cache(feature_pair, tmp_path, windows, temperature=1.0):
  target, tp, draft, _ = feature_pair
  return fc.build_feature_cache(tmp_path, windows, target_params=tp, target_config=target,
                                draft_config=draft, temperature=temperature,
                                greedy_temperature=1.0, identity={"target": "t"}, chunk=4,
                                log=lambda m: None)


def _greedy_corpus(feature_pair, rows=32, length=16):
  """The target's own greedy continuations: what a greedy-decoding draft must predict."""
  target, tp = feature_pair[:2]
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 32, 2).tolist() for _ in range(rows)]
  out = autoregressive_generate(Model(target, tp), prompts,
                                spec=DecodeSpec(length - 2, sampling=GREEDY))
  return np.concatenate([np.asarray(prompts), out.tokens], axis=1).astype(np.int32)


_TRAINED = {}


def _trained_draft(feature_pair, steps=150):
  if "dp" not in _TRAINED:
    import tempfile
    target, tp, draft, dp = feature_pair
    with tempfile.TemporaryDirectory() as tmp:
      cache = _cache(feature_pair, tmp, _greedy_corpus(feature_pair), temperature=0.0)
      settings = distill.DistillSettings(loss="fkl", temperature=0.0, unroll=3)
      optim = distill.OptimizerSettings(lr=1e-2, warmup=10, steps=steps)
      state = distill.init_train_state(dp, jax.random.PRNGKey(0), optim)
      step = distill.make_feature_train_step(tp["embed"], draft_config=draft,
                                             settings=settings, optim=optim)
      for s in range(steps):
        state, metrics = step(state, cache.batch(s, 8, 0), jax.random.PRNGKey(s))
      _TRAINED["dp"], _TRAINED["metrics"] = state.params, jax.device_get(metrics)
  return _TRAINED["dp"]


def test_training_raises_acceptance_at_every_unrolled_pass(feature_pair):
  _trained_draft(feature_pair)
  m = _TRAINED["metrics"]
  assert m["alpha_k1"] > 0.8 and m["alpha_k2"] > 0.7 and m["alpha_k3"] > 0.6, m


def test_feature_loss_tvd_is_one_minus_beta(feature_pair, tmp_path):
  """From the cache's float16 log-probs, TVD of pass 1 is 1 - Σ min(p, q) with p the
  target's full distribution (q = 0 off the head), as `acceptance_probability` has it."""
  target, tp, draft, dp = feature_pair
  windows = _greedy_corpus(feature_pair, rows=8)
  batch = _cache(feature_pair, tmp_path, windows).batch(0, 8, 0)
  settings = distill.DistillSettings(loss="tvd", temperature=1.0, unroll=1)
  _, metrics = distill.feature_loss_fn(dp, tp["embed"], batch, draft_config=draft,
                                       settings=settings)
  toks = jnp.asarray(batch["tokens"])
  logits, _, feats = forward(tp, toks, jnp.broadcast_to(jnp.arange(16), (8, 16)),
                             init_cache(target, 8, 16), config=target,
                             hidden_layers=draft.feature_layers)
  q = jax.nn.softmax(unrolled_feature_logits(dp, toks, feats, config=draft,
                                             input_embed=tp["embed"], depth=1,
                                             full_vocab=True)[0], -1)
  beta = jnp.minimum(jax.nn.softmax(logits, -1), q).sum(-1).mean()
  np.testing.assert_allclose(metrics["alpha"], beta, atol=2e-3)


def test_feature_cache_resumes_and_checks_identity(feature_pair, tmp_path):
  windows = _greedy_corpus(feature_pair, rows=12)
  full = _cache(feature_pair, tmp_path / "a", windows)
  # A build killed after its first chunk: progress says 4 windows, the rest is garbage.
  part = tmp_path / "b"
  _cache(feature_pair, part, windows)
  progress = json.loads((part / "progress.json").read_text())
  (part / "progress.json").write_text(json.dumps({**progress, "done": 4}))
  feats = np.load(part / "features.npy", mmap_mode="r+")
  feats[4:] = 0
  feats.flush()
  resumed = _cache(feature_pair, part, windows)
  for name in fc._ARRAYS:
    np.testing.assert_array_equal(resumed.arrays[name], full.arrays[name])
  with pytest.raises(ValueError, match="built for other settings"):
    _cache(feature_pair, part, windows, temperature=0.5)
  (part / "target_logp.npy").write_bytes(b"\x93NUMPY garbage")
  with pytest.raises(ValueError, match="target_logp.npy is unreadable"):
    _cache(feature_pair, part, windows)


FEATURE_RUN = {"draft.embed_dim": 64, "draft.mlp_dim": 128, "draft.num_heads": 4,
               "draft.num_kv_heads": 2, "draft.feature_layers": (1, 2),
               "on_policy_fraction": 0.0, "unroll": 2, "feature_cache_windows": 32,
               "steps": 40, "draft_init": "copy", "eval_every": 40, "checkpoint_every": 10}


def _feature_config(**changes):
  from configs import distill_tiny
  c = distill_tiny.get_config()
  for key, value in {**FEATURE_RUN, **changes}.items():
    node, name = (c.draft, key[6:]) if key.startswith("draft.") else (c, key)
    setattr(node, name, value)
  return c


@pytest.fixture(scope="module")
def feature_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("feature_run")
  return root, distill.run_distillation(_feature_config(), root / "full", log=lambda m: None)


def test_feature_draft_distillation_run(feature_run):
  """scripts/distill.py's routine with a feature draft on the tiny byte-level target:
  it caches the target's outputs, trains, evaluates and saves a draft that decodes."""
  _, report = feature_run
  assert report["draft_kind"] == "feature"
  assert report["alpha_after"]["alpha_t1"] > report["alpha_before"]["alpha_t1"] + 0.2
  params, cfg, _ = ckpt_lib.load_params(report["draft_dir"])
  assert cfg.feature_layers == (1, 2) and cfg.feature_width == 64 and "embed" not in params
  with pytest.raises(ValueError, match="on_policy_fraction=0"):
    distill.setup_distillation(_feature_config(on_policy_fraction=0.5))


@pytest.mark.slow  # a subprocess run; make test keeps the one-point test of test_distill.py
def test_feature_kill_and_resume_is_bit_exact(feature_run):
  """SIGKILLed right after step 20 (cache built, checkpoint at 20), then resumed: the
  final params equal the uninterrupted run's bit for bit."""
  import os
  import pathlib
  import signal
  import subprocess
  import sys
  root, report = feature_run
  repo = pathlib.Path(__file__).resolve().parents[1]
  workdir = root / "killed"
  overrides = [f"--config.{k}={v}" for k, v in {**FEATURE_RUN, "stop_after": 20}.items()]
  proc = subprocess.run([sys.executable, str(repo / "scripts" / "distill.py"),
                         f"--config={repo / 'configs' / 'distill_tiny.py'}",
                         f"--workdir={workdir}", *overrides], cwd=repo, capture_output=True,
                        text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(repo)})
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
  resumed = distill.run_distillation(_feature_config(), workdir, log=lambda m: None)
  assert resumed["resumed_from"] == [20] and resumed["steps"] == 40
  full, _, _ = ckpt_lib.load_params(report["draft_dir"])
  again, _, _ = ckpt_lib.load_params(resumed["draft_dir"])
  jax.tree.map(np.testing.assert_array_equal, again, full)
  with pytest.raises(ValueError, match=r"feature_layers: checkpoint \[1, 2\] vs run \[2, 2\]"):
    distill.run_distillation(_feature_config(**{"draft.feature_layers": (2, 2)}), workdir,
                             log=lambda m: None)


def test_svd_init_is_refused_for_feature_drafts(feature_pair):
  target, tp, draft, _ = feature_pair
  with pytest.raises(ValueError, match="'svd' is for independent drafts"):
    distill.init_draft_params(draft, jax.random.PRNGKey(0), method="svd", target_params=tp,
                              target_config=target)
  copied = distill.init_draft_params(draft.replace(embed_dim=32, mlp_dim=64, head_dim=8),
                                     jax.random.PRNGKey(0), method="copy", target_params=tp,
                                     target_config=target)
  np.testing.assert_array_equal(copied["layers"]["q"][0], tp["layers"]["q"][2])
  assert "embed" not in copied
