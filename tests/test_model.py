"""The model itself: layouts, shapes and config errors."""

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_config, tiny_model
from specdec_jax.models import matmul
from specdec_jax.models.layouts import serving_layout, stack_layers, unstack_layers
from specdec_jax.models.matmul import SKINNY_ROWS, dot_products_only, out_major_matmul
from specdec_jax.models.model import ModelConfig, forward, init_cache, param_shapes


def test_unstacked_layout_gives_the_same_logits_and_cache():
  cfg = tiny_config(layers=3, qkv_bias=True)
  params = tiny_model(cfg, 0, factor=3.0)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 7), 0, cfg.vocab_size)
  pos = jnp.broadcast_to(jnp.arange(7), (2, 7))
  a, ca = forward(params, tokens, pos, init_cache(cfg, 2, 8), config=cfg)
  unstacked = unstack_layers(params)
  assert "layers" not in unstacked and "layers_2" in unstacked
  b, cb = forward(unstacked, tokens, pos, init_cache(cfg, 2, 8), config=cfg)
  np.testing.assert_allclose(a, b, atol=1e-5)
  np.testing.assert_allclose(ca["k"], cb["k"], atol=1e-6)
  back = stack_layers(unstacked)
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda x, y: bool((x == y).all()),
                                                       back, params))


@pytest.mark.parametrize("tie,subset", [(True, False), (False, False), (False, True)])
def test_serving_layout_gives_the_same_logits_and_cache(tie, subset):
  """Output-major matmuls (`layouts.serving_layout`): the same products, for one token
  and for a verify-sized call, with a tied, untied or vocabulary-subset head; and
  stack_layers brings the stored layout back exactly."""
  cfg = tiny_config(layers=2, qkv_bias=True, tie_embeddings=tie)
  if subset:
    cfg = cfg.replace(head_tokens=tuple(range(0, cfg.vocab_size, 3)))
  params = tiny_model(cfg, 0, factor=3.0)
  served = serving_layout(params)
  assert "q" not in served["layers_0"] and served["layers_0"]["q_t"].shape == (
      cfg.num_heads * cfg.head_dim, cfg.embed_dim)
  assert ("head_t" in served) != tie
  for t in (1, 4):
    tokens = jax.random.randint(jax.random.PRNGKey(t), (2, t), 0, cfg.vocab_size)
    pos = jnp.broadcast_to(jnp.arange(t), (2, t))
    a, ca = forward(params, tokens, pos, init_cache(cfg, 2, 8), config=cfg)
    b, cb = forward(served, tokens, pos, init_cache(cfg, 2, 8), config=cfg)
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(ca["v"], cb["v"], atol=1e-5)
  back = stack_layers(served, cfg)
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(
      lambda x, y: bool((np.asarray(x) == np.asarray(y)).all()), back, params))


@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9])
def test_out_major_matmul_takes_the_multiply_sum_for_a_few_rows(rows):
  """2..SKINNY_ROWS float32 rows lowered for the CPU are a fused multiply-sum (no dot in
  the program); other row counts, and any row count within `dot_products_only`, a dot;
  both give x @ w_t.T."""
  rng = np.random.default_rng(rows)
  w_t = jnp.asarray(rng.normal(size=(48, 32)), jnp.float32)
  x = jnp.asarray(rng.normal(size=(1, rows, 32)), jnp.float32)
  want = np.asarray(x) @ np.asarray(w_t).T
  skinny = 2 <= rows <= SKINNY_ROWS
  for only_dots in (False, True):
    fn = jax.jit(lambda x, w: out_major_matmul(x, w))  # a fresh trace per setting
    with dot_products_only() if only_dots else contextlib.nullcontext():
      program = fn.lower(x, w_t).as_text()
      got = fn(x, w_t)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    assert ("dot" not in program) == (skinny and not only_dots), program


def _shared_rows_program() -> str:
  """The compiled CPU program, as text, of a normalised x [2,576] feeding two out-major
  products of W^T [1536,576] (an MLP's gate and up)."""
  def mlp_in(x, scale, gate_t, up_t):
    h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale
    return out_major_matmul(h, gate_t) * out_major_matmul(h, up_t)
  w = jax.ShapeDtypeStruct((1536, 576), jnp.float32)
  return jax.jit(mlp_in).lower(jax.ShapeDtypeStruct((2, 576), jnp.float32),
                               jax.ShapeDtypeStruct((576,), jnp.float32), w,
                               w).compile().as_text()


def test_shared_rows_are_not_broadcast_into_memory(monkeypatch):
  """Where one x feeds two multiply-sums, no [R,O,I] broadcast of x is written out (each
  product streams its W once); without the products' own barriers XLA:CPU writes one at
  two rows (the negative control: the test can fail)."""
  written = re.compile(r"= f32\[2,1536,576\]\{[0-9,]*\} fusion\(")  # a fusion's output
  assert not written.search(_shared_rows_program())
  monkeypatch.setattr(matmul, "_multiply_sum",
                      lambda flat, w_t: jnp.sum(w_t[None] * flat[:, None, :], axis=-1))
  assert written.search(_shared_rows_program())


def test_param_shapes_match_init():
  cfg = tiny_config(layers=2, tie_embeddings=False)
  shapes = param_shapes(cfg)
  assert shapes["head"].shape == (cfg.embed_dim, cfg.vocab_size)
  assert shapes["layers"]["q"].shape == (2, cfg.embed_dim, cfg.num_heads, cfg.head_dim)


def test_cache_only_call_skips_the_head():
  cfg = tiny_config()
  params = tiny_model(cfg, 0)
  logits, cache = forward(params, jnp.zeros((1, 3), jnp.int32),
                          jnp.arange(3)[None], init_cache(cfg, 1, 4), config=cfg,
                          return_logits=False)
  assert logits is None and int(cache["length"][0]) == 3


@pytest.mark.parametrize("change,match", [
    (dict(num_heads=5), "multiple of num_kv_heads"),
    (dict(head_dim=7), "even"),
    (dict(num_layers=0), "num_layers"),
    (dict(dtype="float16"), "dtype"),
    (dict(head_tokens=(1, 2)), "tie_embeddings=False"),
    (dict(head_tokens=(2, 1), tie_embeddings=False), "strictly increasing"),
    (dict(head_tokens=(1, 8), tie_embeddings=False), "strictly increasing"),
])
def test_bad_config(change, match):
  base = dict(vocab_size=8, num_layers=1, embed_dim=8, mlp_dim=8, num_heads=4, num_kv_heads=2,
              head_dim=2)
  base.update(change)
  with pytest.raises(ValueError, match=match):
    ModelConfig(**base)


def test_vocabulary_subset_head():
  """Head columns land on their token ids; every other token gets logit -inf."""
  cfg = tiny_config(tie_embeddings=False, head_tokens=[3, 5, 30])  # a JSON list is accepted
  assert cfg.head_tokens == (3, 5, 30) and cfg.head_size == 3
  same = tiny_config(tie_embeddings=False, head_tokens=(3, 5, 30))
  assert cfg == same and hash(cfg) == hash(same)  # one jit static, however it was given
  params = tiny_model(cfg, 0)
  assert params["head"].shape == (cfg.embed_dim, 3)
  tokens, positions = jnp.array([[1, 2]]), jnp.arange(2)[None]
  full, _ = forward(params, tokens, positions, init_cache(cfg, 1, 2), config=cfg)
  own, _ = forward(params, tokens, positions, init_cache(cfg, 1, 2), config=cfg,
                   full_vocab=False)
  assert full.shape == (1, 2, 32) and own.shape == (1, 2, 3)
  np.testing.assert_array_equal(full[..., [3, 5, 30]], own)
  others = np.setdiff1d(np.arange(32), [3, 5, 30])
  assert np.isneginf(np.asarray(full)[..., others]).all()


def test_cache_larger_than_max_seq_len_raises():
  with pytest.raises(ValueError, match="max_seq_len"):
    init_cache(tiny_config(max_seq_len=8), 1, 9)
