"""A feature draft (EAGLE-3 style): it reads the target's hidden states, owns no embedding.

Letters: B batch, d drafted tokens this step, G = γ (or γ_max), L the skip lag, V
vocabulary, F target feature width, Dm the draft's width, N tree nodes, D tree depth.

The draft pairs the token at position j with the target's features at j-1 (`models.model`'s
module docstring). Its state (`FeatureState`) is its cache, holding positions below
ℓ_d = cache['length'] computed from the target's true features, and `features` [B,G+1+L,F],
the target's features at ℓ_d-1 .. ℓ_d+G+L-1. One chain step (ℓ = num_tokens-1):
  1'. one draft call re-reads positions ℓ_d .. ℓ_d+G+L (tokens from the buffer, true
      features; fixed width, only ℓ_d..ℓ valid per row, later slots are overwritten before
      they are attended) and gives q_1 from the output at position ℓ;
  2'. a `lax.scan` of d-1 cached calls feeds x_i at position ℓ+i with the draft's own last
      hidden state as context, sampling x_{i+1} ~ q_{i+1}.
The target call returns its features at ℓ..ℓ+k-1; they become `features` and ℓ_d = ℓ+1,
so the next re-read covers the n+1 positions accepted, whichever tokens were proposed
(`follows_emitted`: a hybrid may replace the draft's proposals).

Plain steps may skip the draft (gamma 'auto', `skip_lag` = FEATURE_LAG): the cache keeps
ℓ_d and the target's features at ℓ join `features` at index ℓ - ℓ_d + 1, so the next
drafting step's re-read reads true features for every skipped token, as if it had never
been skipped. When the buffer is full, one cache-only call re-reads its first L positions
and the buffer moves on by them (`catch_up`), however long the row goes on skipping.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.drafts import tree_drafting
from specdec_jax.drafts.base import ModelDraft, sample_rows, with_length
from specdec_jax.models.model import ModelConfig, forward

Array = jax.Array
# gamma='auto': plain steps (no row proposes) may skip a feature draft for up to this many
# positions beyond the G+1 its re-read covers, after which one cache-only call catches up
# on them (`catch_up`). Every drafting step's re-read is G+1+L wide, so L trades that
# width against one catch-up call per L skipped steps.
FEATURE_LAG = 8


@flax.struct.dataclass
class FeatureState:
  """A feature draft's state: its KV cache and the target's features it re-reads."""

  cache: dict
  features: Array  # float [B,G+1+L,F]: the target's features at ℓ_d-1 ..


@dataclasses.dataclass(frozen=True)
class FeatureDraft(ModelDraft):
  """An EAGLE-3 style draft over a target's fused hidden states (`ModelConfig.feature_layers`)."""

  def __post_init__(self):
    if not isinstance(self.config, ModelConfig) or not self.config.feature_layers:
      raise ValueError(f"a feature draft needs a ModelConfig with feature_layers, got "
                       f"{self.config!r}")

  @property
  def target_layers(self) -> tuple[int, ...]:
    return self.config.feature_layers

  @property
  def skip_lag(self) -> int:
    return FEATURE_LAG

  @property
  def follows_emitted(self) -> bool:
    return True

  def check(self, params, target_config) -> None:
    config = self.config
    if config.feature_width != target_config.embed_dim:
      raise ValueError(f"feature draft reads target width {config.feature_width}, the "
                       f"target has embed_dim {target_config.embed_dim}")
    if max(config.feature_layers) > target_config.num_layers:
      raise ValueError(f"feature draft fuses target layers {config.feature_layers}; the "
                       f"target has {target_config.num_layers}")
    if not isinstance(params, dict):
      raise ValueError(f"draft params must be a dict pytree, got {type(params).__name__}")
    fuse = params.get("fuse")
    want = (len(config.feature_layers) * config.feature_width, config.embed_dim)
    if fuse is None or fuse.shape != want:
      got = None if fuse is None else fuse.shape
      raise ValueError(f"draft params do not match its feature-draft config: fuse is {got}, "
                       f"expected {want}")

  def check_tree(self, shape, rule, vocab_size) -> None:
    tree_drafting.check_model_tree(shape, rule, vocab_size)

  def prefill(self, params, target_params, tokens, positions, prompt_len, *, target_features,
              empty_cache, window):
    width = tokens.shape[1]
    # shifted[:, j] = the target's features at j-1 (zeros at position 0)
    shifted = jnp.pad(target_features, ((0, 0), (1, window - 1), (0, 0)))
    _, cache = forward(params, tokens, positions, empty_cache(self.config), config=self.config,
                       return_logits=False, input_embed=target_params["embed"],
                       target_features=shifted[:, :width])
    features = jax.vmap(lambda row, at: jax.lax.dynamic_slice_in_dim(row, at, window))(
        shifted, prompt_len - 1)
    return FeatureState(cache=with_length(cache, prompt_len - 1), features=features)

  def reread(self, params, target_params, state):
    """Step 1': the re-read of positions ℓ_d..ℓ_d+G+L -> (logits [B,1,V] at ℓ, cache,
    h [B,Dm] the draft's last hidden state at ℓ)."""
    draft = state.draft_state
    length = state.num_tokens - 1
    base = draft.cache["length"]  # ℓ_d [B]
    offsets = jnp.arange(draft.features.shape[1])[None, :]
    tokens = jnp.take_along_axis(state.tokens, base[:, None] + offsets, axis=1)
    at = (length - base)[:, None]  # the pending token's index in the re-read [B,1]
    logits, cache, hidden = forward(params, tokens, base[:, None] + offsets, draft.cache,
                                    config=self.config, input_embed=target_params["embed"],
                                    target_features=draft.features,
                                    hidden_layers=(self.config.num_layers,), logits_at=at)
    return logits, cache, jnp.take_along_axis(hidden, at[:, :, None], axis=1)[:, 0]

  def propose(self, params, target_params, state, keys, *, plan, chosen, warp_fn, greedy,
              vocab_size, shallow=None):
    """As `Draft.propose`; where shallow, step 2' is skipped (a `lax.cond`): x_1, q_1 and
    the re-read's cache as always, zeros at 2..d. The cache differs only past ℓ+1, which
    the next step's re-read rewrites."""
    length = state.num_tokens - 1
    gamma = keys.shape[1]
    embed = target_params["embed"]
    logits, cache, h = self.reread(params, target_params, state)
    q1 = warp_fn(logits[:, 0])
    x1 = sample_rows(keys[:, 0], q1, greedy)

    def draft_one(carry, step_keys):
      cache, token, h, pos = carry
      logits, cache, h = forward(params, token[:, None], pos[:, None], cache,
                                 config=self.config, input_embed=embed, context=h[:, None],
                                 hidden_layers=(self.config.num_layers,))
      q = warp_fn(logits[:, 0])
      x = sample_rows(step_keys, q, greedy)
      return (cache, x, h[:, 0], pos + 1), (x, q)

    def deep(cache):
      (cache, _, _, _), (xs, qs) = jax.lax.scan(
          draft_one, (with_length(cache, length + 1), x1, h, length + 1),
          jnp.swapaxes(keys[:, 1:], 0, 1))
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
    return xs, qs, state.draft_state.replace(cache=cache)

  def observe_target(self, draft_state, target_features, *, length, width, skipped):
    old = draft_state.features
    features = target_features.astype(old.dtype)
    if skipped:  # the target's features at ℓ join the buffer at index ℓ - ℓ_d + 1
      at = length - draft_state.cache["length"] + 1
      features = jax.vmap(lambda row, f, i: jax.lax.dynamic_update_slice(row, f, (i, 0)))(
          old, features, at)
    else:
      features = jnp.pad(features, ((0, 0), (0, old.shape[1] - width), (0, 0)))
    return draft_state.replace(features=features)

  def rollback(self, draft_state, *, length, new_length, skipped):
    if skipped:  # ℓ_d stays: the next drafting step's re-read covers the skipped tokens
      return draft_state
    # the re-read of the next step starts right after the pending token t
    return draft_state.replace(cache=with_length(draft_state.cache, length + 1))

  def room_to_skip(self, draft_state, length):
    behind = length - draft_state.cache["length"]  # ℓ - ℓ_d [B]
    return behind <= draft_state.features.shape[1] - 2

  def ready_to_draft(self, draft_state, length):
    behind = length - draft_state.cache["length"]  # the re-read reaches ℓ
    return behind <= draft_state.features.shape[1] - 1

  def catch_up(self, params, target_params, state):
    """One cache-only call re-reads positions ℓ_d..ℓ_d+L-1 (L = FEATURE_LAG) from the
    buffer; ℓ_d advances by n = min(L, ℓ - ℓ_d) and the buffer by n entries."""
    draft = state.draft_state
    base = draft.cache["length"]  # ℓ_d [B]
    at = base[:, None] + jnp.arange(FEATURE_LAG)[None, :]
    tokens = jnp.take_along_axis(state.tokens, at, axis=1)
    _, cache = forward(params, tokens, at, draft.cache, config=self.config,
                       return_logits=False, input_embed=target_params["embed"],
                       target_features=draft.features[:, :FEATURE_LAG])
    moved = jnp.minimum(FEATURE_LAG, state.num_tokens - 1 - base)  # n [B]
    width = draft.features.shape[1]
    padded = jnp.pad(draft.features, ((0, 0), (0, FEATURE_LAG), (0, 0)))
    features = jax.vmap(lambda row, n: jax.lax.dynamic_slice_in_dim(row, n, width))(
        padded, moved)
    return FeatureState(cache=with_length(cache, base + moved), features=features)

  def propose_tree(self, params, target_params, state, keys, *, shape, rule, warp_fn,
                   vocab_size, greedy, lookup=None):
    del lookup  # a hybrid's lookup tree: advance_tree re-reads the path whatever was proposed
    logits, cache, h = self.reread(params, target_params, state)
    embed = target_params["embed"]
    own = (self.config.num_layers,)

    def level(x, positions, cache, mask, parents, hiddens):
      # each node's context: the draft's hidden state at its parent's position
      context = jnp.take(hiddens, jnp.asarray(parents), axis=1)
      logits, cache, hidden = forward(params, x, positions, cache, config=self.config,
                                      attn_mask=mask, input_embed=embed, context=context,
                                      hidden_layers=own)
      return logits, cache, jnp.concatenate([hiddens, hidden], axis=1)

    nodes, q_at, cache, scores = tree_drafting.draft_levels(
        shape, rule, logits, cache, h[:, None], level, keys=keys,
        length=state.num_tokens - 1, warp_fn=warp_fn, vocab_size=vocab_size, greedy=greedy)
    return nodes, q_at, state.draft_state.replace(cache=cache), scores

  def advance_tree(self, draft_state, *, length, new_length, path, call_path, target_features):
    # the target's features at ℓ (root) and the path, then ℓ_d = ℓ+1
    depth = path.shape[1]
    at = jnp.concatenate([jnp.zeros_like(path[:, :1]), call_path + 1], axis=1)  # [B,D+1]
    feats = jnp.take_along_axis(target_features, jnp.maximum(at, 0)[:, :, None], axis=1)
    valid = jnp.concatenate([jnp.ones_like(path[:, :1], bool), path >= 0], axis=1)
    feats = jnp.where(valid[:, :, None], feats, 0)  # zeros past the path, as the chain pads
    width = draft_state.features.shape[1]
    feats = jnp.pad(feats.astype(draft_state.features.dtype),
                    ((0, 0), (0, width - depth - 1), (0, 0)))
    return FeatureState(cache=with_length(draft_state.cache, length + 1), features=feats)
