"""The shipped draft (drafts/smollm2_feature_v1, written by `make distill`): it loads in
float16, was trained against this target and tokenizer, and greedy speculative decoding
with it gives greedy autoregressive decoding's tokens. Skipped until the draft exists."""

import json
import pathlib

import pytest

from helpers import assert_greedy_equals_autoregressive
from specdec_jax import loading
from specdec_jax.io import checkpoint as ckpt_lib

SHIPPED = pathlib.Path(__file__).resolve().parents[1] / "drafts" / "smollm2_feature_v1"
pytestmark = [  # loads SmolLM2 and compiles its decode loops
    pytest.mark.skipif(not (SHIPPED / "model.json").exists(),
                       reason=f"no shipped draft at {SHIPPED.name} (make distill)"),
]


def test_shipped_draft_matches_its_target_and_decodes_exactly():
  meta = json.loads((SHIPPED / "model.json").read_text("utf-8"))
  assert meta["params_dtype"] == "float16"
  size = sum(p.stat().st_size for p in (SHIPPED / "params").rglob("*") if p.is_file())
  assert size <= 25 * 2**20
  tokenizer = loading.load_tokenizer("smollm2")
  target_config, target_params = loading.load_target("smollm2", tokenizer)
  params, config, meta = ckpt_lib.load_params(SHIPPED, tokenizer_identity=tokenizer.identity)
  ckpt_lib.check_draft_target(meta, target_config, target_params, where=str(SHIPPED.name))
  prompts = loading.encode_prompts(tokenizer, ["Write a haiku about the sea.",
                                               "def fibonacci(n):"], chat=False)
  assert_greedy_equals_autoregressive((target_config, target_params, config, params), prompts,
                                      gamma=3, max_new_tokens=12)
