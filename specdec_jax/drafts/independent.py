"""An independent draft: any model on the target's vocabulary, with its own KV cache.

Letters: B batch, d drafted tokens this step, V vocabulary, N tree nodes, D tree depth.

One chain step for row b (length ℓ = num_tokens[b]-1, pending token t):
  1. the first call feeds t at position ℓ, together with the last emitted token at ℓ-1
     where a row's cache lags by one (`first_call`), and samples x_1 ~ q_1 = warp(draft
     logits at ℓ);
  2. a `lax.scan` of d-1 cached calls feeds x_1, .., x_{d-1}, sampling x_2, .., x_d.
The step makes d draft calls: x_d is never fed. After the verifier accepts n of the row's
proposals the cache holds the emitted tokens up to min(ℓ+n+1, ℓ+d) (`rollback`), so it
lags the new ℓ by one exactly when n = d, and the next step's first call writes that
token (x_d) together with the new pending one: ℓ_d >= ℓ-1 is all a step needs
(`ready_to_draft`). A step after which no row lags feeds the pending token alone; where
some rows lag, every row takes the two-token call, and a row with ℓ_d = ℓ rewrites slot
ℓ-1 with the key/value it already holds.
Under gamma 'auto' a step in which no row drafts skips the draft (`skip_lag` =
CATCH_UP_WIDTH > 0): its cache length ℓ_d stays, and before the next step that drafts
one cache-only call per CATCH_UP_WIDTH skipped tokens feeds tokens ℓ_d..ℓ-1 (`catch_up`),
after which the cache is the one a draft that never skipped would hold.
A vocabulary-subset head (`ModelConfig.head_tokens`) gives every other token q = 0; such
a token is then only emitted from the residual.

Inside a hybrid (`hybrid.HybridDraft`) a row whose lookup matched proposes the lookup's
tokens instead of x_1..x_d. The plan says which (`Plan.lookup`; a tree's `lookup`), and
the draft feeds the row's proposed tokens, not its own, into its cache: its cache then
holds every token the target sees, and after the rollback exactly the emitted ones
(`follows_emitted`), whichever source proposed them. Alone (no lookup) it feeds x_i.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax.drafts import tree_drafting
from specdec_jax.drafts.base import ModelDraft, sample_rows, with_length
from specdec_jax.models.model import ModelConfig, check_params, forward

Array = jax.Array
# Skipped tokens one catch-up call feeds (gamma 'auto'); a row that skipped more is caught
# up in several calls before it drafts again.
CATCH_UP_WIDTH = 8


@dataclasses.dataclass(frozen=True)
class IndependentDraft(ModelDraft):
  """A draft model of its own (config name: any model draft, e.g. 'saved:<dir>')."""

  def __post_init__(self):
    if not isinstance(self.config, ModelConfig) or self.config.feature_layers:
      raise ValueError(f"an independent draft needs a ModelConfig without feature_layers, "
                       f"got {self.config!r}")

  @property
  def follows_emitted(self) -> bool:
    return True  # it feeds what its rows propose (a hybrid's lookup where it matched)

  @property
  def skip_lag(self) -> int:
    return CATCH_UP_WIDTH

  def check(self, params, target_config) -> None:
    check_params(params, self.config, "draft")

  def check_tree(self, shape, rule, vocab_size) -> None:
    tree_drafting.check_model_tree(shape, rule, vocab_size)

  def prefill(self, params, target_params, tokens, positions, prompt_len, *, target_features,
              empty_cache, window):
    _, cache = forward(params, tokens, positions, empty_cache(self.config), config=self.config,
                       return_logits=False)
    return with_length(cache, prompt_len - 1)

  def propose(self, params, target_params, state, keys, *, plan, chosen, warp_fn, greedy,
              vocab_size, shallow=None):
    length = state.num_tokens - 1
    gamma = keys.shape[1]
    # a hybrid's lookup (proposals [B,G], found [B]): rows with a match propose its tokens
    looked, found = plan.lookup if plan.lookup is not None else (None, None)

    def draft_one(carry, inputs):
      cache, token, pos = carry
      step_keys, proposed = inputs
      logits, cache = forward(params, token[:, None], pos[:, None], cache, config=self.config)
      q = warp_fn(logits[:, 0])
      x = sample_rows(step_keys, q, greedy)
      fed = x if proposed is None else jnp.where(found, proposed, x)  # the row's proposal
      return (cache, fed, pos + 1), (x, q)

    logits, cache = self.first_call(params, state)
    q1 = warp_fn(logits[:, 0])
    x1 = sample_rows(keys[:, 0], q1, greedy)
    fed = x1 if looked is None else jnp.where(found, looked[:, 0], x1)
    if gamma == 1:
      return x1[:, None], q1[:, None], cache
    proposed = None if looked is None else jnp.swapaxes(looked[:, 1:gamma], 0, 1)
    (cache, _, _), (xs, qs) = jax.lax.scan(
        draft_one, (cache, fed, length + 1), (jnp.swapaxes(keys[:, 1:], 0, 1), proposed))
    xs = jnp.concatenate([x1[:, None], jnp.swapaxes(xs, 0, 1)], axis=1)
    qs = jnp.concatenate([q1[:, None], jnp.swapaxes(qs, 0, 1)], axis=1)
    return xs, qs, cache

  def first_call(self, params, state) -> tuple[Array, dict]:
    """A step's first draft call -> (logits [B,1,V] at ℓ, cache of length ℓ+1). Where a
    row's cache lags (ℓ_d = ℓ-1: its last step accepted every draft), the call feeds the
    tokens at positions ℓ-1 and ℓ (the last emitted token and the pending one t; at ℓ = 0,
    t and the slot above it, never attended); where no row lags, the pending token alone
    (`lax.cond`: one call of the two is run). Needs ℓ_d >= ℓ-1 (`ready_to_draft`)."""
    length = state.num_tokens - 1

    def pending_only():
      tokens = jnp.take_along_axis(state.tokens, length[:, None], axis=1)
      return forward(params, tokens, length[:, None], with_length(state.draft_state, length),
                     config=self.config)

    def with_last_emitted():
      base = jnp.maximum(length - 1, 0)  # [B]
      at = base[:, None] + jnp.arange(2)[None, :]  # [B,2]
      tokens = jnp.take_along_axis(state.tokens, at, axis=1)
      return forward(params, tokens, at, with_length(state.draft_state, base),
                     config=self.config, logits_at=(length - base)[:, None])

    lags = jnp.any(state.draft_state["length"] < length)
    logits, cache = jax.lax.cond(lags, with_last_emitted, pending_only)
    return logits, with_length(cache, length + 1)

  def rollback(self, draft_state, *, length, new_length, skipped):
    if skipped:  # ℓ_d stays: `catch_up` feeds the skipped tokens before the next draft
      return draft_state
    # the cache holds ℓ+d positions (x_d never fed); emitted tokens past them wait for
    # the next step's first call
    return with_length(draft_state, jnp.minimum(new_length, draft_state["length"]))

  def room_to_skip(self, draft_state, length):
    return jnp.ones(length.shape, bool)  # the skipped tokens wait in the loop's buffer

  def ready_to_draft(self, draft_state, length):
    return draft_state["length"] >= length - 1  # the first call feeds ℓ-1 and ℓ

  def catch_up(self, params, target_params, state):
    """One cache-only call over tokens ℓ_d..ℓ_d+W-1 (W = CATCH_UP_WIDTH): ℓ_d advances by
    min(W, ℓ - ℓ_d). The slots it writes past ℓ hold tokens the row has not emitted yet
    (the pending token, then zeros); every later call rewrites them before they are
    attended (a causal cache)."""
    draft_state = state.draft_state
    base = draft_state["length"]  # ℓ_d [B]
    at = base[:, None] + jnp.arange(CATCH_UP_WIDTH)[None, :]
    tokens = jnp.take_along_axis(state.tokens, at, axis=1)
    _, cache = forward(params, tokens, at, draft_state, config=self.config,
                       return_logits=False)
    return with_length(cache, jnp.minimum(base + CATCH_UP_WIDTH, state.num_tokens - 1))

  def propose_tree(self, params, target_params, state, keys, *, shape, rule, warp_fn,
                   vocab_size, greedy, lookup=None):
    length = state.num_tokens - 1
    logits, cache = self.first_call(params, state)

    def level(x, positions, cache, mask, parents, hiddens):
      logits, cache = forward(params, x, positions, cache, config=self.config,
                              attn_mask=mask)
      return logits, cache, hiddens

    return tree_drafting.draft_levels(shape, rule, logits, cache, None, level, keys=keys,
                                      length=length, warp_fn=warp_fn, vocab_size=vocab_size,
                                      greedy=greedy, forced=lookup)

  def advance_tree(self, draft_state, *, length, new_length, path, call_path, target_features):
    # the deepest level is never fed: as a chain, the cache holds ℓ+D positions at most
    depth = path.shape[1]
    return with_length(tree_drafting.compact_path(draft_state, length, path),
                       jnp.minimum(new_length, length + depth))

