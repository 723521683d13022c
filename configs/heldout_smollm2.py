r"""SmolLM2-135M on the held-out prompt set: speedup and α per domain, batch 1.

  PYTHONPATH=. .venv/bin/python scripts/benchmark.py --config=configs/heldout_smollm2.py \
      --out=runs/heldout_t0.json
  PYTHONPATH=. .venv/bin/python scripts/benchmark.py --config=configs/heldout_smollm2.py \
      --config.temperature=1 --out=runs/heldout_t1.json

configs/prompts/heldout.json holds 30 prompts, 6 in each domain: modern prose, chat
instructions (sent through the ChatML template), code (Python, SQL, shell), scripture
and drama. All are original text; tests/test_prompt_sets.py checks that none of it
occurs in the distillation corpora or the Python standard library. Each prompt runs
alone, speculative and autoregressive decoding timed side by side (compile excluded,
median of `repeats`); the script prints one line per prompt and a table per domain and
overall: speedup as a geometric mean, α and acceptance as means, each with its 95%
Student-t interval over prompts. Draft, γ, verifier and max_new_tokens are those of
configs/smollm2_135m.py (the hybrid draft; configs/hybrid_smollm2.py runs its parts
alone). Each prompt width compiles both decode loops once, and a first run on a machine
also measures its cost table. Run it alone: other work on the machine skews the timings.

Figures: docs/results.md#heldout (T = 0), #heldout-t1 (T = 1) and #heldout-cpu2 (T = 0 on
a second CPU kind); the rules for choosing γ replayed on the same set: #gamma-rules.
"""

import ml_collections

from configs import smollm2_135m


def get_config() -> ml_collections.ConfigDict:
  c = smollm2_135m.get_config()
  c.prompt_set = "configs/prompts/heldout.json"
  return c
