"""The draft interface: what every draft kind provides to the decode loop.

Letters: B batch, d drafted tokens this step (<= G), G = γ (or γ_max), V vocabulary,
N tree nodes, F target feature width, W token-buffer width, S cache slots.

A draft kind is one subclass of `Draft`: a frozen dataclass (hashable, so the loops take
it as a jit static) that describes the draft; its params travel beside it
(`models.model.Model(config=draft, params=...)`). The loop owns the tokens, the target
cache, the keys and the verifier; the draft owns its *draft state* (any pytree: a KV
cache, target features, nothing) and these moves on it:

  prefill   the prompts -> the draft state (cache-only calls);
  plan      which rows have something to propose this step, and their proposal source
            (`gamma.adaptive.DRAFT` or `LOOKUP`); computed once per step;
  propose   d tokens x [B,d] per row with the laws q [B,d,V] they were drawn from
            (a chain), or a token tree (`propose_tree`);
  follow    after the target call (`observe_target`, which sees the target's features
            at the call's positions when the draft reads them) and the verifier
            (`rollback`), the draft state follows the emitted tokens;
  catch up  a draft that may be skipped (`skip_lag` > 0, gamma 'auto') falls behind on
            steps in which no row drafts, and follows the skipped tokens later
            (`catch_up`, `room_to_skip`, `ready_to_draft`).

Exactness needs one thing of a draft: x_i is drawn from the q_i it returns, using the
keys it is given, from the row's own tokens and state. The verifier then keeps every
emitted token distributed as the target's p, whatever q is (docs/exactness.md).

A new kind is one file: subclass `Draft`, implement the moves, and `registry.register`
a config name for it (tests/test_custom_draft.py does exactly that, outside the package).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.gamma.adaptive import DRAFT, LOOKUP  # noqa: F401 (re-exported)
from specdec_jax.models.model import ModelConfig
from specdec_jax.models.sampling import sample
from specdec_jax.verification.tree_shapes import TreeShape

Array = jax.Array


@flax.struct.dataclass
class Plan:
  """One step's plan for every row, computed once per step by `Draft.plan`.

  proposes: bool [B], rows with something to propose (a lookup without a match has not);
  source: int32 [B], DRAFT or LOOKUP (which α̂ and step costs a row's γ uses);
  lookup: a prompt lookup's (proposals int32 [B,G], found bool [B]), or None; a hybrid
  hands its plan to its inner draft, whose found rows propose the lookup's tokens.
  """

  proposes: Array
  source: Array
  lookup: Any = None


def with_length(cache: dict, length: Array) -> dict:
  """The cache with its valid length set (a rollback or an advance; entries stay)."""
  return {**cache, "length": length}


def pending_tokens(state) -> Array:
  """int32 [B]: each row's pending token, tokens[b, num_tokens[b]-1]."""
  return jnp.take_along_axis(state.tokens, (state.num_tokens - 1)[:, None], axis=1)[:, 0]


def sample_rows(keys: Array, probs: Array, greedy: bool) -> Array:
  """int32 [B]: one token per row from probs [B,V] with keys [B,2] (the argmax if greedy)."""
  return jax.vmap(functools.partial(sample, greedy=greedy))(keys, probs)


class Draft:
  """A draft kind (see the module docstring). Subclasses are frozen dataclasses.

  Host-side facts (properties) default to a draft with no cache and no vocabulary of its
  own (`vocab_size` and `max_seq_len` None). The moves a stateless draft does not need
  (`prefill`, `plan`, `observe_target`, `rollback`, `advance_tree`, `room_to_skip`,
  `ready_to_draft`) do nothing by default; `propose`, `catch_up` and `propose_tree` raise
  NotImplementedError until a kind defines them.
  """

  # ----------------------------------------------------------------- host-side facts
  @property
  def vocab_size(self) -> int | None:
    """The vocabulary q lives on; None for a draft that proposes target token ids only."""
    return None

  @property
  def max_seq_len(self) -> int | None:
    """Cache slots the draft can hold; None for a draft without a cache."""
    return None

  @property
  def model_config(self):
    """The ModelConfig of the model the draft calls once per drafted token (what the cost
    coefficient c times: `bench.studies.cost_coefficient`); None for a draft without one."""
    return None

  @property
  def target_layers(self) -> tuple[int, ...]:
    """Target layers whose residual streams the draft reads (the target call returns
    them to `observe_target`); () for none."""
    return ()

  @property
  def may_propose_nothing(self) -> bool:
    """True if `plan` may leave a live row nothing to propose under a fixed γ."""
    return False

  @property
  def skip_lag(self) -> int:
    """L > 0: under gamma 'auto' steps in which no row drafts skip the draft, which falls
    behind and catches up (`catch_up`) L positions a call; the caches and token buffer get
    L slots more. 0: the draft runs on every step."""
    return 0

  @property
  def follows_emitted(self) -> bool:
    """True if the draft state after a step is that of the emitted tokens even where a
    hybrid's lookup replaced the draft's proposals (the hybrid needs this): a feature
    draft re-reads the accepted positions; an independent draft feeds the tokens its rows
    propose (`Plan.lookup`; `lookup` of `propose_tree`)."""
    return False

  @property
  def cost_sources(self) -> tuple[str, ...]:
    """The texts its step costs are timed on (`gamma.machine_costs`): 'draft', text where
    nothing repeats (the draft model proposes), and 'lookup', text that repeats itself (a
    prompt lookup matches). With both, the 'lookup' steps are the LOOKUP source's costs."""
    return ("draft",)

  def check(self, params, target_config) -> None:
    """Raises ValueError naming the value if params or the target do not fit the draft."""

  def check_tree(self, shape: TreeShape, rule: str, vocab_size: int) -> None:
    """Raises ValueError if this draft cannot draft `shape` under `rule`."""
    raise ValueError(f"a {type(self).__name__} cannot draft token trees")

  # ----------------------------------------------------------------- the moves
  def prefill(self, params, target_params, tokens: Array, positions: Array,
              prompt_len: Array, *, target_features: Array | None, empty_cache,
              window: int) -> Any:
    """The draft state after the prompts tokens [B,W] (right-padded; prompt_len [B]).

    target_features: [B,W,F] the target's features at positions 0..W-1 when
    `target_layers` is not empty; empty_cache(config): a fresh cache of the run's slots;
    window: G + 1 + lag, the widest re-read a step may need.
    """
    return None

  def plan(self, state, gamma: int) -> Plan:
    """This step's `Plan` (state: the loop's `DecodeState`)."""
    batch = state.num_tokens.shape
    return Plan(proposes=jnp.ones(batch, bool), source=jnp.full(batch, DRAFT, jnp.int32))

  def propose(self, params, target_params, state, keys: Array, *, plan: Plan,
              chosen: Array, warp_fn, greedy: bool, vocab_size: int,
              shallow: Array | None = None) -> tuple[Array, Array, Any]:
    """d = keys.shape[1] proposals -> (xs int32 [B,d], qs float32 [B,d,V], draft state).

    keys [B,d,2]: x_i is drawn with keys[:, i-1] from q_i = warp_fn(logits) (V =
    vocab_size). chosen int32 [B]: each row's γ_b this step (rows may use fewer than d).
    shallow: bool [] (traced) or None: where true no row reads past x_1, so a kind may
    skip its deeper drafts (zeros there); a hint, free to ignore.
    """
    raise NotImplementedError

  def observe_target(self, draft_state, target_features: Array | None, *, length: Array,
                     width: int, skipped: bool) -> Any:
    """The draft state after the target call over positions ℓ..ℓ+width-1 (length = ℓ
    [B]); target_features [B,width,F] when `target_layers` is not empty. skipped: the
    step did not run the draft (only when `skip_lag` > 0). Runs inside each call width's
    branch, so every branch must return the same shapes."""
    return draft_state

  def rollback(self, draft_state, *, length: Array, new_length: Array, skipped: bool) -> Any:
    """The draft state once the row has emitted up to new_length - 1 (pending excluded)."""
    return draft_state

  def room_to_skip(self, draft_state, length: Array) -> Array:
    """bool [B]: the draft state can fall one more position behind (`skip_lag` > 0); a
    row without room is caught up (`catch_up`) before the next skipping step."""
    return jnp.zeros(length.shape, bool)

  def ready_to_draft(self, draft_state, length: Array) -> Array:
    """bool [B]: `propose` may run from this state now (`skip_lag` > 0); a row that is
    not ready is caught up before the next step that runs the draft."""
    return jnp.ones(length.shape, bool)

  def catch_up(self, params, target_params, state) -> Any:
    """The draft state after one call that follows up to `skip_lag` of the tokens its rows
    skipped (the loop's state; the pending token excluded); rows already caught up keep
    their state's meaning. Only when `skip_lag` > 0."""
    raise NotImplementedError

  def propose_tree(self, params, target_params, state, keys: Array, *, shape: TreeShape,
                   rule: str, warp_fn, vocab_size: int, greedy: bool):
    """A token tree -> (nodes int32 [B,N], q_at float32 [B,N+1,V] or None (a deterministic
    candidate set, rule 'topk'), draft state, scores float32 [B,N] for a dynamic tree or
    None). keys [B,N,2]: node i is drawn with keys[:, i] ('sampled'). A draft with
    `follows_emitted` also takes lookup=(nodes [B,N], found [B]) from a hybrid: the
    lookup's tree, which found rows propose instead."""
    raise NotImplementedError

  def advance_tree(self, draft_state, *, length: Array, new_length: Array, path: Array,
                   call_path: Array, target_features: Array | None) -> Any:
    """The draft state after a tree step: path int32 [B,D] the accepted nodes (-1 past n),
    call_path their positions in the target call (-1 past n), target_features [B,N'+1,F]."""
    return draft_state


@dataclasses.dataclass(frozen=True)
class ModelDraft(Draft):
  """A draft that runs a model of its own, `config` (its vocabulary, cache and the model
  the cost coefficient times)."""

  config: ModelConfig

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def max_seq_len(self) -> int:
    return self.config.max_seq_len

  @property
  def model_config(self) -> ModelConfig:
    return self.config


@dataclasses.dataclass(frozen=True)
class WrappingDraft(Draft):
  """A draft kind around another draft, `inner` (its params are the wrapper's): every fact
  and move is the inner draft's until the subclass overrides it. A wrapping kind is one
  such subclass, registered with `registry.register(..., wraps=True)`; configs name its
  inner model draft in `config.feature_draft` (`registry.model_draft_name`)."""

  inner: Draft

  vocab_size = property(lambda self: self.inner.vocab_size)
  max_seq_len = property(lambda self: self.inner.max_seq_len)
  model_config = property(lambda self: self.inner.model_config)
  target_layers = property(lambda self: self.inner.target_layers)
  may_propose_nothing = property(lambda self: self.inner.may_propose_nothing)
  skip_lag = property(lambda self: self.inner.skip_lag)
  follows_emitted = property(lambda self: self.inner.follows_emitted)
  cost_sources = property(lambda self: self.inner.cost_sources)

  def check(self, params, target_config) -> None:
    self.inner.check(params, target_config)

  def check_tree(self, shape, rule, vocab_size) -> None:
    self.inner.check_tree(shape, rule, vocab_size)

  def prefill(self, params, target_params, tokens, positions, prompt_len, **kw):
    return self.inner.prefill(params, target_params, tokens, positions, prompt_len, **kw)

  def plan(self, state, gamma):
    return self.inner.plan(state, gamma)

  def propose(self, params, target_params, state, keys, **kw):
    return self.inner.propose(params, target_params, state, keys, **kw)

  def observe_target(self, draft_state, target_features, **kw):
    return self.inner.observe_target(draft_state, target_features, **kw)

  def rollback(self, draft_state, **kw):
    return self.inner.rollback(draft_state, **kw)

  def room_to_skip(self, draft_state, length):
    return self.inner.room_to_skip(draft_state, length)

  def ready_to_draft(self, draft_state, length):
    return self.inner.ready_to_draft(draft_state, length)

  def catch_up(self, params, target_params, state):
    return self.inner.catch_up(params, target_params, state)

  def propose_tree(self, params, target_params, state, keys, **kw):
    return self.inner.propose_tree(params, target_params, state, keys, **kw)

  def advance_tree(self, draft_state, **kw):
    return self.inner.advance_tree(draft_state, **kw)


class TreeChildren(NamedTuple):
  """What `tree_children` needs of the positions drafted so far."""

  q_at: Array  # float32 [B,P,V], the warped draft law at each position
  rank: Array  # float [B,P,V], the draft's logits there (rule 'topk' ranks by them)


def tree_children(shape: TreeShape, rule: str, start: int, end: int, drafted: TreeChildren,
                  keys: Array, greedy: bool) -> Array:
  """int32 [B,end-start]: the tokens of nodes start..end-1 from their parents' positions:
  'sampled' draws node i from q at its parent with keys[:, i]; 'topk' takes the parent's
  child_rank-th most likely token."""
  parents = shape.parent_positions()[start:end]
  if rule == "topk":
    widest = shape.children_table().shape[1]
    top = jax.lax.top_k(drafted.rank[:, parents], widest)[1]  # [B,n,K]
    ranks = jnp.asarray(shape.child_rank[start:end])
    return jnp.take_along_axis(top, ranks[None, :, None], axis=2)[..., 0].astype(jnp.int32)
  draw = jax.vmap(jax.vmap(functools.partial(sample, greedy=greedy)))
  return draw(keys[:, start:end], drafted.q_at[:, parents])


def tree_levels(shape: TreeShape) -> tuple:
  """Per depth 1..D: (first node, end) of that depth's contiguous node range."""
  depths = np.asarray(shape.depths)
  return tuple((int(np.searchsorted(depths, d)), int(np.searchsorted(depths, d, "right")))
               for d in range(1, shape.max_depth + 1))


def check_levels(shape: TreeShape) -> None:
  """Raises ValueError unless shape is a TreeShape whose nodes are numbered level by level
  (every draft's tree is drafted one depth at a time)."""
  if not isinstance(shape, TreeShape):
    raise ValueError(f"tree must be a TreeShape (tree_shapes), got {type(shape).__name__}")
  if any(b < a for a, b in zip(shape.depths, shape.depths[1:])):
    raise ValueError(f"tree nodes must be numbered level by level (depths non-decreasing), "
                     f"got depths {shape.depths} for parents {shape.parents}")
