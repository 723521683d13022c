"""The distillation step: settings, optimizer, loss, on-policy sampling, train state.

Letters: B batch, T window length (positions), V vocabulary, C subset-head columns,
P on-policy prompt length, N = T - P sampled continuation tokens, K unrolled passes of a
feature draft's training-time test, F target feature width.

Only the draft is differentiated: `loss_fn(draft_params, target, batch)` returns
(loss, metrics); the jitted `train_step` applies optax updates and donates the state.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax.models import sharding
from specdec_jax.distill.divergences import LOSSES, logit_divergences, subset_divergences
from specdec_jax.models.model import ModelConfig, forward, init_cache, unrolled_feature_logits
from specdec_jax.models.sampling import sample, warp
from specdec_jax.models.subset_head import subset_columns

Array = jax.Array
PyTree = Any


# --------------------------------------------------------------------------- settings

@dataclasses.dataclass(frozen=True)
class DistillSettings:
  """What the distillation step optimises; hashable (a jit static).

  prompt_len: P, the on-policy prompt length (0 compiles no sampler; steps must then be
    teacher-forced). vocab_size: the true vocabulary (None: the logits' common width).
  unroll: K, the passes of a feature draft's training-time test (`feature_loss_fn`).
  """

  loss: str = "fkl"
  temperature: float = 1.0
  greedy_temperature: float = 1.0
  prompt_len: int = 0
  vocab_size: int | None = None
  unroll: int = 1

  def __post_init__(self):
    if self.loss not in LOSSES:
      raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
    if not self.temperature >= 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
    if not self.greedy_temperature > 0:
      raise ValueError(f"greedy_temperature must be > 0, got {self.greedy_temperature!r}")
    if self.prompt_len < 0:
      raise ValueError(f"prompt_len must be >= 0, got {self.prompt_len}")
    if not isinstance(self.unroll, int) or self.unroll < 1:
      raise ValueError(f"unroll must be an int >= 1, got {self.unroll!r}")


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
  if draft_config.reads_target_features:
    raise ValueError("a feature draft trains with feature_loss_fn on the target's features, "
                     "not loss_fn")
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
  def from_dict(cls, d: Mapping, mesh=None) -> "TrainState":
    return commit(cls(step=jnp.asarray(d["step"], jnp.int32), params=d["params"],
                      opt_state=d["opt_state"], rng=jnp.asarray(d["rng"], jnp.uint32)), mesh)


def commit(tree: PyTree, mesh=None, kind: str = "params") -> PyTree:
  """`tree` placed on the default device, committed there; or, with a ('data', 'model')
  mesh, placed on it by `sharding.place(tree, mesh, kind)` (params and states: Megatron
  specs; 'batch': rows over 'data'; 'replicated').

  A jitted step's outputs are committed arrays; inputs that are not (fresh
  `jnp` arrays) lower with unspecified shardings, so without this the second
  step would compile the whole step a second time.
  """
  if mesh is not None:
    return sharding.place(tree, mesh, kind)
  device = jax.devices()[0]
  return jax.tree.map(lambda x: x if _on_many_devices(x) else jax.device_put(x, device), tree)


def _on_many_devices(x) -> bool:
  """x is a global array spread over a mesh (left where it is by `commit`)."""
  return (isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
          and len(x.sharding.device_set) > 1)


def init_train_state(params, rng: Array, optim: OptimizerSettings, mesh=None) -> TrainState:
  """A fresh, committed state at step 0. params are copied: the train steps donate it."""
  params = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=make_optimizer(optim).init(params), rng=jnp.asarray(rng))
  return state if isinstance(params, jax.core.Tracer) else commit(state, mesh)


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
                    settings: DistillSettings, optim: OptimizerSettings, mesh=None
                    ) -> Callable[[TrainState, Mapping, Array], tuple[TrainState, dict]]:
  """`train_step(state, batch, key) -> (state, metrics)` with the target frozen.

  target_params is passed to the jitted step as an argument (not baked in as a
  constant) and is never differentiated; the state is donated. With a mesh, params
  and state are sharded over 'model' and the batch over 'data' (`commit`); XLA inserts
  the gradient all-reduce.
  """
  target_params = commit(target_params, mesh)

  def step(state, batch, key):  # committed inputs: one compilation (see `commit`)
    return train_step(commit(state, mesh), target_params, commit(batch, mesh, "batch"),
                      commit(key, mesh, "replicated"), draft_config=draft_config,
                      target_config=target_config, settings=settings, optim=optim)
  return step


# --------------------------------------------------------------------------- feature drafts

def head_columns(draft_config: ModelConfig) -> Array:
  """int32 [V]: the head column of each token id (-1 where a subset head has none)."""
  v = draft_config.vocab_size
  if not draft_config.head_tokens:
    return jnp.arange(v, dtype=jnp.int32)
  column, kept = subset_columns(draft_config.head_tokens, v)
  return jnp.asarray(np.where(kept, column, -1), jnp.int32)


def feature_loss_fn(draft_params, input_embed: Array, batch: Mapping[str, Array], *,
                    draft_config: ModelConfig, settings: DistillSettings):
  """A feature draft's training-time-test loss: (draft_params, target embedding, batch).

  batch (one target forward, e.g. from `feature_cache`): 'tokens' int32 [B,T];
  'features' [B,T,F] (the target's residual streams at draft_config.feature_layers);
  'target_logp' [B,T,C] (log p at `training_temperature` on the draft's C columns,
  normalised over the full vocabulary); 'target_argmax' int32 [B,T] (full vocabulary).
  The draft is unrolled K = settings.unroll passes (`unrolled_feature_logits`); pass k
  counts at positions i >= k-1 and every pass weighs the same. Returns (loss, metrics):
  as `loss_fn`, with 'alpha' and 'top1' of pass 1 and 'alpha_k<k>' of every pass.
  """
  tokens = batch["tokens"]
  k, (b, t) = settings.unroll, tokens.shape
  dt = draft_config.jnp_dtype
  logits = unrolled_feature_logits(draft_params, tokens, batch["features"].astype(dt),
                                   config=draft_config, input_embed=input_embed, depth=k)
  columns = head_columns(draft_config)
  argmax_col = columns[batch["target_argmax"]]  # [B,T], -1 off the head
  p_greedy = None
  if settings.temperature == 0:
    p_greedy = jax.nn.one_hot(argmax_col, logits.shape[-1], dtype=jnp.float32)  # 0 at -1
  divs = subset_divergences(batch["target_logp"][None], logits,
                            temperature=settings.temperature,
                            greedy_temperature=settings.greedy_temperature,
                            p_greedy=None if p_greedy is None else p_greedy[None],
                            full_head=not draft_config.head_tokens)  # each [K,B,T]
  rows = jnp.arange(t)[None, :] >= jnp.arange(k)[:, None]  # [K,T]: pass k+1 counts at i >= k
  weights = jnp.broadcast_to(rows[:, None, :], (k, b, t)).astype(jnp.float32)
  weights = weights / jnp.sum(weights, axis=(1, 2), keepdims=True) / k  # passes weigh the same
  loss = jnp.sum(divs[settings.loss] * weights)

  sg = jax.lax.stop_gradient
  agree = jnp.argmax(logits, -1) == argmax_col[None]  # [K,B,T]
  per_pass = {name: jnp.sum(sg(d) * weights, axis=(1, 2)) * k for name, d in divs.items()}
  top1 = jnp.sum(agree * weights, axis=(1, 2)) * k
  alpha = 1.0 - per_pass["tvd"] if settings.temperature > 0 else top1
  metrics = {name: d[0] for name, d in per_pass.items()}
  metrics.update(loss=sg(loss), alpha=alpha[0], top1=top1[0],
                 positions=jnp.asarray(b * t, jnp.float32))
  metrics.update({f"alpha_k{i + 1}": alpha[i] for i in range(k)})
  return loss, metrics


def feature_train_step_fn(state: "TrainState", input_embed: Array, batch: Mapping[str, Array],
                          key: Array, *, draft_config: ModelConfig, settings: DistillSettings,
                          optim: "OptimizerSettings"):
  """One feature-draft step on a batch of cached target outputs (see `feature_loss_fn`).

  The target's embedding (input_embed) is read, never trained; key is unused (teacher
  forcing only), kept for the common loop.
  """
  del key
  grad_fn = jax.value_and_grad(feature_loss_fn, has_aux=True)
  (_, metrics), grads = grad_fn(state.params, input_embed, batch, draft_config=draft_config,
                                settings=settings)
  state, stats = _apply_gradients(state, grads, optim)
  metrics.update(stats)
  return state, metrics


feature_train_step = jax.jit(feature_train_step_fn, donate_argnums=(0,), static_argnames=(
    "draft_config", "settings", "optim"))


def make_feature_train_step(input_embed: Array, *, draft_config: ModelConfig,
                            settings: DistillSettings, optim: "OptimizerSettings", mesh=None
                            ) -> Callable[["TrainState", Mapping, Array], tuple]:
  """`train_step(state, batch, key) -> (state, metrics)` for a feature draft (mesh: see
  `make_train_step`)."""
  input_embed = commit({"embed": input_embed}, mesh)["embed"]

  def step(state, batch, key):
    return feature_train_step(commit(state, mesh), input_embed,
                              commit(batch, mesh, "batch"), commit(key, mesh, "replicated"),
                              draft_config=draft_config, settings=settings, optim=optim)
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
