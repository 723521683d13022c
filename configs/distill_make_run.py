r"""The short distillation `make run` does on a fresh machine when no draft is cached.

  python scripts/run.py   # uses this config only if artifacts/smollm2_draft is missing

configs/distill_smollm2.py cut to fit the 15-minute budget of a first `make run`
(installation included): fewer steps, evaluation only before and after. The draft
it makes accepts less than the full 1200-step one; `scripts/distill.py` with
configs/distill_smollm2.py makes that one (38 minutes on 2 cores). Measured on a fresh
clone: 200 steps took 7 min 24 s for the whole `make run` (held-out alpha 0.32 at
temperature 0; acceptance 0.21 and 0.91x at gamma 2), so this takes 350 steps.
"""

import importlib.util
import os


def get_config():
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distill_smollm2.py")
  spec = importlib.util.spec_from_file_location("distill_smollm2", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  c.steps = 350
  c.warmup = 30
  c.checkpoint_every = 20
  c.eval_every = 1000  # before and after only
  c.eval_windows = 32
  return c
