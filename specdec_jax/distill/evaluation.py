"""Held-out measures of a draft against its target: α per temperature, top-1, NLL.

Letters: N windows, T window length, V vocabulary.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.distill.step import _common_vocab, commit, full_logits
from specdec_jax.models.model import ModelConfig, forward, init_cache, unrolled_feature_logits
from specdec_jax.models.sampling import warp


# --------------------------------------------------------------------------- evaluation

def _alpha_key(temperature: float) -> str:
  return f"alpha_t{temperature:g}"


def _depth_key(temperature: float, depth: int) -> str:
  return f"alpha_t{temperature:g}_d{depth}"


@functools.partial(jax.jit, static_argnames=(
    "draft_config", "target_config", "temperatures", "top_k", "top_p", "vocab_size", "depth"))
def _eval_chunk(draft_params, target_params, windows, weights, *, draft_config, target_config,
                temperatures, top_k, top_p, vocab_size, depth=1):
  """Sums over one chunk of windows [b,T+1] (row weights [b]) of per-position measures."""
  inputs, labels = windows[:, :-1], windows[:, 1:]
  w = jnp.broadcast_to(weights[:, None], inputs.shape)
  target = None
  if draft_config.reads_target_features:  # the draft reads the target's features: one forward
    b, t = inputs.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    target, _, features = forward(target_params, inputs, positions,
                                  init_cache(target_config, b, t), config=target_config,
                                  hidden_layers=draft_config.feature_layers)
    target = target[..., :vocab_size]
    passes = unrolled_feature_logits(draft_params, inputs, features, config=draft_config,
                                     input_embed=target_params["embed"], depth=depth,
                                     full_vocab=True)[..., :vocab_size]
    draft = passes[0]
  else:
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
    if target is None:
      target = full_logits(target_params, inputs, target_config)[..., :vocab_size]
    sums["target_nll"] = jnp.sum(nll(target) * w)
    sums["top1"] = jnp.sum((jnp.argmax(target, -1) == jnp.argmax(draft, -1)) * w)
    for t in temperatures:
      p = warp(target, t, top_k, top_p)
      beta = jnp.sum(jnp.minimum(p, warp(draft, t, top_k, top_p)), -1)
      sums[_alpha_key(t)] = jnp.sum(beta * w)
      for k in range(2, depth + 1):  # the k-th drafted token: pass k, rows i >= k-1
        valid = w * (jnp.arange(inputs.shape[1]) >= k - 1)[None, :]
        sums[f"positions_d{k}"] = jnp.sum(valid)
        beta_k = jnp.sum(jnp.minimum(p, warp(passes[k - 1], t, top_k, top_p)), -1)
        sums[_depth_key(t, k)] = jnp.sum(beta_k * valid)
  return sums


def evaluate(draft_params, target_params, windows, *, draft_config: ModelConfig,
             target_config: ModelConfig | None, temperatures=(0.0, 1.0), top_k: int = 0,
             top_p: float = 1.0, batch_size: int = 8, vocab_size: int | None = None,
             depth: int = 1) -> dict[str, float]:
  """Held-out measures over windows [N,T+1] (inputs [:, :-1], labels [:, 1:]), in chunks.

  Returns means over all N·T positions: 'alpha_t<τ>' = mean Σ min(p,q) at each τ (with
  top_k / top_p), 'top1' (argmax agreement), 'target_nll', 'draft_nll'; and 'positions'.
  A vocabulary-subset draft also gives 'draft_label_coverage' (the fraction of labels in
  its vocabulary); its 'draft_nll' is the mean over those labels.
  With target_params None only 'draft_nll' is measured. A feature draft is measured at
  its first drafted position (pass 1 of `unrolled_feature_logits`: true target features);
  with depth K > 1 also at drafted positions k = 2..K ('alpha_t<τ>_d<k>': pass k, which
  reads its own hidden states, over the positions i >= k-1 where it is defined).
  """
  if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
    raise ValueError(f"depth must be an int >= 1, got {depth!r}")
  if depth > 1 and not draft_config.reads_target_features:
    raise ValueError(f"depth={depth} > 1 is measured for feature drafts only")
  windows = np.asarray(windows, np.int32)
  if windows.ndim != 2 or windows.shape[1] < 2:
    raise ValueError(f"windows must be int [N,T+1] with T >= 1, got shape {windows.shape}")
  if target_params is None:
    if draft_config.reads_target_features:
      raise ValueError("a feature draft is evaluated with its target (target_params)")
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
        top_k=top_k, top_p=top_p, vocab_size=vocab, depth=depth))
    for k, v in sums.items():
      totals[k] = totals.get(k, 0.0) + float(v)
  count = totals.pop("positions")
  counts = {k: totals.pop(f"positions_d{k}") for k in range(2, depth + 1)
            if f"positions_d{k}" in totals}
  out = {k: v / counts[int(k.rsplit("_d", 1)[1])] if "_d" in k and k.startswith("alpha")
         else v / count for k, v in totals.items()}
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
