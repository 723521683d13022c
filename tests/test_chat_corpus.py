"""The 'chat' corpus (the target's own answers through its chat template): the shipped
instruction list, generation at tiny scale, resumption after a kill between batches,
independence of the batch size, and bad input."""

import json
import pathlib

import numpy as np
import pytest

from helpers import noise_params, tiny_config
from specdec_jax.decoding import loop
from specdec_jax.distill import chat_corpus
from specdec_jax.loading import ByteTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Equal lengths: one prompt width, so one compilation of the decode loop.
INSTRUCTIONS = ["Name a fruit.", "Name a tree.", "Say hello!!", "Count to 3.", "Tell a joke"]


@pytest.fixture(scope="module")
def target():
  config = tiny_config(vocab=257, layers=1, width=16, max_seq_len=64)
  return config, noise_params(config, seed=3, scale=0.5)


def _generate(cache_dir, target, **kw):
  config, params = target
  settings = dict(samples=2, max_new_tokens=6, batch_size=2, temperature=0.7, seed=5,
                  log=lambda m: None)
  return chat_corpus.generate_chat_corpus(
      cache_dir, INSTRUCTIONS, tokenizer=ByteTokenizer(), target_params=params,
      target_config=config, target_identity="tiny", **{**settings, **kw})


def test_shipped_instructions_are_many_distinct_and_not_held_out():
  """≥ 200 distinct instructions; none shares a 40-character window with the held-out
  benchmark prompts (configs/prompts/heldout.json), which must stay unseen."""
  items = chat_corpus.load_instructions()
  assert len(items) >= 200 and len(set(items)) == len(items)
  heldout = ROOT / "configs/prompts/heldout.json"
  if not heldout.exists():
    pytest.skip("no held-out prompt set in this checkout")
  texts = [p["text"].lower() for p in json.loads(heldout.read_text("utf-8"))["prompts"]]
  for item in items:
    low = item.lower()
    windows = {low[i:i + 40] for i in range(max(len(low) - 39, 1))}
    assert not any(w in t for w in windows for t in texts), item


def test_documents_are_prompt_then_answer_per_sample(target, tmp_path):
  """One document per instruction: for each sample the chat-templated prompt, then the
  answer, ending in EOS; the cache is reused without generating again."""
  docs = _generate(tmp_path, target)
  assert list(docs) == [f"chat-{i:04d}" for i in range(len(INSTRUCTIONS))]
  eos = ByteTokenizer.eos_id
  for i, text in enumerate(INSTRUCTIONS):
    doc = docs[f"chat-{i:04d}"]
    ends = np.flatnonzero(doc == eos)
    assert len(ends) == 2 and ends[-1] == doc.size - 1  # two samples, each ended by EOS
    prompt = list(text.encode())
    assert doc[:len(prompt)].tolist() == prompt
    assert doc[ends[0] + 1:ends[0] + 1 + len(prompt)].tolist() == prompt
  assert _generate(tmp_path, target).keys() == docs.keys()  # cached


def test_resumes_after_a_kill_between_batches_with_identical_output(target, tmp_path,
                                                                    monkeypatch):
  """Killed after two of five batches, the generation keeps them, resumes at the third
  and ends with the uninterrupted run's tokens; another batch size gives them too (a
  row's answer depends on (seed, row id, prompt, settings) only)."""
  full = _generate(tmp_path / "full", target)
  calls = []
  real = loop.autoregressive_generate

  def dying(*args, **kw):
    if len(calls) == 2:
      raise KeyboardInterrupt("killed")
    calls.append(1)
    return real(*args, **kw)
  monkeypatch.setattr(loop, "autoregressive_generate", dying)
  with pytest.raises(KeyboardInterrupt):
    _generate(tmp_path / "cut", target)
  [directory] = (tmp_path / "cut").iterdir()
  assert len(list(directory.glob("batch_*.json"))) == 2
  assert not list(directory.glob(".*.tmp"))
  calls.clear()
  monkeypatch.setattr(loop, "autoregressive_generate",
                      lambda *a, **k: (calls.append(1), real(*a, **k))[1])
  resumed = _generate(tmp_path / "cut", target)
  assert len(calls) == 3  # batches 2, 3 and 4 only
  assert all(np.array_equal(resumed[k], full[k]) for k in full)
  other = _generate(tmp_path / "b4", target, batch_size=4)
  assert all(np.array_equal(other[k], full[k]) for k in full)
  changed = _generate(tmp_path / "seed", target, seed=6)
  assert any(not np.array_equal(changed[k], full[k]) for k in full)


def test_more_samples_extend_the_cached_answers(target, tmp_path, monkeypatch):
  """Raising samples from 2 to 3 generates only the 5 new answers; the first two
  samples of every document stay as they were."""
  two = _generate(tmp_path, target)
  calls = []
  real = loop.autoregressive_generate
  monkeypatch.setattr(loop, "autoregressive_generate",
                      lambda *a, **k: (calls.append(len(a[1])), real(*a, **k))[1])
  three = _generate(tmp_path, target, samples=3)
  assert sum(calls) == len(INSTRUCTIONS)
  eos = ByteTokenizer.eos_id
  for k in two:
    assert np.count_nonzero(three[k] == eos) == 3
    assert np.array_equal(three[k][:two[k].size], two[k])


def test_bad_settings_and_files_are_refused(target, tmp_path):
  with pytest.raises(ValueError, match="batch_size"):
    _generate(tmp_path, target, batch_size=0)
  with pytest.raises(ValueError, match="temperature"):
    _generate(tmp_path, target, temperature=-1.0)
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps({"instructions": ["a", "a"]}))
  with pytest.raises(ValueError, match="appears twice"):
    chat_corpus.load_instructions(bad)
  bad.write_text(json.dumps({"instructions": ["a", ""]}))
  with pytest.raises(ValueError, match="instruction 1"):
    chat_corpus.load_instructions(bad)
  with pytest.raises(FileNotFoundError):
    chat_corpus.load_instructions(tmp_path / "missing.json")
