"""The 'chat' corpus: the target's own answers to varied instructions, generated once.

EAGLE-3 trains its draft on the target's own responses to chat prompts; users of an
instruct model send it instructions, so that is the text a shipped draft must know.
Offline we have the target: each instruction (a list shipped in the repository,
`configs/prompts/train_instructions.json`) goes through the tokenizer's chat template
(ChatML for SmolLM2) and the target answers it with our own batched
`autoregressive_generate`, `samples` times at temperature `temperature` (top-p
optional). Sample s of instruction i is decoded with row id r = i * MAX_SAMPLES + s and
the one recorded `seed`, so its answer depends only on (seed, i, s, the instruction, the
settings) — never on the batch it ran in, the batch size or the number of samples.

A document is one instruction: for each sample, prompt tokens (chat template +
instruction) then response tokens, ending in EOS. Training uses the whole sequence: the
feature cache takes spans of the concatenated corpus with a loss at every position, the
instruction is user text of the kind the draft later sees in prompts, and the ChatML
scaffolding is a few tokens per document. Held-out data is split by instruction (all
samples of one instruction on one side), as the other corpora split by document.

The answers are cached under `cache_dir/chat-<16 hex of the identity>/`: `meta.json`
(the identity: target, tokenizer, instructions, max_new_tokens, temperature, top-p,
seed) and one `batch_<first row>.json` per finished batch, each written atomically.
Samples are generated sample-major (every instruction's sample 0, then sample 1, ...).
A killed generation keeps every finished batch and generates only the missing answers
when run again, with identical output; raising `samples` later adds answers to the same
cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any, Callable, Sequence

import numpy as np

from specdec_jax.io.atomic import atomic_write_json
from specdec_jax.models.model import ModelConfig

INSTRUCTIONS = "configs/prompts/train_instructions.json"
MAX_SAMPLES = 1024  # samples per instruction; row id = instruction * MAX_SAMPLES + sample
_ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_instructions(path: str | os.PathLike = INSTRUCTIONS) -> list[str]:
  """The instruction strings of a JSON file {'instructions': [str, ...], ...}.

  A relative path is tried from the working directory, then from the repository root.
  Raises ValueError naming the file if it holds no list of distinct non-empty strings.
  """
  path = pathlib.Path(path)
  if not path.is_absolute() and not path.exists():
    path = _ROOT / path
  if not path.exists():
    raise FileNotFoundError(f"instruction file {path} not found")
  try:
    items = json.loads(path.read_text("utf-8"))["instructions"]
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{path} is not a JSON object with an 'instructions' list ({e})") from None
  if not isinstance(items, list) or not items:
    raise ValueError(f"{path}: 'instructions' must be a non-empty list")
  for i, text in enumerate(items):
    if not isinstance(text, str) or not text.strip():
      raise ValueError(f"{path}: instruction {i} must be a non-empty string, got {text!r}")
  if len(set(items)) != len(items):
    dup = next(t for t in items if items.count(t) > 1)
    raise ValueError(f"{path}: instruction {dup[:60]!r} appears twice")
  return items


def generate_chat_corpus(cache_dir: str | os.PathLike, instructions: Sequence[str], *,
                         tokenizer, samples: int = 1, **settings) -> dict[str, np.ndarray]:
  """{'chat-<i>': int32 tokens of instruction i's samples} (see the module docstring),
  generating (or resuming, or reusing) the cached answers (`generate_answers`)."""
  answers, prompts = generate_answers(cache_dir, instructions, tokenizer=tokenizer,
                                      samples=samples, **settings)
  return _documents(answers, prompts, samples, tokenizer.eos_id)


def generate_answers(cache_dir: str | os.PathLike, instructions: Sequence[str], *,
                     tokenizer, target_params, target_config: ModelConfig,
                     target_identity: str, samples: int = 1, max_new_tokens: int = 256,
                     batch_size: int = 16, temperature: float = 0.7, top_p: float = 1.0,
                     seed: int = 0, log: Callable[[str], None] = print
                     ) -> tuple[dict[tuple[int, int], list[int]], list[list[int]]]:
  """({(sample, instruction): the target's answer tokens}, each instruction's prompt
  tokens): the cached answers, generating (or resuming) the missing ones."""
  from specdec_jax.models.sampling import SamplingConfig
  from specdec_jax.decoding.loop import autoregressive_generate
  from specdec_jax.decoding.spec import DecodeSpec
  from specdec_jax.models.model import Model
  for name, value in (("samples", samples), ("max_new_tokens", max_new_tokens),
                      ("batch_size", batch_size)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"chat {name} must be an int >= 1, got {value!r}")
  if samples > MAX_SAMPLES:
    raise ValueError(f"chat samples must be <= {MAX_SAMPLES}, got {samples}")
  sampling = SamplingConfig(temperature=float(temperature), top_p=float(top_p))
  instructions = list(instructions)
  identity = {
      "target": str(target_identity), "tokenizer": str(tokenizer.identity),
      "instructions_sha256": hashlib.sha256(
          json.dumps(instructions, ensure_ascii=False).encode("utf-8")).hexdigest(),
      "num_instructions": len(instructions), "max_new_tokens": max_new_tokens,
      "temperature": float(temperature), "top_p": float(top_p), "seed": int(seed)}
  directory = pathlib.Path(cache_dir) / f"chat-{_sha16(identity)}"
  directory.mkdir(parents=True, exist_ok=True)
  meta_path = directory / "meta.json"
  if meta_path.exists():
    try:
      saved = json.loads(meta_path.read_text("utf-8"))["identity"]
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"chat corpus file {meta_path} is unreadable ({e}); delete "
                       f"{directory} to regenerate it") from None
    if saved != identity:
      raise ValueError(f"chat corpus {directory} was generated with other settings; "
                       "delete it to regenerate")
  else:
    atomic_write_json(meta_path, {"identity": identity}, sort_keys=True)

  prompts = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": t}]))
             for t in instructions]
  answers = _read_answers(directory)
  todo = [(s, i) for s in range(samples) for i in range(len(instructions))
          if (s, i) not in answers]
  if todo:
    from tqdm import tqdm
    if answers:
      log(f"chat corpus: {len(answers)} answers cached, generating {len(todo)} ({directory})")
    with tqdm(total=len(todo), desc="chat corpus", unit="answer", dynamic_ncols=True) as bar:
      for k in range(0, len(todo), batch_size):
        batch = todo[k:k + batch_size]
        rows = [i * MAX_SAMPLES + s for s, i in batch]
        result = autoregressive_generate(
            Model(target_config, target_params), [prompts[i] for _, i in batch],
            spec=DecodeSpec(max_new_tokens, sampling=sampling, eos_id=tokenizer.eos_id,
                            vocab_size=tokenizer.vocab_size),
            seed=int(seed), row_ids=np.asarray(rows), pad_id=tokenizer.pad_id)
        records = [{"row": r, "instruction": i, "sample": s, "response": result.row(b)}
                   for b, (r, (s, i)) in enumerate(zip(rows, batch))]
        atomic_write_json(directory / f"batch_{rows[0]:09d}.json", {"rows": records})
        answers |= {(s, i): rec["response"] for (s, i), rec in zip(batch, records)}
        bar.update(len(batch))
        bar.set_postfix(tokens=sum(len(r["response"]) for r in records))
  return {k: v for k, v in answers.items() if k[0] < samples}, prompts


def _read_answers(directory: pathlib.Path) -> dict[tuple[int, int], list[int]]:
  """{(sample, instruction): response tokens} of every batch file in `directory`."""
  answers = {}
  for path in sorted(directory.glob("batch_*.json")):
    try:
      for r in json.loads(path.read_text("utf-8"))["rows"]:
        answers[int(r["sample"]), int(r["instruction"])] = [int(t) for t in r["response"]]
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"chat corpus file {path} is unreadable ({e}); delete it to "
                       "regenerate its answers") from None
  return answers


def _documents(answers, prompts, samples: int, eos_id: int) -> dict[str, np.ndarray]:
  num_instructions = len(prompts)
  docs = {}
  for i in range(num_instructions):
    pieces = []
    for s in range(samples):
      response = answers[s, i]
      if not response or response[-1] != eos_id:  # cut at max_new_tokens: end it
        response = response + [eos_id]
      pieces += [prompts[i], response]
    docs[f"chat-{i:04d}"] = np.concatenate(pieces).astype(np.int32)
  return docs


def _sha16(obj: Any) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]
