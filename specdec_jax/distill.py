"""Distilling a draft toward a target for speculative decoding (DistillSpec, Zhou et al. 2024).

Letters: B batch, T window length (positions), V vocabulary, P on-policy prompt length,
N = T - P sampled continuation tokens, D target width, d draft width, L layers.

What is optimised. At every position the target gives p and the draft q over the same
vocabulary, both after the decode temperature τ. Speculative decoding accepts a drafted
token with probability β = Σ min(p, q) = 1 - TV(p, q) (REFERENCE.md §2), so α = E[β] is
what distillation should raise. Four divergences (`LOSSES`):

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

Layers of this module: divergences (`divergence`, `logit_divergences`); the step
(`loss_fn`, `sample_continuations`, `train_step` / `make_train_step`, `make_optimizer`);
`evaluate` / `evaluate_alpha`; draft initialisation (`init_draft_params`); and the runs
behind the scripts (`setup_distillation`, `run_distillation`, `run_pretraining`, which
checkpoint through `specdec_jax.io.checkpoint`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
import signal
import time
from typing import Any, Callable, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax import data, loading
from specdec_jax.io import checkpoint as ckpt_lib
from specdec_jax.model import ModelConfig, forward, init_cache, param_count, param_shapes
from specdec_jax.sampling import sample, warp

Array = jax.Array
PyTree = Any

LOSSES = ("fkl", "rkl", "jsd", "tvd")
DRAFT_INITS = ("random", "svd", "copy", "saved:<dir>")


# --------------------------------------------------------------------------- divergences

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
  t = temperature if temperature > 0 else greedy_temperature
  log_p_full = jax.nn.log_softmax(target_logits.astype(jnp.float32) / t, axis=-1)
  log_q = jax.nn.log_softmax(draft_logits.astype(jnp.float32) / t, axis=-1)
  if draft_tokens is None:
    log_p = log_p_full
  else:
    log_p_full = log_p_full[..., draft_tokens]
    log_p = log_p_full - jax.nn.logsumexp(log_p_full, axis=-1, keepdims=True)
  p, q = jnp.exp(log_p), jnp.exp(log_q)
  out = {name: fn(p, q, log_p=log_p, log_q=log_q)
         for name, fn in _DIVERGENCES.items() if name != "tvd"}
  if temperature == 0:
    p_tv = warp(target_logits, 0.0)
    p_tv = p_tv if draft_tokens is None else p_tv[..., draft_tokens]
  else:
    p_tv = jnp.exp(log_p_full)
  out["tvd"] = tvd(p_tv, q)
  return out


# --------------------------------------------------------------------------- settings

@dataclasses.dataclass(frozen=True)
class DistillSettings:
  """What the distillation step optimises; hashable (a jit static).

  prompt_len: P, the on-policy prompt length (0 compiles no sampler; steps must then be
    teacher-forced). vocab_size: the true vocabulary (None: the logits' common width).
  """

  loss: str = "fkl"
  temperature: float = 1.0
  greedy_temperature: float = 1.0
  prompt_len: int = 0
  vocab_size: int | None = None

  def __post_init__(self):
    if self.loss not in LOSSES:
      raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
    if not self.temperature >= 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
    if not self.greedy_temperature > 0:
      raise ValueError(f"greedy_temperature must be > 0, got {self.greedy_temperature!r}")
    if self.prompt_len < 0:
      raise ValueError(f"prompt_len must be >= 0, got {self.prompt_len}")


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
  """clip_by_global_norm, then AdamW on a warmup + cosine schedule (to lr·end_fraction)."""

  lr: float = 1e-3
  warmup: int = 100
  steps: int = 1000
  clip: float = 1.0
  weight_decay: float = 0.0
  b2: float = 0.95
  end_fraction: float = 0.1

  def schedule(self) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(
        0.0, self.lr, max(self.warmup, 0), max(self.steps, self.warmup + 1),
        end_value=self.lr * self.end_fraction)


def _decay_mask(params: PyTree) -> PyTree:
  """Weight decay on matrices only: not on norm scales or biases."""
  def keep(path, _):
    name = jax.tree_util.keystr(path)
    return "norm" not in name and "bias" not in name
  return jax.tree_util.tree_map_with_path(keep, params)


def make_optimizer(settings: OptimizerSettings) -> optax.GradientTransformation:
  """optax.chain(clip_by_global_norm, adamw(warmup_cosine_decay_schedule))."""
  return optax.chain(
      optax.clip_by_global_norm(settings.clip),
      optax.adamw(settings.schedule(), b1=0.9, b2=settings.b2,
                  weight_decay=settings.weight_decay, mask=_decay_mask))


# --------------------------------------------------------------------------- model helpers

def full_logits(params, tokens: Array, config: ModelConfig, *,
                full_vocab: bool = True) -> Array:
  """Teacher-forced logits of a whole window: tokens [B,T] -> float32 [B,T,V].

  full_vocab=False: a vocabulary-subset head's own columns [B,T,C] (see `forward`).
  """
  b, t = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  logits, _ = forward(params, tokens, positions, init_cache(config, b, t), config=config,
                      full_vocab=full_vocab)
  return logits


def _common_vocab(target_v: int, draft_v: int, vocab_size: int | None) -> int:
  if vocab_size is not None:
    if vocab_size > min(target_v, draft_v):
      raise ValueError(f"vocab_size={vocab_size} exceeds a model's vocabulary "
                       f"(target {target_v}, draft {draft_v})")
    return vocab_size
  if target_v != draft_v:
    raise ValueError(f"draft/target vocabulary mismatch: target {target_v}, draft {draft_v}; "
                     "set vocab_size to the true vocabulary if one is only padded")
  return target_v


def sample_continuations(draft_params, prompts: Array, key: Array, *, config: ModelConfig,
                         num_new: int, temperature: float,
                         vocab_size: int | None = None) -> Array:
  """Draft samples: prompts [B,P] -> tokens [B,P+N], continuing each row with N tokens.

  The prompt is prefilled with one call; then a `lax.scan` of N cached single-token
  calls samples from warp(logits, temperature) (argmax at 0). Token i of every row uses
  fold_in(key, i).
  """
  b, p = prompts.shape
  vocab = config.vocab_size if vocab_size is None else vocab_size
  cache = init_cache(config, b, p + num_new)
  positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
  logits, cache = forward(draft_params, prompts, positions, cache, config=config)

  def body(carry, i):
    cache, last = carry
    token = sample(jax.random.fold_in(key, i), warp(last[:, :vocab], temperature))
    pos = jnp.full((b, 1), p + i, jnp.int32)
    logits, cache = forward(draft_params, token[:, None], pos, cache, config=config)
    return (cache, logits[:, 0]), token

  _, new = jax.lax.scan(body, (cache, logits[:, -1]), jnp.arange(num_new))
  return jnp.concatenate([prompts, new.T.astype(prompts.dtype)], axis=1)


def is_on_policy(step: int, fraction: float) -> bool:
  """Whether step `step` (0-based) is on-policy: exactly `fraction` of steps, evenly spread."""
  if not 0.0 <= fraction <= 1.0:
    raise ValueError(f"on_policy_fraction must lie in [0, 1], got {fraction}")
  eps = 1e-9
  return math.floor((step + 1) * fraction + eps) > math.floor(step * fraction + eps)


# --------------------------------------------------------------------------- loss

def loss_fn(draft_params, target, batch: Mapping[str, Array], *, draft_config: ModelConfig,
            settings: DistillSettings, target_config: ModelConfig | None = None):
  """(draft_params, target params or target logits [B,T,V], batch) -> (loss, metrics).

  batch: 'tokens' int32 [B,T]; optional 'mask' float [B,T] (which positions count).
  Only draft_params is differentiated: the target side is `stop_gradient`ed. metrics
  holds 'loss', 'alpha' (mean Σ min(p,q) at the decode temperature), 'top1' (argmax
  agreement) and every divergence of `LOSSES` (the training versions).
  """
  tokens = batch["tokens"]
  mask = batch.get("mask")
  mask = jnp.ones(tokens.shape, jnp.float32) if mask is None else mask.astype(jnp.float32)
  if isinstance(target, Mapping):
    if target_config is None:
      raise ValueError("target params need target_config")
    target_logits = full_logits(target, tokens, target_config)
  else:
    target_logits = target
  target_logits = jax.lax.stop_gradient(target_logits)
  draft_logits = full_logits(draft_params, tokens, draft_config, full_vocab=False)
  v = _common_vocab(target_logits.shape[-1], draft_config.vocab_size, settings.vocab_size)
  target_logits = target_logits[..., :v]
  draft_tokens = None
  if draft_config.head_tokens:
    draft_tokens = jnp.asarray(draft_config.head_tokens, jnp.int32)
    if draft_config.head_tokens[-1] >= v:
      raise ValueError(f"draft head_tokens reach id {draft_config.head_tokens[-1]} >= the "
                       f"true vocabulary {v}")
  else:
    draft_logits = draft_logits[..., :v]

  weights = mask / jnp.maximum(jnp.sum(mask), 1.0)
  divs = logit_divergences(target_logits, draft_logits, temperature=settings.temperature,
                           greedy_temperature=settings.greedy_temperature,
                           draft_tokens=draft_tokens)
  loss = jnp.sum(divs[settings.loss] * weights)

  sg = jax.lax.stop_gradient
  draft_argmax = jnp.argmax(draft_logits, -1)
  if draft_tokens is not None:
    draft_argmax = draft_tokens[draft_argmax]
  agree = jnp.argmax(target_logits, -1) == draft_argmax
  metrics = {name: jnp.sum(sg(d) * weights) for name, d in divs.items()}
  top1 = jnp.sum(agree * weights)
  # α = mean Σ min(p, q) at the decode temperature: 1 - TVD for τ > 0 (TVD is exactly
  # 1 - β there); at τ = 0, p and q are one-hot, so β is argmax agreement.
  alpha = 1.0 - metrics["tvd"] if settings.temperature > 0 else top1
  metrics.update(loss=sg(loss), alpha=alpha, top1=top1, positions=jnp.sum(mask))
  return loss, metrics


# --------------------------------------------------------------------------- train state

@flax.struct.dataclass
class TrainState:
  step: Array  # int32 [], steps taken (= the data position of the next batch)
  params: PyTree
  opt_state: PyTree
  rng: Array  # uint32 [2], the train key; step s uses fold_in(rng, s)

  def to_dict(self) -> dict:
    return {"step": self.step, "params": self.params, "opt_state": self.opt_state,
            "rng": self.rng}

  @classmethod
  def from_dict(cls, d: Mapping) -> "TrainState":
    return commit(cls(step=jnp.asarray(d["step"], jnp.int32), params=d["params"],
                      opt_state=d["opt_state"], rng=jnp.asarray(d["rng"], jnp.uint32)))


def commit(tree: PyTree) -> PyTree:
  """`tree` placed on the default device, committed there.

  A jitted step's outputs are committed arrays; inputs that are not (fresh
  `jnp` arrays) lower with unspecified shardings, so without this the second
  step would compile the whole step a second time.
  """
  return jax.device_put(tree, jax.devices()[0])


def init_train_state(params, rng: Array, optim: OptimizerSettings) -> TrainState:
  """A fresh, committed state at step 0. params are copied: the train steps donate it."""
  params = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=make_optimizer(optim).init(params), rng=jnp.asarray(rng))
  return state if isinstance(params, jax.core.Tracer) else commit(state)


def _apply_gradients(state: TrainState, grads, optim: OptimizerSettings):
  tx = make_optimizer(optim)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  stats = {"grad_norm": optax.global_norm(grads), "lr": optim.schedule()(state.step)}
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), stats


def train_step_fn(state: TrainState, target_params, batch: Mapping[str, Array], key: Array, *,
                  draft_config: ModelConfig, target_config: ModelConfig,
                  settings: DistillSettings, optim: OptimizerSettings):
  """One distillation step. batch: 'tokens' int32 [B,T], 'on_policy' bool [].

  On-policy steps replace tokens[:, P:] by draft samples (key) and weight positions
  P-1..T-1; teacher-forced steps weight every position. target_params gets no gradient.
  """
  tokens = batch["tokens"]
  b, t = tokens.shape
  ones = jnp.ones((b, t), jnp.float32)
  p = settings.prompt_len
  if p:
    if not 0 < p < t:
      raise ValueError(f"prompt_len={p} must lie in (0, seq_len={t})")
    vocab = _common_vocab(target_config.vocab_size, draft_config.vocab_size,
                          settings.vocab_size)

    def on_policy(tokens):
      sampled = sample_continuations(jax.lax.stop_gradient(state.params), tokens[:, :p], key,
                                     config=draft_config, num_new=t - p,
                                     temperature=settings.temperature, vocab_size=vocab)
      mask = jnp.broadcast_to(jnp.arange(t) >= p - 1, (b, t)).astype(jnp.float32)
      return sampled, mask

    tokens, mask = jax.lax.cond(batch["on_policy"], on_policy, lambda x: (x, ones), tokens)
  else:
    mask = ones
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  (_, metrics), grads = grad_fn(state.params, target_params, {"tokens": tokens, "mask": mask},
                                draft_config=draft_config, settings=settings,
                                target_config=target_config)
  state, stats = _apply_gradients(state, grads, optim)
  metrics.update(stats, on_policy=jnp.asarray(batch.get("on_policy", False), jnp.float32))
  return state, metrics


train_step = jax.jit(train_step_fn, donate_argnums=(0,), static_argnames=(
    "draft_config", "target_config", "settings", "optim"))


def make_train_step(target_params, *, draft_config: ModelConfig, target_config: ModelConfig,
                    settings: DistillSettings, optim: OptimizerSettings
                    ) -> Callable[[TrainState, Mapping, Array], tuple[TrainState, dict]]:
  """`train_step(state, batch, key) -> (state, metrics)` with the target frozen.

  target_params is passed to the jitted step as an argument (not baked in as a
  constant) and is never differentiated; the state is donated.
  """
  target_params = commit(target_params)

  def step(state, batch, key):  # committed inputs: one compilation (see `commit`)
    return train_step(commit(state), target_params, commit(batch), commit(key),
                      draft_config=draft_config,
                      target_config=target_config, settings=settings, optim=optim)
  return step


# --------------------------------------------------------------------------- LM pretraining

def lm_loss_fn(params, batch: Array, *, config: ModelConfig):
  """Next-token cross-entropy: batch int32 [B,T+1] -> (mean nll, metrics)."""
  logits = full_logits(params, batch[:, :-1], config)
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), batch[:, 1:, None], -1)[..., 0]
  loss = jnp.mean(nll)
  return loss, {"loss": loss, "ppl": jnp.exp(loss)}


def lm_train_step_fn(state: TrainState, batch: Array, key: Array, *, config: ModelConfig,
                     optim: OptimizerSettings):
  """One cross-entropy step on windows [B,T+1]; key is unused (kept for a common loop)."""
  del key
  (_, metrics), grads = jax.value_and_grad(lm_loss_fn, has_aux=True)(
      state.params, batch, config=config)
  state, stats = _apply_gradients(state, grads, optim)
  return state, {**metrics, **stats}


lm_train_step = jax.jit(lm_train_step_fn, donate_argnums=(0,),
                        static_argnames=("config", "optim"))


# --------------------------------------------------------------------------- evaluation

def _alpha_key(temperature: float) -> str:
  return f"alpha_t{temperature:g}"


@functools.partial(jax.jit, static_argnames=(
    "draft_config", "target_config", "temperatures", "top_k", "top_p", "vocab_size"))
def _eval_chunk(draft_params, target_params, windows, weights, *, draft_config, target_config,
                temperatures, top_k, top_p, vocab_size):
  """Sums over one chunk of windows [b,T+1] (row weights [b]) of per-position measures."""
  inputs, labels = windows[:, :-1], windows[:, 1:]
  w = jnp.broadcast_to(weights[:, None], inputs.shape)
  draft = full_logits(draft_params, inputs, draft_config)[..., :vocab_size]

  def nll(logits):
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.take_along_axis(logp, labels[..., None], -1)[..., 0]

  draft_nll = nll(draft)
  sums = {"positions": jnp.sum(w)}
  if draft_config.head_tokens:  # labels outside a subset head have q = 0 (nll = inf)
    covered = jnp.isfinite(draft_nll)
    sums["draft_label_coverage"] = jnp.sum(covered * w)
    draft_nll = jnp.where(covered, draft_nll, 0.0)
  sums["draft_nll"] = jnp.sum(draft_nll * w)
  if target_params is not None:
    target = full_logits(target_params, inputs, target_config)[..., :vocab_size]
    sums["target_nll"] = jnp.sum(nll(target) * w)
    sums["top1"] = jnp.sum((jnp.argmax(target, -1) == jnp.argmax(draft, -1)) * w)
    for t in temperatures:
      beta = jnp.sum(jnp.minimum(warp(target, t, top_k, top_p), warp(draft, t, top_k, top_p)), -1)
      sums[_alpha_key(t)] = jnp.sum(beta * w)
  return sums


def evaluate(draft_params, target_params, windows, *, draft_config: ModelConfig,
             target_config: ModelConfig | None, temperatures=(0.0, 1.0), top_k: int = 0,
             top_p: float = 1.0, batch_size: int = 8, vocab_size: int | None = None
             ) -> dict[str, float]:
  """Held-out measures over windows [N,T+1] (inputs [:, :-1], labels [:, 1:]), in chunks.

  Returns means over all N·T positions: 'alpha_t<τ>' = mean Σ min(p,q) at each τ (with
  top_k / top_p), 'top1' (argmax agreement), 'target_nll', 'draft_nll'; and 'positions'.
  A vocabulary-subset draft also gives 'draft_label_coverage' (the fraction of labels in
  its vocabulary); its 'draft_nll' is the mean over those labels.
  With target_params None only 'draft_nll' is measured.
  """
  windows = np.asarray(windows, np.int32)
  if windows.ndim != 2 or windows.shape[1] < 2:
    raise ValueError(f"windows must be int [N,T+1] with T >= 1, got shape {windows.shape}")
  if target_params is None:
    vocab = draft_config.vocab_size if vocab_size is None else vocab_size
  else:
    vocab = _common_vocab(target_config.vocab_size, draft_config.vocab_size, vocab_size)
  n = windows.shape[0]
  draft_params, target_params = commit(draft_params), commit(target_params)
  totals: dict[str, float] = {}
  for start in range(0, n, batch_size):
    chunk = windows[start:start + batch_size]
    weights = np.ones(batch_size, np.float32)
    if chunk.shape[0] < batch_size:  # pad to one shape, so one compilation
      weights[chunk.shape[0]:] = 0.0
      chunk = np.concatenate([chunk, np.zeros((batch_size - chunk.shape[0],) + chunk.shape[1:],
                                              np.int32)])
    sums = jax.device_get(_eval_chunk(
        draft_params, target_params, chunk, weights, draft_config=draft_config,
        target_config=target_config, temperatures=tuple(float(t) for t in temperatures),
        top_k=top_k, top_p=top_p, vocab_size=vocab))
    for k, v in sums.items():
      totals[k] = totals.get(k, 0.0) + float(v)
  count = totals.pop("positions")
  out = {k: v / count for k, v in totals.items()}
  if "draft_label_coverage" in totals:  # the nll over the labels a subset head can emit
    out["draft_nll"] = totals["draft_nll"] / max(totals["draft_label_coverage"], 1.0)
  out["positions"] = int(count)
  return out


def evaluate_alpha(draft_params, target_params, windows, *, draft_config: ModelConfig,
                   target_config: ModelConfig, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0, batch_size: int = 8,
                   vocab_size: int | None = None) -> float:
  """Mean Σ min(p,q) over every position of windows [N,T+1] at one temperature."""
  out = evaluate(draft_params, target_params, windows, draft_config=draft_config,
                 target_config=target_config, temperatures=(temperature,), top_k=top_k,
                 top_p=top_p, batch_size=batch_size, vocab_size=vocab_size)
  return out[_alpha_key(temperature)]


# --------------------------------------------------------------------------- draft init

def embedding_projection(target_params, dim: int) -> np.ndarray:
  """W [D,d]: the top-d right singular vectors of the target embedding E [V,D].

  Computed from the eigenvectors of Eᵀ E (float64), i.e. an uncentred PCA: the
  target's logits are E·y with no offset, so directions are kept through the origin.
  """
  embed = np.asarray(jax.device_get(target_params["embed"]), np.float64)
  if dim > embed.shape[1]:
    raise ValueError(f"draft width {dim} exceeds the target width {embed.shape[1]}")
  eigvals, eigvecs = np.linalg.eigh(embed.T @ embed)
  return eigvecs[:, np.argsort(eigvals)[::-1][:dim]]


def random_params(config: ModelConfig, key: Array) -> PyTree:
  """Params distributed as `init_params` (normal std 0.02, norm scales 1, biases 0).

  Drawn with numpy on the tree of `param_shapes` (an abstract trace): no model forward
  and no threefry kernel is compiled (each costs seconds on CPU; this takes
  milliseconds for a tiny model). Leaf i is drawn from
  `np.random.default_rng([*key_data(key), i])`, in tree order.
  """
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  seed = [int(x) for x in np.asarray(key, np.uint32).ravel()]

  def make(i, path, leaf):
    name = jax.tree_util.keystr(path)
    if "norm" in name:
      return jnp.ones(leaf.shape, leaf.dtype)
    if "bias" in name:
      return jnp.zeros(leaf.shape, leaf.dtype)
    values = np.random.default_rng([*seed, i]).standard_normal(leaf.shape, np.float32)
    return jnp.asarray(0.02 * values, leaf.dtype)

  leaves, treedef = jax.tree_util.tree_flatten_with_path(param_shapes(config))
  return jax.tree_util.tree_unflatten(
      treedef, [make(i, path, leaf) for i, (path, leaf) in enumerate(leaves)])


def _rescale(x: np.ndarray, rms: float = 0.02) -> np.ndarray:
  """x scaled to the element RMS of `init_params` (normal, std 0.02)."""
  return x * (rms / np.sqrt(np.mean(x * x)))


def init_draft_params(draft_config: ModelConfig, key: Array, *, method: str = "random",
                      target_params=None, target_config: ModelConfig | None = None,
                      tokenizer_identity: str | None = None) -> PyTree:
  """Initial draft params. method (see `DRAFT_INITS`):

  'random'       `random_params(draft_config, key)` (distributed as `init_params`).
  'svd'          random blocks; embedding E·W [V,d] where W [D,d] is
                 `embedding_projection` of the target's embedding E [V,D]; an own draft
                 head Wᵀ·diag(g)·head_target [d,V] with g the target's final-norm gain
                 (= (diag(g)·E·W)ᵀ for a tied target): the target's effective head
                 restricted to the kept subspace (and to the head_tokens columns of a
                 vocabulary-subset head). Both are rescaled to the element RMS
                 of a random init (0.02), keeping the geometry, not the magnitude:
                 at the target's magnitude (~10x larger) Adam's fixed-size steps move
                 them 10x more slowly, and the initial logits (~|e|²·sqrt(d) for the
                 current token) are far too confident.
  'copy'         the target's embedding, head (its head_tokens columns for a subset head),
                 final norm and first k = draft num_layers blocks (needs equal widths:
                 D, F, N, K, H, and k <= target layers).
  'saved:<dir>'  a `save_params` directory (its config must equal draft_config).
  """
  params = random_params(draft_config, key)
  if method == "random":
    return params
  if method.startswith("saved:"):
    saved, cfg, _ = ckpt_lib.load_params(method[len("saved:"):],
                                         tokenizer_identity=tokenizer_identity)
    if cfg != draft_config:
      raise ValueError(ckpt_lib.describe_mismatch("saved draft config", cfg.to_dict(),
                                                  draft_config.to_dict()))
    return saved
  if target_params is None or target_config is None:
    raise ValueError(f"draft init {method!r} needs the target params and config")
  if target_config.vocab_size != draft_config.vocab_size:
    raise ValueError(f"draft vocab {draft_config.vocab_size} != target vocab "
                     f"{target_config.vocab_size}")
  dt = draft_config.jnp_dtype
  if method == "svd":
    w = embedding_projection(target_params, draft_config.embed_dim)  # [D,d]
    embed_t = np.asarray(jax.device_get(target_params["embed"]), np.float64)
    params = dict(params, embed=jnp.asarray(_rescale(embed_t @ w), dt))
    if not draft_config.tie_embeddings:
      head_t = (embed_t.T if target_config.tie_embeddings
                else np.asarray(jax.device_get(target_params["head"]), np.float64))
      gain = np.asarray(jax.device_get(target_params["final_norm"]["scale"]), np.float64)
      head = w.T @ (gain[:, None] * head_t)  # [d,V]
      if draft_config.head_tokens:
        head = head[:, list(draft_config.head_tokens)]
      params["head"] = jnp.asarray(_rescale(head), dt)
    return params
  if method == "copy":
    fields = ("embed_dim", "mlp_dim", "num_heads", "num_kv_heads", "head_dim", "qkv_bias")
    diff = {f: (getattr(draft_config, f), getattr(target_config, f)) for f in fields
            if getattr(draft_config, f) != getattr(target_config, f)}
    if diff:
      raise ValueError(f"draft init 'copy' needs equal widths; (draft, target) differ: {diff}")
    k = draft_config.num_layers
    if k > target_config.num_layers:
      raise ValueError(f"draft has {k} layers, the target only {target_config.num_layers}")
    params = {
        "embed": target_params["embed"],
        "final_norm": target_params["final_norm"],
        "layers": jax.tree.map(lambda x: x[:k], target_params["layers"]),
    }
    if not draft_config.tie_embeddings:
      head = (target_params["embed"].T if target_config.tie_embeddings
              else target_params["head"])
      params["head"] = (head[:, jnp.asarray(draft_config.head_tokens)]
                        if draft_config.head_tokens else head)
    return jax.tree.map(lambda x: jnp.asarray(x, dt), params)
  raise ValueError(f"unknown draft init {method!r}; expected one of {DRAFT_INITS}")


# --------------------------------------------------------------------------- run set-up

def load_target(config, tokenizer) -> tuple[ModelConfig, dict]:
  """(target_config, target_params) of config.target via `loading.load_target`.

  'smollm2' | '<path>.gguf' | 'hf:<dir>' | 'saved:<dir>' | 'random_tiny' (random params
  of config.target_model, final norm scaled by its logit_scale so that p is peaked).
  """
  return loading.load_target(config.target, tokenizer, dims=config.target_model)


def load_corpus(config, tokenizer) -> tuple[np.ndarray, np.ndarray]:
  """(train tokens, held-out tokens) of config.corpora, split by document, cached."""
  train, held = [], []
  for corpus in config.corpora:
    docs = data.load_documents(corpus)
    tr, he = data.split_documents(docs, config.heldout_fraction, seed=config.split_seed)
    tag = f"{tokenizer.identity[:12]}-h{config.heldout_fraction:g}-s{config.split_seed}"
    for split, part, out in (("train", tr, train), ("heldout", he, held)):
      out.append(data.tokenize_cached(part, tokenizer, config.cache_dir,
                                      f"{corpus}-{split}-{tag}", tokenizer.eos_id).tokens)
  return np.concatenate(train), np.concatenate(held)


def draft_config_from(config, target_config: ModelConfig, train_tokens=None,
                      always=()) -> ModelConfig:
  """The draft's ModelConfig: config.draft dims on the target's vocabulary and RoPE.

  config.draft.head_vocab = C > 0 gives a vocabulary-subset head on C ids: those in
  `always` (e.g. EOS) and the most frequent train_tokens; 0 or absent: the full vocabulary.
  """
  head_vocab = int(config.draft.get("head_vocab", 0) or 0)
  head_tokens = ()
  if head_vocab:
    if train_tokens is None:
      raise ValueError("draft.head_vocab > 0 needs the training tokens to rank")
    head_tokens = data.frequent_tokens(train_tokens, head_vocab, target_config.vocab_size,
                                       always=always)
  return loading.model_config(config.draft, target_config.vocab_size,
                              rope_theta=target_config.rope_theta,
                              norm_eps=target_config.norm_eps, head_tokens=head_tokens)


def _special_ids(tokenizer) -> tuple[int, ...]:
  """EOS / BOS ids of a tokenizer (those it has)."""
  ids = (getattr(tokenizer, name, None) for name in ("eos_id", "bos_id"))
  return tuple(int(i) for i in ids if i is not None and i >= 0)


def _optim(config, steps: int | None = None, lr: float | None = None,
           warmup: int | None = None) -> OptimizerSettings:
  return OptimizerSettings(lr=config.lr if lr is None else lr,
                           warmup=config.warmup if warmup is None else warmup,
                           steps=config.steps if steps is None else steps, clip=config.clip,
                           weight_decay=config.weight_decay)


def _named_keys(seed: int, *names: str) -> dict[str, Array]:
  root = jax.random.PRNGKey(seed)
  return dict(zip(names, jax.random.split(root, len(names))))


def _mean_metrics(pending: list[dict]) -> dict[str, float]:
  pending = jax.device_get(pending)
  return {k: float(np.mean([m[k] for m in pending])) for k in pending[0]}


def _fmt(metrics: Mapping[str, float], keys=None) -> str:
  keys = keys or sorted(metrics)
  return " ".join(f"{k}={metrics[k]:.4g}" for k in keys if k in metrics)


def _log_default(msg: str) -> None:
  from tqdm import tqdm
  tqdm.write(msg)


def _fit(state: TrainState, *, step_fn, batch_fn, eval_fn, checkpointer, steps: int,
         log_every: int, eval_every: int, stop_after: int, extra: dict, log, desc: str):
  """The shared training loop: resume, step, log, evaluate, checkpoint. -> (state, extra)."""
  from tqdm import tqdm
  start = int(state.step)
  clock = time.perf_counter()
  spent = float(extra.get("train_time_s", 0.0))
  pending: list[dict] = []
  with tqdm(total=steps, initial=start, desc=desc, dynamic_ncols=True) as bar:
    for step in range(start, steps):
      batch = batch_fn(step)
      state, metrics = step_fn(state, batch, jax.random.fold_in(state.rng, step))
      pending.append(metrics)
      done = step + 1
      if done % log_every == 0 or done == steps:
        mean = _mean_metrics(pending)
        pending = []
        extra["last_metrics"] = {"step": done, **mean}
        bar.set_postfix(loss=f"{mean['loss']:.4g}")
        log(f"[{desc}] step {done}: {_fmt(mean)}")
      if eval_every and (done % eval_every == 0 or done == steps):
        result = eval_fn(state.params)
        extra.setdefault("evals", []).append({"step": done, **result})
        log(f"[{desc}] step {done} held-out: {_fmt(result)}")
      extra.update(data_step=done, train_time_s=spent + time.perf_counter() - clock)
      if checkpointer.save(done, state.to_dict(), extra=extra, force=done == steps):
        log(f"[{desc}] checkpoint saved at step {done}")
      bar.update(1)
      if stop_after and done == stop_after:  # a simulated crash: no cleanup at all
        log(f"[{desc}] stop_after={stop_after}: killing this process")
        os.kill(os.getpid(), signal.SIGKILL)
  checkpointer.close()
  return state, extra


def _final_eval(extra: dict, state: TrainState, eval_fn) -> dict:
  """The held-out measures of the final params: the loop's last evaluation if it ran at
  the final step, else a fresh one."""
  evals = extra.get("evals") or [{}]
  if evals[-1].get("step") == int(state.step):
    return {k: v for k, v in evals[-1].items() if k != "step"}
  return eval_fn(state.params)


def _write_json(path: pathlib.Path, obj) -> None:
  tmp = path.with_name(f".{path.name}.tmp")
  tmp.write_text(json.dumps(obj, indent=1, sort_keys=True, default=str))
  os.replace(tmp, path)


# --------------------------------------------------------------------------- runs

@dataclasses.dataclass(frozen=True)
class DistillSetup:
  """Everything a distillation run builds from its config before the loop."""

  tokenizer: Any
  target_config: ModelConfig
  target_params: PyTree
  draft_config: ModelConfig
  settings: DistillSettings
  optim: OptimizerSettings
  train_tokens: np.ndarray  # int32 [N_train]
  windows: np.ndarray  # int32 [eval_windows, seq_len+1], held-out documents
  keys: dict[str, Array]  # 'draft_init', 'train'


def setup_distillation(config) -> DistillSetup:
  """Tokenizer, target, draft config, step settings, corpus and keys of a config."""
  tokenizer = loading.load_tokenizer(config.tokenizer)
  target_config, target_params = load_target(config, tokenizer)
  train_tokens, held_tokens = load_corpus(config, tokenizer)
  settings = DistillSettings(
      loss=config.loss, temperature=config.temperature,
      greedy_temperature=config.greedy_temperature,
      prompt_len=config.prompt_len if config.on_policy_fraction > 0 else 0,
      vocab_size=getattr(tokenizer, "vocab_size", None))
  return DistillSetup(
      tokenizer=tokenizer, target_config=target_config,
      target_params=commit(target_params),
      draft_config=draft_config_from(config, target_config, train_tokens,
                                     always=_special_ids(tokenizer)), settings=settings,
      optim=_optim(config), train_tokens=train_tokens,
      windows=data.heldout_windows(held_tokens, config.eval_windows, config.seq_len,
                                   seed=config.split_seed),
      keys=_named_keys(config.seed, "draft_init", "train"))


def run_distillation(config, workdir: str | os.PathLike, *, log=None) -> dict:
  """Distills config.draft toward config.target; resumes from workdir's latest checkpoint.

  Writes workdir/checkpoints/ (orbax), workdir/draft/ (`save_params`) and
  workdir/report.json, and returns the report.
  """
  log = log or _log_default
  workdir = pathlib.Path(workdir).absolute()
  workdir.mkdir(parents=True, exist_ok=True)
  setup = setup_distillation(config)
  tokenizer, draft_config, train_tokens = setup.tokenizer, setup.draft_config, setup.train_tokens
  target_config, target_params = setup.target_config, setup.target_params
  settings, optim, keys = setup.settings, setup.optim, setup.keys
  identity = ckpt_lib.run_identity(draft_config, tokenizer.identity,
                                   ckpt_lib.target_identity(target_config, target_params))
  log(f"target {config.target}: {param_count(target_params):,} params; draft "
      f"{config.draft_init}: {draft_config}")

  evaluate_fn = functools.partial(
      evaluate, target_params=target_params, windows=setup.windows, draft_config=draft_config,
      target_config=target_config, temperatures=tuple(sorted({0.0, 1.0, config.temperature})),
      batch_size=config.eval_batch_size, vocab_size=settings.vocab_size)
  like = jax.eval_shape(lambda p: init_train_state(p, keys["train"], optim).to_dict(),
                        param_shapes(draft_config))
  checkpointer = ckpt_lib.Checkpointer(workdir / "checkpoints", identity=identity,
                                       save_every=config.checkpoint_every, keep=config.keep)
  restored = checkpointer.restore_latest(like)
  if restored is None:
    params = init_draft_params(draft_config, keys["draft_init"], method=config.draft_init,
                               target_params=target_params, target_config=target_config,
                               tokenizer_identity=tokenizer.identity)
    state = init_train_state(params, keys["train"], optim)
    extra = {"eval_before": evaluate_fn(state.params), "resumed_from": []}
    log(f"before distillation: {_fmt(extra['eval_before'])}")
  else:
    state, extra = TrainState.from_dict(restored[0]), restored[1]
    extra["resumed_from"] = extra.get("resumed_from", []) + [int(state.step)]
    log(f"resumed from step {int(state.step)} in {checkpointer.directory}")

  step_fn = make_train_step(target_params, draft_config=draft_config,
                            target_config=target_config, settings=settings, optim=optim)

  def batch_fn(step):
    tokens = data.batch_at(train_tokens, config.batch_size, config.seq_len, config.seed, step)
    return {"tokens": tokens[:, :-1],
            "on_policy": np.bool_(is_on_policy(step, config.on_policy_fraction))}

  state, extra = _fit(state, step_fn=step_fn, batch_fn=batch_fn,
                      eval_fn=evaluate_fn, checkpointer=checkpointer,
                      steps=config.steps, log_every=config.log_every,
                      eval_every=config.eval_every, stop_after=config.stop_after,
                      extra=extra, log=log, desc=f"distill-{config.loss}")
  after = _final_eval(extra, state, evaluate_fn)
  draft_dir = ckpt_lib.save_params(
      workdir / "draft", state.params, draft_config, tokenizer_identity=tokenizer.identity,
      extra={"target": identity["target"], "loss": config.loss,
             "temperature": config.temperature, "alpha_after": after})
  report = {
      "alpha_before": {k: v for k, v in extra["eval_before"].items() if k.startswith("alpha")},
      "alpha_after": {k: v for k, v in after.items() if k.startswith("alpha")},
      "eval_before": extra["eval_before"], "eval_after": after,
      "evals": extra.get("evals", []), "final_train_metrics": extra.get("last_metrics"),
      "loss": config.loss, "temperature": config.temperature,
      "training_time_s": extra.get("train_time_s"), "steps": int(state.step),
      "resumed_from": extra.get("resumed_from", []),
      "seeds": {"seed": config.seed, "split_seed": config.split_seed,
                "target_seed": config.target_model.seed if config.target == "random_tiny"
                else None},
      "target": config.target, "target_identity": identity["target"],
      "tokenizer": tokenizer.identity, "draft_config": draft_config.to_dict(),
      "draft_params": param_count(state.params), "draft_dir": str(draft_dir),
      "config": config.to_dict(),
  }
  _write_json(workdir / "report.json", report)
  log(f"alpha before {report['alpha_before']} -> after {report['alpha_after']}")
  return report


def run_pretraining(config, workdir: str | os.PathLike, *, models=("target", "draft"),
                    log=None) -> dict:
  """Trains config.target_model and/or config.draft from scratch with cross-entropy.

  Each model gets workdir/<name>/checkpoints and workdir/<name>/model (`save_params`,
  usable as target 'saved:<dir>' or draft_init 'saved:<dir>'); returns a report per model.
  """
  log = log or _log_default
  workdir = pathlib.Path(workdir).absolute()
  tokenizer = loading.load_tokenizer(config.tokenizer)
  train_tokens, held_tokens = load_corpus(config, tokenizer)
  pre = config.pretrain
  windows = data.heldout_windows(held_tokens, config.eval_windows, pre.seq_len,
                                 seed=config.split_seed)
  vocab = tokenizer.vocab_size
  reports = {}
  for name in models:
    dims = {"target": config.target_model, "draft": config.draft}[name]
    if dims.get("head_vocab") or dims.get("head_tokens"):
      raise ValueError(f"pretraining trains a full-vocabulary head (cross-entropy needs q > 0 "
                       f"on every label); set {name}.head_vocab=0, got "
                       f"{dims.get('head_vocab') or len(dims.get('head_tokens'))}")
    model_config = loading.model_config(dims, vocab)
    keys = _named_keys(config.seed, f"{name}_init", "train")
    optim = _optim(config, steps=pre.steps, lr=pre.lr, warmup=pre.warmup)
    identity = ckpt_lib.run_identity(model_config, tokenizer.identity, "none (pretraining)")
    checkpointer = ckpt_lib.Checkpointer(workdir / name / "checkpoints", identity=identity,
                                         save_every=config.checkpoint_every, keep=config.keep)
    like = jax.eval_shape(lambda p: init_train_state(p, keys["train"], optim).to_dict(),
                          param_shapes(model_config))
    restored = checkpointer.restore_latest(like)
    if restored is None:
      state = init_train_state(random_params(model_config, keys[f"{name}_init"]),
                               keys["train"], optim)
      extra = {"resumed_from": []}
    else:
      state, extra = TrainState.from_dict(restored[0]), restored[1]
      extra["resumed_from"] = extra.get("resumed_from", []) + [int(state.step)]
      log(f"[{name}] resumed from step {int(state.step)}")
    eval_fn = functools.partial(evaluate, target_params=None, windows=windows,
                                draft_config=model_config, target_config=None,
                                batch_size=config.eval_batch_size)
    step_fn = functools.partial(lm_train_step, config=model_config, optim=optim)
    state, extra = _fit(
        state, step_fn=step_fn,
        batch_fn=lambda s: data.batch_at(train_tokens, pre.batch_size, pre.seq_len,
                                         config.seed, s),
        eval_fn=eval_fn, checkpointer=checkpointer, steps=pre.steps,
        log_every=config.log_every, eval_every=config.eval_every,
        stop_after=config.stop_after, extra=extra, log=log, desc=f"pretrain-{name}")
    nll = _final_eval(extra, state, eval_fn)["draft_nll"]
    heldout = {"nll": nll, "ppl": math.exp(nll)}
    model_dir = ckpt_lib.save_params(workdir / name / "model", state.params, model_config,
                                     tokenizer_identity=tokenizer.identity,
                                     extra={"heldout": heldout})
    reports[name] = {"heldout": heldout, "model_dir": str(model_dir),
                     "training_time_s": extra.get("train_time_s"), "steps": int(state.step),
                     "params": param_count(state.params), "config": model_config.to_dict(),
                     "resumed_from": extra.get("resumed_from", [])}
  report = {"models": reports, "tokenizer": tokenizer.identity, "seed": config.seed,
            "config": config.to_dict()}
  _write_json(workdir / "pretrain_report.json", report)
  return report
