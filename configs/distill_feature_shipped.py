r"""The shipped feature draft of SmolLM2-135M-Instruct: trained on text like what users send.

  make distill    # = the two commands below, into runs/distill_feature_shipped

  nice -n 19 python scripts/distill.py --config=configs/distill_feature_shipped.py \
      --workdir=runs/distill_feature_shipped
  python scripts/export_draft.py --workdir=runs/distill_feature_shipped \
      --out=drafts/smollm2_feature_v1 --command="make distill" \
      --report_out=docs/results/distill_shipped.json

The draft is configs/distill_feature_smollm2.py's (one d=576 decoder layer, EAGLE-3
style, reading target layers 4/16/29/30; 8192-token subset head), trained on a mix:

  chat         0.4  the target's own answers to configs/prompts/train_instructions.json
                    through its chat template (237 instructions x 3 samples, T=0.7, seed 0,
                    batch 32, up to 256 new tokens; `distill.chat_corpus`), cached in
                    data_cache/;
  stdlib       0.2  the running Python's standard-library source (2M characters);
  bible        0.2  the World English Bible;
  shakespeare  0.2  Shakespeare's works.

The mix decides the 2048 cached training windows (262,144 target tokens, ~5.5 GB of
float16 under workdir/feature_cache) and the head's 8192 tokens (ranked
by frequency weighted by corpus). Every 300 steps the held-out α of each corpus (32
windows of held-out documents each) is measured at T=0 and T=1 for drafted depths 1-3
(`evaluate(..., depth=3)`); report.json keeps them all (`evals`), the α-vs-steps curve
per domain. The chat documents are trained and measured whole, so chat's held-out α
includes the prompt's tokens (ChatML scaffolding and instruction, ~40 of ~250 per
answer), the scaffolding nearly certain: read it as an upper bound for answers alone.

Figures: docs/results.md#distill (held-out α per corpus against training steps, the
run's time, machine and commit; the file is this run's report.json, which
drafts/smollm2_feature_v1/model.json also records). Re-running the command resumes the
chat corpus, the feature cache and the checkpoints.

`--config=configs/distill_feature_shipped.py:tiny` is the same pipeline at test scale on a
random byte-level target (configs/distill_tiny.py's).
"""

import ml_collections

# The repository root is on sys.path (scripts/_bootstrap.py, the Makefile's PYTHONPATH).
from configs import distill_feature_smollm2, distill_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = distill_feature_smollm2.get_config()
  del c["corpora"]  # a names tuple there; weights here (data.parse_mixture)
  c.corpora = "chat:0.4,stdlib:0.2,bible:0.2,shakespeare:0.2"
  c.chat = ml_collections.ConfigDict(dict(
      instructions="configs/prompts/train_instructions.json", samples=3, max_new_tokens=256,
      batch_size=32, temperature=0.7, top_p=1.0, seed=0, limit=0))  # limit 0: all
  c.stdlib_max_chars = 2_000_000
  c.feature_cache_windows = 2048  # x seq_len 128 = 262,144 target tokens
  c.steps = 1200
  c.warmup = 60
  c.checkpoint_every = 50
  c.eval_every = 300
  c.eval_windows = 32  # per corpus
  c.eval_depth = 3  # α at drafted positions 1..3 (= unroll)
  if arg == "tiny":
    tiny = distill_tiny.get_config()
    for key in ("target", "tokenizer", "target_model", "seq_len", "lr", "log_every",
                "eval_batch_size"):
      c[key] = tiny[key]
    c.draft.update(dict(num_layers=1, embed_dim=64, mlp_dim=128, num_heads=4, num_kv_heads=2,
                        head_dim=16, max_seq_len=256, head_vocab=96, feature_layers=(1, 2)))
    c.chat.update(dict(samples=2, max_new_tokens=24, batch_size=8, limit=12))
    c.stdlib_max_chars = 60_000
    c.heldout_fraction = 0.25
    c.feature_cache_windows = 64
    c.steps, c.warmup, c.checkpoint_every, c.eval_every = 40, 5, 10, 20
    c.eval_windows = 2
    c.unroll = 2
    c.eval_depth = 2
  elif arg:
    raise ValueError(f"unknown config argument {arg!r}; expected 'tiny' or none")
  return c
