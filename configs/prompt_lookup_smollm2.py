r"""SmolLM2-135M with the prompt-lookup (n-gram) draft on a repetitive text.

  python scripts/benchmark.py --config=configs/prompt_lookup_smollm2.py --gammas=auto,2,4,8
  python scripts/benchmark.py --config=configs/smollm2_135m.py --config.draft=ngram:3 \
      --gammas=2,4,8                                      # free prose: the bicycles prompt

The prompt is the opening of Psalm 136 (World English Bible, the corpus of
`specdec_jax.io.corpora`), whose refrain "For his loving kindness endures forever" comes
back every line: the draft proposes what followed the last match of up to 3 trailing
tokens, at no draft cost and with no training.

Figures: docs/results.md#prompt-lookup (the first command with --gammas=2,4,8); the lookup on
Luke's opening and both verifiers at an earlier commit: docs/results_archive.md#block-and-lookup.
"""

import ml_collections

from configs import smollm2_135m

PSALM_136 = (
    "Give thanks to Yahweh, for he is good; For his loving kindness endures forever. Give "
    "thanks to the God of gods; For his loving kindness endures forever. Give thanks to the "
    "Lord of lords; For his loving kindness endures forever: To him who alone does great "
    "wonders; For his loving kindness endures forever: To him who by understanding made the "
    "heavens; For his loving kindness endures forever:")


def get_config() -> ml_collections.ConfigDict:
  c = smollm2_135m.get_config()
  c.draft = "ngram:3"  # prompt lookup of up to 3 trailing tokens (specdec_jax.drafts.ngram)
  c.prompts = (PSALM_136,)
  # A fixed gamma of 8, the best of 2, 4 and 8 greedy on this prompt
  # (docs/results.md#prompt-lookup): on a refrain a lookup nearly always has a match, and
  # a fixed gamma spares `make run` a second per-machine cost measurement (one compiled
  # loop per width 1..9). --config.gamma=auto chooses per step up to gamma_max (a row
  # without a match then proposes nothing).
  c.gamma = "8"
  c.gamma_max = 8
  return c
