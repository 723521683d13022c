r"""The short feature-draft distillation `make run` does on a fresh machine.

  python scripts/run.py   # uses this config only if artifacts/smollm2_feature_draft is missing

configs/distill_feature_smollm2.py cut to fit the 15-minute budget of a first `make run`
(installation included): a smaller cache of target outputs, fewer steps, evaluation only
before and after. docs/results.md (`make run` on a fresh clone) gives its measured time
and speed-up.
"""

# The repository root is on sys.path (scripts/_bootstrap.py, the Makefile's PYTHONPATH).
from configs import distill_feature_smollm2


def get_config():
  c = distill_feature_smollm2.get_config()
  c.feature_cache_windows = 256  # 32,768 target tokens
  c.steps = 160
  c.warmup = 20
  c.checkpoint_every = 20
  c.eval_every = 100000  # before and after only
  c.eval_windows = 16
  return c
