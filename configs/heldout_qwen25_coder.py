r"""Qwen2.5-Coder 1.5B with its 0.5B sibling on the held-out prose, chat and code prompts,
against transformers' plain and assisted generation on the same pair (batch 1).

  make qwen peer      # the pair (once) and the peer's venv (requirements-reference.txt)
  PYTHONPATH=. .venv/bin/python scripts/benchmark.py --config=configs/heldout_qwen25_coder.py \
      --peer=transformers --out=docs/results/heldout_qwen25_coder_t0.json

docs/results.md names the command of every variant measured (temperature 1, batch 4 with
--config.batch_size=4, a token tree, γ 'auto') beside its table.

The 18 prompts of configs/prompts/heldout.json's prose, chat and code domains (chat through
the ChatML template with Qwen's default system message), each alone: our autoregressive and
speculative decoding timed side by side (compile excluded), then, after our copy of the
pair is freed, transformers' plain and assisted generation (its default assistant
settings) on the same token ids, max_new_tokens and temperature. One timed call per
sampler and prompt (repeats = 1; each result file records its phases' times), and the
set's figure is the geometric mean over prompts with its 95% interval. Run it alone.

Draft, γ and verifier are those of configs/qwen25_coder.py (the independent 0.5B draft
with its head cut to 65,536 ids, γ = 3, block verification).
"""

import ml_collections

from configs import qwen25_coder


def get_config() -> ml_collections.ConfigDict:
  c = qwen25_coder.get_config()
  c.prompt_set = "configs/prompts/heldout.json:prose,chat,code"
  c.repeats = 1
  return c
