"""The token pipeline: documents (`specdec_jax.io.corpora`) tokenized, cached, batched.

A tokenized corpus is one int32 array: every document's tokens followed by `eos_id`.
Training batches are windows [B, T+1] at random offsets drawn from
`np.random.default_rng([seed, step])`, so batch `step` is a pure function of (tokens,
seed, step) and a run resumed at `start_step` sees exactly the batches an uninterrupted
run would.

A `Mixture` holds several tokenized corpora with sampling weights (config
'chat:0.4,stdlib:0.2,...'; `parse_mixture`): training windows, batches and a subset
head's frequent tokens are then drawn from the corpora in those proportions, and
held-out windows are kept per corpus.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
from typing import Iterator, Protocol, Sequence

import numpy as np

from specdec_jax.io.atomic import atomic_write, atomic_write_json
from specdec_jax.io.corpora import Document


class Tokenizer(Protocol):
  """What `TokenizedCorpus` needs from a tokenizer."""
  identity: str

  def encode(self, text: str) -> list[int]:
    ...


# ---------------------------------------------------------------------------------------
# Tokenizing and caching.


def _fingerprint(docs: Sequence[Document], version: str = "") -> str:
  h = hashlib.sha256()
  if version:  # e.g. the Python version of 'stdlib' (empty: the hash of old caches)
    h.update(f"version:{version}|".encode("utf-8"))
  for d in docs:
    for s in (d.name, d.text):
      b = s.encode("utf-8")
      h.update(len(b).to_bytes(8, "little"))
      h.update(b)
  return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class TokenizedCorpus:
  """Documents tokenized into one int32 array, each followed by `eos_id`.

  Document i occupies `tokens[starts[i] : starts[i+1] - 1]`; its eos is at
  `starts[i+1] - 1`.
  """
  tokens: np.ndarray  # int32[N]
  names: tuple[str, ...]
  starts: np.ndarray  # int64[num_documents + 1]
  eos_id: int
  identity: str  # the tokenizer's identity

  @classmethod
  def from_documents(
    cls, docs: Sequence[Document], tokenizer: Tokenizer, eos_id: int
  ) -> TokenizedCorpus:
    """Tokenizes `docs` with `tokenizer.encode`."""
    pieces, lengths = [], [0]
    for d in docs:
      ids = np.asarray(tokenizer.encode(d.text), dtype=np.int64)
      pieces += [ids, np.asarray([eos_id], np.int64)]
      lengths.append(ids.size + 1)
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(np.int32).max):
      raise ValueError("token ids must lie in [0, 2**31)")
    return cls(tokens.astype(np.int32), tuple(d.name for d in docs),
               np.cumsum(lengths), int(eos_id), str(tokenizer.identity))

  def __len__(self) -> int:
    return int(self.tokens.size)

  def document(self, name: str) -> np.ndarray:
    """The tokens of document `name`, without its eos."""
    i = self.names.index(name)
    return self.tokens[self.starts[i]:self.starts[i + 1] - 1]


def tokenize_cached(
  docs: Sequence[Document],
  tokenizer: Tokenizer,
  cache_dir: str | os.PathLike,
  name: str,
  eos_id: int,
  *,
  version: str = "",
) -> TokenizedCorpus:
  """`TokenizedCorpus.from_documents`, cached as `cache_dir/name.npy` + `name.json`.

  The cache is reused only when its sidecar matches the tokenizer identity, eos id,
  document names, a hash of the texts and `version` (`corpus_version`: e.g. the Python
  version of 'stdlib'), and the array matches its recorded checksum;
  otherwise it is recomputed and overwritten. Both files are written atomically, the
  sidecar last (after the old one is removed).
  """
  cache_dir = pathlib.Path(cache_dir)
  npy, meta_path = cache_dir / f"{name}.npy", cache_dir / f"{name}.json"
  meta = {
    "tokenizer": str(tokenizer.identity),
    "corpus": name,
    "eos_id": int(eos_id),
    "documents": [d.name for d in docs],
    "fingerprint": _fingerprint(docs, version),
  }
  if version:
    meta["version"] = str(version)
  try:
    saved = json.loads(meta_path.read_text("utf-8"))
    if {k: saved.get(k) for k in meta} == meta:
      tokens = np.load(npy, allow_pickle=False)
      starts = np.asarray(saved["starts"], np.int64)
      if (tokens.dtype == np.int32 and tokens.shape == (saved["num_tokens"],)
          and hashlib.sha256(tokens.tobytes()).hexdigest() == saved["sha256"]):
        return TokenizedCorpus(tokens, tuple(meta["documents"]), starts, int(eos_id),
                               meta["tokenizer"])
  except (OSError, ValueError, KeyError, TypeError):
    pass  # missing or unreadable cache: recompute
  corpus = TokenizedCorpus.from_documents(docs, tokenizer, eos_id)
  cache_dir.mkdir(parents=True, exist_ok=True)
  meta_path.unlink(missing_ok=True)  # no stale sidecar may vouch for the new array
  atomic_write(npy, lambda f: np.save(f, corpus.tokens, allow_pickle=False))
  meta |= {"num_documents": len(docs), "num_tokens": len(corpus),
           "sha256": hashlib.sha256(corpus.tokens.tobytes()).hexdigest(),
           "starts": corpus.starts.tolist()}
  atomic_write_json(meta_path, meta)
  return corpus


# ---------------------------------------------------------------------------------------
# Batches.


def _as_tokens(tokens) -> np.ndarray:
  tokens = np.asarray(tokens.tokens if isinstance(tokens, TokenizedCorpus) else tokens)
  if tokens.ndim != 1:
    raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
  return tokens.astype(np.int32, copy=False)


def _windows(tokens: np.ndarray, offsets: np.ndarray, seq_len: int) -> np.ndarray:
  return tokens[offsets[:, None] + np.arange(seq_len + 1)]


def batch_at(tokens, batch_size: int, seq_len: int, seed: int, step: int) -> np.ndarray:
  """Training batch number `step`: int32[batch_size, seq_len + 1] random windows."""
  tokens = _as_tokens(tokens)
  if tokens.size < seq_len + 1:
    raise ValueError(f"{tokens.size} tokens are too few for windows of {seq_len + 1}")
  rng = np.random.default_rng([seed, step])
  offsets = rng.integers(0, tokens.size - seq_len, size=batch_size)
  return _windows(tokens, offsets, seq_len)


def batch_iterator(
  tokens, batch_size: int, seq_len: int, seed: int, start_step: int = 0
) -> Iterator[np.ndarray]:
  """Yields `batch_at(..., step)` for step = start_step, start_step + 1, ... forever."""
  tokens = _as_tokens(tokens)
  for step in itertools.count(start_step):
    yield batch_at(tokens, batch_size, seq_len, seed, step)


def frequent_tokens(tokens, count: int, vocab_size: int, always=()) -> tuple[int, ...]:
  """`count` sorted ids for a vocabulary-subset head's `head_tokens`: the ids in `always`
  (e.g. EOS) and, filling the rest, the most frequent ids of `tokens` (ties: lower id)."""
  tokens = _as_tokens(tokens)
  if not 0 < count <= vocab_size:
    raise ValueError(f"head vocabulary of {count} tokens must lie in [1, {vocab_size}]")
  if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
    raise ValueError(f"token ids must lie in [0, {vocab_size}), got {tokens.min()}..{tokens.max()}")
  return top_ids(np.bincount(tokens, minlength=vocab_size).astype(np.float64), count,
                  always)


def top_ids(score: np.ndarray, count: int, always) -> tuple[int, ...]:
  """Sorted ids: `always` and, filling `count`, the highest `score`s (ties: lower id)."""
  vocab_size = score.size
  always = sorted({int(t) for t in always})
  if always and (always[0] < 0 or always[-1] >= vocab_size):
    raise ValueError(f"always ids must lie in [0, {vocab_size}), got {always}")
  score = score.copy()
  score[always] = -1.0  # taken anyway; rank the rest
  ranked = np.argsort(-score, kind="stable")[:max(count - len(always), 0)]
  return tuple(sorted(set(ranked.tolist()) | set(always)))


_HELDOUT_STREAM = 2**40 + 0x5EED  # a stream id no training step reaches


def heldout_windows(tokens, num: int, seq_len: int, seed: int = 0) -> np.ndarray:
  """A fixed evaluation set: int32[num, seq_len + 1], non-overlapping windows.

  The windows are `num` of the aligned chunks `tokens[c*(T+1) : (c+1)*(T+1)]`, chosen
  by `seed` and sorted by position.
  """
  tokens = _as_tokens(tokens)
  chunks = tokens.size // (seq_len + 1)
  if num > chunks:
    raise ValueError(f"only {chunks} windows of {seq_len + 1} fit in {tokens.size} tokens")
  rng = np.random.default_rng([seed, _HELDOUT_STREAM])
  chosen = np.sort(rng.choice(chunks, size=num, replace=False))
  return _windows(tokens, chosen * (seq_len + 1), seq_len)


# ---------------------------------------------------------------------------------------
# Mixtures of corpora.


def parse_mixture(spec) -> tuple[tuple[str, ...], tuple[float, ...] | None]:
  """(names, weights) of a corpora spec.

  A sequence of names ('bible', 'shakespeare') has weights None: its corpora are
  concatenated, each weighted by its size. A string 'chat:0.4,stdlib:0.2,bible:0.2,...'
  gives each corpus a weight; weights are normalised to sum to 1.
  """
  if not isinstance(spec, str):
    names = tuple(str(n) for n in spec)
    if not names or len(set(names)) != len(names):
      raise ValueError(f"corpora must name distinct corpora, got {spec!r}")
    return names, None
  names, weights = [], []
  for part in spec.split(","):
    name, sep, weight = part.strip().partition(":")
    try:
      w = float(weight) if sep else float("nan")
    except ValueError:
      w = float("nan")
    if not name or not np.isfinite(w) or w <= 0:
      raise ValueError(f"corpora entry {part.strip()!r} of {spec!r} must be 'name:weight' with "
                       "a finite weight > 0")
    names.append(name)
    weights.append(w)
  if len(set(names)) != len(names):
    raise ValueError(f"corpora {spec!r} names a corpus twice")
  total = sum(weights)
  return tuple(names), tuple(w / total for w in weights)


def allocate(total: int, weights: Sequence[float]) -> list[int]:
  """`total` split in proportion to `weights` (largest remainder; ties to the first)."""
  exact = np.asarray(weights, np.float64) * total / np.sum(weights)
  counts = np.floor(exact).astype(int)
  order = np.argsort(-(exact - counts), kind="stable")
  counts[order[:total - counts.sum()]] += 1
  return counts.tolist()


@dataclasses.dataclass(frozen=True)
class Mixture:
  """Tokenized corpora (train and held-out tokens per corpus) and their sampling weights.

  weights None: the corpora are one concatenated corpus (each weighted by its size), as
  a plain list of corpora always was.
  """
  names: tuple[str, ...]
  weights: tuple[float, ...] | None
  train: tuple[np.ndarray, ...]  # int32 [N_c] per corpus
  heldout: tuple[np.ndarray, ...]  # int32 [H_c] per corpus

  def __post_init__(self):
    if not (len(self.names) == len(self.train) == len(self.heldout)
            and (self.weights is None or len(self.weights) == len(self.names))):
      raise ValueError("a Mixture needs one weight, train and held-out array per corpus")

  @property
  def train_tokens(self) -> np.ndarray:
    return np.concatenate(self.train)

  @property
  def heldout_tokens(self) -> np.ndarray:
    return np.concatenate(self.heldout)

  def frequent_tokens(self, count: int, vocab_size: int, always=()) -> tuple[int, ...]:
    """`frequent_tokens` of the whole mixture: each corpus's token frequencies weighted by
    its mixture weight (plain counts of the concatenation when weights is None)."""
    if self.weights is None:
      return frequent_tokens(self.train_tokens, count, vocab_size, always)
    score = np.zeros(vocab_size, np.float64)  # Σ_c w_c · (frequency of x in corpus c)
    for name, tokens, weight in zip(self.names, self.train, self.weights):
      if not tokens.size:
        raise ValueError(f"corpus {name!r} has no training tokens")
      frequent_tokens(tokens, 1, vocab_size)  # its checks of count and ids
      score += np.bincount(tokens, minlength=vocab_size) * (weight / tokens.size)
    if not 0 < count <= vocab_size:
      raise ValueError(f"head vocabulary of {count} tokens must lie in [1, {vocab_size}]")
    return top_ids(score, count, always)

  def windows(self, num: int, seq_len: int, seed: int) -> np.ndarray:
    """int32 [num, seq_len]: distinct non-overlapping training spans, `allocate(num,
    weights)` of them from each corpus (one concatenated corpus when weights is None)."""
    if self.weights is None:
      return corpus_spans(self.train_tokens, num, seq_len, [seed, 7], "the training corpus")
    parts = [corpus_spans(tokens, n, seq_len, [seed, 7, i], f"corpus {name!r}")
             for i, (name, tokens, n) in enumerate(
                 zip(self.names, self.train, allocate(num, self.weights)))]
    return np.concatenate(parts)

  def batch_at(self, batch_size: int, seq_len: int, seed: int, step: int) -> np.ndarray:
    """Training batch `step`: int32 [batch_size, seq_len + 1]; each row's corpus is drawn
    by weight, then a random window of it (`batch_at` of the concatenation if None)."""
    if self.weights is None:
      return batch_at(self.train_tokens, batch_size, seq_len, seed, step)
    rng = np.random.default_rng([seed, step])
    corpus = rng.choice(len(self.names), size=batch_size, p=self.weights)
    rows = []
    for c in corpus:
      tokens = self.train[c]
      if tokens.size < seq_len + 1:
        raise ValueError(f"corpus {self.names[c]!r}: {tokens.size} tokens are too few for "
                         f"windows of {seq_len + 1}")
      start = rng.integers(0, tokens.size - seq_len)
      rows.append(tokens[start:start + seq_len + 1])
    return np.stack(rows).astype(np.int32)

  def heldout_windows(self, num: int, seq_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    """{corpus: int32 [num, seq_len + 1]} held-out windows per corpus; with weights None
    one set {'all': ...} from the concatenation."""
    if self.weights is None:
      return {"all": heldout_windows(self.heldout_tokens, num, seq_len, seed)}
    return {name: heldout_windows(tokens, num, seq_len, seed)
            for name, tokens in zip(self.names, self.heldout)}


def corpus_spans(tokens, num: int, seq_len: int, seed, what: str) -> np.ndarray:
  """int32 [num, seq_len]: distinct non-overlapping spans of `tokens` in random order,
  chosen by `np.random.default_rng(seed)`; `what` names the tokens in errors."""
  tokens = _as_tokens(tokens)
  available = tokens.size // seq_len
  if num > available:
    raise ValueError(f"{num} windows of {seq_len} tokens exceed the {available} in {what}")
  starts = np.random.default_rng(seed).choice(available, size=num, replace=False)
  return tokens[(starts * seq_len)[:, None] + np.arange(seq_len)[None, :]]
