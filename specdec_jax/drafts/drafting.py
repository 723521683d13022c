"""Drafting: the proposals x and their laws q of one speculative step, per draft kind.

Letters: B batch, d drafted tokens this step (<= G), V vocabulary, G+1 re-read width
of a feature draft, F target feature width, E embedding width.

The draft interface (one per `ModelConfig.kind` or draft class; `DRAFT_FNS`):
  draft_fn(target_params, draft_params, state, draft_keys [B,d,2], *, draft_config,
           gamma=d, warp_fn, greedy) -> (xs int32 [B,d], qs float32 [B,d,V], draft cache)
state is the decode loop's `speculative.DecodeState`; x_i is drawn with draft_keys[:, i-1]
from q_i = warp_fn(draft logits), so each row's proposals are a function of its own
tokens, cache and keys alone. The prompt lookup (`ngram`) needs no function: its
proposals come from `ngram.lookup` with q one-hot. The steps each function runs are
those of `speculative`'s module docstring (1-2 for an independent draft, 1'-2' for a
feature draft).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specdec_jax.drafts import ngram
from specdec_jax.models.model import ModelConfig, forward
from specdec_jax.models.sampling import sample

Array = jax.Array
# ModelConfig.kind 'model' | 'feature'; 'ngram'; 'hybrid' (lookup + a feature draft)
DraftConfig = ModelConfig | ngram.NgramDraft | ngram.HybridDraft


def with_length(cache: dict, length: Array) -> dict:
  """The cache with its valid length set (a rollback or an advance; entries stay)."""
  return {**cache, "length": length}


def pending_tokens(state) -> Array:
  """int32 [B]: each row's pending token, tokens[b, num_tokens[b]-1]."""
  return jnp.take_along_axis(state.tokens, (state.num_tokens - 1)[:, None], axis=1)[:, 0]


def draft_model(target_params, draft_params, state, draft_keys: Array, *,
                 draft_config: ModelConfig, gamma: int, warp_fn, greedy: bool):
  """Steps 1-2 for an independent draft -> (xs [B,G], qs [B,G,V], draft cache)."""
  del target_params
  length = state.num_tokens - 1

  def draft_one(carry, keys):
    cache, token, pos = carry
    logits, cache = forward(draft_params, token[:, None], pos[:, None], cache,
                            config=draft_config)
    q = warp_fn(logits[:, 0])
    x = jax.vmap(functools.partial(sample, greedy=greedy))(keys, q)
    return (cache, x, pos + 1), (x, q)

  draft_cache = with_length(state.draft_cache, length)
  (draft_cache, last, _), (xs, qs) = jax.lax.scan(
      draft_one, (draft_cache, pending_tokens(state), length), jnp.swapaxes(draft_keys, 0, 1))
  _, draft_cache = forward(draft_params, last[:, None], (length + gamma)[:, None], draft_cache,
                           config=draft_config, return_logits=False)
  return jnp.swapaxes(xs, 0, 1), jnp.swapaxes(qs, 0, 1), draft_cache


def draft_feature(target_params, draft_params, state, draft_keys: Array, *,
                   draft_config: ModelConfig, gamma: int, warp_fn, greedy: bool,
                   shallow: Array | None = None):
  """Steps 1'-2' for a feature draft -> (xs [B,G], qs [B,G,V], draft cache).

  shallow: bool [] (traced): where true, step 2' is skipped (a `lax.cond`): x_1, q_1 and the
  re-read's cache as always, zeros at positions 2..G (no row proposes them: see
  `draft_hybrid`). The cache differs only past ℓ+1, which the next step's re-read rewrites.
  """
  length = state.num_tokens - 1
  embed = target_params["embed"]
  own = (draft_config.num_layers,)  # the draft's last hidden state: its own context
  draft_sample = jax.vmap(functools.partial(sample, greedy=greedy))
  base = state.draft_cache["length"]  # ℓ_d [B]
  offsets = jnp.arange(state.features.shape[1])[None, :]  # G+1 at every call width
  reread = jnp.take_along_axis(state.tokens, base[:, None] + offsets, axis=1)  # [B,G+1]
  at = (length - base)[:, None]  # the pending token's index in the re-read [B,1]
  logits, cache, hidden = forward(draft_params, reread, base[:, None] + offsets,
                                  state.draft_cache, config=draft_config, input_embed=embed,
                                  target_features=state.features, hidden_layers=own,
                                  logits_at=at)
  first = logits[:, 0]
  h = jnp.take_along_axis(hidden, at[:, :, None], axis=1)[:, 0]
  q1 = warp_fn(first)
  x1 = draft_sample(draft_keys[:, 0], q1)

  def draft_one(carry, keys):
    cache, token, h, pos = carry
    logits, cache, h = forward(draft_params, token[:, None], pos[:, None], cache,
                               config=draft_config, input_embed=embed, context=h[:, None],
                               hidden_layers=own)
    q = warp_fn(logits[:, 0])
    x = draft_sample(keys, q)
    return (cache, x, h[:, 0], pos + 1), (x, q)

  def deep(cache):
    (cache, _, _, _), (xs, qs) = jax.lax.scan(
        draft_one, (with_length(cache, length + 1), x1, h, length + 1),
        jnp.swapaxes(draft_keys[:, 1:], 0, 1))
    return jnp.swapaxes(xs, 0, 1), jnp.swapaxes(qs, 0, 1), cache

  if gamma == 1:
    xs, qs = x1[:, None], q1[:, None]
  else:
    if shallow is None:
      rest, qrest, cache = deep(cache)
    else:
      b, v = q1.shape
      rest, qrest, cache = jax.lax.cond(
          shallow, lambda c: (jnp.zeros((b, gamma - 1), x1.dtype),
                              jnp.zeros((b, gamma - 1, v), q1.dtype), c), deep, cache)
    xs = jnp.concatenate([x1[:, None], rest], axis=1)
    qs = jnp.concatenate([q1[:, None], qrest], axis=1)
  return xs, qs, cache


def draft_hybrid(target_params, draft_params, state, draft_keys: Array, *,
                  draft_config: ngram.HybridDraft, gamma: int, warp_fn, greedy: bool,
                  lookup: tuple[Array, Array] | None = None, chosen: Array | None = None):
  """The feature draft's steps 1'-2' for every row; rows with a lookup match take its
  proposals, q one-hot -> (xs [B,G], qs [B,G,V], draft cache).

  lookup: (proposals [B,>=G], found [B]) of `ngram.lookup` when the caller has it.
  chosen int [B] (γ_b, 0 for idle rows): when every row that proposes two or more takes
  the lookup, the feature draft's deeper drafts (step 2') are skipped: no row proposes
  them, and every token and q handed to the verifier is the same as with them.
  """
  if lookup is None:
    lookup = ngram.lookup(state.tokens, state.num_tokens, min_n=draft_config.min_n,
                          max_n=draft_config.max_n, gamma=gamma)
  looked, found = lookup[0][:, :gamma], lookup[1]
  shallow = None if chosen is None else jnp.all(found | (chosen <= 1))
  xs, qs, cache = draft_feature(target_params, draft_params, state, draft_keys,
                                draft_config=draft_config.feature, gamma=gamma,
                                warp_fn=warp_fn, greedy=greedy, shallow=shallow)
  one_hot = jax.nn.one_hot(looked, qs.shape[-1], dtype=qs.dtype)
  return (jnp.where(found[:, None], looked, xs), jnp.where(found[:, None, None], one_hot, qs),
          cache)


def feature_part(draft_config: DraftConfig | None) -> ModelConfig | None:
  """The feature draft that reads the target's features: the draft itself or a hybrid's."""
  kind = getattr(draft_config, "kind", None)
  return draft_config.feature if kind == "hybrid" else (
      draft_config if kind == "feature" else None)


# kind -> draft function (the lookup draft has none; see the module docstring)
DRAFT_FNS = dict(model=draft_model, feature=draft_feature, hybrid=draft_hybrid)
