"""Distilling a draft toward a target for speculative decoding (DistillSpec, Zhou et al. 2024).

Letters: B batch, T window length (positions), V vocabulary, P on-policy prompt length,
N = T - P sampled continuation tokens, D target width, d draft width, L layers.

What is optimised. At every position the target gives p and the draft q over the same
vocabulary, both after the decode temperature τ. Speculative decoding accepts a drafted
token with probability β = Σ min(p, q) = 1 - TV(p, q) (docs/background.md#formulas), so
α = E[β] is what distillation should raise. Four divergences (`LOSSES`):

  fkl  KL(p || q) = Σ p (log p - log q)       mass-covering (standard distillation)
  rkl  KL(q || p) = Σ q (log q - log p)       mode-seeking
  jsd  ½ KL(p || m) + ½ KL(q || m), m = (p + q) / 2
  tvd  1 - Σ min(p, q)                        exactly 1 - β: the rejection probability

Greedy decoding (τ = 0). p and q are one-hot argmaxes and β is 1 iff the argmaxes agree:
piecewise constant, no gradient. Distilling for greedy decoding must raise q(argmax p),
so at τ = 0 the draft side is softened to temperature `greedy_temperature` (1 by default):
  tvd  TV(onehot(argmax p), q_1) = 1 - q_1(argmax p), the surrogate whose minimum is
       q_1(argmax p) = 1, i.e. certain agreement;
  fkl, rkl, jsd  on the target and draft both at `greedy_temperature` (soft labels):
       KL(p||q) with one-hot p would be the hard-label cross-entropy -log q(argmax p),
       and KL(q||p) with one-hot p is infinite, so the full target distribution is
       used; at their minimum q = p, so argmaxes agree.
The measured α at τ = 0 is the argmax agreement rate. Truncation (top-k / top-p) is not
part of the training divergences (it has no useful gradient); `evaluate` measures α with
the full `warp`.

Numerics: FKL/RKL/JSD are computed from `log_softmax` of the logits (finite everywhere).
The probability-level functions `forward_kl` .. `tvd` take exact zeros: a term with zero
weight is 0 (never 0·log 0 = NaN, also in the gradient), KL is +inf where the support of
the first argument leaves that of the second, which is its true value.

Data (DistillSpec §3). Each step is either teacher-forced (a corpus window [B,T], loss
at every position) or on-policy (the window's first P tokens as a prompt, N = T - P tokens
sampled from the current draft at τ by a `lax.scan` over a KV cache, loss at positions
P-1 .. T-1, i.e. at every state the draft itself reached). Step s is on-policy iff
floor((s+1)·f) > floor(s·f) for on-policy fraction f: exactly f of the steps, evenly
spread, a pure function of s (so resumed runs see the same mix). The draft samples are
data: no gradient flows through the sampling.

A vocabulary-subset draft (`ModelConfig.head_tokens`, C of the V tokens; config
`draft.head_vocab`, ranked by training-corpus frequency) has q = 0 off its C tokens, so
those tokens are only ever emitted from the residual, never drafted; exactness is
untouched and α ≤ p(subset). Its head costs C/V of a full one (SmolLM2: the 256x49152
head is most of a 2-layer d=256 draft's time). FKL/RKL/JSD then compare q with p
restricted to the subset and renormalised; TVD stays exactly 1 - β.

Keys: one root `PRNGKey(seed)` split into named keys ('draft_init', 'train'); the train
key lives in the train state and step s uses fold_in(train_key, s).

Modules, each importing only from those above it (every public name is re-exported here):
  divergences     `divergence`, `logit_divergences` and the four divergences;
  step            settings, `make_optimizer`, `loss_fn`, `feature_loss_fn`,
                  `sample_continuations`, the train state and `train_step` / `make_train_step`;
  evaluation      `evaluate` / `evaluate_alpha`;
  initialization  `init_draft_params`, `random_params`, `embedding_projection`;
  feature_cache   the target's features and top-k probabilities, computed once and
                  kept on disk so a feature draft trains several epochs per target pass;
  chat_corpus     the 'chat' corpus: the target's own answers to the shipped
                  instructions through its chat template, generated once, resumable;
  run_setup       a run's set-up from its config (`setup_distillation`, `draft_config_from`),
                  the corpora mix (`load_mixture`: weighted corpora, held out per corpus);
  runs            the runs behind the scripts (`run_distillation`, `run_pretraining`):
                  the training loop, held-out α per corpus (`evaluate_sets`), checkpointing
                  through `specdec_jax.io.checkpoint`, reports.
"""

from specdec_jax.distill.divergences import (LOSSES, divergence, forward_kl, jsd,
                                             logit_divergences, reverse_kl, tvd)
from specdec_jax.distill.evaluation import evaluate, evaluate_alpha
from specdec_jax.distill.initialization import (DRAFT_INITS, embedding_projection,
                                                init_draft_params, random_params)
from specdec_jax.distill.run_setup import (DistillSetup, draft_config_from, load_corpus,
                                           load_mixture, load_target, setup_distillation)
from specdec_jax.distill.runs import evaluate_sets, run_distillation, run_pretraining
from specdec_jax.distill.step import (DistillSettings, OptimizerSettings, TrainState, commit,
                                      feature_loss_fn, full_logits, head_columns,
                                      init_train_state, is_on_policy, lm_loss_fn,
                                      lm_train_step, loss_fn, make_feature_train_step,
                                      make_optimizer, make_train_step,
                                      sample_continuations, train_step)

__all__ = [
    "LOSSES", "divergence", "forward_kl", "jsd", "logit_divergences", "reverse_kl", "tvd",
    "evaluate", "evaluate_alpha", "DRAFT_INITS", "embedding_projection", "init_draft_params",
    "random_params", "DistillSetup", "draft_config_from", "evaluate_sets", "load_corpus",
    "load_mixture", "load_target",
    "run_distillation", "run_pretraining", "setup_distillation", "DistillSettings",
    "OptimizerSettings", "TrainState", "commit", "full_logits", "init_train_state",
    "is_on_policy", "lm_loss_fn", "lm_train_step", "loss_fn", "make_optimizer",
    "make_train_step", "sample_continuations", "train_step", "feature_loss_fn",
    "head_columns", "make_feature_train_step",
]
