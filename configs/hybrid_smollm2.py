r"""The hybrid draft against its parts on the held-out prompt set: what each part buys.

  # the hybrid (the default draft), the prompt lookup alone and the feature draft alone,
  # one after the other on an otherwise idle machine:
  for part in hybrid lookup feature; do
    PYTHONPATH=. .venv/bin/python scripts/benchmark.py \
        --config=configs/hybrid_smollm2.py:$part --out=runs/heldout_$part.json; done
  # the hybrid with a lookup of the last n = 2 tokens, greedy decodes replayed under γ 'auto':
  PYTHONPATH=. .venv/bin/python scripts/gamma_policy_study.py \
      --config=configs/hybrid_smollm2.py:2

The config is configs/heldout_smollm2.py (prompt set, γ, temperature and verifier of
configs/smollm2_135m.py) with the draft its argument names:

  hybrid (or none)  'hybrid:3', the default draft of configs/smollm2_135m.py, so then the
                    same run as configs/heldout_smollm2.py (`drafts.hybrid.HybridDraft`);
  lookup            'ngram:3', the prompt lookup alone (a row without a match proposes
                    nothing and takes a plain step);
  feature           config.feature_draft alone (the shipped drafts/smollm2_feature_v1);
  <n>               'hybrid:<n>', the hybrid with a lookup of the last n tokens.

'hybrid:n': per row and step, where the last n tokens occurred earlier in the row (prompt
or generated text), the draft proposes what followed them, q one-hot; every other row
proposes the feature draft's tokens with its own q. Why n = 3 and not 1 or 2: a match of
one or two BPE tokens (", and", " of the") recurs by chance in ordinary prose and would
replace the feature draft's proposal with a near-arbitrary continuation; three tokens
recur mostly where the text really repeats (refrains, code, lists, greedy loops), where a
lookup is nearly always right. Replays of the held-out set under each machine's own
step costs for n = 2, 3 and 4: docs/results_archive.md#hybrid. Exact
at any temperature: the choice of branch depends only on tokens already known
(tests/test_hybrid.py). Expected: the same greedy text as --config.draft=none.

Figures: docs/results.md#heldout (the hybrid, as the default draft); the hybrid against the
feature draft alone, and n = 2, 3 and 4, at earlier commits: docs/results_archive.md#hybrid.
"""

import ml_collections

from configs import heldout_smollm2

LOOKUP_TOKENS = 3  # n of the default hybrid and of the lookup alone (why 3: above)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = heldout_smollm2.get_config()
  part = arg or "hybrid"
  if part == "hybrid":
    c.draft = f"hybrid:{LOOKUP_TOKENS}"  # lookup of the last 3 tokens, else the feature draft
  elif part == "lookup":
    c.draft = f"ngram:{LOOKUP_TOKENS}"
  elif part == "feature":
    c.draft = c.feature_draft
  elif part.isdigit() and int(part) >= 1:
    c.draft = f"hybrid:{int(part)}"
  else:
    raise ValueError(f"unknown config argument {arg!r}; expected 'hybrid', 'lookup', "
                     f"'feature' or a lookup length n >= 1")
  return c
