"""Token trees in the decode loop (`decoding.tree_step`): greedy equality, the chain special
case, the caches after a tree step, batch independence, the law at T=1, bad input.

Law tests: a tiny target (vocabulary 4) generates 3 tokens after a fixed prompt; the
exact probability of each of the 4^3 = 64 continuations is enumerated (one forward over
all of them, after the same warp) and ROWS tree-decoded rows (one batched call, each row
its own key stream) are compared by a chi-square test with cells expected below 5
pooled. Each case fails for a correct sampler with probability SIGNIFICANCE = 1e-3 (five
cases: at most 0.5% for the file); seeds are fixed, so the outcome is deterministic. The
negative control (no residual after a rejection) must fail it. Cases marked slow (more
shapes and kinds of the same checks, the control) run in `make test-all`.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from helpers import SIGNIFICANCE, chi_square_pvalue, tiny_config, tiny_model
from specdec_jax import (DecodeSpec, Model, SamplingConfig, TreeProposal,
                         autoregressive_generate, speculative_generate)
from specdec_jax.decoding import loop
from specdec_jax.decoding.spec import make_proposer, prepare
from specdec_jax.decoding.tree_step import tree_step_fn
from specdec_jax.drafts.hybrid import HybridDraft
from specdec_jax.drafts.ngram import NgramDraft
from specdec_jax.models.model import forward, init_cache
from specdec_jax.verification.tree_shapes import TreeShape

GREEDY = SamplingConfig(temperature=0.0)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 0], [7], [3, 1, 4, 1]]
SHAPES = [TreeShape.from_branching((2, 2)), TreeShape.from_branching((3, 1, 1))]
SPARSE = TreeShape.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
DYNAMIC = TreeShape.from_branching((3, 2, 1)).with_budget(4)  # 4 of 15 candidates per call


@pytest.fixture(scope="module")
def model_pair():
  """Vocabulary 8; the draft is the target's first layer (it agrees often, not always)."""
  target = tiny_config(vocab=8, layers=2, width=32)
  tp = tiny_model(target, 0, factor=8.0)
  draft = target.replace(num_layers=1)
  dp = {**tp, "layers": jax.tree_util.tree_map(lambda x: x[:1], tp["layers"])}
  return target, tp, draft, dp


@pytest.fixture(scope="module")
def feature_pair(model_pair):
  """The same target with a random feature draft (EAGLE-3 style) reading layers 1 and 2."""
  target, tp = model_pair[:2]
  draft = tiny_config(vocab=8, layers=1, width=16, tie_embeddings=False,
                      feature_layers=(1, 2), feature_width=target.embed_dim)
  return target, tp, draft, tiny_model(draft, 1, factor=3.0)


def generate(pair, prompts=PROMPTS, *, max_new_tokens=12, gamma=1, tree=None,
             tree_rule="sampled", sampling=SamplingConfig(), verifier="block", **call):
  """speculative_generate with the config's fields: gamma (unused with a tree), tree and
  tree_rule become the proposer (`make_proposer`); call: seed, row_ids, prompt_width."""
  target, tp, draft, dp = pair
  spec = DecodeSpec(max_new_tokens, make_proposer(gamma, tree=tree, tree_rule=tree_rule),
                    sampling=sampling, verifier=verifier)
  return speculative_generate(Model(target, tp), Model(draft, dp), prompts, spec=spec, **call)


# make test: rule 'sampled' with the independent and the feature draft, rule 'topk' on
# the sparse and the dynamic tree and with the hybrid draft; the other combinations in
# make test-all
GREEDY_CASES = [("model", SHAPES[0], "sampled"), ("feature", SHAPES[1], "sampled"),
                ("feature", SPARSE, "topk"), ("feature", DYNAMIC, "topk"),
                ("hybrid", SHAPES[1], "topk")] + [
    pytest.param(*case, marks=pytest.mark.slow) for case in (
        ("feature", SHAPES[0], "topk"), ("model", SHAPES[1], "topk"),
        ("model", SHAPES[0], "topk"), ("feature", SHAPES[0], "sampled"),
        ("model", SHAPES[1], "sampled"), ("feature", SHAPES[1], "topk"),
        ("model", DYNAMIC, "topk"), ("ngram", SHAPES[1], "topk"))]


@pytest.mark.parametrize("kind,shape,rule", GREEDY_CASES)
def test_greedy_tree_equals_greedy_autoregressive(model_pair, feature_pair, kind, shape, rule):
  pair = dict(model=model_pair, feature=feature_pair,
              ngram=model_pair[:2] + (NgramDraft(2), None),
              hybrid=feature_pair[:2] + (HybridDraft(feature_pair[2], 2, 2),
                                         feature_pair[3]))[kind]
  target, tp = pair[:2]
  ar = autoregressive_generate(Model(target, tp), PROMPTS,
                               spec=DecodeSpec(12, sampling=GREEDY))
  out = generate(pair, sampling=GREEDY, tree=shape, tree_rule=rule)
  np.testing.assert_array_equal(out.tokens, ar.tokens)
  np.testing.assert_array_equal(out.lengths, ar.lengths)
  live = out.accepted >= 0
  assert (out.gammas[live] == shape.max_depth).all()
  assert out.accepted.max() >= 1  # some paths were accepted (the compaction ran)


def test_chain_shape_equals_the_chain_at_t0(model_pair):
  """TreeShape.chain(γ), rule 'sampled' == today's chain, verifier 'token', same γ."""
  chain = generate(model_pair, sampling=GREEDY, gamma=3, verifier="token")
  tree = generate(model_pair, sampling=GREEDY, tree=TreeShape.chain(3))
  np.testing.assert_array_equal(tree.tokens, chain.tokens)
  np.testing.assert_array_equal(tree.accepted, chain.accepted)
  assert chain.accepted.max() >= 1


def _one_tree_step(pair, shape, rule, sampling, steps=2):
  target, tp, draft, dp = pair
  prepared = prepare(Model(target, tp), Model(draft, dp), PROMPTS,
                     DecodeSpec(12, TreeProposal(shape, rule), sampling=sampling))
  assert prepared.spec.gamma == shape.num_nodes and prepared.spec.vocab_size == 8
  state = loop.prefill(Model(target, tp), dp, prepared)
  step = jax.jit(lambda s: tree_step_fn(tp, dp, s, target_config=target, draft=prepared.draft,
                                        spec=prepared.spec))
  before = state
  for _ in range(steps):
    before, state = state, step(state)
  return before, state


def _prefill(pair_config, params, tokens, **kw):
  b, w = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(w), (b, w))
  run = jax.jit(lambda p, t, x: forward(p, t, x, init_cache(pair_config, b, w),
                                         config=pair_config, return_logits=False, **kw))
  return run(params, tokens, positions)


@pytest.mark.parametrize("kind,shape", [
    ("model", SHAPES[0]), ("feature", DYNAMIC),
    pytest.param("feature", SHAPES[0], marks=pytest.mark.slow),
    pytest.param("model", DYNAMIC, marks=pytest.mark.slow)])
def test_caches_after_a_tree_step_equal_a_fresh_prefill(model_pair, feature_pair, kind, shape):
  """K/V of the emitted prefix (slots 0..num_tokens-2) == a prefill of those tokens, in
  the target cache and, but for a depth-D node never fed, an independent draft's; a
  feature draft's `features` == the target's features at ℓ_old .. new ℓ - 1. A dynamic
  tree's path comes from its call slots, not its candidate numbering."""
  pair = model_pair if kind == "model" else feature_pair
  target, tp, draft, dp = pair
  before, state = _one_tree_step(pair, shape, "topk", SamplingConfig(1.0))
  emitted = np.asarray(state.num_tokens - before.num_tokens)
  assert (emitted >= 2).any()  # a path of n >= 1 was compacted
  width = int(state.num_tokens.max())
  tokens = state.tokens[:, :width]
  layers = draft.feature_layers if kind == "feature" else ()
  out = _prefill(target, tp, tokens, hidden_layers=layers)
  want_length = np.asarray(state.num_tokens - 1)
  caches = [(state.target_cache, out[1], want_length)]
  if kind == "model":  # a path down to depth D: its last node was never fed
    full = emitted == shape.max_depth + 1
    caches.append((state.draft_state, _prefill(draft, dp, tokens)[1], want_length - full))
  for cache, fresh, length in caches:
    np.testing.assert_array_equal(np.asarray(cache["length"]), length)
    valid = np.arange(width)[None, :] < length[:, None]  # [B,W]
    for name in ("k", "v"):
      got = np.asarray(cache[name][:, :, :width])[:, valid]
      want = np.asarray(fresh[name][:, :, :width])[:, valid]
      np.testing.assert_allclose(got, want, atol=1e-5)
  if kind == "feature":
    feats, old = np.asarray(out[2]), np.asarray(before.num_tokens - 1)
    np.testing.assert_array_equal(np.asarray(state.draft_state.cache["length"]), old + 1)
    for b in range(len(PROMPTS)):
      np.testing.assert_allclose(np.asarray(state.draft_state.features[b, :emitted[b]]),
                                 feats[b, old[b]:old[b] + emitted[b]], atol=1e-5)


@pytest.mark.parametrize("kind,rule,shape", [
    ("model", "topk", DYNAMIC),
    pytest.param("model", "sampled", SHAPES[0], marks=pytest.mark.slow),
    pytest.param("feature", "topk", SHAPES[0], marks=pytest.mark.slow)])
def test_row_output_independent_of_batch_companions(model_pair, feature_pair, kind, rule,
                                                    shape):
  pair = model_pair if kind == "model" else feature_pair
  kw = dict(sampling=SamplingConfig(1.0), tree=shape, tree_rule=rule, prompt_width=6)
  alone = generate(pair, prompts=[PROMPTS[1]], seed=5, row_ids=[7], **kw)
  mixed = generate(pair, prompts=[PROMPTS[0], PROMPTS[1], PROMPTS[3]], seed=5,
                   row_ids=[1, 7, 3], **kw)
  np.testing.assert_array_equal(alone.tokens[0], mixed.tokens[1])


# ------------------------------------------------------------------- the law at T=1

VOCAB, NEW, ROWS = 4, 3, 4000
LAW_PROMPT = [1, 3, 0]


@pytest.fixture(scope="module")
def law_pair():
  return helpers.law_pair(VOCAB)


@pytest.fixture(scope="module")
def law_feature_pair(law_pair):
  return helpers.law_feature_pair(law_pair)


def exact_sequence_probs(config, params, sampling) -> np.ndarray:
  """[VOCAB**NEW]: the target's probability of every continuation (base-VOCAB index)."""
  return helpers.law_of_continuations(config, params, sampling, LAW_PROMPT, VOCAB, NEW)


LAW_CASES = [("model", (2, 2), "sampled", 0), ("model", (3, 1), "topk", 1),
             ("ngram", (2, 1, 1), "topk", 3), ("hybrid", (2, 1, 1), "topk", 4),
             ("feature", TreeShape.from_branching((3, 2)).with_budget(3), "topk", 5),
             pytest.param("feature", (2, 1), "sampled", 2, marks=pytest.mark.slow)]


def tree_law_pvalue(pair, branching, rule, seed, control: bool = False) -> float:
  """The chi-square p-value of ROWS tree-decoded continuations against the exact law.
  branching: a per-depth branching tuple or a TreeShape."""
  target, tp, draft, dp = pair
  sampling = SamplingConfig(temperature=1.0)
  exact = exact_sequence_probs(target, tp, sampling)
  np.testing.assert_allclose(exact.sum(), 1.0, atol=1e-5)
  shape = (branching if isinstance(branching, TreeShape)
           else TreeShape.from_branching(branching))
  out = speculative_generate(Model(target, tp), Model(draft, dp), [LAW_PROMPT] * ROWS,
                             spec=DecodeSpec(NEW, TreeProposal(shape, rule), sampling=sampling),
                             seed=seed)
  assert (out.lengths == NEW).all()
  if isinstance(draft, (NgramDraft, HybridDraft)):  # lookups exist in 3 + 3 tokens of 4 kinds
    assert (out.accepted > 0).any()
  elif not control:  # the draft is neither useless nor the target
    assert 0.2 < out.acceptance_rate() < 0.95
  index = (out.tokens * VOCAB ** np.arange(NEW - 1, -1, -1)).sum(axis=1)
  return chi_square_pvalue(index, exact)


@pytest.mark.parametrize("kind,branching,rule,seed", LAW_CASES)
def test_tree_sequences_follow_target_distribution(law_pair, law_feature_pair, kind,
                                                   branching, rule, seed):
  pair = dict(model=law_pair, feature=law_feature_pair,
              ngram=law_pair[:2] + (NgramDraft(1), None),
              hybrid=law_feature_pair[:2] + (HybridDraft(law_feature_pair[2], 1, 1),
                                             law_feature_pair[3]))[kind]
  pvalue = tree_law_pvalue(pair, branching, rule, seed)
  assert pvalue > SIGNIFICANCE, pvalue


@pytest.mark.slow
def test_negative_control_without_residual_fails(law_pair, monkeypatch):
  """Keeping p after a rejection (no residual) must fail the same test: it has the power."""
  import functools
  from specdec_jax.decoding import tree_step
  monkeypatch.setattr(tree_step, "tree_verify", functools.partial(
      tree_step.tree_verify, residual_fn=lambda p, q: p))
  jax.clear_caches()  # the loop compiled by the exact test above would hide the patch
  try:
    assert tree_law_pvalue(law_pair, (2, 2), "sampled", 0, control=True) < SIGNIFICANCE
  finally:
    jax.clear_caches()  # nor may the patched loop serve a later test


# ------------------------------------------------------------------------ bad input

def test_tree_not_in_level_order_is_refused(model_pair):
  with pytest.raises(ValueError, match="level by level"):
    generate(model_pair, tree=TreeShape((-1, 0, -1)))


def test_tree_with_gamma_auto_is_refused(model_pair):
  """A config's gamma 'auto' with a tree has no proposer (`make_proposer` refuses it)."""
  with pytest.raises(ValueError, match="gamma='auto'"):
    generate(model_pair, gamma="auto", tree=SHAPES[0])


@pytest.mark.parametrize("shape,rule,match", [
    (TreeShape.from_branching((3, 1)), "sampled", "needs tree_rule 'topk'"),
    (SHAPES[0], "topk", "chains below the root"),
])
def test_lookup_tree_needs_topk_and_chains_below_the_root(model_pair, shape, rule, match):
  target, tp = model_pair[:2]
  with pytest.raises(ValueError, match=match):
    speculative_generate(Model(target, tp), Model(NgramDraft(), None), PROMPTS,
                         spec=DecodeSpec(4, TreeProposal(shape, rule)))


def test_hybrid_tree_needs_topk(feature_pair):
  target, tp, draft, dp = feature_pair
  with pytest.raises(ValueError, match="needs tree_rule 'topk'"):
    speculative_generate(Model(target, tp), Model(HybridDraft(draft, 2, 2), dp), PROMPTS,
                         spec=DecodeSpec(4, TreeProposal(SHAPES[1], "sampled")))


def test_unknown_tree_rule_is_refused(model_pair):
  with pytest.raises(ValueError, match="'greedy'"):
    generate(model_pair, tree=SHAPES[0], tree_rule="greedy")


@pytest.mark.parametrize("kind,rule,match", [
    ("model", "sampled", "needs tree_rule 'topk'"),
    ("ngram", "topk", "needs a model draft's probabilities")])
def test_dynamic_tree_needs_topk_and_a_model_draft(model_pair, kind, rule, match):
  """Each draft kind checks its own trees (`Draft.check_tree`): a model draft refuses a
  dynamic tree under rule 'sampled', a lookup any dynamic tree."""
  target, tp, draft, dp = model_pair
  draft, dp = (draft, dp) if kind == "model" else (NgramDraft(), None)
  shape = TreeShape.from_branching((3, 1, 1)).with_budget(4)  # a lookup draft's form
  with pytest.raises(ValueError, match="dynamic tree .budget 4. " + match):
    speculative_generate(Model(target, tp), Model(draft, dp), PROMPTS,
                         spec=DecodeSpec(4, TreeProposal(shape, rule)))


def test_select_nodes_takes_the_likeliest_and_their_ancestors():
  """Largest log path probability first; a tie goes to the lower index (a parent)."""
  from specdec_jax.drafts.tree_drafting import select_nodes
  shape = TreeShape.from_branching((2, 2)).with_budget(3)  # nodes 2, 3 below 0
  scores = jnp.array([[-0.1, -2.0, -0.1, -0.5, -3.0, -3.0],
                      [-1.0, -0.2, -5.0, -6.0, -0.9, -0.3]])
  np.testing.assert_array_equal(select_nodes(shape, scores), [[0, 2, 3], [1, 4, 5]])
