r"""Distills a draft toward a target; resumes from the latest checkpoint in --workdir.

  PYTHONPATH=. .venv/bin/python scripts/distill.py --config=configs/distill_smollm2.py \
      --workdir=runs/distill_smollm2 [--config.loss=tvd --config.temperature=0]

Writes workdir/checkpoints/ (orbax, every config.checkpoint_every steps),
workdir/draft/ (the finished draft, `specdec_jax.io.checkpoint.load_params`) and
workdir/report.json (held-out alpha before/after, losses, timing, seeds, config).

Sharded over a mesh, on one host or several (each process runs the same command with
its own id; every process writes its shards of each checkpoint):

  python scripts/distill.py --config=configs/distill_tiny.py --workdir=runs/t \
      --config.mesh=2,2 --config.distributed=HOST:PORT,2,<process id>
"""

import json

import _bootstrap  # repository root on sys.path; run(main)
import jax
from absl import flags, logging
from ml_collections import config_flags

from specdec_jax import distill

from specdec_jax.models import sharding

CONFIG_FAMILY = "distill"  # the config fields this script reads (scripts/_bootstrap.py)
CONFIG_READS = "*"
_CONFIG = config_flags.DEFINE_config_file("config", None, "A configs/distill_*.py file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, draft and report go here.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  sharding.initialize_distributed(_CONFIG.value.get("distributed", ""))  # before other JAX work
  report = distill.run_distillation(_CONFIG.value, _WORKDIR.value)
  if jax.process_index() != 0:
    return
  summary = {k: report[k] for k in ("alpha_before", "alpha_after", "training_time_s", "steps",
                                    "draft_dir")}
  print(json.dumps(summary, indent=1), flush=True)


if __name__ == "__main__":
  _bootstrap.run(main)
