"""Training text for the shipped draft and its export: the 'stdlib' corpus, weighted
mixtures (windows, batches, the subset head's tokens), α per drafted depth, and the
float16 save format (round trip, refusal of files model.json does not describe, greedy
equality of speculative and plain decoding with the loaded float16 draft)."""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_greedy_equals_autoregressive, tiny_config, tiny_model
from specdec_jax.io import corpora, token_data
from specdec_jax import distill
from specdec_jax.io import checkpoint as ckpt_lib
from specdec_jax.loading import ByteTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------------- stdlib

def _fake_stdlib(root):
  files = {"json/decoder.py": "x = 1\n" * 50, "abc.py": "class A: pass\n" * 40,
           "os.py": "import sys\n" * 30, "test/test_os.py": "t = 1\n",
           "unittest/test_case.py": "t = 1\n", "idlelib/run.py": "i = 1\n",
           "site-packages/pkg/mod.py": "s = 1\n", "lib2to3/tests/data/f.py": "l = 1\n",
           "big.py": "b = 1\n" * (corpora.STDLIB_MAX_FILE_BYTES // 6 + 1), "notes.txt": "n\n"}
  for rel, text in files.items():
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)
  (root / "latin1.py").write_bytes(b"# caf\xe9\n")  # not UTF-8: skipped


def test_stdlib_selection_is_deterministic_and_excludes_tests_tools_and_big_files(tmp_path):
  _fake_stdlib(tmp_path)
  docs = corpora._load_stdlib(10**6, root=tmp_path)
  assert [d.name for d in docs] == ["abc.py", "json/decoder.py", "os.py"]
  assert docs == corpora._load_stdlib(10**6, root=tmp_path)
  capped = corpora._load_stdlib(700, root=tmp_path)  # the character cap
  assert sum(len(d.text) for d in capped) <= 700 and 0 < len(capped) < 3
  assert capped == corpora._load_stdlib(700, root=tmp_path)
  with pytest.raises(ValueError, match="max_chars"):
    corpora._load_stdlib(0, root=tmp_path)


def test_real_stdlib_corpus_and_its_cache_identity_carry_the_python_version(tmp_path):
  """The running Python's library loads; its token cache is not reused under another
  Python version (the fingerprint includes it)."""
  docs = corpora.load_documents("stdlib", max_chars=40_000)
  assert docs and sum(len(d.text) for d in docs) <= 40_000
  assert not any(part in ("test", "tests", "idlelib", "site-packages")
                 for d in docs for part in d.name.split("/")[:-1])
  assert corpora.corpus_version("stdlib").endswith(
      ".".join(map(str, sys.version_info[:3]))) and corpora.corpus_version("bible") == ""
  tok = ByteTokenizer()
  a = token_data.tokenize_cached(docs[:2], tok, tmp_path, "s", tok.eos_id, version="cpython-3.11.7")
  meta = json.loads((tmp_path / "s.json").read_text())
  token_data.tokenize_cached(docs[:2], tok, tmp_path, "s", tok.eos_id, version="cpython-3.12.1")
  other = json.loads((tmp_path / "s.json").read_text())
  assert meta["version"] == "cpython-3.11.7" and other["version"] == "cpython-3.12.1"
  assert meta["fingerprint"] != other["fingerprint"]
  unversioned = token_data.tokenize_cached(docs[:2], tok, tmp_path, "u", tok.eos_id)
  assert np.array_equal(a.tokens, unversioned.tokens)


# --------------------------------------------------------------------------- mixtures

def _mixture(weights=(0.5, 0.25, 0.25)):
  rng = np.random.default_rng(0)
  train = (rng.integers(0, 10, 4000), rng.integers(10, 20, 1000), rng.integers(20, 30, 600))
  held = tuple(t[:300] + 0 for t in train)
  return token_data.Mixture(("a", "b", "c"), weights,
                            tuple(t.astype(np.int32) for t in train),
                            tuple(h.astype(np.int32) for h in held))


def test_parse_mixture_normalises_and_names_bad_entries():
  assert token_data.parse_mixture("chat:2,stdlib:1,bible:1") == (
      ("chat", "stdlib", "bible"), (0.5, 0.25, 0.25))
  assert token_data.parse_mixture(("bible", "shakespeare")) == (("bible", "shakespeare"), None)
  for bad in ("chat", "chat:0", "chat:-1", "chat:nan", "chat:x", "a:1,a:2", ":1"):
    with pytest.raises(ValueError, match="corp"):
      token_data.parse_mixture(bad)
  assert token_data.allocate(10, (0.4, 0.2, 0.2, 0.2)) == [4, 2, 2, 2]
  assert sum(token_data.allocate(7, (1, 1, 1))) == 7


def test_windows_batches_and_heldout_sets_follow_the_weights():
  mix = _mixture()
  windows = mix.windows(40, 8, seed=1)
  source = windows[:, 0] // 10  # corpus a: ids 0-9, b: 10-19, c: 20-29
  assert windows.shape == (40, 8) and np.bincount(source).tolist() == [20, 10, 10]
  assert all(np.all(w // 10 == w[0] // 10) for w in windows)  # each window in one corpus
  assert np.array_equal(windows, mix.windows(40, 8, seed=1))
  batch = mix.batch_at(400, 8, seed=0, step=3)
  assert batch.shape == (400, 9) and np.array_equal(batch, mix.batch_at(400, 8, 0, 3))
  share = np.bincount(batch[:, 0] // 10, minlength=3) / 400
  assert np.allclose(share, (0.5, 0.25, 0.25), atol=0.1)  # binomial sd 0.025: 4 sd
  sets = mix.heldout_windows(3, 8)
  assert list(sets) == ["a", "b", "c"] and all(s.shape == (3, 9) for s in sets.values())
  plain = token_data.Mixture(mix.names, None, mix.train, mix.heldout)  # a list of corpora
  assert np.array_equal(plain.batch_at(4, 8, 0, 3),
                        token_data.batch_at(mix.train_tokens, 4, 8, 0, 3))
  assert list(plain.heldout_windows(3, 8)) == ["all"]
  with pytest.raises(ValueError, match="corpus 'c'"):
    mix.windows(400, 8, seed=1)  # c holds 75 windows of 8


def test_subset_head_tokens_come_from_the_whole_weighted_mix():
  """A corpus of 600 tokens at weight 0.8 puts its ids into a 10-token head that plain
  counts over the concatenation would fill with the 4000-token corpus's ids."""
  mix = _mixture(weights=(0.1, 0.1, 0.8))
  head = mix.frequent_tokens(10, 32, always=(31,))
  assert 31 in head and sum(20 <= t < 30 for t in head) == 9
  plain = token_data.frequent_tokens(mix.train_tokens, 10, 32, always=(31,))
  assert sum(t < 10 for t in plain) == 9
  from configs import distill_tiny
  c = distill_tiny.get_config()
  c.draft.head_vocab = 10
  target = tiny_config(vocab=32, layers=1, width=16)
  assert distill.draft_config_from(c, target, mix, always=(31,)).head_tokens == head


# --------------------------------------------------------------------------- depth and export

@pytest.fixture(scope="module")
def feature_pair():
  """test_feature_draft.py's 3-layer target and 1-layer feature draft (same shapes)."""
  target = tiny_config(vocab=32, layers=3, width=32)
  draft = tiny_config(vocab=32, layers=1, width=16, tie_embeddings=False,
                      feature_layers=(1, 3), feature_width=32)
  return target, tiny_model(target, 0, factor=6.0), draft, tiny_model(draft, 1, factor=3.0)


def test_alpha_per_drafted_depth(feature_pair):
  """depth=2 adds α of the second drafted position and leaves the first unchanged."""
  target, tp, draft, dp = feature_pair
  windows = np.random.default_rng(0).integers(0, 32, (3, 9))
  one = distill.evaluate(dp, tp, windows, draft_config=draft, target_config=target)
  two = distill.evaluate(dp, tp, windows, draft_config=draft, target_config=target, depth=2)
  assert two["alpha_t0"] == pytest.approx(one["alpha_t0"])
  assert 0.0 <= two["alpha_t0_d2"] <= 1.0 and 0.0 < two["alpha_t1_d2"] <= 1.0
  with pytest.raises(ValueError, match="depth"):
    distill.evaluate(dp, tp, windows, draft_config=draft, target_config=target, depth=0)


def test_float16_save_round_trip_is_exact_greedily(feature_pair, tmp_path):
  """A float16 save loads as float32 params equal to the float16-rounded originals, and
  greedy speculative decoding with it gives plain greedy decoding's tokens."""
  target, tp, draft, dp = feature_pair
  ckpt_lib.save_params(tmp_path / "d", dp, draft, tokenizer_identity="tok",
                       params_dtype="float16")
  meta = json.loads((tmp_path / "d/model.json").read_text())
  assert meta["params_dtype"] == "float16" and meta["files_sha256"]
  params, config, _ = ckpt_lib.load_params(tmp_path / "d", tokenizer_identity="tok")
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(dp)):
    assert a.dtype == jnp.float32
    assert np.array_equal(np.asarray(a), np.asarray(b).astype(np.float16).astype(np.float32))
  # test_feature_draft.py's pair, prompts and lengths: its compiled loops are reused.
  prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13], [14, 15]]
  out = assert_greedy_equals_autoregressive((target, tp, config, params), prompts, gamma=3,
                                            max_new_tokens=16)
  assert out.acceptance_rate() > 0  # the draft did propose accepted tokens


def test_a_draft_is_checked_against_the_target_it_was_trained_for(feature_pair):
  target, tp, _, _ = feature_pair
  meta = {"extra": {"target": ckpt_lib.target_identity(target, tp)}}
  ckpt_lib.check_draft_target(meta, target, tp)
  with pytest.raises(ValueError, match="trained against target"):
    ckpt_lib.check_draft_target(meta, target, jax.tree.map(lambda x: x + 1, tp))
  with pytest.raises(ValueError, match="no target identity"):
    ckpt_lib.check_draft_target({"extra": {}}, target, tp)


def test_float16_files_other_than_model_json_says_are_refused(feature_pair, tmp_path):
  _, _, draft, dp = feature_pair
  good = tmp_path / "good"
  ckpt_lib.save_params(good, dp, draft, tokenizer_identity="tok", params_dtype="float16")
  other = jax.tree.map(lambda x: x * 1.001, dp)  # other float16 params, same shapes
  swapped = tmp_path / "swapped"
  ckpt_lib.save_params(swapped, other, draft, tokenizer_identity="tok", params_dtype="float16")
  shutil.copy(good / "model.json", swapped / "model.json")
  with pytest.raises(ValueError, match="changed or replaced"):
    ckpt_lib.load_params(swapped)
  wide = tmp_path / "wide"  # float32 files under a model.json that says float16
  ckpt_lib.save_params(wide, dp, draft, tokenizer_identity="tok")
  meta = json.loads((good / "model.json").read_text())
  meta["files_sha256"] = ckpt_lib.files_checksums(wide / "params")
  (wide / "model.json").write_text(json.dumps(meta))
  with pytest.raises(ValueError, match="float32"):
    ckpt_lib.load_params(wide)
  meta = json.loads((good / "model.json").read_text())
  del meta["files_sha256"]
  (good / "model.json").write_text(json.dumps(meta))
  with pytest.raises(ValueError, match="files_sha256"):
    ckpt_lib.load_params(good)


@pytest.mark.slow  # the whole pipeline of `make distill` at test scale
def test_make_distill_pipeline_at_tiny_scale(tmp_path):
  """configs/distill_feature_shipped.py:tiny through scripts/distill.py (chat corpus,
  stdlib, Bible, Shakespeare; per-corpus α per depth) and scripts/export_draft.py."""
  env = {**os.environ, "PYTHONPATH": ROOT}
  work, out = tmp_path / "work", tmp_path / "drafts" / "tiny_v1"
  for args in (["scripts/distill.py", "--config=configs/distill_feature_shipped.py:tiny",
                f"--workdir={work}", f"--config.cache_dir={tmp_path / 'cache'}"],
               ["scripts/export_draft.py", f"--workdir={work}", f"--out={out}",
                "--command=make distill"]):
    subprocess.run([sys.executable, *args], cwd=ROOT, env=env, check=True,
                   capture_output=True, text=True)
  meta = json.loads((out / "model.json").read_text())
  alpha = meta["extra"]["heldout_alpha"]
  assert set(alpha) == {"all", "chat", "stdlib", "bible", "shakespeare"}
  assert set(alpha["chat"]) == {"t0", "t1"} and set(alpha["chat"]["t0"]) == {"d1", "d2"}
  assert alpha["all"]["t1"]["d1"] > 0.3  # trained (0.15 before)
  assert meta["extra"]["training"]["command"] == "make distill"
  assert meta["extra"]["training"]["starts"][0]["command"].startswith("python scripts/")
  assert len(meta["extra"]["alpha_curve"]) == 2  # evaluations at steps 20 and 40
  ckpt_lib.load_params(out, tokenizer_identity=ByteTokenizer.identity)
