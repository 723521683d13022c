r"""Trains small target/draft models from scratch on the corpus (next-token cross-entropy).

  PYTHONPATH=. .venv/bin/python scripts/train.py --config=configs/distill_tiny.py \
      --workdir=runs/pretrain_tiny [--models=target,draft]

Uses config.target_model and config.draft for the shapes, config.pretrain for steps,
learning rate, batch and window, and the same checkpointing as scripts/distill.py
(resumes from workdir/<model>/checkpoints). Each finished model is saved to
workdir/<model>/model, usable as `--config.target=saved:<dir>` or
`--config.draft_init=saved:<dir>` of a distillation run; workdir/pretrain_report.json
holds held-out perplexities and timings.
"""

import json

import _bootstrap  # repository root on sys.path; run(main)
from absl import app, flags, logging
from ml_collections import config_flags

from specdec_jax import distill

CONFIG_FAMILY = "distill"  # the config fields this script reads (scripts/_bootstrap.py)
CONFIG_READS = (
    "tokenizer", "target", "seed", "mesh", "distributed", "chat", "target_model", "draft",
    "lr", "warmup", "steps", "batch_size", "eval_batch_size", "eval_windows", "seq_len",
    "temperature", "clip", "weight_decay", "checkpoint_every", "keep", "eval_every",
    "log_every", "heldout_fraction", "stop_after", "corpora", "split_seed", "cache_dir",
    "pretrain", "stdlib_max_chars"
)
_CONFIG = config_flags.DEFINE_config_file("config", None, "A configs/distill_*.py file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, models and report go here.")
_MODELS = flags.DEFINE_list("models", ["target", "draft"], "Which of target, draft to train.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  bad = set(_MODELS.value) - {"target", "draft"}
  if bad:
    raise app.UsageError(f"--models takes target and/or draft, got {sorted(bad)}")
  report = distill.run_pretraining(_CONFIG.value, _WORKDIR.value, models=tuple(_MODELS.value))
  summary = {name: {k: r[k] for k in ("heldout", "steps", "training_time_s", "model_dir")}
             for name, r in report["models"].items()}
  print(json.dumps(summary, indent=1), flush=True)


if __name__ == "__main__":
  _bootstrap.run(main)
