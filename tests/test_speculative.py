"""The decode loops: greedy equality, draft == target, cache, seeds, compilation, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import (GREEDY, assert_greedy_equals_autoregressive, greedy_draft_pair,
                     speculative, tiny_config, tiny_model)
from specdec_jax import (
    DecodeSpec,
    FixedGamma,
    Model,
    SamplingConfig,
    autoregressive_generate,
    forward,
    init_cache,
    speculative_generate,
)
from specdec_jax.decoding import loop, results, step
from specdec_jax.decoding.spec import prepare

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13], [14, 15]]


def generate(pair, prompts=PROMPTS, gamma=3, max_new_tokens=16, **kw):
  return speculative(pair, prompts, gamma=gamma, max_new_tokens=max_new_tokens, **kw)


def autoregressive(target, params, prompts=PROMPTS, max_new_tokens=16, seed=0,
                   prompt_width=None, pad_id=0, **spec_fields):
  """Autoregressive decoding of PROMPTS (spec_fields: sampling, eos_id)."""
  return autoregressive_generate(Model(target, params), prompts,
                                 spec=DecodeSpec(max_new_tokens, **spec_fields), seed=seed,
                                 prompt_width=prompt_width, pad_id=pad_id)


@pytest.fixture(scope="module")
def greedy_pair():
  """A draft that agrees with the target often but not always (greedy)."""
  return greedy_draft_pair()


@pytest.mark.parametrize("gamma", [1, 3, pytest.param(5, marks=pytest.mark.slow)])
def test_greedy_speculative_equals_greedy_autoregressive(greedy_pair, gamma):
  sp = assert_greedy_equals_autoregressive(greedy_pair, PROMPTS, gamma=gamma)
  np.testing.assert_array_equal(sp.lengths, [16] * len(PROMPTS))
  # The rows really accept different numbers of tokens, step by step.
  per_row = [sp.accepted[b][sp.accepted[b] >= 0].tolist() for b in range(len(PROMPTS))]
  assert len({tuple(r) for r in per_row}) > 1, per_row
  assert 0 < sp.acceptance_rate() < 1


def test_greedy_still_checks_the_verifier_name(greedy_pair):
  """At T = 0 the step verifies with `greedy_verify` whatever the spec names (that it
  never calls the spec's verifier there, and that both verifiers reduce to argmax
  matching on one-hot targets: tests/test_verify.py), but a misspelt verifier is still
  refused, not silently ignored."""
  with pytest.raises(ValueError, match="unknown verifier 'blocks'"):
    generate(greedy_pair, gamma=3, sampling=GREEDY, verifier="blocks")


def test_greedy_with_vocabulary_subset_draft(greedy_pair):
  """A draft head over half the vocabulary: tokens outside it are always rejected
  drafts' corrections, and the output is still the greedy target's."""
  target, tp, draft, dp = greedy_pair
  ar = autoregressive(target, tp, sampling=GREEDY)
  subset = tuple(sorted(set(range(0, 32, 2)) | set(ar.tokens[:2].ravel().tolist())))
  sub = draft.replace(tie_embeddings=False, head_tokens=subset)
  sub_params = {**dp, "head": dp["embed"].T[:, jnp.asarray(subset)]}
  sp = generate((target, tp, sub, sub_params), sampling=GREEDY)
  np.testing.assert_array_equal(sp.tokens, ar.tokens)
  assert 0 < sp.acceptance_rate() < 1
  outside = ~np.isin(ar.tokens, subset)
  assert outside.any()  # the target emits tokens the draft can never propose


def test_greedy_with_eos_stops_each_row(greedy_pair):
  target, tp, _, _ = greedy_pair
  ar = autoregressive(target, tp, sampling=GREEDY)
  eos = int(ar.tokens[0, 5])  # a token that row 0 emits, so at least one row stops early
  ar_eos = autoregressive(target, tp, sampling=GREEDY, eos_id=eos, pad_id=31)
  sp_eos = generate(greedy_pair, sampling=GREEDY, eos_id=eos, pad_id=31)
  np.testing.assert_array_equal(sp_eos.tokens, ar_eos.tokens)
  np.testing.assert_array_equal(sp_eos.lengths, ar_eos.lengths)
  assert sp_eos.lengths[0] <= 6 and sp_eos.row(0)[-1] == eos
  for b in range(len(PROMPTS)):
    row = sp_eos.row(b)
    assert eos not in row[:-1]
    assert (sp_eos.tokens[b, len(row):] == 31).all()


def test_draft_equal_to_target_accepts_everything(tiny_pair):
  target, tp, _, _ = tiny_pair
  gamma = 4
  out = speculative_generate(Model(target, tp), Model(target, tp), PROMPTS,
                             spec=DecodeSpec(15, FixedGamma(gamma), SamplingConfig(1.0)))
  live = out.accepted >= 0
  assert (out.accepted[live] == gamma).all()
  assert out.num_steps == 3  # 15 tokens at gamma + 1 = 5 per step
  np.testing.assert_allclose(out.accept_prob[live], 1.0, atol=1e-5)


@pytest.mark.parametrize("gamma", [1, 3])
def test_an_independent_chain_makes_gamma_draft_calls(tiny_pair, monkeypatch, gamma):
  """A chain step of an independent draft calls its model γ times: single tokens where no
  row's cache lags (after the prefill, or a step with a rejection), and where one lags (its
  last step accepted x_γ) a first call over the last emitted token and the pending one,
  then γ-1 single tokens; never a cache-only call for x_γ (which would make γ+1 calls).
  The two first calls give the same drafts. Counted eagerly (`jax.disable_jit`: the scan
  runs as a Python loop, `lax.cond` runs one branch)."""
  from specdec_jax.drafts import independent
  target, tp, draft, dp = tiny_pair
  prepared, state = prepared_state(tiny_pair, DecodeSpec(10, FixedGamma(gamma)), seed=0)
  widths = []

  def counted(params, tokens, *args, **kw):
    widths.append(tokens.shape[1])
    return forward(params, tokens, *args, **kw)

  monkeypatch.setattr(independent, "forward", counted)
  model_draft = prepared.draft
  assert isinstance(model_draft, independent.IndependentDraft)
  keys = jax.random.split(jax.random.PRNGKey(0), len(PROMPTS) * gamma).reshape(-1, gamma, 2)

  def propose(state):
    widths.clear()
    with jax.disable_jit():
      return model_draft.propose(
          dp, tp, state, keys, plan=model_draft.plan(state, gamma),
          chosen=jnp.full(len(PROMPTS), gamma), warp_fn=lambda x: jax.nn.softmax(x, -1),
          greedy=False, vocab_size=target.vocab_size)

  xs, qs, _ = propose(state)
  assert xs.shape == (len(PROMPTS), gamma) and qs.shape[:2] == xs.shape
  assert widths == [1] * gamma  # the prefill leaves ℓ_d = ℓ
  lengths = state.draft_state["length"]
  lagging = state.replace(draft_state={**state.draft_state, "length": lengths.at[0].add(-1)})
  xs_lag, qs_lag, _ = propose(lagging)
  assert widths == [2] + [1] * (gamma - 1)
  np.testing.assert_array_equal(xs_lag, xs)
  np.testing.assert_allclose(qs_lag, qs, atol=1e-5)


def test_max_new_tokens_cuts_the_last_block(tiny_pair):
  out = generate(tiny_pair, max_new_tokens=7, sampling=SamplingConfig(1.0))
  np.testing.assert_array_equal(out.lengths, [7] * len(PROMPTS))


# ------------------------------------------------------------------ KV cache

def test_incremental_logits_equal_full_forward(tiny_pair):
  target, tp, _, _ = tiny_pair
  tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 12), 0, target.vocab_size)
  pos = jnp.broadcast_to(jnp.arange(12), (3, 12))
  full, _ = forward(tp, tokens, pos, init_cache(target, 3, 16), config=target)
  cache = init_cache(target, 3, 16)
  pieces = []
  for start, stop in [(0, 5), (5, 6), (6, 9), (9, 12)]:
    logits, cache = forward(tp, tokens[:, start:stop], pos[:, start:stop], cache, config=target)
    pieces.append(logits)
  np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), full, atol=1e-4, rtol=1e-4)
  np.testing.assert_array_equal(cache["length"], [12, 12, 12])


def test_rollback_then_continue_equals_fresh_run(tiny_pair):
  target, tp, _, _ = tiny_pair
  a = jnp.asarray([[3, 1, 4, 1, 5]])
  rejected = jnp.asarray([[9, 2, 6]])
  kept = jnp.asarray([[7, 8]])

  def run(chunks, rollback_to=None):
    cache, logits = init_cache(target, 1, 16), None
    for i, chunk in enumerate(chunks):
      if rollback_to is not None and i == len(chunks) - 1:
        cache = {**cache, "length": jnp.asarray([rollback_to], jnp.int32)}
      start = int(cache["length"][0])
      pos = start + jnp.arange(chunk.shape[1])[None]
      logits, cache = forward(tp, chunk, pos, cache, config=target)
    return logits

  rolled = run([a, rejected, kept], rollback_to=5)
  fresh = run([a, kept])
  np.testing.assert_allclose(rolled, fresh, atol=1e-5)


def test_padded_prompts_match_unpadded(tiny_pair):
  """Right padding: a short prompt in a batch of long ones samples as it would alone."""
  alone = generate(tiny_pair, prompts=[PROMPTS[2]], sampling=SamplingConfig(1.0), seed=4)
  batch = generate(tiny_pair, sampling=SamplingConfig(1.0), seed=4,
                   row_ids=[1, 2, 0, 3, 4])  # PROMPTS[2] keeps row id 0 here
  assert batch.row(2) == alone.row(0)


# ------------------------------------------------------------------ seeds

def test_same_seed_same_tokens_different_seed_differs(tiny_pair):
  a = generate(tiny_pair, sampling=SamplingConfig(1.0), seed=7)
  b = generate(tiny_pair, sampling=SamplingConfig(1.0), seed=7)
  c = generate(tiny_pair, sampling=SamplingConfig(1.0), seed=8)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.accepted, b.accepted)
  assert (a.tokens != c.tokens).any()


def test_row_output_independent_of_batch_size(tiny_pair):
  prompts8 = [[1, 2, 3, 4]] + [[i, i + 1, 2, 5] for i in range(7)]
  one = generate(tiny_pair, prompts=prompts8[:1], sampling=SamplingConfig(1.0), seed=3)
  eight = generate(tiny_pair, prompts=prompts8, sampling=SamplingConfig(1.0), seed=3)
  assert one.row(0) == eight.row(0)
  np.testing.assert_array_equal(one.accepted[0], eight.accepted[0][: one.num_steps])


def test_per_row_seeds(tiny_pair):
  both = generate(tiny_pair, prompts=[[1, 2], [1, 2]], sampling=SamplingConfig(1.0), seed=[5, 6],
                  row_ids=[0, 0])
  five = generate(tiny_pair, prompts=[[1, 2]], sampling=SamplingConfig(1.0), seed=5)
  six = generate(tiny_pair, prompts=[[1, 2]], sampling=SamplingConfig(1.0), seed=6)
  assert both.row(0) == five.row(0) and both.row(1) == six.row(0)


# ------------------------------------------------------------------ compilation

def prepared_state(pair, spec: DecodeSpec, seed=0):
  """(prepared, state): `spec.prepare` of PROMPTS and the prefilled `DecodeState` (the
  `loop.init_state_jit` the generate functions compile)."""
  target, tp, draft, dp = pair
  prepared = prepare(Model(target, tp), Model(draft, dp), PROMPTS, spec, seed=seed)
  state = loop.init_state_jit(tp, dp, prepared.tokens, prepared.prompt_len, prepared.row_keys,
                              target_config=target, draft=prepared.draft, gamma=spec.gamma,
                              max_new_tokens=spec.max_new_tokens)
  return prepared, state


def test_step_and_loop_compile_once(tiny_pair):
  """Repeated calls add at most one compiled program (none where an earlier test module
  of this process compiled the same one: `conftest.release_compiled_programs`)."""
  target, tp, _, dp = tiny_pair
  prepared, state = prepared_state(tiny_pair, DecodeSpec(12, FixedGamma(2), SamplingConfig(0.8)))
  statics = dict(target_config=target, draft=prepared.draft, spec=prepared.spec)
  before = step.speculative_step._cache_size()
  for _ in range(4):
    state = step.speculative_step(tp, dp, state, None, **statics)
  assert step.speculative_step._cache_size() <= before + 1
  assert int(state.step) == 4 and (np.asarray(state.num_tokens) > prepared.prompt_len).all()

  loop_before = loop.run_steps_jit._cache_size()
  for seed in range(3):
    generate(tiny_pair, gamma=2, max_new_tokens=12, sampling=SamplingConfig(0.8), seed=seed)
  assert loop.run_steps_jit._cache_size() <= loop_before + 1


def test_manual_steps_equal_the_loop(tiny_pair):
  """The jitted step, called from Python, gives the loop's tokens."""
  target, tp, _, dp = tiny_pair
  sampling = SamplingConfig(1.0)
  looped = generate(tiny_pair, gamma=2, max_new_tokens=10, sampling=sampling, seed=2)
  prepared, state = prepared_state(tiny_pair, DecodeSpec(10, FixedGamma(2), sampling), seed=2)
  while not bool(state.done.all()):
    state = step.speculative_step(tp, dp, state, None, target_config=target,
                                  draft=prepared.draft, spec=prepared.spec)
  stepped = results.finish(state, 10, 0)
  np.testing.assert_array_equal(stepped.tokens, looped.tokens)


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("change,match", [
    (dict(gamma=0), "gamma"),
    (dict(gamma=2.5), "gamma"),
    (dict(sampling="greedy"), "sampling"),
    (dict(prompts=[]), "empty"),
    (dict(prompts=[[1, 2], []]), "prompt 1 is empty"),
    (dict(prompts=[[1.5, 2.0]]), "integer"),
    (dict(prompts=np.zeros((2, 2, 2), np.int32)), "2-D"),
    (dict(prompts="hello"), "list"),
    (dict(prompts=[[1, 99]]), r"\[0, 32\)"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=200), "exceeds the target cache"),
    (dict(eos_id=40), "eos_id"),
    (dict(seed=-1), "seed"),
    (dict(row_ids=[0, 1]), "row_ids"),
])
def test_bad_input_raises_value_error(tiny_pair, change, match):
  kw = dict(prompts=PROMPTS, gamma=2, max_new_tokens=8)
  kw.update(change)
  with pytest.raises(ValueError, match=match):
    generate(tiny_pair, **kw)


@pytest.mark.parametrize("kw,match", [
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
])
def test_bad_sampling_settings(kw, match):
  with pytest.raises(ValueError, match=match):
    SamplingConfig(**kw)


def test_vocab_mismatch_raises(tiny_pair):
  target, tp, _, _ = tiny_pair
  other = tiny_config(vocab=40, layers=1, width=16)
  with pytest.raises(ValueError, match="vocabulary mismatch"):
    generate((target, tp, other, tiny_model(other, 2)), gamma=2, max_new_tokens=4)


def test_padded_vocab_is_cut_to_the_true_vocabulary(tiny_pair):
  """A draft whose vocabulary is padded to 40 works with vocab_size=32 and never emits ids >= 32."""
  target, tp, _, _ = tiny_pair
  other = tiny_config(vocab=40, layers=1, width=16)
  out = generate((target, tp, other, tiny_model(other, 2)), gamma=2, max_new_tokens=8,
                 vocab_size=32, sampling=SamplingConfig(1.0))
  assert out.tokens.max() < 32


def test_params_config_mismatch_raises(tiny_pair):
  target, tp, draft, dp = tiny_pair
  with pytest.raises(ValueError, match="draft params do not match"):
    generate((target, tp, draft, tp), gamma=2, max_new_tokens=4)


@pytest.mark.parametrize("sampling", [pytest.param(GREEDY, marks=pytest.mark.slow),
                                      SamplingConfig(temperature=1.0)])
def test_prompt_width_pads_without_changing_tokens(greedy_pair, sampling):
  """Padding the prompts wider (one compiled loop for many prompt lengths) changes no
  token, greedy or sampled (the strict case, in make test: every draw's key and position
  must stay the row's own), speculative or plain; a bad width is a clear error."""
  target, tp, _, _ = greedy_pair
  plain = generate(greedy_pair, sampling=sampling, seed=3)
  padded = generate(greedy_pair, sampling=sampling, seed=3, prompt_width=12)
  np.testing.assert_array_equal(padded.tokens, plain.tokens)
  ar = [autoregressive(target, tp, sampling=sampling, seed=3, prompt_width=w)
        for w in (None, 12)]
  np.testing.assert_array_equal(ar[1].tokens, ar[0].tokens)
  with pytest.raises(ValueError, match="prompt_width must be an int >= 1, got 0"):
    generate(greedy_pair, prompt_width=0)
