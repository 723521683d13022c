"""Vocabulary-subset draft heads: the ranked ids file, the C ids chosen from it, the head
cut from a full draft, the loader and the config fields that ask for it, and the script
that writes the file from the target's own answers."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_greedy_equals_autoregressive, greedy_draft_pair, tiny_config, tiny_model
from specdec_jax.io import head_tokens
from specdec_jax.loading import ByteTokenizer, HeadSubset, draft_config_of, load_draft
from specdec_jax.models.layouts import serving_layout
from specdec_jax.models.model import forward, init_cache

REPO = pathlib.Path(__file__).resolve().parent.parent


def _write(path, tokens, vocab=32, always=(31,), identity="bytes-v1"):
  return head_tokens.write(path, tokens=tokens, vocab_size=vocab, tokenizer_identity=identity,
                           always=always, corpus={}, command="test", stamp={})


def test_ids_are_ranked_by_count_then_id(tmp_path):
  record = _write(tmp_path / "h.json", [np.array([5, 3, 3, 9, 9, 7]), np.array([9, 5])])
  assert record["ids"] == [9, 3, 5, 7] and record["counts"] == [3, 2, 2, 1]
  assert record["tokens"] == 8 and record["distinct"] == 4
  with pytest.raises(ValueError, match=r"token ids must lie in \[0, 32\)"):
    _write(tmp_path / "bad.json", [np.array([32])])


def test_choose_keeps_always_then_counts_then_lowest_unseen_ids(tmp_path):
  path = tmp_path / "h.json"
  _write(path, [np.array([5, 3, 3, 9, 9, 9, 7])])  # 9:3, 3:2, 5:1, 7:1
  assert head_tokens.choose(path, 3, vocab_size=32) == (3, 9, 31)  # always 31, then 9, 3
  assert head_tokens.choose(path, 5, vocab_size=32) == (3, 5, 7, 9, 31)
  # past the seen ids, the unseen ones by id: 0, 1, 2
  assert head_tokens.choose(path, 8, vocab_size=32) == (0, 1, 2, 3, 5, 7, 9, 31)
  with pytest.raises(ValueError, match="vocabulary of 32 ids, the draft has 64"):
    head_tokens.choose(path, 3, vocab_size=64)
  with pytest.raises(ValueError, match="another tokenizer"):
    head_tokens.choose(path, 3, vocab_size=32, tokenizer_identity="other")
  for bad in (0, 32, True):
    with pytest.raises(ValueError, match="0 < C < 32"):
      head_tokens.choose(path, bad, vocab_size=32)
  with pytest.raises(ValueError, match="not found"):
    head_tokens.choose(tmp_path / "missing.json", 3, vocab_size=32)
  (tmp_path / "other.json").write_text(json.dumps({"format": "x"}))
  with pytest.raises(ValueError, match="is not a head-tokens file"):
    head_tokens.choose(tmp_path / "other.json", 3, vocab_size=32)


@pytest.mark.parametrize("tied", [True, False])
def test_cut_head_keeps_the_full_heads_logits_at_its_ids(tied):
  """Every logit of the cut head equals the full head's at that id, -inf elsewhere."""
  cfg = tiny_config(tie_embeddings=tied)
  params = tiny_model(cfg, 3)
  ids = (1, 4, 5, 17, 30)
  cut_cfg, cut_params = head_tokens.cut_head(cfg, params, ids)
  assert cut_cfg.head_tokens == ids and not cut_cfg.tie_embeddings
  assert cut_params["head"].shape == (cfg.embed_dim, len(ids))
  tokens = jnp.asarray([[3, 7, 2, 9]], jnp.int32)
  positions = jnp.arange(4, dtype=jnp.int32)[None]
  full, _ = forward(params, tokens, positions, init_cache(cfg, 1, 8), config=cfg)
  sub, _ = forward(cut_params, tokens, positions, init_cache(cut_cfg, 1, 8), config=cut_cfg)
  np.testing.assert_allclose(sub[..., list(ids)], full[..., list(ids)], rtol=1e-5, atol=1e-5)
  rest = np.setdiff1d(np.arange(cfg.vocab_size), ids)
  assert np.isneginf(np.asarray(sub[..., rest])).all()
  with pytest.raises(ValueError, match="already has a subset head"):
    head_tokens.cut_head(cut_cfg, cut_params, ids)
  serving_cfg, serving = head_tokens.cut_head(cfg, serving_layout(params), ids)
  assert serving_cfg == cut_cfg and serving["head_t"].shape == (len(ids), cfg.embed_dim)
  served, _ = forward(serving, tokens, positions, init_cache(cut_cfg, 1, 8), config=cut_cfg)
  np.testing.assert_allclose(served, sub, rtol=1e-5, atol=1e-5)


def test_greedy_output_is_the_targets_with_a_cut_head():
  """Greedy speculative decoding with a subset head that misses tokens the target emits
  still emits exactly the target's greedy tokens (the residual supplies them)."""
  target, tp, draft, dp = greedy_draft_pair()
  ids = tuple(range(0, 32, 3))
  out = assert_greedy_equals_autoregressive((target, tp, *head_tokens.cut_head(draft, dp, ids)),
                                            [[1, 2, 3], [4, 5]], max_new_tokens=12)
  assert not np.isin(out.tokens, ids).all() and 0 < out.acceptance_rate() < 1


def test_loader_cuts_a_model_draft_and_a_hybrids_inner_draft(tmp_path):
  path = tmp_path / "h.json"
  _write(path, [np.array([10, 10, 65, 97])], vocab=257, always=(0,))
  tok = ByteTokenizer()
  target = tiny_config(vocab=257)
  tp = tiny_model(target, 0)
  head = HeadSubset(str(path), 6)
  cfg, params = load_draft("truncate:1", tok, target, tp, head=head)
  assert cfg.head_tokens == (0, 1, 2, 10, 65, 97) and params["head"].shape == (32, 6)
  assert "head" not in tp  # the target keeps its tied head
  hybrid, _ = load_draft("hybrid:2", tok, target, tp, feature_draft="truncate:1", head=head)
  assert hybrid.inner.model_config.head_tokens == cfg.head_tokens
  planned, _ = draft_config_of("truncate:1", target, head=head)
  assert planned == cfg
  assert load_draft("ngram:2", tok, target, tp, head=head)[0].model_config is None
  with pytest.raises(ValueError, match="another tokenizer"):
    _write(path, [np.array([10])], vocab=257, identity="other")
    load_draft("truncate:1", tok, target, tp, head=head)


def _script(name, *flags, cwd=REPO):
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, str(REPO / "scripts" / name), *flags], cwd=cwd,
                        env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flags,message", [
    (("--config.draft_head_size=8",), "error: config.draft_head_size = 8 needs "
     "config.draft_head_tokens"),
    (("--config.draft_head_size=8", "--config.draft_head_tokens=missing.json"),
     "error: config.draft_head_tokens head-tokens file missing.json not found"),
    (("--config.draft_head_tokens={file}",), "error: config.draft_head_tokens is set but not "
     "used: config.draft_head_size is 0"),
    (("--config.draft=ngram:2", "--config.draft_head_size=8",
      "--config.draft_head_tokens={file}"), "error: config.draft_head_size = 8 cuts a model "
     "draft's head, and draft 'ngram:2' has none"),
])
def test_bad_head_settings_exit_2_with_one_line(flags, message, tmp_path):
  file = tmp_path / "h.json"
  _write(file, [np.array([10])], vocab=257)
  proc = _script("generate.py", "--config=configs/tiny.py", "--prompt=abc",
                 *(f.format(file=file) for f in flags))
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(message), lines


def test_script_ranks_the_targets_answers_and_a_run_uses_them(tmp_path):
  out = tmp_path / "head.json"
  proc = _script("head_tokens.py", "--config=configs/tiny.py", f"--out={out}", "--limit=3",
                 "--max_new_tokens=5", "--batch_size=2", f"--cache_dir={tmp_path / 'cache'}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = json.loads(out.read_text())
  assert record["tokens"] == 15 and sum(record["counts"]) == 15  # 3 answers of 5 tokens
  assert record["corpus"]["num_instructions"] == 3 and record["vocab_size"] == 257
  assert record["always"] and record["command"].startswith("python scripts/head_tokens.py")
  proc = _script("generate.py", "--config=configs/tiny.py", "--prompt=abc", "--json",
                 f"--config.draft_head_tokens={out}", "--config.draft_head_size=40")
  assert proc.returncode == 0, proc.stderr[-3000:]


def test_head_study_reads_alpha_and_coverage_for_every_subset():
  """α of the full head along the target's greedy answers is 1 for the target as its own
  draft; a subset holding none of the answer tokens covers none and, at T = 0, accepts
  none; the ids of the answers alone cover all, and then α at T = 0 is the full head's
  whenever the draft's argmax is an answer token (here: the target itself)."""
  from specdec_jax import Model
  from specdec_jax.bench import head_study
  target, tp, draft, dp = greedy_draft_pair()
  prompts = [[1, 2, 3], [4, 5, 6, 7]]
  answers = head_study.greedy_answers(Model(target, tp), prompts, max_new_tokens=6,
                                      eos_id=None, vocab_size=32)
  assert [len(a) for a in answers] == [6, 6]
  used = sorted({t for a in answers for t in a})
  unused = [t for t in range(32) if t not in used]
  self_rows = head_study.head_alphas(Model(target, tp), Model(target, tp), prompts, answers,
                                     [(), used, unused], vocab_size=32)
  assert self_rows[0]["alpha_t0"] == pytest.approx(1.0)
  assert self_rows[0]["alpha_t1"] == pytest.approx(1.0, abs=1e-5)
  assert self_rows[1]["coverage"] == 1.0 and self_rows[1]["alpha_t0"] == pytest.approx(1.0)
  assert self_rows[2]["coverage"] == 0.0 and self_rows[2]["alpha_t0"] == 0.0
  assert self_rows[0]["positions"] == 12
  rows = head_study.head_alphas(Model(target, tp), Model(draft, dp), prompts, answers,
                                [(), used], vocab_size=32)
  agree, overlap = [], []  # by hand: a full forward of each row, read before each answer token
  for prompt, answer in zip(prompts, answers):
    row = jnp.asarray([prompt + answer], jnp.int32)
    positions = jnp.arange(row.shape[1], dtype=jnp.int32)[None]
    at = slice(len(prompt) - 1, len(prompt) - 1 + len(answer))
    p = forward(tp, row, positions, init_cache(target, 1, row.shape[1]), config=target)[0][0, at]
    q = forward(dp, row, positions, init_cache(draft, 1, row.shape[1]), config=draft)[0][0, at]
    agree += list(np.argmax(p, -1) == np.argmax(q, -1))
    overlap += list(np.minimum(jax.nn.softmax(p), jax.nn.softmax(q)).sum(-1))
  assert rows[0]["alpha_t0"] == pytest.approx(np.mean(agree))
  assert rows[0]["alpha_t1"] == pytest.approx(np.mean(overlap), abs=1e-5)
  assert 0 < rows[0]["alpha_t1"] < 1
  assert rows[1]["alpha_t1"] != pytest.approx(rows[0]["alpha_t1"])  # q renormalised on the subset


@pytest.mark.parametrize("script", ["head_study.py", "head_tokens.py", "benchmark.py"])
def test_scripts_accept_the_pairs_config_with_its_subset_head(script, monkeypatch):
  """The Qwen config sets a subset head: scripts that load no draft ignore it, the head
  study reads it (and cuts every size from the full head), none refuses the config.
  The pair's GGUFs are opt-in (`make qwen`): their presence is stood in for here, and
  the refusal without them has its own test (test_qwen_shape.py)."""
  sys.path.insert(0, str(REPO / "scripts"))
  import _bootstrap
  from specdec_jax.io import wheel_parts
  monkeypatch.chdir(REPO)
  monkeypatch.setattr(wheel_parts, "qwen_path", lambda name, directory=None: name)
  family, reads = _bootstrap.declarations()[script]
  _bootstrap.check_config_args(["--config=configs/qwen25_coder.py"], script, family, reads)
