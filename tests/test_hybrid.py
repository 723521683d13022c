"""Hybrid drafts (lookup where the last n tokens occurred before, a feature draft
elsewhere): the lookup's `found`, exactness, greedy equality, batch composition, the
feature draft's state after either branch, names and errors.

The whole-sequence tests reuse test_exactness's enumeration (vocabulary 4, 4 new
tokens after [1, 3, 0], 40,000 rows) with a 2-token match rule, so some steps of a row
take the lookup and others the feature draft; each case checks that both branches
ran. False-failure rate: each chi-square case fails for a correct sampler with
probability SIGNIFICANCE = 1e-3 (four cases, three of them slow: at most 0.4% for the
file); seeds are fixed, so the outcome is deterministic. The naive "correct from p"
verifier, the negative control, must fail the same test.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import (SIGNIFICANCE, assert_greedy_equals_autoregressive, chi_square_pvalue,
                     noise_params, speculative, tiny_config, tiny_model)
from specdec_jax import (AutoGamma, DecodeSpec, FixedGamma, Model, SamplingConfig,
                         speculative_generate)
from specdec_jax.decoding import loop, step
from specdec_jax.decoding.spec import prepare
from specdec_jax.drafts.hybrid import HybridDraft
from specdec_jax.drafts.independent import IndependentDraft
from specdec_jax.drafts.ngram import NgramDraft, lookup
from specdec_jax.gamma import adaptive
from specdec_jax.io import checkpoint as ckpt_lib
from specdec_jax.loading import ByteTokenizer, load_draft
from specdec_jax.verification.verify import block_verify, verify
from test_exactness import (NEW, PROMPT, ROWS, assert_naive_verifier_fails,
                            exact_sequence_probs,
                            sample_sequences, sequence_index)


def lookup_fires(row: list[int], min_n: int, max_n: int) -> bool:
  """The rule of `HybridDraft`, as a plain loop: some n in [min_n, max_n] trailing
  tokens occurred earlier with a known follower."""
  length = len(row)
  return any(row[j:j + n] == row[length - n:]
             for n in range(min_n, max_n + 1) if length > n
             for j in range(length - n))


def branch_counts(prompts, out, draft: HybridDraft) -> tuple[int, int]:
  """(lookup steps, feature steps) over every row's live steps, replayed from its
  emitted tokens (step s of a row emits accepted[s] + 1 of them)."""
  seen, counts = {}, np.zeros(2, np.int64)
  for b, prompt in enumerate(prompts):
    key = (tuple(prompt), out.tokens[b].tobytes(), out.accepted[b].tobytes())
    if key not in seen:
      row, emitted, here = list(prompt), out.row(b), np.zeros(2, np.int64)
      for n in out.accepted[b][out.accepted[b] >= 0]:
        here[0 if lookup_fires(row, draft.min_n, draft.max_n) else 1] += 1
        row += emitted[len(row) - len(prompt): len(row) - len(prompt) + n + 1]
      seen[key] = here
    counts += seen[key]
  return int(counts[0]), int(counts[1])


def test_lookup_found_needs_a_match_of_min_n():
  tokens = jnp.asarray([[1, 2, 3, 9, 1, 2, 3, 0],    # "1 2 3" occurred: n = 3 matches
                        [5, 2, 3, 9, 1, 2, 3, 0],    # only "2 3": n = 2 matches
                        [5, 6, 7, 3, 1, 2, 3, 0],    # only "3": n = 1 matches
                        [1, 2, 3, 4, 0, 0, 0, 0]])   # no earlier copy of any suffix
  length = jnp.asarray([7, 7, 7, 4])
  rows = np.asarray(tokens)
  for min_n, want in ((1, [1, 1, 1, 0]), (2, [1, 1, 0, 0]), (3, [1, 0, 0, 0])):
    xs, found = lookup(tokens, length, min_n=min_n, max_n=3, gamma=2)
    np.testing.assert_array_equal(found, np.asarray(want, bool))
    assert [lookup_fires(rows[b, :int(length[b])].tolist(), min_n, 3) for b in range(4)] \
        == want
    if min_n == 2:  # the follower of the match, then periodic; the pending token without
      np.testing.assert_array_equal(xs, [[9, 1], [9, 1], [3, 3], [4, 4]])


# ------------------------------------------------------------------ exactness

@pytest.fixture(scope="module")
def hybrid_pair():
  """test_exactness's target and feature draft, wrapped in a 2-token lookup (24 positions:
  gamma='auto' adds the feature lag to the cache)."""
  target = tiny_config(vocab=4, layers=2, width=16, max_seq_len=24)
  feature = tiny_config(vocab=4, layers=1, width=8, max_seq_len=24, tie_embeddings=False,
                        feature_layers=(1, 2), feature_width=target.embed_dim)
  return (target, tiny_model(target, 10, factor=4.0), HybridDraft(feature, 2, 2),
          tiny_model(feature, 12, factor=4.0))


HYBRID_CASES = [  # the default verifier with a warp in the fast suite; the rest with test-all
    (SamplingConfig(temperature=0.7, top_p=0.9), block_verify),
    pytest.param(SamplingConfig(temperature=1.0), verify, marks=pytest.mark.slow),
    pytest.param(SamplingConfig(temperature=1.0), block_verify, marks=pytest.mark.slow),
    pytest.param(SamplingConfig(temperature=0.7, top_p=0.9), verify, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("sampling,verifier", HYBRID_CASES)
def test_hybrid_sequences_follow_target_distribution(hybrid_pair, sampling, verifier):
  """Rows switch between one-hot lookup proposals and the feature draft's own q step by
  step, and whole sequences still follow the target exactly."""
  exact = exact_sequence_probs(hybrid_pair[0], hybrid_pair[1], sampling)
  out = sample_sequences(hybrid_pair, 3, sampling, verifier=verifier, seed=7)
  looked, drafted = branch_counts([PROMPT] * len(out.lengths), out, hybrid_pair[2])
  assert min(looked, drafted) > 0.1 * (looked + drafted)  # both branches taken often
  assert 0.2 < out.alpha() < 0.95
  assert chi_square_pvalue(sequence_index(out.tokens), exact) > SIGNIFICANCE


def test_hybrid_negative_control_fails(hybrid_pair):
  assert_naive_verifier_fails(hybrid_pair, seed=7)


# Per-source step costs under which the feature draft's rows take γ <= 1 (γ >= 2 costs 50
# plain steps) and the lookup's rows γ = 3, so every step of the 40,000-row batch takes the
# shallow path (`HybridDraft.propose`: the feature draft's deeper drafts are skipped).
SHALLOW_COSTS = adaptive.CostTable(c=0.0, verify_costs=(1.0, 1.1, 1.2, 1.3),
                                   step_costs=(1.0, 1.2, 50.0, 50.0),
                                   lookup_step_costs=(1.0, 1.1, 1.2, 1.3))


def test_auto_hybrid_by_source_follows_target_distribution(hybrid_pair):
  """gamma='auto' with one α̂ and one cost row per proposal source (lookup, feature
  draft): rows choose γ by the source of each step, the feature draft skips its deeper
  drafts, and whole sequences still follow the target exactly (T=1)."""
  target, tp, draft, dp = hybrid_pair
  sampling = SamplingConfig(temperature=1.0)
  exact = exact_sequence_probs(target, tp, sampling)
  out = speculative_generate(Model(target, tp), Model(draft, dp), [PROMPT] * ROWS,
                             spec=DecodeSpec(NEW, AutoGamma(SHALLOW_COSTS, 3), sampling=sampling),
                             seed=11)
  assert (out.lengths == NEW).all()
  live = out.gammas[out.gammas >= 0]
  assert (live == 3).any() and (live == 1).any() and not (live == 2).any()
  assert chi_square_pvalue(sequence_index(out.tokens), exact) > SIGNIFICANCE


def prefilled(pair, gamma: int, new: int, sampling: SamplingConfig):
  """(Prepared, prefilled DecodeState) of PROMPTS for pair at a fixed γ, seed 5."""
  target, tp, draft, dp = pair
  prepared = prepare(Model(target, tp), Model(draft, dp), PROMPTS,
                     DecodeSpec(new, FixedGamma(gamma), sampling=sampling, verifier="block"),
                     seed=5)
  return prepared, loop.prefill(Model(target, tp), dp, prepared)


def test_shallow_hybrid_drafts_what_the_verifier_would_see(greedy_pair):
  """When every row proposing two or more takes the lookup, the skipped deeper drafts
  change nothing a row proposes: x and q equal the full drafting's on lookup rows at
  every depth and on the other rows at depth 1 (T=1, same keys)."""
  _, tp, hybrid, dp = greedy_pair
  gamma, new = 3, 8
  _, state = prefilled(greedy_pair, gamma, new, SamplingConfig(1.0))
  keys = jax.random.split(jax.random.PRNGKey(0), len(PROMPTS) * gamma).reshape(
      len(PROMPTS), gamma, 2)
  found = np.asarray(lookup(state.tokens, state.num_tokens, min_n=2, max_n=2, gamma=gamma)[1])
  assert found.any() and not found.all()
  plan = hybrid.plan(state, gamma)
  np.testing.assert_array_equal(plan.lookup[1], found)
  draft = functools.partial(hybrid.propose, dp, tp, state, keys, plan=plan, greedy=False,
                            vocab_size=32,
                            warp_fn=lambda logits: jax.nn.softmax(logits[..., :32], -1))
  full_x, full_q, _ = draft(chosen=jnp.full((len(PROMPTS),), gamma))  # no row shallow
  shallow_x, shallow_q, _ = draft(chosen=jnp.asarray(np.where(found, gamma, 1)))
  np.testing.assert_array_equal(shallow_x[found], full_x[found])
  np.testing.assert_array_equal(shallow_q[found], full_q[found])
  np.testing.assert_array_equal(shallow_x[:, 0], full_x[:, 0])
  np.testing.assert_allclose(shallow_q[:, 0], full_q[:, 0], atol=1e-6)
  assert not np.array_equal(shallow_q[~found][:, 1:], full_q[~found][:, 1:])  # really skipped
  deep_x, _, _ = draft(chosen=jnp.asarray(np.where(found, 1, 2)))  # a feature row at γ = 2
  np.testing.assert_array_equal(deep_x, full_x)


# ------------------------------------------------------------------ decoding

PROMPTS = [[1, 2, 3, 1, 2], [4, 5, 6, 7, 8], [9], [10, 11, 10, 11], [14, 15]]


@pytest.fixture(scope="module")
def greedy_pair():
  """A 3-layer target (whose greedy text falls into loops) and a 1-layer feature draft
  reading its layers 1 and 3, in a 2-token lookup."""
  target = tiny_config(vocab=32, layers=3, width=32, max_seq_len=64)
  feature = tiny_config(vocab=32, layers=1, width=16, max_seq_len=64, tie_embeddings=False,
                        feature_layers=(1, 3), feature_width=32)
  return (target, tiny_model(target, 0, factor=6.0), HybridDraft(feature, 2, 2),
          tiny_model(feature, 1, factor=3.0))


def generate(pair, prompts=PROMPTS, gamma=3, max_new_tokens=16, **kw):
  return speculative(pair, prompts, gamma=gamma, max_new_tokens=max_new_tokens, **kw)


def test_greedy_hybrid_equals_greedy_autoregressive(greedy_pair):
  """T=0 (the step verifies greedily, whatever the spec's verifier)."""
  sp = assert_greedy_equals_autoregressive(greedy_pair, PROMPTS)
  looked, drafted = branch_counts(PROMPTS, sp, greedy_pair[2])
  assert looked > 0 and drafted > 0


def test_row_output_independent_of_batch_composition(greedy_pair):
  kw = dict(sampling=SamplingConfig(1.0), seed=3)
  one = generate(greedy_pair, prompts=PROMPTS[:1], **kw)
  five = generate(greedy_pair, **kw)
  assert one.row(0) == five.row(0)
  np.testing.assert_array_equal(one.accepted[0], five.accepted[0][: one.num_steps])
  swapped = generate(greedy_pair, prompts=PROMPTS[::-1], row_ids=list(range(5))[::-1], **kw)
  assert swapped.row(4) == five.row(0)
  assert min(branch_counts(PROMPTS, five, greedy_pair[2])) > 0


def test_feature_branch_equals_a_fresh_feature_draft(greedy_pair):
  """After hybrid steps (rows taking either branch), the feature draft's q_1..q_G on
  the next step equal those of a pure feature draft prefilled afresh with the same
  tokens: its cache and features are those of the emitted tokens."""
  target, tp, hybrid, dp = greedy_pair
  feature, gamma, new = hybrid.inner, 3, 24
  prepared, state = prefilled(greedy_pair, gamma, new, SamplingConfig(1.0))
  width = prepared.tokens.shape[1] + new  # a fixed prefix width: one compile of the prefill
  keys = jax.random.split(jax.random.PRNGKey(0), len(PROMPTS) * gamma).reshape(
      len(PROMPTS), gamma, 2)
  draft_qs = jax.jit(lambda st: feature.propose(
      dp, tp, st, keys, plan=feature.plan(st, gamma), chosen=jnp.full((len(PROMPTS),), gamma),
      greedy=False, vocab_size=32,
      warp_fn=lambda logits: jax.nn.softmax(logits[..., :32], -1))[1])
  branches = np.zeros(2, np.int64)
  for _ in range(6):
    state = step.speculative_step(tp, dp, state, target_config=target, draft=prepared.draft,
                                  spec=prepared.spec)
    num = np.asarray(state.num_tokens)
    prefixes = np.asarray(state.tokens)[:, :width].copy()
    for b in range(len(PROMPTS)):
      prefixes[b, num[b]:] = 0
    fresh = loop.init_state_jit(tp, dp, prefixes, state.num_tokens, prepared.row_keys,
                                target_config=target, draft=feature, gamma=gamma,
                                max_new_tokens=new)
    np.testing.assert_allclose(draft_qs(state), draft_qs(fresh), atol=2e-5)
    _, found = lookup(state.tokens, state.num_tokens, min_n=2, max_n=2, gamma=gamma)
    branches += [int(found.sum()), int((~found).sum())]
  assert branches.min() > 0, branches  # the steps before covered both branches


# ------------------------------------------------------------------ names and errors

def test_hybrid_draft_names_and_errors(greedy_pair, tmp_path):
  target, tp, hybrid, dp = greedy_pair
  tok = ByteTokenizer()
  feature = hybrid.inner.config  # the feature draft's ModelConfig
  ckpt_lib.save_params(tmp_path / "f", dp, feature, tokenizer_identity=tok.identity)
  cfg, params = load_draft("hybrid:3", tok, target, tp, feature_draft=f"saved:{tmp_path / 'f'}")
  assert cfg == HybridDraft(feature.replace(max_seq_len=64), 3, 3)
  assert isinstance(cfg, HybridDraft) and cfg.vocab_size == 32
  assert params["fuse"].shape == (64, 16)
  for bad in ("hybrid:0", "hybrid:x", "hybrid:", "hybrid:2:3"):
    with pytest.raises(ValueError, match="hybrid"):
      load_draft(bad, tok, target, tp, feature_draft=f"saved:{tmp_path / 'f'}")
  for feature_draft in (None, "", "hybrid:2", "ngram:2"):
    with pytest.raises(ValueError, match="needs config.feature_draft"):
      load_draft("hybrid:3", tok, target, tp, feature_draft=feature_draft)
  # an independent inner draft feeds the lookup's tokens where a row takes them
  truncated, _ = load_draft("hybrid:3", tok, target, tp, feature_draft="truncate:1")
  assert truncated == HybridDraft(IndependentDraft(target.replace(num_layers=1)), 3, 3)
  with pytest.raises(ValueError, match="follows the emitted tokens .* got NgramDraft"):
    HybridDraft(NgramDraft(2))
  with pytest.raises(ValueError, match="min_n <= max_n, got 3 > 2"):
    HybridDraft(feature, 3, 2)
  with pytest.raises(ValueError, match="min_n >= 1, got 0"):
    HybridDraft(feature, 0, 2)
  with pytest.raises(ValueError, match="fuse"):  # a hybrid's params are its feature draft's
    generate(greedy_pair[:3] + (tp,), max_new_tokens=2)


def test_load_pair_resolves_hybrid_from_config(tmp_path):
  """configs/tiny.py with draft 'hybrid:2' and config.feature_draft naming a saved
  feature draft of its target: the one loader builds the HybridDraft around it."""
  from configs import tiny
  from specdec_jax.loading import load_pair
  config = tiny.get_config()
  config.target_model.update(num_layers=2, embed_dim=32, mlp_dim=64, num_heads=2,
                             num_kv_heads=1, head_dim=16)
  feature = tiny_config(vocab=257, layers=1, width=16, tie_embeddings=False,
                        feature_layers=(1, 2), feature_width=32)
  ckpt_lib.save_params(tmp_path / "f", noise_params(feature), feature,
                       tokenizer_identity=ByteTokenizer.identity)
  config.draft, config.feature_draft = "hybrid:2", f"saved:{tmp_path / 'f'}"
  pair = load_pair(config)
  assert pair.draft_config == HybridDraft(feature.replace(max_seq_len=512), 2, 2)
  assert pair.draft_params["fuse"].shape == (64, 16) and pair.vocab_size == 257
  config.feature_draft = "truncate:1"  # an independent inner draft
  assert isinstance(load_pair(config).draft_config.inner, IndependentDraft)
