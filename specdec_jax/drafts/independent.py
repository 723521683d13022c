"""An independent draft: any model on the target's vocabulary, with its own KV cache.

Letters: B batch, d drafted tokens this step, V vocabulary, N tree nodes, D tree depth.

One chain step for row b (length ℓ = num_tokens[b]-1, pending token t):
  1. the draft feeds t, x_1, .., x_{d-1} (a `lax.scan` of d cached calls), sampling
     x_i ~ q_i = warp(draft logits) and keeping q_i;
  2. one cache-only call writes x_d (head skipped), so the draft has seen every token the
     target will see; after the verifier its cache length is set to the new ℓ.
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
from specdec_jax.drafts.base import ModelDraft, pending_tokens, sample_rows, with_length
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

    cache = with_length(state.draft_state, length)
    proposed = None if looked is None else jnp.swapaxes(looked[:, :gamma], 0, 1)
    (cache, last, _), (xs, qs) = jax.lax.scan(
        draft_one, (cache, pending_tokens(state), length), (jnp.swapaxes(keys, 0, 1), proposed))
    _, cache = forward(params, last[:, None], (length + gamma)[:, None], cache,
                       config=self.config, return_logits=False)
    return jnp.swapaxes(xs, 0, 1), jnp.swapaxes(qs, 0, 1), cache

  def rollback(self, draft_state, *, length, new_length, skipped):
    if skipped:  # ℓ_d stays: `catch_up` feeds the skipped tokens before the next draft
      return draft_state
    return with_length(draft_state, new_length)

  def room_to_skip(self, draft_state, length):
    return jnp.ones(length.shape, bool)  # the skipped tokens wait in the loop's buffer

  def ready_to_draft(self, draft_state, length):
    return draft_state["length"] >= length

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
    logits, cache = forward(params, pending_tokens(state)[:, None], length[:, None],
                            with_length(state.draft_state, length), config=self.config)

    def level(x, positions, cache, mask, parents, last, hiddens):
      out = forward(params, x, positions, cache, config=self.config, return_logits=not last,
                    attn_mask=mask)
      return out[0], out[1], hiddens

    return tree_drafting.draft_levels(shape, rule, logits, cache, None, level, keys=keys,
                                      length=length, warp_fn=warp_fn, vocab_size=vocab_size,
                                      greedy=greedy, forced=lookup)

  def advance_tree(self, draft_state, *, length, new_length, path, call_path, target_features):
    return with_length(tree_drafting.compact_path(draft_state, length, path), new_length)

