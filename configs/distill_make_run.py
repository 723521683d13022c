r"""The short distillation `make run` does on a fresh machine when no draft is cached.

  python scripts/run.py   # uses this config only if artifacts/smollm2_draft is missing

configs/distill_smollm2.py cut to fit the 15-minute budget of a first `make run`
(installation included): fewer steps, evaluation only before and after. The draft
it makes accepts less than the full 600-step one; `scripts/distill.py` with
configs/distill_smollm2.py makes that one (about 40 minutes on 2 cores).
"""

import importlib.util
import os


def get_config():
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distill_smollm2.py")
  spec = importlib.util.spec_from_file_location("distill_smollm2", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  c.steps = 200
  c.warmup = 25
  c.checkpoint_every = 20
  c.eval_every = 1000  # before and after only
  c.eval_windows = 32
  return c
