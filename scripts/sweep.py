r"""Acceptance and speed against γ over drafts, temperatures and batch sizes.

  PYTHONPATH=. .venv/bin/python scripts/sweep.py --config=configs/sweep_tiny.py --workdir=DIR
  PYTHONPATH=. .venv/bin/python scripts/sweep.py --config=configs/sweep_smollm2.py \
      --workdir=runs/sweep_smollm2
  PYTHONPATH=. .venv/bin/python scripts/sweep.py --config=configs/sweep_smollm2.py \
      --config.prompt_set=configs/prompts/heldout.json --workdir=runs/sweep_heldout

Writes DIR/results.csv (deterministic: byte-identical for the same config, seed and
code), DIR/results_timing.csv, batch.csv, batch_timing.csv, best_gamma.csv,
results.json and the plots tokens_per_step.png, speedup.png, accept_by_position.png
(see specdec_jax/bench/sweep.py). Prints the grid as a table and the wall time. With
--config.prompt_set, also a table per cell of α and speedup per domain and overall,
each with its 95% interval over prompts (results.json "domains" and "per_prompt").
"""

import time

import _bootstrap  # repository root on sys.path; run(main)
from absl import flags, logging
from ml_collections import config_flags

from specdec_jax.bench import sweep, sweep_tables

CONFIG_FAMILY = "sweep"  # the config fields this script reads (scripts/_bootstrap.py)
CONFIG_READS = "*"
_CONFIG = config_flags.DEFINE_config_file("config", None, "a configs/sweep_*.py file",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "output directory")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint read at INFO
  t0 = time.perf_counter()
  results = sweep.run_sweep(_CONFIG.value, _WORKDIR.value)
  print(sweep_tables.summary_table(results["grid"]))
  if "domains" in results:
    print(sweep_tables.domain_tables(results["domains"]))
  for row in results["batch"]:
    print(f"batch {row['batch']:>2}: speedup {row['time_speedup']:.2f}x  "
          f"SD {row['time_sd_tokens_per_s']:.0f} tok/s  AR {row['time_ar_tokens_per_s']:.0f} "
          f"tok/s  idle row-steps {row['idle_fraction']:.3f}  tokens/step per row "
          f"{row['tokens_per_row_step']:.2f} vs per loop step {row['tokens_per_loop_step']:.2f}")
  for row in results["best_gamma"]:
    print(f"best γ {row['draft_name']} T={row['temperature']:g}: measured "
          f"{row['time_best_gamma_measured']} ({row['time_best_speedup_measured']:.2f}x), "
          f"predicted {row['time_best_gamma_predicted']} "
          f"({row['time_best_speedup_predicted']:.2f}x)")
  print(f"wrote {_WORKDIR.value}; wall time {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  _bootstrap.run(main)
