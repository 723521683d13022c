r"""α before and after distillation, per loss and per data source, as one table.

  python scripts/distill_table.py --config=configs/distill_smollm2.py --workdir=DIR \
      [--steps=40] [--losses=fkl,rkl,jsd,tvd] [--sources=mix,corpus,on_policy]

Every run starts from the same draft initialisation and seed and differs only in the
loss (with the config's on-policy fraction, 'mix') or in the data source (forward KL
on corpus windows only, or on draft samples only). Writes DIR/table.json (the rows and
the machine stamp) and DIR/table.md; each run's report stays in DIR/<loss>-<source>/report.json.
"""

import pathlib

import _bootstrap  # repository root on sys.path; run(main)
from absl import flags, logging
from ml_collections import config_flags

from specdec_jax import distill
from specdec_jax.io.atomic import atomic_write_json, atomic_write_text
from specdec_jax.io.machine import machine_stamp

CONFIG_FAMILY = "distill"  # the config fields this script reads (scripts/_bootstrap.py)
CONFIG_READS = "*"
_CONFIG = config_flags.DEFINE_config_file("config", None, "A configs/distill_*.py file.",
                                          lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "One sub-folder per run goes here.")
_STEPS = flags.DEFINE_integer("steps", 40, "distillation steps per run")
_LOSSES = flags.DEFINE_list("losses", ["fkl", "rkl", "jsd", "tvd"], "losses (data: mix)")
_SOURCES = flags.DEFINE_list("sources", ["corpus", "on_policy"], "sources (loss: fkl)")
flags.mark_flags_as_required(["config", "workdir"])

_FRACTION = {"corpus": 0.0, "on_policy": 1.0}


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  base = _CONFIG.value
  runs = [(loss, "mix") for loss in _LOSSES.value]
  runs += [("fkl", source) for source in _SOURCES.value]
  rows = []
  for loss, source in runs:
    config = base.copy_and_resolve_references()
    config.loss = loss
    config.steps = _STEPS.value
    config.warmup = min(config.warmup, max(1, _STEPS.value // 5))
    config.eval_every = 10 ** 9  # before and after only
    if source != "mix":
      config.on_policy_fraction = _FRACTION[source]
    report = distill.run_distillation(config, pathlib.Path(_WORKDIR.value) / f"{loss}-{source}")
    rows.append(dict(loss=loss, source=source,
                     on_policy_fraction=config.on_policy_fraction, steps=report["steps"],
                     seed=config.seed, temperature=config.temperature,
                     **{f"before_{k}": v for k, v in report["alpha_before"].items()},
                     **{f"after_{k}": v for k, v in report["alpha_after"].items()},
                     training_time_s=report["training_time_s"]))
  out = pathlib.Path(_WORKDIR.value)
  atomic_write_json(out / "table.json", dict(stamp=machine_stamp(), rows=rows))
  keys = [k for k in rows[0] if k.startswith(("before_", "after_"))]
  lines = ["| loss | data | steps | " + " | ".join(keys) + " | train s |",
           "|" + "---|" * (4 + len(keys))]
  for r in rows:
    lines.append(f"| {r['loss']} | {r['source']} ({r['on_policy_fraction']:g} on-policy) | "
                 f"{r['steps']} | " + " | ".join(f"{r[k]:.3f}" for k in keys)
                 + f" | {r['training_time_s']:.0f} |")
  atomic_write_text(out / "table.md", "\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  _bootstrap.run(main)
