r"""A short feature-draft distillation, for a first run of scripts/run.py with a draft of one's own.

  python scripts/run.py --config.draft=saved:artifacts/smollm2_feature_draft
  python scripts/run.py --config.feature_draft=saved:artifacts/smollm2_feature_draft

scripts/run.py distils with this config (its default --distill_config) when the draft it
is given is a missing 'saved:<dir>' outside drafts/: the first command uses the new draft
alone, the second inside the hybrid. `make run` itself distils nothing: its feature draft
is the shipped one in drafts/ (configs/smollm2_135m.py). This is
configs/distill_feature_smollm2.py cut to fit a 15-minute first run (installation
included): a smaller cache of target outputs, fewer steps, evaluation only before and
after.

Figures, from when `make run` still distilled this draft: docs/results_archive.md#fresh-clone-a
and #feature-drafts (held-out α, time, speedup).
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
