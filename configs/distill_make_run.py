r"""A short distillation of the independent draft, for a first run of scripts/run.py with it.

  python scripts/run.py --config.draft=saved:artifacts/smollm2_draft \
      --distill_config=configs/distill_make_run.py   # only if that draft is missing

`make run` itself uses the feature draft of configs/distill_feature_make_run.py.
This is configs/distill_smollm2.py cut to fit the 15-minute budget of a first `make run`
(installation included): fewer steps, evaluation only before and after. The draft
it makes accepts less than the full 1200-step one; `scripts/distill.py` with
configs/distill_smollm2.py makes that one (38 minutes on 2 cores). Measured on a fresh
clone: 200 steps took 7 min 24 s for the whole `make run` (held-out alpha 0.32 at
temperature 0; acceptance 0.21 and 0.91x at gamma 2), so this takes 350 steps.
"""

# The repository root is on sys.path (scripts/_bootstrap.py, the Makefile's PYTHONPATH).
from configs import distill_smollm2


def get_config():
  c = distill_smollm2.get_config()
  c.steps = 350
  c.warmup = 30
  c.checkpoint_every = 20
  c.eval_every = 1000  # before and after only
  c.eval_windows = 32
  return c
