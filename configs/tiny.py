r"""A tiny random target with its own first layer as draft: the fast smoke-test pair.

  python scripts/benchmark.py --config=configs/tiny.py
  python scripts/generate.py --config=configs/tiny.py --prompt "abc" --json

Random weights produce no sensible text; this config exercises the machinery and
measures the step's compile time and loop overhead in seconds.
Figures: docs/results.md#tiny; docs/results_archive.md#tiny-pair at an earlier commit.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.tokenizer = "bytes"  # UTF-8 bytes, vocabulary 257
  c.target = "random_tiny"
  c.target_model = ml_collections.ConfigDict(dict(
      num_layers=4, embed_dim=128, mlp_dim=384, num_heads=4, num_kv_heads=2, head_dim=32,
      seed=1, logit_scale=4.0))
  c.draft = "truncate:1"
  c.feature_draft = ""  # the feature draft of a 'hybrid:<n>' draft, e.g. 'saved:<dir>'
  c.draft_head_tokens = ""  # a vocabulary-subset draft head (configs/smollm2_135m.py)
  c.draft_head_size = 0
  c.draft_model = ml_collections.ConfigDict(dict(
      num_layers=1, embed_dim=64, mlp_dim=128, num_heads=2, num_kv_heads=1, head_dim=32))
  c.dtype = "float32"
  c.max_seq_len = 512
  c.unstacked = True
  c.chat = False
  c.prompts = ("The quick brown fox", "jumps over", "the lazy dog.", "Lorem ipsum")
  c.prompt_set = ""  # a prompt-set JSON (benchmark: each prompt alone); '' = c.prompts
  c.gamma = "3"  # drafts per step, or 'auto' (per row and step, up to gamma_max)
  c.gamma_max = 3
  c.costs = ""  # gamma 'auto': a pinned cost table file ('' = this machine's, measured)
  c.gamma_prior = 0.0  # gamma 'auto': the draft's prior acceptance (0 = the rule's default)
  c.verifier = "block"  # 'block' (Sun et al. 2025; the default) | 'token' (Leviathan et al.)
  c.tree = ""  # a token tree per step, e.g. '2,2,1' (configs/smollm2_135m.py); '' = a chain
  c.tree_rule = "sampled"  # 'sampled' | 'topk'
  c.temperature = 1.0
  c.top_k = 0
  c.top_p = 1.0
  c.max_new_tokens = 64
  c.batch_size = 4
  c.seed = 0
  c.mesh = ""  # '' = one device; 'data,model' = a sharded mesh (specdec_jax.models.sharding)
  c.distributed = ""  # '' | 'auto' | 'host:port,num_processes,process_id' (jax.distributed)
  c.repeats = 5
  return c
