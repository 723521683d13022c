"""A byte-level BPE tokenizer built offline from GGUF metadata, and vocabulary identity.

The recipe rebuilds the Hugging Face tokenizer from `tokenizer.ggml.*` keys:
BPE(vocab, merges), a ByteLevel decoder, token_type == 3 entries as special tokens, and
the pre-tokenizer `tokenizer.ggml.pre` names: 'qwen2' (Qwen2 / Qwen2.5) is an NFC
normalizer and Sequence[Split(QWEN2_SPLIT, isolated), ByteLevel(no prefix space, no
regex)], as Qwen's tokenizer.json; any other name (SmolLM2's 'smollm') gets SmolLM2's,
Sequence[Digits(individual), ByteLevel(no prefix space, GPT-2 regex)]. Nothing is
downloaded.

`identity` is a sha256 of the token strings in id order: two models can share a
draft/target pair only if their identities match (`check_same_vocab`). Padding
rows of an embedding beyond the tokenizer's vocabulary are not part of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Sequence

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

Message = dict[str, str]

_CONTROL = 3  # llama.cpp token type of special / control tokens
# Qwen2's pre-tokenizer split (its tokenizer.json; llama.cpp's 'qwen2' pre-tokenizer): one
# digit per piece, letters with at most one leading non-letter ('(xs', '.shape'),
# punctuation runs with their trailing newlines ('):\n').
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def pre_tokenizer(pre: str | None):
  """(normalizer or None, pre-tokenizer) for llama.cpp's `tokenizer.ggml.pre` name."""
  if pre == "qwen2":
    return normalizers.NFC(), pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
  return None, pre_tokenizers.Sequence([
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
  ])


def vocab_identity(tokens: Sequence[str]) -> str:
  """sha256 hex of the token strings in id order (a JSON list, so no separator ambiguity)."""
  blob = json.dumps(list(tokens), ensure_ascii=False, separators=(",", ":"))
  return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def check_same_vocab(a_identity: str, b_identity: str) -> None:
  """Raises ValueError unless two tokenizer identities are equal."""
  if a_identity != b_identity:
    raise ValueError(
        f"tokenizers differ (identity {a_identity[:12]}... != {b_identity[:12]}...): "
        "speculative decoding needs the draft and target to share one vocabulary")


class Tokenizer:
  """Encode / decode / ChatML formatting for a GGUF's byte-level BPE vocabulary."""

  def __init__(self, tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int],
               *, bos_id: int, eos_id: int, pad_id: int | None = None,
               chat_template: str | None = None, pre: str | None = None):
    self.tokens = list(tokens)
    self.vocab_size = len(self.tokens)
    self.bos_id, self.eos_id = int(bos_id), int(eos_id)
    self.pad_id = self.eos_id if pad_id is None else int(pad_id)
    self.chat_template = chat_template
    self.identity = vocab_identity(self.tokens)
    vocab = {tok: i for i, tok in enumerate(self.tokens)}
    if len(vocab) != len(self.tokens):
      raise ValueError("duplicate token strings in the vocabulary")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    for pair in pairs:  # checked here: tokenizers panics on a merge whose result is unknown
      if len(pair) != 2 or not all(part in vocab for part in (*pair, "".join(pair))):
        raise ValueError(f"invalid BPE merge {' '.join(pair)!r}: its parts and result must be "
                         "tokens of the vocabulary")
    bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
    tok = tokenizers.Tokenizer(bpe)
    normalizer, tok.pre_tokenizer = pre_tokenizer(pre)
    if normalizer is not None:
      tok.normalizer = normalizer
    tok.decoder = decoders.ByteLevel()
    self.special_ids = [i for i, t in enumerate(token_types) if t == _CONTROL]
    tok.add_special_tokens([
        tokenizers.AddedToken(self.tokens[i], special=True, normalized=False)
        for i in self.special_ids])
    self._tok = tok

  @classmethod
  def from_gguf(cls, path: str | os.PathLike) -> "Tokenizer":
    """Builds the tokenizer from a GGUF's metadata (gpt2-style BPE only)."""
    from specdec_jax.io.gguf import metadata, open_gguf  # the reader and its errors
    path = os.fspath(path)
    reader = open_gguf(path)
    kind = metadata(reader, "tokenizer.ggml.model", None)
    if kind != "gpt2":
      raise ValueError(f"unsupported tokenizer model {kind!r} in {path}; only 'gpt2' "
                       "(byte-level BPE) is supported")
    tokens = metadata(reader, "tokenizer.ggml.tokens")
    return cls(
        tokens,
        metadata(reader, "tokenizer.ggml.merges"),
        metadata(reader, "tokenizer.ggml.token_type", [1] * len(tokens)),
        bos_id=metadata(reader, "tokenizer.ggml.bos_token_id"),
        eos_id=metadata(reader, "tokenizer.ggml.eos_token_id"),
        pad_id=metadata(reader, "tokenizer.ggml.padding_token_id", None),
        chat_template=metadata(reader, "tokenizer.chat_template", None),
        pre=metadata(reader, "tokenizer.ggml.pre", None),
    )

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`; special-token strings in it become their ids; no BOS added."""
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    """Text of `ids` (special tokens kept unless skip_special_tokens)."""
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def token_to_id(self, token: str) -> int | None:
    return self._tok.token_to_id(token)

  def default_system_prompt(self) -> str | None:
    """The system message a ChatML template inserts when the first message is not one: the
    first literal `<|im_start|>system\\n...<|im_end|>` in it. Template code between the two
    markers (quotes, braces: Qwen2.5's template opens a tools branch with the bare marker
    and adds the message later) is not a message."""
    if not self.chat_template:
      return None
    match = re.search(r"<\|im_start\|>system(?:\n|\\n)([^'\"{}%]*?)<\|im_end\|>",
                      self.chat_template)
    return match.group(1) if match else None

  def apply_chat_template(self, messages: Sequence[Message],
                          add_generation_prompt: bool = True) -> str:
    """ChatML text of `messages` ([{'role', 'content'}]), as the GGUF's template renders it.

    The template (`tokenizer.chat_template`) is implemented directly rather than run
    through jinja2: one `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, a
    default system message first when the conversation has none, and
    `<|im_start|>assistant\\n` when add_generation_prompt.
    """
    if self.chat_template is not None and "<|im_start|>" not in self.chat_template:
      raise ValueError("the GGUF's chat template is not ChatML; only ChatML is implemented")
    for m in messages:
      if not isinstance(m, dict) or "role" not in m or "content" not in m:
        raise ValueError(f"each message needs 'role' and 'content', got {m!r}")
    parts = []
    system = self.default_system_prompt()
    if messages and messages[0]["role"] != "system" and system is not None:
      parts.append(f"<|im_start|>system\n{system}<|im_end|>\n")
    for m in messages:
      parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    if add_generation_prompt:
      parts.append("<|im_start|>assistant\n")
    return "".join(parts)
