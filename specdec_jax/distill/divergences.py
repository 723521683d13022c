"""Divergences between target and draft distributions (DistillSpec, Zhou et al. 2024).

Letters: V vocabulary, C columns of a vocabulary-subset draft head.

  fkl  KL(p || q) = Σ p (log p - log q)       mass-covering (standard distillation)
  rkl  KL(q || p) = Σ q (log q - log p)       mode-seeking
  jsd  ½ KL(p || m) + ½ KL(q || m), m = (p + q) / 2
  tvd  1 - Σ min(p, q)                        exactly 1 - β: the rejection probability

See `specdec_jax.distill` for the greedy surrogates and the subset-head restriction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.models.sampling import warp

Array = jax.Array

LOSSES = ("fkl", "rkl", "jsd", "tvd")


def _safe_log(x: Array) -> Array:
  """log x with -inf at exact zeros and no NaN in the gradient there."""
  positive = x > 0
  return jnp.where(positive, jnp.log(jnp.where(positive, x, 1.0)), -jnp.inf)


def _kl(a: Array, log_a: Array, log_b: Array) -> Array:
  """Σ a (log a - log b) over the last axis; terms with a == 0 are exactly 0."""
  positive = a > 0
  terms = a * (jnp.where(positive, log_a, 0.0) - jnp.where(positive, log_b, 0.0))
  return jnp.sum(jnp.where(positive, terms, 0.0), axis=-1)


def forward_kl(p: Array, q: Array, *, log_p: Array | None = None,
               log_q: Array | None = None) -> Array:
  """KL(p || q): p, q [..., V] -> [...]. log_p / log_q, if given, are used instead of log."""
  log_p = _safe_log(p) if log_p is None else log_p
  log_q = _safe_log(q) if log_q is None else log_q
  return _kl(p, log_p, log_q)


def reverse_kl(p: Array, q: Array, *, log_p: Array | None = None,
               log_q: Array | None = None) -> Array:
  """KL(q || p): p, q [..., V] -> [...]."""
  return forward_kl(q, p, log_p=log_q, log_q=log_p)


def jsd(p: Array, q: Array, *, log_p: Array | None = None,
        log_q: Array | None = None) -> Array:
  """Jensen-Shannon divergence ½ KL(p||m) + ½ KL(q||m), m = (p+q)/2: [..., V] -> [...]."""
  if log_p is None or log_q is None:
    log_p, log_q = _safe_log(p), _safe_log(q)
    log_m = _safe_log(0.5 * (p + q))
  else:
    log_m = jnp.logaddexp(log_p, log_q) - jnp.log(2.0)
  return 0.5 * _kl(p, log_p, log_m) + 0.5 * _kl(q, log_q, log_m)


def tvd(p: Array, q: Array, **unused_logs) -> Array:
  """1 - Σ min(p, q) = 1 - β, the rejection probability: [..., V] -> [...]."""
  del unused_logs
  return 1.0 - jnp.sum(jnp.minimum(p, q), axis=-1)


_DIVERGENCES = {"fkl": forward_kl, "rkl": reverse_kl, "jsd": jsd, "tvd": tvd}


def divergence(name: str, p: Array, q: Array, **logs) -> Array:
  """One of `LOSSES` on target probs p and draft probs q [..., V] -> [...]."""
  if name not in _DIVERGENCES:
    raise ValueError(f"unknown loss {name!r}; expected one of {LOSSES}")
  return _DIVERGENCES[name](p, q, **logs)


def logit_divergences(target_logits: Array, draft_logits: Array, *, temperature: float,
                      greedy_temperature: float = 1.0,
                      draft_tokens: Array | None = None) -> dict[str, Array]:
  """All of `LOSSES` between target logits [..., V] and draft logits [..., C] -> {name: [...]}.

  τ > 0: p, q = softmax(logits / τ). τ = 0: the module docstring's soft surrogates.
  draft_tokens (int [C]): the token ids of a vocabulary-subset draft's columns (None: C = V,
  column v is token v). The draft gives every other token probability 0, so FKL/RKL/JSD
  compare q with p restricted to those tokens and renormalised (KL(p || q) would be
  infinite); TVD uses the unrestricted p and stays exactly 1 - β.
  """
  t = training_temperature(temperature, greedy_temperature)
  log_p_full = jax.nn.log_softmax(target_logits.astype(jnp.float32) / t, axis=-1)
  p_greedy = warp(target_logits, 0.0) if temperature == 0 else None
  if draft_tokens is not None:
    log_p_full = log_p_full[..., draft_tokens]
    p_greedy = None if p_greedy is None else p_greedy[..., draft_tokens]
  return subset_divergences(log_p_full, draft_logits, temperature=temperature,
                            greedy_temperature=greedy_temperature, p_greedy=p_greedy,
                            full_head=draft_tokens is None)


def training_temperature(temperature: float, greedy_temperature: float) -> float:
  """The temperature both sides are softened to in training: τ, or greedy_temperature at 0."""
  return temperature if temperature > 0 else greedy_temperature


def subset_divergences(target_logp: Array, draft_logits: Array, *, temperature: float,
                       greedy_temperature: float = 1.0, p_greedy: Array | None = None,
                       full_head: bool = False) -> dict[str, Array]:
  """`logit_divergences` from the target's log-probabilities on the draft's C columns.

  target_logp [..., C]: log p at the training temperature (`training_temperature`) of
  the tokens the draft's columns stand for, normalised over the full vocabulary (so its
  exp sums to p(subset) <= 1). p_greedy [..., C]: at τ = 0, one-hot at the target's
  argmax (zeros where that token is not a column). full_head: the C columns are the whole
  vocabulary (no renormalisation needed). This is what a feature draft trains on from
  the cached target outputs (`feature_cache`), where the full-vocabulary p is not kept.
  """
  t = training_temperature(temperature, greedy_temperature)
  log_q = jax.nn.log_softmax(draft_logits.astype(jnp.float32) / t, axis=-1)
  target_logp = target_logp.astype(jnp.float32)
  if full_head:
    log_p = target_logp
  else:
    log_p = target_logp - jax.nn.logsumexp(target_logp, axis=-1, keepdims=True)
  p, q = jnp.exp(log_p), jnp.exp(log_q)
  out = {name: fn(p, q, log_p=log_p, log_q=log_q)
         for name, fn in _DIVERGENCES.items() if name != "tvd"}
  if temperature == 0:
    if p_greedy is None:
      raise ValueError("temperature 0 needs p_greedy (one-hot at the target's argmax)")
    p_tv = p_greedy
  else:
    p_tv = jnp.exp(target_logp)
  out["tvd"] = tvd(p_tv, q)
  return out
