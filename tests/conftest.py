"""Shared tiny models for the tests (CPU, fixed seeds)."""

import jax
import pytest

from specdec_jax.model import ModelConfig, init_params


def sharpen(params, factor):
  """Scales every non-norm weight so random logits are far from uniform."""
  def scale(path, x):
    return x if "norm" in jax.tree_util.keystr(path) else x * factor
  return jax.tree_util.tree_map_with_path(scale, params)


def tiny_config(vocab=32, layers=2, width=32, max_seq_len=64, **kw):
  return ModelConfig(vocab_size=vocab, num_layers=layers, embed_dim=width, mlp_dim=2 * width,
                     num_heads=4, num_kv_heads=2, head_dim=width // 4, max_seq_len=max_seq_len,
                     **kw)


def tiny_model(config, seed, factor=15.0):
  return sharpen(init_params(config, jax.random.PRNGKey(seed)), factor)


@pytest.fixture(scope="session")
def tiny_pair():
  """(target_config, target_params, draft_config, draft_params), vocabulary 32."""
  target = tiny_config(layers=2)
  draft = tiny_config(layers=1, width=16)
  return target, tiny_model(target, 0), draft, tiny_model(draft, 1)
