r"""Soak: long generation must compile once and hold its memory flat.

  python scripts/soak.py --config=configs/tiny.py --steps=1000 [--out=FILE.json]
  python scripts/soak.py --config=configs/smollm2_135m.py --tokens=2000

Calls `speculative_generate` again and again on prompts of one shape (windows of the
held-out corpus for a real tokenizer; random bytes for the tiny pair) until --steps
speculative steps or --tokens generated tokens, and records after every call the
number of compiled decode loops (`run_steps_jit`'s cache) and the resident memory
(VmRSS). Prints, and writes with --out, the compile count after warm-up and at the
end and the largest drift of resident memory from its value after the first call.
"""

import os
import time

import _bootstrap  # repository root on sys.path; run(main)
import numpy as np
from absl import flags, logging
from ml_collections import config_flags

from specdec_jax import config_proposer
from specdec_jax.gamma import adaptive
from specdec_jax.decoding import loop
from specdec_jax.decoding.spec import AutoGamma, DecodeSpec
from specdec_jax.io.atomic import atomic_write_json
from specdec_jax.io.machine import machine_stamp
from specdec_jax.loading import load_pair

CONFIG_FAMILY = "run"  # the config fields this script reads (scripts/_bootstrap.py)
CONFIG_READS = (
    "tokenizer", "target", "target_model", "draft", "feature_draft", "draft_model",
    "draft_head_tokens", "draft_head_size", "dtype",
    "max_seq_len", "unstacked", "chat", "prompts", "gamma", "gamma_max", "gamma_prior", "costs",
    "verifier", "tree", "tree_rule", "temperature", "top_k", "top_p", "max_new_tokens",
    "batch_size", "seed"
)
_CONFIG = config_flags.DEFINE_config_file("config", None, "a configs/*.py file", lock_config=True)
_STEPS = flags.DEFINE_integer("steps", 0, "stop after this many speculative steps (0: --tokens)")
_TOKENS = flags.DEFINE_integer("tokens", 0, "stop after this many generated tokens")
_PROMPT_TOKENS = flags.DEFINE_integer("prompt_tokens", 24, "tokens per prompt")
_OUT = flags.DEFINE_string("out", None, "write the record as JSON here")


def resident_bytes() -> int:
  """This process's resident set (VmRSS), in bytes."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) * 1024
  raise RuntimeError("no VmRSS in /proc/self/status")


def prompt_windows(pair, num: int, length: int, seed: int) -> list[list[int]]:
  """num prompts of exactly `length` tokens: held-out text, or random ids for 'bytes'."""
  rng = np.random.default_rng(seed)
  if getattr(pair.tokenizer, "identity", "") == "bytes-v1":
    return rng.integers(32, 127, size=(num, length)).tolist()
  from specdec_jax.bench.sweep import heldout_prompts
  return heldout_prompts(pair.tokenizer, "bible", num=num, prompt_tokens=length, seed=seed)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  if (_STEPS.value > 0) == (_TOKENS.value > 0):
    raise ValueError(f"give exactly one of --steps and --tokens, got {_STEPS.value} and "
                     f"{_TOKENS.value}")
  pair = load_pair(config)
  if pair.draft_config is None:
    raise ValueError("soak needs a draft: set --config.draft")
  batch = len(pair.prompts)
  prompts = prompt_windows(pair, 64 * batch, _PROMPT_TOKENS.value, config.seed)
  proposer = config_proposer.config_proposer(  # gamma 'auto': this machine's cost table
      config, pair, directory=_bootstrap.COSTS_DIR)
  if isinstance(proposer, config_proposer.PlainDecoding):
    print(proposer.line + "; the soak runs gamma 'auto' anyway (plain steps)")
    gamma_max = int(config.get("gamma_max", adaptive.DEFAULT_GAMMA_MAX))
    proposer = AutoGamma(proposer.table, gamma_max, config_proposer.config_rule(config))
  spec = DecodeSpec(config.max_new_tokens, proposer, sampling=pair.sampling,
                    verifier=pair.verifier, vocab_size=pair.vocab_size)
  record, steps, tokens, call = [], 0, 0, 0
  clock = time.perf_counter()
  while (steps < _STEPS.value) if _STEPS.value else (tokens < _TOKENS.value):
    rows = [prompts[(call * batch + b) % len(prompts)] for b in range(batch)]
    out = loop.speculative_generate(pair.target, pair.draft, rows, spec=spec, seed=call)
    steps += int(out.steps_per_row.max())
    tokens += int(out.lengths.sum())
    call += 1
    record.append(dict(call=call, steps=steps, tokens=tokens, rss=resident_bytes(),
                       compiled=loop.run_steps_jit._cache_size()))
  rss = np.array([r["rss"] for r in record])
  drift = float(np.max(np.abs(rss - rss[0])) / rss[0])
  summary = dict(calls=call, steps=steps, tokens=tokens, seconds=time.perf_counter() - clock,
                 compiled_after_first_call=record[0]["compiled"],
                 compiled_at_end=record[-1]["compiled"],
                 rss_after_first_call_mb=rss[0] / 2**20, rss_at_end_mb=rss[-1] / 2**20,
                 rss_max_drift=drift, acceptance=float(out.acceptance_rate()))
  print(f"soak {config.target} + {config.draft}: {call} calls, {steps} speculative steps, "
        f"{tokens} tokens in {summary['seconds']:.0f} s; decode loops compiled "
        f"{summary['compiled_after_first_call']} after the first call, "
        f"{summary['compiled_at_end']} at the end; resident memory "
        f"{summary['rss_after_first_call_mb']:.0f} -> {summary['rss_at_end_mb']:.0f} MB "
        f"(largest drift {100 * drift:.2f}%)")
  if _OUT.value:
    atomic_write_json(_OUT.value, dict(stamp=machine_stamp(), summary=summary, record=record,
                                       config=config.to_dict()),
                      default=str)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  _bootstrap.run(main)
