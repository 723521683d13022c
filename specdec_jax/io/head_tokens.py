"""A vocabulary-subset head for an independent draft: which C token ids it scores.

Letters: V vocabulary, C kept ids (the head's columns), D model width.

An independent draft spends a large part of each call on its output head: the untied 151,936
x 896 head of Qwen2.5-Coder-0.5B's GGUF file is about a fifth of its weights. A subset head
scores only C of the V ids (`ModelConfig.head_tokens`) and gives every other id q = 0.
Verification stays exact for any q (docs/exactness.md); a q that is 0 where the target would
pick an id only lowers acceptance there, so the ids kept are the ones the target itself
emits most often (FR-Spec, Zhao et al., ACL 2025, ranks them by frequency in a corpus; we
rank them in the target's own answers, the text a draft has to predict).

A head-tokens file (JSON, written by `scripts/head_tokens.py` and read at load time):

  format       'head-tokens-v1'
  tokenizer    the vocabulary identity (`io.tokenizer.vocab_identity`) the ids belong to
  vocab_size   V
  always       ids every subset keeps (EOS and the other special ids of the tokenizer)
  ids, counts  every id seen in the answers, by count (highest first; ties: lower id)
  corpus       how the answers were made (target, instructions, samples, tokens, ...)
  command, stamp   the command that wrote it and its machine stamp

`choose(path, C)` keeps `always` and then the C - |always| ids of highest count; ids never
seen rank after every seen one, lower id first (byte-level BPE gives the earliest merges,
the commonest pieces, the lowest ids). `cut_head` turns a full-vocabulary draft into its
subset: its head (or, for a tied model, its embedding) restricted to those C columns.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np

from specdec_jax.io.atomic import atomic_write_json
from specdec_jax.io.token_data import top_ids
from specdec_jax.models.model import ModelConfig

FORMAT = "head-tokens-v1"


def ranked_counts(tokens: Sequence[np.ndarray], vocab_size: int) -> tuple[list[int], list[int]]:
  """(ids, counts) of every id in the token arrays, by count (highest first; ties: lower id)."""
  counts = np.zeros(vocab_size, np.int64)
  for t in tokens:
    t = np.asarray(t, np.int64).ravel()
    if t.size and (t.min() < 0 or t.max() >= vocab_size):
      raise ValueError(f"token ids must lie in [0, {vocab_size}), got {t.min()}..{t.max()}")
    counts += np.bincount(t, minlength=vocab_size)
  seen = np.flatnonzero(counts)
  order = seen[np.lexsort((seen, -counts[seen]))]
  return order.tolist(), counts[order].tolist()


def write(path: str | os.PathLike, *, tokens: Sequence[np.ndarray], vocab_size: int,
          tokenizer_identity: str, always: Sequence[int], corpus: dict, command: str,
          stamp: dict) -> dict:
  """Writes the head-tokens file of `tokens` (the target's answers) atomically; returns it."""
  ids, counts = ranked_counts(tokens, vocab_size)
  record = {"format": FORMAT, "tokenizer": str(tokenizer_identity), "vocab_size": int(vocab_size),
            "always": sorted({int(t) for t in always}), "corpus": corpus,
            "tokens": int(sum(counts)), "distinct": len(ids), "command": command,
            "stamp": stamp, "ids": ids, "counts": counts}
  atomic_write_json(path, record)
  return record


def read(path: str | os.PathLike) -> dict:
  """The head-tokens file at `path`; ValueError naming the file if it is not one."""
  try:
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
  except FileNotFoundError:
    raise ValueError(f"head-tokens file {path} not found (write it with "
                     "scripts/head_tokens.py)") from None
  except (OSError, ValueError) as e:
    raise ValueError(f"head-tokens file {path} is unreadable ({e})") from None
  if not isinstance(record, dict) or record.get("format") != FORMAT:
    raise ValueError(f"{path} is not a head-tokens file (format {FORMAT!r})")
  ids, counts = record.get("ids"), record.get("counts")
  if not (isinstance(ids, list) and isinstance(counts, list) and len(ids) == len(counts)):
    raise ValueError(f"head-tokens file {path}: 'ids' and 'counts' must be lists of one length")
  return record


def choose(path: str | os.PathLike, count: int, *, vocab_size: int,
           tokenizer_identity: str | None = None) -> tuple[int, ...]:
  """The sorted C = `count` ids of a subset head from the file at `path` (module docstring).

  vocab_size: the draft's V (the file's must match); tokenizer_identity: checked against
  the file's where given."""
  record = read(path)
  if record["vocab_size"] != vocab_size:
    raise ValueError(f"head-tokens file {path} is for a vocabulary of {record['vocab_size']} "
                     f"ids, the draft has {vocab_size}")
  if tokenizer_identity is not None and record["tokenizer"] != tokenizer_identity:
    raise ValueError(f"head-tokens file {path} was made with another tokenizer (identity "
                     f"{record['tokenizer'][:12]}... != {tokenizer_identity[:12]}...)")
  if isinstance(count, bool) or not isinstance(count, int) or not 0 < count < vocab_size:
    raise ValueError(f"a subset head keeps C ids with 0 < C < {vocab_size}, got {count!r}")
  score = np.zeros(vocab_size, np.float64)
  ids = np.asarray(record["ids"], np.int64)
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    raise ValueError(f"head-tokens file {path} holds ids outside [0, {vocab_size})")
  # seen ids by count (all >= 1); unseen ids tie at 0 and `top_ids` takes the lower id first
  score[ids] = np.asarray(record["counts"], np.float64)
  return top_ids(score, count, record["always"])


def subset_config(config: ModelConfig, ids: Sequence[int]) -> ModelConfig:
  """The ModelConfig of an independent draft's head cut to `ids` (sorted): untied, with
  `head_tokens`; ValueError for a feature draft or a head cut already."""
  if config.reads_target_features:
    raise ValueError("a subset head is cut from an independent draft; this one is a feature "
                     "draft (it reads the target's head)")
  if config.head_tokens:
    raise ValueError("this draft already has a subset head")
  return config.replace(tie_embeddings=False, head_tokens=tuple(int(i) for i in ids))


def cut_head(config: ModelConfig, params: dict, ids: Sequence[int]) -> tuple[ModelConfig, dict]:
  """(config, params) of the subset head on `ids` (sorted, `subset_config`): the head [D,V]
  (a tied model's embedding, transposed; `head_t` [V,D] in the serving layout) cut to its
  C columns. The blocks, the embedding and the cache are unchanged, so every logit it
  gives equals the full head's at that id."""
  config = subset_config(config, ids)
  ids = np.asarray(config.head_tokens, np.int64)
  serving = "head_t" in params or any(k.startswith("layers_") for k in params)
  if serving:  # the serving layout (`models.layouts`): head_t [C,D], rows of [V,D]
    rows = params["head_t"] if "head_t" in params else params.get("embed")
    if rows is None:
      raise ValueError("cut_head needs params with a 'head', 'head_t' or tied 'embed'")
    return config, {**params, "head_t": np.ascontiguousarray(np.asarray(rows)[ids])}
  if "head" in params:
    head = np.asarray(params["head"])
  elif "embed" in params:  # tied: the head is the embedding, transposed
    head = np.asarray(params["embed"]).T
  else:
    raise ValueError("cut_head needs params with a 'head', 'head_t' or tied 'embed'")
  return config, {**params, "head": np.ascontiguousarray(head[:, ids])}
