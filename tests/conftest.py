"""Shared fixtures: tiny random models (CPU, fixed seeds)."""

import pytest

from helpers import tiny_config, tiny_model


@pytest.fixture(scope="session")
def tiny_pair():
  """(target_config, target_params, draft_config, draft_params), vocabulary 32."""
  target = tiny_config(layers=2)
  draft = tiny_config(layers=1, width=16)
  return target, tiny_model(target, 0), draft, tiny_model(draft, 1)
