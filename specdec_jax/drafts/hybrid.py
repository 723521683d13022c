"""A hybrid draft: prompt lookup where the row's last n tokens occurred before, another
draft elsewhere (config name 'hybrid:<n>').

Letters: B batch, d drafted tokens this step, V vocabulary, N tree nodes.

Per row and step: where the last n tokens, for some min_n <= n <= max_n, occurred earlier
with a known follower, the row proposes the lookup's continuation (`ngram.lookup`), q
one-hot; every other row proposes the inner draft's tokens with its own q. The choice is a
function of the row's known tokens alone, so each row's x is still drawn from the q handed
to the verifier: exact. 'hybrid:<n>' is min_n = max_n = n: "the last n tokens occurred
before" (any longer match contains one of n). The configs take n = 3: one or two BPE
tokens (", and", " of the") recur by chance in ordinary prose, and their continuation
would displace the inner draft's proposal with a near-arbitrary one; three recur mainly
where the text repeats (refrains, code, greedy loops), where a lookup is nearly always
right.

The inner draft runs every step on every row, and its state must follow the emitted
tokens whichever proposal a row took (`Draft.follows_emitted`): a feature draft re-reads
the accepted positions; an independent draft is handed the lookup (`Plan.lookup`, and
`lookup=` of `propose_tree`) and feeds each row's proposed tokens into its cache. When
every row that proposes two or more takes the lookup, the inner draft may skip its deeper
drafts (`shallow`): no row proposes them. In a tree (rule 'topk', chains
below the root) the inner draft drafts its tree on every row and rows with a match take
the lookup's tree; the candidate set is still deterministic.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax.drafts import ngram
from specdec_jax.drafts.base import DRAFT, LOOKUP, Draft, Plan, WrappingDraft
from specdec_jax.drafts.feature import FeatureDraft
from specdec_jax.drafts.independent import IndependentDraft
from specdec_jax.models.model import ModelConfig

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class HybridDraft(WrappingDraft):
  """Prompt lookup of min_n..max_n trailing tokens over `inner` (its params are the
  hybrid's). A ModelConfig as inner is taken as its model draft: a FeatureDraft with
  feature_layers, else an IndependentDraft."""

  min_n: int = 3
  max_n: int = 3

  def __post_init__(self):
    inner = self.inner
    if isinstance(inner, ModelConfig):
      inner = FeatureDraft(inner) if inner.feature_layers else IndependentDraft(inner)
      object.__setattr__(self, "inner", inner)
    if not isinstance(inner, Draft) or not inner.follows_emitted:
      raise ValueError(f"hybrid draft needs an inner draft whose state follows the emitted "
                       f"tokens (a feature or an independent model draft), got "
                       f"{type(inner).__name__}")
    for name in ("min_n", "max_n"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"hybrid draft needs {name} >= 1, got {value!r}")
    if self.min_n > self.max_n:
      raise ValueError(f"hybrid draft needs min_n <= max_n, got {self.min_n} > {self.max_n}")

  @classmethod
  def from_name(cls, name: str, inner) -> "HybridDraft":
    """'hybrid:<n>' -> HybridDraft(inner, min_n=n, max_n=n)."""
    n = cls.parse_n(name)
    return cls(inner, n, n)

  @staticmethod
  def parse_n(name: str) -> int:
    """'hybrid:<n>' -> n >= 1; ValueError naming the name otherwise."""
    kind, _, n = name.partition(":")
    try:
      if kind != "hybrid":
        raise ValueError
      n = int(n)
      if n < 1:
        raise ValueError
    except ValueError:
      raise ValueError(f"hybrid draft name must be 'hybrid:<n>' with n >= 1, got "
                       f"{name!r}") from None
    return n

  # the inner draft runs every step (its model_config is what c times); facts and moves
  # not defined here are the inner draft's (`WrappingDraft`)
  may_propose_nothing = property(lambda self: False)
  follows_emitted = property(lambda self: True)
  cost_sources = property(lambda self: ("draft", "lookup"))

  def check_tree(self, shape, rule, vocab_size) -> None:
    ngram.check_lookup_tree(shape, rule)
    self.inner.check_tree(shape, rule, vocab_size)

  def plan(self, state, gamma):
    looked = ngram.lookup(state.tokens, state.num_tokens, min_n=self.min_n, max_n=self.max_n,
                          gamma=gamma)
    found = looked[1]
    return Plan(proposes=jnp.ones(found.shape, bool),
                source=jnp.where(found, LOOKUP, DRAFT).astype(jnp.int32), lookup=looked)

  def propose(self, params, target_params, state, keys, *, plan, chosen, warp_fn, greedy,
              vocab_size, shallow=None):
    gamma = keys.shape[1]
    looked, found = plan.lookup[0][:, :gamma], plan.lookup[1]
    xs, qs, draft_state = self.inner.propose(
        params, target_params, state, keys, plan=plan, chosen=chosen, warp_fn=warp_fn,
        greedy=greedy, vocab_size=vocab_size, shallow=jnp.all(found | (chosen <= 1)))
    one_hot = jax.nn.one_hot(looked, qs.shape[-1], dtype=qs.dtype)
    return (jnp.where(found[:, None], looked, xs),
            jnp.where(found[:, None, None], one_hot, qs), draft_state)

  def propose_tree(self, params, target_params, state, keys, **kw):
    looked, found = ngram.lookup_tree(state, shape=kw["shape"], min_n=self.min_n,
                                      max_n=self.max_n)
    nodes, q_at, draft_state, scores = self.inner.propose_tree(
        params, target_params, state, keys, lookup=(looked, found), **kw)
    return jnp.where(found[:, None], looked, nodes), q_at, draft_state, scores
