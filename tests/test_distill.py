"""Tests for specdec_jax.distill and specdec_jax.io.checkpoint (tiny models, CPU)."""

import functools
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import distill_tiny
from specdec_jax import distill, loading
from specdec_jax.io import checkpoint as ckpt_lib
from specdec_jax.models.model import ModelConfig
from specdec_jax.models.sampling import warp
from specdec_jax.verification.verify import acceptance_probability

ROOT = pathlib.Path(__file__).resolve().parents[1]
# One short run shared by the training tests: checkpoints at 10, 20, 30, 40.
OVERRIDES = {"steps": 40, "checkpoint_every": 10, "eval_every": 0, "eval_windows": 8,
             "log_every": 10}
STOP_AFTER = 20


def _config(cache_dir, **changes):
  config = distill_tiny.get_config()
  for key, value in {**OVERRIDES, "cache_dir": str(cache_dir), **changes}.items():
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def _quiet(msg):
  del msg


def _probs(key, shape, zeros=False):
  logits = 2.0 * jax.random.normal(key, shape)
  probs = jax.nn.softmax(logits, -1)
  if zeros:  # exact zeros, as top-k / top-p leave them
    probs = warp(logits, 1.0, top_k=shape[-1] // 2)
  return probs


# --------------------------------------------------------------------------- losses

@pytest.mark.parametrize("name", distill.LOSSES)
@pytest.mark.parametrize("zeros", [False, True])
def test_loss_zero_iff_equal(name, zeros):
  p = _probs(jax.random.PRNGKey(0), (4, 3, 16), zeros)
  q = _probs(jax.random.PRNGKey(1), (4, 3, 16), zeros)
  same = distill.divergence(name, p, p)
  differ = distill.divergence(name, p, q)
  assert same.shape == (4, 3)
  np.testing.assert_allclose(same, 0.0, atol=1e-6)
  assert np.all(np.asarray(differ) > 1e-3)
  assert not np.any(np.isnan(np.asarray(differ)))


def test_tvd_is_one_minus_acceptance_probability():
  p = _probs(jax.random.PRNGKey(2), (3, 5, 32), zeros=True)
  q = _probs(jax.random.PRNGKey(3), (3, 5, 32))
  np.testing.assert_array_equal(distill.tvd(p, q), 1.0 - acceptance_probability(q, p))
  # The worked example of docs/background.md#worked-example: Σ min = 0.6.
  p1, q1 = jnp.array([0.2, 0.5, 0.3]), jnp.array([0.6, 0.3, 0.1])
  np.testing.assert_allclose(distill.tvd(p1, q1), 0.4, rtol=1e-6)


def test_divergences_with_exact_zeros():
  p = jnp.array([0.5, 0.5, 0.0])
  q = jnp.array([1.0, 0.0, 0.0])
  assert np.isinf(distill.forward_kl(p, q))  # p leaves q's support: KL(p||q) = inf
  np.testing.assert_allclose(distill.reverse_kl(p, q), np.log(2.0), rtol=1e-6)
  kl_pm = 0.5 * np.log(0.5 / 0.75) + 0.5 * np.log(0.5 / 0.25)  # m = [0.75, 0.25, 0]
  kl_qm = np.log(1 / 0.75)
  np.testing.assert_allclose(distill.jsd(p, q), 0.5 * kl_pm + 0.5 * kl_qm, rtol=1e-5)
  for name in ("rkl", "jsd", "tvd"):
    grad = jax.grad(lambda q: distill.divergence(name, p, q))(jnp.array([0.6, 0.4, 0.0]))
    assert np.all(np.isfinite(np.asarray(grad))), name


def test_logit_divergences_greedy_surrogates():
  key = jax.random.PRNGKey(4)
  target = 3.0 * jax.random.normal(key, (2, 6, 24))
  draft = 3.0 * jax.random.normal(jax.random.PRNGKey(5), (2, 6, 24))
  same = distill.logit_divergences(target, target, temperature=0.7)
  for name in distill.LOSSES:
    np.testing.assert_allclose(same[name], 0.0, atol=1e-6)
  greedy = distill.logit_divergences(target, draft, temperature=0.0)
  q1 = jax.nn.softmax(draft, -1)
  q_at_argmax = jnp.take_along_axis(q1, jnp.argmax(target, -1)[..., None], -1)[..., 0]
  np.testing.assert_allclose(greedy["tvd"], 1.0 - q_at_argmax, rtol=1e-5, atol=1e-6)
  soft = distill.logit_divergences(target, draft, temperature=1.0)
  np.testing.assert_allclose(greedy["fkl"], soft["fkl"], rtol=1e-6)


def test_logit_divergences_with_a_vocabulary_subset_draft():
  """Subset columns: TVD is exactly 1 - β against the full p; FKL/RKL/JSD compare q with
  p restricted to the subset and vanish when q equals that restriction."""
  target = 3.0 * jax.random.normal(jax.random.PRNGKey(6), (2, 5, 24))
  subset = jnp.array([0, 3, 4, 9, 17, 23])
  draft = 3.0 * jax.random.normal(jax.random.PRNGKey(7), (2, 5, 6))
  scattered = jnp.full((2, 5, 24), -jnp.inf).at[..., subset].set(draft)
  for t in (1.0, 0.0):
    divs = distill.logit_divergences(target, draft, temperature=t, draft_tokens=subset)
    beta = acceptance_probability(warp(scattered, t), warp(target, t))
    if t:
      np.testing.assert_allclose(divs["tvd"], 1.0 - beta, rtol=1e-5, atol=1e-6)
    else:  # the greedy surrogate 1 - q_1(argmax p), with q_1(argmax p) = 0 off the subset
      q1 = jax.nn.softmax(scattered, -1)
      at = jnp.take_along_axis(q1, jnp.argmax(target, -1)[..., None], -1)[..., 0]
      np.testing.assert_allclose(divs["tvd"], 1.0 - at, rtol=1e-5, atol=1e-6)
    for name in ("fkl", "rkl", "jsd"):
      assert np.all(np.isfinite(np.asarray(divs[name]))), name
  restricted = target[..., subset]
  same = distill.logit_divergences(target, restricted, temperature=1.0, draft_tokens=subset)
  for name in ("fkl", "rkl", "jsd"):
    np.testing.assert_allclose(same[name], 0.0, atol=1e-6)
  assert np.all(np.asarray(same["tvd"]) > 0.05)  # the mass off the subset is never accepted


def test_frequent_tokens():
  from specdec_jax.io import token_data
  tokens = np.array([5, 5, 5, 2, 2, 7, 1, 1, 1, 1])
  assert token_data.frequent_tokens(tokens, 2, 10) == (1, 5)
  assert token_data.frequent_tokens(tokens, 3, 10, always=[9]) == (1, 5, 9)
  assert token_data.frequent_tokens(tokens, 4, 10) == (1, 2, 5, 7)  # ties: lower id first
  with pytest.raises(ValueError, match="head vocabulary of 0"):
    token_data.frequent_tokens(tokens, 0, 10)
  with pytest.raises(ValueError, match="token ids"):
    token_data.frequent_tokens(tokens, 2, 6)
  with pytest.raises(ValueError, match="always ids"):
    token_data.frequent_tokens(tokens, 2, 10, always=[10])


# --------------------------------------------------------------------------- steps

@functools.lru_cache(maxsize=None)
def _tiny_pair():
  target = ModelConfig(vocab_size=40, num_layers=2, embed_dim=32, mlp_dim=64, num_heads=4,
                       num_kv_heads=2, head_dim=8, max_seq_len=64)
  draft = target.replace(num_layers=1, embed_dim=16, mlp_dim=32, num_heads=2, num_kv_heads=1)
  tp = distill.random_params(target, jax.random.PRNGKey(0))
  tp = {**tp, "final_norm": {"scale": tp["final_norm"]["scale"] * 8.0}}
  return target, tp, draft, distill.random_params(draft, jax.random.PRNGKey(1))


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("subset", [False, True])
def test_loss_metrics_alpha_is_mean_beta(temperature, subset):
  """The step's 'alpha' metric (read off TVD, or argmax agreement at τ = 0) is the mean
  Σ min(p, q) of the warped full-vocabulary distributions."""
  target, tp, draft, dp = _tiny_pair()
  if subset:
    draft = draft.replace(tie_embeddings=False, head_tokens=tuple(range(0, 40, 3)))
  dp = distill.random_params(draft, jax.random.PRNGKey(2))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 40, (2, 7)), jnp.int32)
  settings = distill.DistillSettings(temperature=temperature)
  _, metrics = distill.loss_fn(dp, tp, {"tokens": tokens}, draft_config=draft,
                               settings=settings, target_config=target)
  p = warp(distill.full_logits(tp, tokens, target), temperature)
  q = warp(distill.full_logits(dp, tokens, draft), temperature)
  np.testing.assert_allclose(metrics["alpha"], jnp.mean(jnp.sum(jnp.minimum(p, q), -1)),
                             rtol=1e-5, atol=1e-6)


def test_sampler_greedy_is_argmax_of_uncached_logits():
  target, tp, _, _ = _tiny_pair()
  prompts = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
  sampler = jax.jit(functools.partial(distill.sample_continuations, config=target, num_new=6,
                                      temperature=0.0))
  out = np.asarray(sampler(tp, prompts, jax.random.PRNGKey(0)))
  np.testing.assert_array_equal(out[:, :4], prompts)
  # Token i+1 is the argmax of the teacher-forced (cache-free window) logits at i.
  logits = jax.jit(distill.full_logits, static_argnums=2)(tp, out, target)
  np.testing.assert_array_equal(out[:, 4:], np.argmax(logits[:, 3:-1], -1))


def test_on_policy_schedule():
  for fraction in (0.0, 0.25, 0.5, 1.0):
    flags = [distill.is_on_policy(s, fraction) for s in range(40)]
    assert sum(flags) == round(40 * fraction)
  assert [distill.is_on_policy(s, 0.5) for s in range(4)] == [False, True, False, True]


def test_draft_init_options():
  target, tp, draft, _ = _tiny_pair()
  svd = distill.init_draft_params(draft.replace(tie_embeddings=False), jax.random.PRNGKey(0),
                                  method="svd", target_params=tp, target_config=target)
  w = distill.embedding_projection(tp, draft.embed_dim)
  np.testing.assert_allclose(w.T @ w, np.eye(draft.embed_dim), atol=1e-6)
  projected = np.asarray(tp["embed"]) @ w
  scale = 0.02 / np.sqrt(np.mean(projected ** 2))  # rescaled to a random init's RMS
  np.testing.assert_allclose(svd["embed"], projected * scale, rtol=1e-4, atol=1e-7)
  assert svd["head"].shape == (draft.embed_dim, target.vocab_size)
  copy_cfg = target.replace(num_layers=1)
  copied = distill.init_draft_params(copy_cfg, jax.random.PRNGKey(0), method="copy",
                                     target_params=tp, target_config=target)
  np.testing.assert_array_equal(copied["layers"]["q"], tp["layers"]["q"][:1])
  with pytest.raises(ValueError, match="equal widths"):
    distill.init_draft_params(draft, jax.random.PRNGKey(0), method="copy", target_params=tp,
                              target_config=target)
  # A subset head takes exactly the named columns of the full head it would have had.
  tokens = (0, 3, 7, 39)
  for method, cfg in (("copy", copy_cfg.replace(tie_embeddings=False)),
                      ("svd", draft.replace(tie_embeddings=False))):
    init = functools.partial(distill.init_draft_params, key=jax.random.PRNGKey(0),
                             method=method, target_params=tp, target_config=target)
    full = init(cfg)["head"]
    sub = init(cfg.replace(head_tokens=tokens))["head"]
    if method == "svd":  # both rescaled to RMS 0.02: equal up to one positive factor
      full = full[:, list(tokens)] * (0.02 / np.sqrt(np.mean(np.square(full[:, list(tokens)]))))
    else:
      full = full[:, list(tokens)]
    np.testing.assert_allclose(sub, full, rtol=1e-5, atol=1e-7)


def test_evaluate_alpha_matches_direct_computation():
  target, tp, draft, dp = _tiny_pair()
  windows = np.asarray(jax.random.randint(jax.random.PRNGKey(7), (5, 9), 0, 40), np.int32)
  alpha = distill.evaluate_alpha(dp, tp, windows, draft_config=draft, target_config=target,
                                 temperature=0.8, batch_size=2)  # 3 chunks, the last padded
  logits = jax.jit(distill.full_logits, static_argnums=2)
  p = warp(logits(tp, windows[:, :-1], target), 0.8)
  q = warp(logits(dp, windows[:, :-1], draft), 0.8)
  np.testing.assert_allclose(alpha, float(jnp.mean(jnp.sum(jnp.minimum(p, q), -1))), rtol=1e-5)


# --------------------------------------------------------------------------- checkpoints

def test_checkpointer_identity_and_params_roundtrip(tmp_path):
  target, tp, draft, dp = _tiny_pair()
  identity = ckpt_lib.run_identity(draft, "tok-a", ckpt_lib.target_identity(target, tp))
  state = {"params": dp, "step": jnp.int32(3)}
  assert ckpt_lib.restore_latest(tmp_path / "none", state, identity=identity) is None
  with ckpt_lib.Checkpointer(tmp_path / "ck", identity=identity, save_every=2, keep=2) as ck:
    assert ck.restore_latest(state) is None
    assert not ck.save(3, state)  # not due
    for step in (2, 4, 6):
      assert ck.save(step, state, extra={"data_step": step})
    assert ck.all_steps() == [4, 6]
  restored, extra = ckpt_lib.restore_latest(tmp_path / "ck", state, identity=identity)
  assert extra == {"data_step": 6}
  jax.tree.map(np.testing.assert_array_equal, restored, state)

  other_draft = ckpt_lib.run_identity(draft.replace(embed_dim=24), "tok-a", identity["target"])
  with pytest.raises(ValueError,
                     match=r"draft_config differs \(embed_dim: checkpoint 16 vs run 24"):
    ckpt_lib.restore_latest(tmp_path / "ck", state, identity=other_draft)
  tp2 = {**tp, "embed": tp["embed"] + 1e-3}
  other_target = ckpt_lib.run_identity(draft, "tok-a", ckpt_lib.target_identity(target, tp2))
  with pytest.raises(ValueError, match="target differs: checkpoint 'config:.*' vs run"):
    ckpt_lib.restore_latest(tmp_path / "ck", state, identity=other_target)

  ckpt_lib.save_params(tmp_path / "draft", dp, draft, tokenizer_identity="tok-a")
  params, config, meta = ckpt_lib.load_params(tmp_path / "draft", tokenizer_identity="tok-a")
  assert config == draft and meta["tokenizer"] == "tok-a"
  jax.tree.map(np.testing.assert_array_equal, params, dp)
  with pytest.raises(ValueError, match="tokenizer"):
    ckpt_lib.load_params(tmp_path / "draft", tokenizer_identity="tok-b")


# --------------------------------------------------------------------------- end to end

def _save_tiny_target(directory, seed):
  """A random byte-level target like 'random_tiny' (built without compiling an init)."""
  dims = distill_tiny.get_config().target_model
  config = loading.model_config(dims, loading.ByteTokenizer.vocab_size)
  params = distill.random_params(config, jax.random.PRNGKey(seed))
  params["final_norm"]["scale"] = params["final_norm"]["scale"] * dims.logit_scale
  ckpt_lib.save_params(directory, params, config,
                       tokenizer_identity=loading.ByteTokenizer.identity)
  return f"saved:{directory}"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """An uninterrupted tiny distillation: (root, report)."""
  root = tmp_path_factory.mktemp("distill")
  OVERRIDES["target"] = _save_tiny_target(root / "target", seed=1)
  report = distill.run_distillation(_config(root / "cache"), root / "full", log=_quiet)
  return root, report


def test_distillation_raises_alpha(tiny_run):
  _, report = tiny_run
  before, after = report["alpha_before"], report["alpha_after"]
  assert after["alpha_t1"] > before["alpha_t1"] + 0.1, (before, after)
  assert after["alpha_t0"] > before["alpha_t0"] + 0.3, (before, after)
  assert report["steps"] == 40 and report["resumed_from"] == []
  assert set(report["final_train_metrics"]) >= {"loss", "alpha", *distill.LOSSES}
  assert (pathlib.Path(report["draft_dir"]) / "model.json").exists()


def test_gradient_flows_only_to_the_draft(tiny_run):
  root, _ = tiny_run
  run = distill.setup_distillation(_config(root / "cache"))  # the run's shapes: jit cache hit
  tokens = run.train_tokens[:8 * 32].reshape(8, 32)
  grads_d, grads_t = jax.jit(jax.grad(
      lambda d, t: distill.loss_fn(d, t, {"tokens": tokens[:2, :12]},
                                   draft_config=run.draft_config, settings=run.settings,
                                   target_config=run.target_config)[0],
      argnums=(0, 1)))(distill.random_params(run.draft_config, run.keys["draft_init"]),
                       run.target_params)
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads_t))
  assert float(jnp.abs(grads_d["embed"]).max()) > 0

  target_before = jax.tree.map(np.array, run.target_params)
  params = distill.random_params(run.draft_config, run.keys["draft_init"])
  state = distill.init_train_state(params, run.keys["train"], run.optim)
  step = distill.make_train_step(run.target_params, draft_config=run.draft_config,
                                 target_config=run.target_config, settings=run.settings,
                                 optim=run.optim)
  for i, on_policy in enumerate([False, True]):
    state, metrics = step(state, {"tokens": tokens, "on_policy": np.bool_(on_policy)},
                          jax.random.PRNGKey(i))
    assert float(metrics["on_policy"]) == float(on_policy)
  prompt_len = run.settings.prompt_len
  assert int(state.step) == 2 and float(metrics["positions"]) == 8 * (32 - prompt_len + 1)
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.array, run.target_params),
               target_before)
  assert not np.array_equal(np.array(state.params["embed"]), np.array(params["embed"]))


def test_kill_and_resume_is_bit_exact(tiny_run):
  root, report = tiny_run
  workdir = root / "killed"
  args = [sys.executable, str(ROOT / "scripts" / "distill.py"),
          f"--config={ROOT / 'configs' / 'distill_tiny.py'}", f"--workdir={workdir}",
          f"--config.stop_after={STOP_AFTER}", f"--config.cache_dir={root / 'cache'}",
          *(f"--config.{k}={v}" for k, v in OVERRIDES.items())]
  proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120,
                        env={**os.environ, "PYTHONPATH": str(ROOT)})
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
  assert not (workdir / "report.json").exists()
  assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()
                if p.name.isdigit()) == [10, STOP_AFTER]

  resumed = distill.run_distillation(_config(root / "cache"), workdir, log=_quiet)
  assert resumed["resumed_from"] == [STOP_AFTER] and resumed["steps"] == 40
  full, _, _ = ckpt_lib.load_params(report["draft_dir"])
  again, _, _ = ckpt_lib.load_params(resumed["draft_dir"])
  jax.tree.map(np.testing.assert_array_equal, again, full)
  assert resumed["alpha_after"] == report["alpha_after"]


def test_restore_into_mismatched_run_raises(tiny_run):
  root, _ = tiny_run
  workdir = root / "full"
  with pytest.raises(ValueError,
                     match=r"draft_config differs \(embed_dim: checkpoint 32 vs run 48"):
    distill.run_distillation(_config(root / "cache", **{"draft.embed_dim": 48}), workdir,
                             log=_quiet)
  other_target = _save_tiny_target(root / "other_target", seed=2)
  with pytest.raises(ValueError, match="target differs"):
    distill.run_distillation(_config(root / "cache", target=other_target), workdir, log=_quiet)


def test_vocabulary_subset_draft_distils_and_reloads(tiny_run):
  """draft.head_vocab: a head over the most frequent training bytes (plus EOS) trains,
  reports its label coverage, and its saved config restores the same subset."""
  root, _ = tiny_run
  config = _config(root / "cache", steps=20, **{"draft.head_vocab": 48})
  report = distill.run_distillation(config, root / "subset", log=_quiet)
  draft_config = ModelConfig(**report["draft_config"])
  assert len(draft_config.head_tokens) == 48 and 256 in draft_config.head_tokens  # EOS
  assert 0.9 < report["eval_after"]["draft_label_coverage"] < 1.0
  assert report["alpha_after"]["alpha_t1"] > report["alpha_before"]["alpha_t1"] + 0.1
  params, saved_config, _ = ckpt_lib.load_params(report["draft_dir"])
  assert saved_config == draft_config and params["head"].shape == (32, 48)
  other = draft_config.replace(head_tokens=draft_config.head_tokens[:-1])
  with pytest.raises(ValueError, match=r"head_tokens: checkpoint 48 ids .* vs run 47 ids"):
    distill.init_draft_params(other, jax.random.PRNGKey(0), method=f"saved:{report['draft_dir']}")
  with pytest.raises(ValueError, match="full-vocabulary head"):
    distill.run_pretraining(config, root / "pretrain_subset", models=("draft",), log=_quiet)


@pytest.mark.slow
def test_killed_at_five_random_moments_resumes_bit_exact(tiny_run):
  """SIGKILL at 5 seeded-random moments of a run that checkpoints every step and evaluates
  every 4: once the run has saved a seeded-random step s_k, wait a random 0-0.3 s (a
  step, a checkpoint write or an evaluation is under way) and kill it. After each kill
  every listed checkpoint reads back, and the finished run's params are bit-identical
  to the uninterrupted run's."""
  root, report = tiny_run
  workdir = root / "killed5"
  args = [sys.executable, str(ROOT / "scripts" / "distill.py"),
          f"--config={ROOT / 'configs' / 'distill_tiny.py'}", f"--workdir={workdir}",
          f"--config.cache_dir={root / 'cache'}",
          *(f"--config.{k}={v}" for k, v in {**OVERRIDES, "checkpoint_every": 1,
                                              "eval_every": 4, "keep": 3}.items())]
  env = {**os.environ, "PYTHONPATH": str(ROOT)}
  rng = np.random.default_rng(5)
  kill_after = sorted(rng.choice(np.arange(2, 38), size=5, replace=False).tolist())

  def saved_steps():
    directory = workdir / "checkpoints"
    if not directory.exists():
      return []
    return [int(p.name) for p in directory.iterdir() if p.name.isdigit()]

  for k, step in enumerate(kill_after):
    log = root / f"killed5_{k}.log"
    with open(log, "w") as err:
      proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=err, stderr=err)
      deadline = time.monotonic() + 120
      while proc.poll() is None and max(saved_steps(), default=0) < step:
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.01)
      time.sleep(float(rng.uniform(0.0, 0.3)))
      assert proc.poll() is None, f"the run ended before step {step}: {log.read_text()[-2000:]}"
      proc.send_signal(signal.SIGKILL)
      proc.wait()
    with ckpt_lib.Checkpointer(workdir / "checkpoints", identity={}, save_every=1,
                               keep=3) as ckpt:
      for saved in ckpt.all_steps():
        assert ckpt.read_meta(saved)["step"] == saved
  resumed = distill.run_distillation(
      _config(root / "cache", checkpoint_every=1, eval_every=4, keep=3), workdir, log=_quiet)
  assert resumed["steps"] == 40 and len(resumed["resumed_from"]) == 5
  full, _, _ = ckpt_lib.load_params(report["draft_dir"])
  again, _, _ = ckpt_lib.load_params(resumed["draft_dir"])
  jax.tree.map(np.testing.assert_array_equal, again, full)
