"""specdec_jax.io.tokenizer: ids against transformers' tokenizer, round trips, ChatML, identity."""

import json
import os

import pytest

from specdec_jax.io.gguf import smollm2_path
from specdec_jax.io.tokenizer import Tokenizer, check_same_vocab, vocab_identity

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "smollm2_golden.json")
with open(GOLDEN) as _f:
  REF = json.load(_f)


@pytest.fixture(scope="module")
def tok():
  return Tokenizer.from_gguf(smollm2_path())


def test_special_ids(tok):
  ref = REF["tokenizer"]
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (
      ref["bos_id"], ref["eos_id"], ref["pad_id"], ref["vocab_size"])
  assert tok.decode([tok.bos_id, tok.eos_id]) == "<|im_start|><|im_end|>"
  assert len(tok.special_ids) == 17


@pytest.mark.parametrize("case", REF["tokenizer"]["cases"], ids=lambda c: repr(c["text"][:20]))
def test_ids_match_reference(tok, case):
  assert tok.encode(case["text"]) == case["ids"]


@pytest.mark.parametrize("case", REF["tokenizer"]["cases"], ids=lambda c: repr(c["text"][:20]))
def test_round_trip(tok, case):
  assert tok.decode(tok.encode(case["text"])) == case["text"]


def test_prompt_ids_and_greedy_text(tok):
  for prompt in REF["prompts"]:
    assert tok.encode(prompt["text"]) == prompt["ids"]
    assert tok.decode(prompt["greedy_ids"]) == prompt["greedy_text"]


def test_digits_split_and_specials(tok):
  assert [tok.decode([i]) for i in tok.encode("x 2024")] == ["x", " ", "2", "0", "2", "4"]
  assert tok.encode("<|im_end|>") == [tok.eos_id]
  assert tok.decode(tok.encode("<|im_start|>hi<|im_end|>"), skip_special_tokens=True) == "hi"


@pytest.mark.parametrize("case", REF["chat_template"], ids=["default-system", "system", "no-gen"])
def test_chat_template_matches_reference(tok, case):
  assert tok.apply_chat_template(case["messages"], case["add_generation_prompt"]) == case["text"]


def test_chat_template_text(tok):
  text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
  assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                  "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
  assert REF["prompts"][1]["text"] == tok.apply_chat_template(REF["chat_messages"])
  with pytest.raises(ValueError, match="'role' and 'content'"):
    tok.apply_chat_template([{"text": "Hi"}])


def _tiny(tokens):
  merges = ["a b"] if "ab" in tokens else []
  return Tokenizer(tokens, merges, [3] + [1] * (len(tokens) - 1), bos_id=0, eos_id=0)


def test_identity(tok):
  assert tok.identity == vocab_identity(tok.tokens)
  assert len(tok.identity) == 64 and tok.identity == Tokenizer.from_gguf(smollm2_path()).identity
  check_same_vocab(tok.identity, tok.identity)
  a, b = _tiny(["<s>", "a", "b", "ab"]), _tiny(["<s>", "a", "b", "ba"])
  assert a.encode("ab") == [3]
  with pytest.raises(ValueError, match="tokenizers differ"):
    check_same_vocab(a.identity, b.identity)
  with pytest.raises(ValueError, match="tokenizers differ"):  # same strings, another order
    check_same_vocab(a.identity, _tiny(["<s>", "b", "a", "ab"]).identity)


def test_bad_merges():
  with pytest.raises(ValueError, match="invalid BPE merge 'a b'"):
    Tokenizer(["a", "b"], ["a b"], [1, 1], bos_id=0, eos_id=0)
  with pytest.raises(ValueError, match="duplicate token"):
    Tokenizer(["a", "a"], [], [1, 1], bos_id=0, eos_id=0)


def test_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="GGUF file not found"):
    Tokenizer.from_gguf(tmp_path / "missing.gguf")
