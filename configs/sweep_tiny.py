r"""Acceptance and speed against γ on the tiny random pair: the fast, reproducible sweep.

  PYTHONPATH=. .venv/bin/python scripts/sweep.py --config=configs/sweep_tiny.py \
      --workdir=runs/sweep_tiny_A
  PYTHONPATH=. .venv/bin/python scripts/sweep.py --config=configs/sweep_tiny.py \
      --workdir=runs/sweep_tiny_B
  cmp runs/sweep_tiny_A/results.csv runs/sweep_tiny_B/results.csv   # identical
  # (timings are written elsewhere; tests/test_sweep.py checks it under make test-all)

Most of the run is XLA compiles, one per cell. The target is configs/tiny.py's random
4-layer model; its own first layer (truncate:1) and first two layers (truncate:2) draft.
Per cell the sweep writes α, tokens per step beside the prediction (1 - α^(γ+1)) / (1 - α)
(a little below it at large γ, where the last step is cut at max_new_tokens) and speed.
On a model this small the loop's fixed work, not the models, sets the speed
(docs/results.md#tiny; docs/results_archive.md#tiny-pair): the point of this config is
the machinery, not the speed. No figure of this sweep is kept.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # Models (loading.py specs).
  c.tokenizer = "bytes"
  c.target = "random_tiny"
  c.target_model = ml_collections.ConfigDict(dict(
      num_layers=4, embed_dim=128, mlp_dim=384, num_heads=4, num_kv_heads=2, head_dim=32,
      seed=1, logit_scale=4.0))
  c.drafts = (("trunc1", "truncate:1"), ("trunc2", "truncate:2"))  # (name, spec) pairs
  c.draft_model = ml_collections.ConfigDict(dict(  # dims of a 'random' draft
      num_layers=1, embed_dim=64, mlp_dim=128, num_heads=2, num_kv_heads=1, head_dim=32))
  c.dtype = "float32"
  c.max_seq_len = 256
  c.unstacked = False  # stacked layers compile faster; compiles dominate this sweep
  # Prompts: 'config' (c.prompts) or 'heldout:<corpus>' (c.num_prompts windows of
  # c.prompt_tokens tokens from held-out documents, split as distillation splits).
  c.prompt_source = "config"
  c.prompts = ("The quick brown fox", "jumps over", "the lazy dog.", "Lorem ipsum")
  c.prompt_set = ""  # a prompt-set JSON (prompt_sets): replaces the prompts above; '' = off
  c.chat = False
  c.num_prompts = 4
  c.prompt_tokens = 32
  c.heldout_fraction = 0.1
  c.split_seed = 0
  # Grid.
  c.gammas = (1, 2, 4)
  c.temperatures = (0.0, 0.7, 1.0)
  c.verifier = "block"  # 'block' | 'token' (decoding.spec.VERIFIERS)
  c.top_k = 0
  c.top_p = 1.0
  c.max_new_tokens = 32
  c.stop_at_eos = False  # True: rows stop at the tokenizer's EOS
  c.grid_batch = 0  # rows per generate call; 0 = all prompts in one call
  c.seed = 0
  c.repeats = 3  # timed calls per sampler per cell (median)
  c.cost_repeats = 10  # timed forwards per point of c and v(k)
  # Batch study (batch 4 here equals the grid's call: no extra compile).
  c.batch_sizes = (1, 4, 16)
  c.batch_draft = "trunc2"  # a name in c.drafts; '' = the first
  c.batch_gamma = 4
  c.batch_temperature = 1.0
  c.plots = True
  return c
