r"""Acceptance against γ for SmolLM2-135M: the feature draft beside the independent one.

  PYTHONPATH=. .venv/bin/python scripts/sweep.py --config=configs/sweep_smollm2.py \
      --workdir=runs/sweep_smollm2

Prompts are 32 windows of 32 tokens from held-out documents (16 Bible books, 16
Shakespeare plays: the split of distillation), each continued for 48 tokens, for
γ = 1..4 at T = 0 and 1. All 32 rows run as one batch (a row's tokens do not depend on
its batch: tests/test_speculative.py), so acceptance is per window and the sweep
prints α with the half-width of its 95% interval over the windows; `repeats = 0` times
nothing (batch-1 speed-ups come from scripts/benchmark.py). The feature draft is the
shipped one (drafts/, `make distill`); the independent one is made by
`python scripts/run.py --config.draft=saved:artifacts/smollm2_draft
--distill_config=configs/distill_make_run.py`; drop one from c.drafts if it is missing.
Figures: docs/results.md#sweep (`python scripts/measure_results.py --only=sweep` measures
them again).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # Models (loading.py specs).
  c.tokenizer = "smollm2"
  c.target = "smollm2"
  c.target_model = ml_collections.ConfigDict()  # dims, for 'random_tiny' only
  c.drafts = (("feature", "saved:drafts/smollm2_feature_v1"),
              ("model", "saved:artifacts/smollm2_draft"))
  c.draft_model = ml_collections.ConfigDict(dict(  # dims of a 'random' draft
      num_layers=2, embed_dim=256, mlp_dim=768, num_heads=4, num_kv_heads=2, head_dim=64,
      tie_embeddings=False))
  c.dtype = "float32"  # bfloat16 is far slower on XLA:CPU (docs/background.md#cpu)
  c.max_seq_len = 256
  c.unstacked = True  # per-layer params: faster per token on CPU
  # Prompts: held-out text windows, no chat template (the draft is distilled on raw text).
  c.prompt_source = "heldout:bible+shakespeare"
  c.prompts = ()
  # A prompt-set JSON (specdec_jax.bench.prompt_sets), e.g. configs/prompts/heldout.json: replaces
  # the windows above and adds α (and, with repeats > 0, speedup at batch 1) per domain.
  c.prompt_set = ""
  c.chat = False
  c.num_prompts = 32
  c.prompt_tokens = 32
  c.heldout_fraction = 0.1  # as configs/distill_smollm2.py
  c.split_seed = 0
  # Grid.
  c.gammas = (1, 2, 3, 4)
  c.temperatures = (0.0, 1.0)
  c.verifier = "block"  # 'block' | 'token' (decoding.spec.VERIFIERS)
  c.top_k = 0
  c.top_p = 1.0
  c.max_new_tokens = 48
  c.stop_at_eos = False
  c.grid_batch = 0  # rows per generate call: 0 = all prompts in one call
  c.seed = 0
  c.repeats = 0  # timed rounds per cell; 0 = acceptance only
  c.cost_repeats = 20
  # Batch study.
  c.batch_sizes = ()  # () = no batch study
  c.batch_draft = ""  # a name in c.drafts; '' = the first
  c.batch_gamma = 4
  c.batch_temperature = 1.0
  c.plots = False
  return c
