r"""SmolLM2-135M with the hybrid draft: prompt lookup where the text repeats, the feature
draft elsewhere (`ngram.HybridDraft`).

  PYTHONPATH=. .venv/bin/python scripts/generate.py --config=configs/hybrid_smollm2.py \
      --prompt "Tell me about Paris."
  PYTHONPATH=. .venv/bin/python scripts/benchmark.py --config=configs/hybrid_smollm2.py
  # hybrid (the default), lookup and the feature draft alone on the held-out prompt set, one
  # after the other, on an otherwise idle machine (γ and T as configs/smollm2_135m.py):
  for d in hybrid:3 ngram:3; do
    PYTHONPATH=. .venv/bin/python scripts/benchmark.py --config=configs/heldout_smollm2.py \
        --config.draft=$d --out=runs/heldout_${d%:*}.json; done
  PYTHONPATH=. .venv/bin/python scripts/benchmark.py --config=configs/heldout_smollm2.py \
      --config.draft=saved:drafts/smollm2_feature_v1 --out=runs/heldout_feature.json

'hybrid:3': per row and step, where the last 3 tokens occurred earlier in the row
(prompt or generated text), the draft proposes what followed them, q one-hot; every
other row proposes the feature draft's tokens with its own q. The feature draft is
config.feature_draft (the shipped one, drafts/smollm2_feature_v1). Why 3 and
not 1 or 2: a match of one or two BPE tokens (", and", " of the") recurs by chance in
ordinary prose and would replace the feature draft's proposal with a near-arbitrary
continuation; three tokens recur mostly where the text really repeats (refrains,
code, lists, greedy loops), where a lookup is nearly always right. Replayed over greedy
traces of the held-out set with γ 'auto' (`scripts/gamma_policy_study.py
--config=configs/heldout_smollm2.py --config.draft=hybrid:<n>`, each machine's own step
costs, probes every 4th plain step), n = 2 gave 1.455x against 1.422x for n = 3 on an
AVX-512 machine, but 1.069x against 1.133x on an AVX2 machine without AVX-512, where a
failed lookup step of γ = 6 costs 3.1 plain steps (1.7 on the first); n = 4 was below 3
on both. Exact at any temperature: the choice of branch depends only on tokens already
known (tests/test_hybrid.py). Expected: the same greedy text as --config.draft=none.
"""

import ml_collections

from configs import smollm2_135m


def get_config() -> ml_collections.ConfigDict:
  c = smollm2_135m.get_config()
  c.draft = "hybrid:3"  # lookup of the last 3 tokens, else c.feature_draft's tokens
  return c
