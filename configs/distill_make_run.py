r"""A short distillation of the independent draft, for a first run of scripts/run.py with it.

  python scripts/run.py --config.draft=saved:artifacts/smollm2_draft \
      --distill_config=configs/distill_make_run.py   # distils only if that draft is missing

`make run` itself distils nothing: its draft is the hybrid over the shipped feature draft
in drafts/ (configs/smollm2_135m.py). This is configs/distill_smollm2.py cut to fit a
15-minute first run (installation included): fewer steps, evaluation only before and
after. The draft it makes accepts less than the full 1200-step one, which
`scripts/distill.py` with configs/distill_smollm2.py makes.

Figures: docs/results_archive.md#first-run-steps (the 200-step run that set the step
count) and #feature-drafts (this draft's held-out α and time, and a 160-step version
against the feature draft at the same budget).
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
