"""Helpers shared by the tests: tiny random models, decoding a pair, a chi-square check."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from specdec_jax import (DecodeSpec, FixedGamma, GenerationResult, Model, SamplingConfig,
                         autoregressive_generate, speculative_generate)
from specdec_jax.models.model import ModelConfig, forward, init_cache, init_params, param_shapes
from specdec_jax.models.sampling import warp

# A correct sampler fails a chi-square test at this level with probability 1e-3.
SIGNIFICANCE = 1e-3
GREEDY = SamplingConfig(temperature=0.0)


@jax.jit
def sharpen(params, factor):
  """Scales every non-norm weight so random logits are far from uniform (one compiled
  program per tree, not one per leaf)."""
  def scale(path, x):
    return x if "norm" in jax.tree_util.keystr(path) else x * factor
  return jax.tree_util.tree_map_with_path(scale, params)


def tiny_config(vocab=32, layers=2, width=32, max_seq_len=64, **kw):
  return ModelConfig(vocab_size=vocab, num_layers=layers, embed_dim=width, mlp_dim=2 * width,
                     num_heads=4, num_kv_heads=2, head_dim=width // 4, max_seq_len=max_seq_len,
                     **kw)


def tiny_model(config, seed, factor=15.0):
  return sharpen(init_params(config, jax.random.PRNGKey(seed)), factor)


def noise_params(config, seed=0, scale=0.1):
  """init_params(config)'s tree filled with numpy noise (norm scales near 1); compiles nothing."""
  rng = np.random.default_rng(seed)

  def fill(path, s):
    base = 1.0 if "scale" in jax.tree_util.keystr(path) else 0.0
    return jnp.asarray(base + scale * rng.standard_normal(s.shape), s.dtype)
  return jax.tree_util.tree_map_with_path(fill, param_shapes(config))


def chi_square_pvalue(samples: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
  """p-value of int samples against probs. Zero-probability cells must stay empty;
  cells expected to hold fewer than `min_expected` samples are pooled into one."""
  probs = np.asarray(probs, np.float64)
  counts = np.bincount(samples, minlength=len(probs))
  assert len(counts) == len(probs), "sampled an out-of-range id"
  impossible = np.flatnonzero(counts * (probs == 0))
  assert impossible.size == 0, f"sampled impossible outcomes: {impossible}"
  keep = probs > 0
  expected = probs[keep] / probs[keep].sum() * counts.sum()
  observed = counts[keep]
  small = expected < min_expected
  if small.any():
    expected = np.append(expected[~small], expected[small].sum())
    observed = np.append(observed[~small], observed[small].sum())
  if len(expected) == 1:  # a point mass: the assert above is the whole test
    return 1.0
  return stats.chisquare(observed, expected).pvalue


def complete_with_fresh_draws(p_rows: np.ndarray, tokens: np.ndarray, accepted: np.ndarray,
                              seed: int) -> np.ndarray:
  """int [N,G+1]: each row's emitted tokens tokens[:, :n+1] (n = accepted), then fresh
  draws from p_j at every later position j (numpy, seeded). A verifier step is exact iff
  these completed sequences are distributed as p_1 ⊗ .. ⊗ p_{G+1} (position-wise p
  [G+1,V])."""
  n, width = tokens.shape
  rng = np.random.default_rng(seed)
  cdf = np.cumsum(p_rows / p_rows.sum(-1, keepdims=True), axis=-1)
  fresh = np.stack([np.minimum(np.searchsorted(cdf[j], rng.random(n), side="right"),
                               p_rows.shape[-1] - 1) for j in range(width)], axis=1)
  return np.where(np.arange(width)[None] <= accepted[:, None], tokens, fresh)


def greedy_draft_pair():
  """(target, params, draft, params), vocabulary 32: the draft is the target's first layer
  with its embedding and head, so greedily it agrees often but not always."""
  target = tiny_config(vocab=32, layers=2, width=32)
  tp = tiny_model(target, 0, factor=8.0)
  draft = target.replace(num_layers=1)
  dp = {**tp, "layers": jax.tree_util.tree_map(lambda x: x[:1], tp["layers"])}
  return target, tp, draft, dp


def law_pair(vocab: int = 4):
  """The tiny (target, params, draft, params) of the whole-sequence law tests: a 2-layer
  target and a 1-layer independent draft on a `vocab`-token vocabulary, 24 slots (room
  for gamma 'auto''s skip lag)."""
  target = tiny_config(vocab=vocab, layers=2, width=16, max_seq_len=24)
  draft = tiny_config(vocab=vocab, layers=1, width=8, max_seq_len=24)
  return target, tiny_model(target, 10, factor=4.0), draft, tiny_model(draft, 11, factor=4.0)


def law_feature_pair(pair):
  """`law_pair`'s target with a 1-layer feature draft reading its layers 1 and 2."""
  target, tp = pair[:2]
  draft = tiny_config(vocab=target.vocab_size, layers=1, width=8, max_seq_len=24,
                      tie_embeddings=False, feature_layers=(1, 2),
                      feature_width=target.embed_dim)
  return target, tp, draft, tiny_model(draft, 12, factor=4.0)


def law_of_continuations(config, params, sampling, prompt, vocab: int, new: int) -> np.ndarray:
  """[vocab**new]: the target's probability of every continuation of `new` tokens after
  `prompt` (index = base-vocab digits, first token most significant), by one forward."""
  seqs = np.array(list(itertools.product(range(vocab), repeat=new)), np.int32)
  tokens = np.concatenate([np.tile(prompt, (len(seqs), 1)), seqs], axis=1)
  positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
  logits, _ = forward(params, jnp.asarray(tokens), jnp.asarray(positions),
                      init_cache(config, len(seqs), tokens.shape[1]), config=config)
  probs = np.asarray(warp(logits, sampling.temperature, sampling.top_k, sampling.top_p),
                     np.float64)
  start = len(prompt) - 1
  return probs[np.arange(len(seqs))[:, None], start + np.arange(new)[None, :], seqs].prod(1)


def speculative(pair, prompts, *, gamma: int, max_new_tokens: int, seed=0, row_ids=None,
                pad_id: int = 0, prompt_width: int | None = None, **spec_fields):
  """`speculative_generate` with pair = (target, params, draft, params) and a fixed γ;
  spec_fields are the rest of the `DecodeSpec` (sampling, verifier, eos_id, vocab_size)."""
  target, tp, draft, dp = pair
  spec = DecodeSpec(max_new_tokens, FixedGamma(gamma), **spec_fields)
  return speculative_generate(Model(target, tp), Model(draft, dp), prompts, spec=spec,
                              seed=seed, row_ids=row_ids, pad_id=pad_id,
                              prompt_width=prompt_width)


def assert_greedy_equals_autoregressive(pair, prompts, *, gamma: int = 3,
                                        max_new_tokens: int = 16,
                                        **spec_fields) -> GenerationResult:
  """Greedy speculative decoding with pair's draft emits greedy autoregressive decoding's
  tokens; returns the speculative result (spec_fields: the verifier, say)."""
  target, tp = pair[:2]
  plain = autoregressive_generate(Model(target, tp), prompts,
                                  spec=DecodeSpec(max_new_tokens, sampling=GREEDY))
  out = speculative(pair, prompts, gamma=gamma, max_new_tokens=max_new_tokens,
                    sampling=GREEDY, **spec_fields)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  return out
