"""A new draft kind defined in this file alone, against the `Draft` interface, runs exactly
through every decode path: a fixed γ, γ 'auto' and token trees.

`UnigramDraft` ignores the context: every proposal is drawn from one fixed law q over the
vocabulary (config name 'unigram:<seed>', q a seeded random law). It touches no library
module: it subclasses `specdec_jax.drafts.base.Draft`, implements the moves it needs and
registers a name. Whole generated sequences are compared with the target's exact law
(enumeration, as tests/test_exactness.py does) by a chi-square test.

False-failure rate: each law case fails for a correct sampler with probability
SIGNIFICANCE = 1e-3 over seeds (three cases: at most 0.3% for the file); seeds are fixed,
so the outcome is deterministic. The negative control, a draft that reports a q other
than the one it sampled from, must fail the same test at 1e-9.

A new kind that wraps another draft is one file too: `AlternateDraft` (config name
'alternate', its model draft named by config.feature_draft) subclasses
`specdec_jax.drafts.base.WrappingDraft` and proposes on even steps only. The registry,
the loader and the config contract take it with no other change, and it decodes exactly
(one more law case: at most 0.4% for the file).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import SIGNIFICANCE, chi_square_pvalue, law_of_continuations, law_pair
from specdec_jax import (AutoGamma, DecodeSpec, FixedGamma, Model, SamplingConfig,
                         TreeProposal, autoregressive_generate, speculative_generate)
from specdec_jax import config_fields
from specdec_jax.drafts import registry
from specdec_jax.drafts.base import (Draft, TreeChildren, WrappingDraft, sample_rows,
                                     tree_children, tree_levels)
from specdec_jax.drafts.independent import IndependentDraft
from specdec_jax.loading import ByteTokenizer, load_draft
from specdec_jax.gamma.adaptive import CostTable
from specdec_jax.verification.tree_shapes import parse_tree

VOCAB, NEW, ROWS = 4, 4, 40_000
PROMPT = [1, 3, 0]
T1 = SamplingConfig(temperature=1.0)


@dataclasses.dataclass(frozen=True)
class UnigramDraft(Draft):
  """Every proposal ~ the fixed law `q` (a tuple: hashable), whatever the context."""

  q: tuple[float, ...]
  honest: bool = True  # False: report the uniform law instead of q (the negative control)

  @property
  def vocab_size(self) -> int:
    return len(self.q)

  def check_tree(self, shape, rule, vocab_size) -> None:
    if rule not in ("sampled", "topk") or shape.budget is not None:
      raise ValueError(f"unigram trees take rule 'sampled' or 'topk', static shapes; got "
                       f"{rule!r}")

  def _laws(self, batch: int, positions: int):
    """(the law sampled from, the law reported), each [B,positions,V]."""
    q = jnp.broadcast_to(jnp.asarray(self.q, jnp.float32), (batch, positions, len(self.q)))
    reported = q if self.honest else jnp.full_like(q, 1.0 / len(self.q))
    return q, reported

  def propose(self, params, target_params, state, keys, *, plan, chosen, warp_fn, greedy,
              vocab_size, shallow=None):
    q, reported = self._laws(keys.shape[0], keys.shape[1])
    xs = jax.vmap(lambda k, p: sample_rows(k, p, greedy), in_axes=(1, 1), out_axes=1)(keys, q)
    return xs, reported, None

  def propose_tree(self, params, target_params, state, keys, *, shape, rule, warp_fn,
                   vocab_size, greedy):
    q, reported = self._laws(keys.shape[0], shape.num_nodes + 1)
    drafted = TreeChildren(q_at=q, rank=jnp.log(q))
    nodes = jnp.concatenate([
        tree_children(shape, rule, start, end, drafted, keys, greedy)
        for start, end in tree_levels(shape)], axis=1)
    return nodes, reported, None, None


def unigram(argument: str, inner=None, honest: bool = True) -> UnigramDraft:
  """'unigram:<seed>' -> a seeded random law over the test's vocabulary."""
  rng = np.random.default_rng(int(argument))
  return UnigramDraft(tuple(float(x) for x in rng.dirichlet(np.ones(VOCAB))), honest)


registry.register("unigram", unigram)
COSTS = CostTable(c=0.2, verify_costs=(1.0, 1.1, 1.2, 1.3))  # some rows draft, some not
PROPOSERS = dict(chain=FixedGamma(3), auto=AutoGamma(COSTS, 3),
                 tree=TreeProposal(parse_tree("2,1"), "sampled"))


@pytest.fixture(scope="module")
def pair():
  target, tp, _, _ = law_pair(VOCAB)
  return Model(target, tp), Model(registry.make("unigram:5"), None)


def sequence_index(tokens: np.ndarray) -> np.ndarray:
  return (tokens * VOCAB ** np.arange(NEW - 1, -1, -1)).sum(axis=1)


def test_registered_by_name():
  assert "unigram" in registry.kinds()
  assert registry.make("unigram:5") == unigram("5")


@pytest.mark.parametrize("path", sorted(PROPOSERS))
def test_greedy_equals_autoregressive(pair, path):
  target, draft = pair
  prompts = [PROMPT, [2, 2, 1, 0], [0]]
  greedy = SamplingConfig(temperature=0.0)
  plain = autoregressive_generate(target, prompts, spec=DecodeSpec(7, sampling=greedy))
  proposer = dataclasses.replace(PROPOSERS[path], rule="topk") if path == "tree" else (
      PROPOSERS[path])
  out = speculative_generate(target, draft, prompts,
                             spec=DecodeSpec(7, proposer, sampling=greedy))
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  # the drafts really took part: some were proposed and some accepted (a step that
  # rejected every draft, or an 'auto' that never drafted, would pass the line above)
  assert (np.asarray(out.gammas) > 0).any()
  assert (np.asarray(out.accepted) > 0).any()


@pytest.mark.parametrize("path", sorted(PROPOSERS))
def test_sequences_follow_target_distribution(pair, path):
  target, draft = pair
  exact = law_of_continuations(target.config, target.params, T1, PROMPT, VOCAB, NEW)
  out = speculative_generate(target, draft, [PROMPT] * ROWS,
                             spec=DecodeSpec(NEW, PROPOSERS[path], sampling=T1,
                                             verifier="token"), seed=7)
  assert (out.lengths == NEW).all()
  # the draft took part (a run that never drafted would be plain sampling, exact for free)
  assert (np.asarray(out.gammas) > 0).any() and (np.asarray(out.accepted) > 0).any()
  assert chi_square_pvalue(sequence_index(out.tokens), exact) > SIGNIFICANCE


def test_negative_control_dishonest_draft_fails(pair):
  """A draft that samples from q but reports the uniform law breaks exactness: the same
  test must reject it."""
  target, _ = pair
  liar = Model(unigram("5", honest=False), None)
  exact = law_of_continuations(target.config, target.params, T1, PROMPT, VOCAB, NEW)
  out = speculative_generate(target, liar, [PROMPT] * ROWS,
                             spec=DecodeSpec(NEW, FixedGamma(3), sampling=T1, verifier="token"),
                             seed=7)
  assert chi_square_pvalue(sequence_index(out.tokens), exact) < 1e-9


# --------------------------------------------------------------- a wrapping kind

@dataclasses.dataclass(frozen=True)
class AlternateDraft(WrappingDraft):
  """Any draft, proposing on even loop steps only (odd steps are plain steps): every other
  fact and move is the inner draft's."""

  may_propose_nothing = property(lambda self: True)

  def plan(self, state, gamma):
    plan = self.inner.plan(state, gamma)
    return plan.replace(proposes=plan.proposes & (state.step % 2 == 0))


registry.register("alternate", lambda argument, inner: AlternateDraft(inner), wraps=True)


def test_wrapping_kind_is_named_loaded_and_admitted_by_the_config_contract():
  assert registry.needs_inner("alternate") and not registry.needs_inner("unigram:5")
  assert registry.model_draft_name("alternate", "truncate:1") == "truncate:1"
  assert registry.model_draft_name("unigram:5", "truncate:1") == "unigram:5"
  target, tp, _, _ = law_pair(VOCAB)
  draft, params = load_draft("alternate", ByteTokenizer(), target, tp,
                             feature_draft="truncate:1")
  assert draft == AlternateDraft(IndependentDraft(target.replace(num_layers=1)))
  assert params is not None
  used = config_fields.FAMILIES["run"]["feature_draft"].used
  assert used({"draft": "alternate"}) is None
  assert "wraps no model draft" in used({"draft": "unigram:5"})


@pytest.fixture(scope="module")
def wrapped_pair():
  target, tp, draft, dp = law_pair(VOCAB)
  return Model(target, tp), Model(registry.make("alternate", IndependentDraft(draft)), dp)


def test_wrapping_kind_greedy_equals_autoregressive(wrapped_pair):
  target, draft = wrapped_pair
  prompts = [PROMPT, [2, 2, 1, 0], [0]]
  greedy = SamplingConfig(temperature=0.0)
  plain = autoregressive_generate(target, prompts, spec=DecodeSpec(7, sampling=greedy))
  out = speculative_generate(target, draft, prompts,
                             spec=DecodeSpec(7, FixedGamma(3), sampling=greedy))
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  gammas = np.asarray(out.gammas)
  live = gammas >= 0
  assert (gammas[:, 1::2][live[:, 1::2]] == 0).all()  # odd steps propose nothing
  assert (gammas[:, ::2][live[:, ::2]] == 3).all()
  assert (np.asarray(out.accepted) > 0).any()  # its drafts were accepted, not just made


def test_wrapping_kind_sequences_follow_target_distribution(wrapped_pair):
  target, draft = wrapped_pair
  exact = law_of_continuations(target.config, target.params, T1, PROMPT, VOCAB, NEW)
  out = speculative_generate(target, draft, [PROMPT] * ROWS,
                             spec=DecodeSpec(NEW, FixedGamma(3), sampling=T1), seed=7)
  assert (out.lengths == NEW).all()
  assert chi_square_pvalue(sequence_index(out.tokens), exact) > SIGNIFICANCE
