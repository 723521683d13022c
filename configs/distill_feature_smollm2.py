r"""A feature draft (EAGLE-3 style) for SmolLM2-135M-Instruct, trained on cached target outputs.

  PYTHONPATH=. .venv/bin/python scripts/distill.py \
      --config=configs/distill_feature_smollm2.py --workdir=runs/distill_feature_smollm2

The draft is one decoder layer of the target's shape (d=576), initialised from the
target's last block. At position i it reads the target's embedding of x_i and the
target's residual streams after blocks 4, 16, 29 and 30 at position i-1, each
RMS-normalised and fused by one linear map to 576; its head scores 8192 ids, EOS,
BOS and the 8190 most frequent training tokens, initialised from the target's tied head.
Where the target's features do not exist yet (the 2nd..γ-th drafted token) it reads its
own last hidden state; training unrolls it `unroll` passes that way (training-time test).

One target forward per training window fills a disk cache (workdir/feature_cache:
features and log-probabilities on the head's columns, float16); the draft then trains
several epochs over it (`distill.feature_cache`). Re-running the command resumes the
cache and the checkpoints. Figures (held-out α, time, speedups), with their machine and
commit: docs/results_archive.md#feature-drafts.
"""

# The repository root is on sys.path (scripts/_bootstrap.py, the Makefile's PYTHONPATH).
from configs import distill_smollm2


def get_config():
  c = distill_smollm2.get_config()
  c.draft.update(dict(num_layers=1, embed_dim=576, mlp_dim=1536, num_heads=9, num_kv_heads=3,
                      head_dim=64, head_vocab=8192, feature_layers=(4, 16, 29, 30)))
  c.draft_init = "copy"  # the target's last block, final norm and head columns
  c.on_policy_fraction = 0.0  # teacher-forced on cached target outputs
  c.unroll = 3  # training-time test: passes 2 and 3 read the draft's own hidden states
  c.feature_cache_windows = 1024  # x seq_len 128 = 131,072 target tokens
  c.steps = 750
  c.warmup = 40
  c.lr = 2e-3
  c.weight_decay = 0.0
  c.checkpoint_every = 50
  c.eval_every = 250
  c.eval_windows = 64
  return c
