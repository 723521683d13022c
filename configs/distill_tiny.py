r"""Tiny distillation for tests and smoke runs: a random byte-level target, a 1-layer draft.

  PYTHONPATH=. .venv/bin/python scripts/distill.py --config=configs/distill_tiny.py \
      --workdir=runs/distill_tiny

`report.json` (held-out α before and after) and the draft land in the workdir;
tests/test_distill.py checks that a run like this one raises α. The target is random (no
download): a 2-layer d=64 model over UTF-8 bytes whose final norm is scaled by
`logit_scale`, so its next-byte distributions are peaked (entropy ~3 nats) and depend
mostly on the current byte, which a 1-layer draft learns quickly.

`scripts/train.py --config=configs/distill_tiny.py` trains `target_model` and `draft`
from scratch on the corpus instead (cross-entropy, `pretrain` settings).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # Target, tokenizer and draft.
  c.target = "random_tiny"  # 'smollm2' | '<path>.gguf' | 'saved:<dir>' | 'random_tiny'
  c.tokenizer = "bytes"  # 'bytes' | 'smollm2' | '<path>.gguf'
  c.target_model = ml_collections.ConfigDict(dict(
      num_layers=2, embed_dim=64, mlp_dim=128, num_heads=4, num_kv_heads=2, head_dim=16,
      max_seq_len=256, seed=1, logit_scale=6.0))
  c.draft = ml_collections.ConfigDict(dict(
      num_layers=1, embed_dim=32, mlp_dim=64, num_heads=2, num_kv_heads=1, head_dim=16,
      max_seq_len=256, tie_embeddings=False,
      feature_layers=()))  # target layer ids: a feature draft (EAGLE-3); () = independent
  c.unroll = 1  # feature drafts: training-time-test passes (draft.feature_layers set)
  c.feature_cache_windows = 0  # feature drafts: cached target windows of seq_len tokens
  c.draft_init = "random"  # 'random' | 'svd' | 'copy' | 'saved:<dir>'
  # Objective.
  c.loss = "fkl"  # 'fkl' | 'rkl' | 'jsd' | 'tvd'
  c.temperature = 1.0  # decode temperature; 0 = greedy
  c.greedy_temperature = 1.0  # softening used at temperature 0
  c.on_policy_fraction = 0.5  # fraction of steps on draft samples (DistillSpec)
  c.prompt_len = 16  # on-policy prompt; the draft samples seq_len - prompt_len tokens
  # Optimisation.
  c.steps = 60
  c.batch_size = 8
  c.seq_len = 32
  c.lr = 1e-2
  c.warmup = 10
  c.clip = 1.0
  c.weight_decay = 0.0
  # Loop, checkpoints, evaluation.
  c.checkpoint_every = 20
  c.keep = 2
  c.eval_every = 30
  c.log_every = 10
  c.eval_windows = 16
  c.eval_batch_size = 8
  c.stop_after = 0  # > 0: SIGKILL this process right after step stop_after (crash tests)
  c.seed = 0
  c.mesh = ""  # '' = one device; 'data,model' = a sharded mesh (specdec_jax.models.sharding)
  c.distributed = ""  # '' | 'auto' | 'host:port,num_processes,process_id' (jax.distributed)
  # Data.
  c.corpora = ("shakespeare",)
  c.heldout_fraction = 0.1
  c.split_seed = 0
  c.cache_dir = "data_cache"
  # scripts/train.py (cross-entropy from scratch).
  c.pretrain = ml_collections.ConfigDict(dict(
      steps=200, lr=3e-3, warmup=20, batch_size=16, seq_len=64))
  return c
