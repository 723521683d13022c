r"""Acceptance and speed against γ for SmolLM2-135M: distilled draft vs truncated target.

  PYTHONPATH=. .venv/bin/python scripts/sweep.py --config=configs/sweep_smollm2.py \
      --workdir=runs/sweep_smollm2
  # before the distilled draft exists (it is made by `make run` / scripts/distill.py):
  PYTHONPATH=. .venv/bin/python scripts/sweep.py --config=configs/sweep_smollm2.py \
      --workdir=runs/sweep_smollm2 --config.drafts="(('trunc2', 'truncate:2'),)"

Prompts are 2 windows of 32 tokens from held-out Shakespeare plays (the split of
distillation), continued for 48 tokens at batch 1, γ = 1..8, T = 0, 0.7, 1.
Expected: 25-30 minutes on 2 CPU cores (48 cells of 20-45 s: a ~12 s compile,
then 3 interleaved timed calls per sampler; c and v(k) measured once, ~1 min;
batch study ~3 min). The 2-layer truncation (undistilled, keeps the target's
576x49152 head: c ≈ 0.2) has α < 0.1 and is slower than plain decoding at every
γ; REFERENCE.md §2 predicts 1.3-1.7x for a distilled draft with α = 0.5-0.7
(best γ 2-4). Compare results.csv's alpha and tokens_per_step columns with those.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # Models (loading.py specs).
  c.tokenizer = "smollm2"
  c.target = "smollm2"
  c.target_model = ml_collections.ConfigDict()  # dims, for 'random_tiny' only
  c.drafts = (("distilled", "saved:artifacts/smollm2_draft"), ("trunc2", "truncate:2"))
  c.draft_model = ml_collections.ConfigDict(dict(  # dims of a 'random' draft
      num_layers=2, embed_dim=256, mlp_dim=768, num_heads=4, num_kv_heads=2, head_dim=64,
      tie_embeddings=False))
  c.dtype = "float32"  # bfloat16 is 7.5x slower on XLA:CPU (REFERENCE.md §2)
  c.max_seq_len = 256
  c.unstacked = True  # per-layer params: faster per token on CPU
  # Prompts: held-out text windows, no chat template (the draft is distilled on raw text).
  c.prompt_source = "heldout:shakespeare"
  c.prompts = ()
  c.chat = False
  c.num_prompts = 2
  c.prompt_tokens = 32
  c.heldout_fraction = 0.1  # as configs/distill_smollm2.py
  c.split_seed = 0
  # Grid.
  c.gammas = (1, 2, 3, 4, 5, 6, 7, 8)
  c.temperatures = (0.0, 0.7, 1.0)
  c.top_k = 0
  c.top_p = 1.0
  c.max_new_tokens = 48
  c.stop_at_eos = False
  c.grid_batch = 1  # rows per generate call: batch 1, the prompts one after another
  c.seed = 0
  c.repeats = 3
  c.cost_repeats = 20
  # Batch study.
  c.batch_sizes = (1, 4, 16)
  c.batch_draft = ""  # a name in c.drafts; '' = the first
  c.batch_gamma = 4
  c.batch_temperature = 1.0
  c.plots = True
  return c
