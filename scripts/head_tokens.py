r"""Ranks the target's own tokens for a vocabulary-subset draft head (`io.head_tokens`).

  python scripts/head_tokens.py --config=configs/qwen25_coder.py \
      --out=configs/head_tokens/qwen25_coder.json [--samples=1] [--max_new_tokens=96]

The config's target answers every instruction of configs/prompts/train_instructions.json
(through the tokenizer's chat template: the distillation 'chat' corpus,
`distill.chat_corpus`, cached and resumable under --cache_dir), and the ids of its answers
are counted. The file keeps every id seen, by count, with the tokenizer's special ids
(always kept) and this command; a run config then takes its C most frequent ids with
--config.draft_head_tokens=FILE --config.draft_head_size=C. The instructions share no
text with the held-out prompts (tests/test_chat_corpus.py).
"""

import sys

import _bootstrap  # repository root on sys.path; run(main)
from absl import flags, logging
from ml_collections import config_flags

CONFIG_FAMILY = "run"  # the config fields this script reads (scripts/_bootstrap.py)
CONFIG_READS = ("tokenizer", "target", "target_model", "dtype", "max_seq_len", "unstacked",
                "seed")
_CONFIG = config_flags.DEFINE_config_file("config", None, "a configs/*.py file", lock_config=True)
_OUT = flags.DEFINE_string("out", None, "the head-tokens JSON to write")
_SAMPLES = flags.DEFINE_integer("samples", 1, "answers per instruction")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 96, "tokens per answer at most")
_BATCH = flags.DEFINE_integer("batch_size", 16, "answers generated together")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.7, "the answers' sampling temperature")
_LIMIT = flags.DEFINE_integer("limit", 0, "if > 0: only the first this many instructions")
_CACHE = flags.DEFINE_string("cache_dir", "", "where the answers are cached "
                             "('' = $SPECDEC_CACHE, else ~/.cache/specdec_jax)")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  for name, flag, low in (("samples", _SAMPLES, 1), ("max_new_tokens", _MAX_NEW, 1),
                          ("batch_size", _BATCH, 1), ("limit", _LIMIT, 0)):
    if flag.value < low:
      raise ValueError(f"--{name} must be an int >= {low}, got {flag.value}")
  if _TEMPERATURE.value < 0:
    raise ValueError(f"--temperature must be >= 0, got {_TEMPERATURE.value}")
  config = _CONFIG.value
  from specdec_jax import loading
  from specdec_jax.distill import chat_corpus
  from specdec_jax.io import checkpoint, head_tokens, wheel_parts
  from specdec_jax.io.machine import machine_stamp

  instructions = chat_corpus.load_instructions()
  if _LIMIT.value:
    instructions = instructions[:_LIMIT.value]
  cache = wheel_parts.writable_cache_dir(_CACHE.value or None)
  models = loading.load_models(config, [])
  tokenizer = models.tokenizer
  target_identity = checkpoint.target_identity(models.target_config, models.target_params)
  settings = dict(samples=_SAMPLES.value, max_new_tokens=_MAX_NEW.value,
                  temperature=_TEMPERATURE.value, seed=int(config.seed))
  answers, _ = chat_corpus.generate_answers(
      cache, instructions, tokenizer=tokenizer, target_params=models.target_params,
      target_config=models.target_config, target_identity=target_identity,
      batch_size=_BATCH.value, **settings)
  special = {getattr(tokenizer, name, None) for name in ("eos_id", "bos_id", "pad_id")}
  corpus = dict(instructions=chat_corpus.INSTRUCTIONS, num_instructions=len(instructions),
                chat_template=True, target=str(config.target),
                target_identity=target_identity, **settings)
  record = head_tokens.write(
      _OUT.value, tokens=list(answers.values()), vocab_size=models.target_config.vocab_size,
      tokenizer_identity=tokenizer.identity,
      always=[int(i) for i in special if i is not None and i >= 0], corpus=corpus,
      command=" ".join(["python", "scripts/head_tokens.py"] + sys.argv[1:]),
      stamp=machine_stamp())
  print(f"{record['tokens']} answer tokens, {record['distinct']} distinct ids; wrote "
        f"{_OUT.value}")


if __name__ == "__main__":
  flags.mark_flag_as_required("out")
  flags.mark_flag_as_required("config")
  _bootstrap.run(main)
