"""Set-up of the runs from a config: target, corpora, draft config, step settings, keys.

`setup_distillation` builds everything a distillation run needs before its loop
(`DistillSetup`); `load_corpus` / `load_mixture` give the tokenized corpora of
config.corpora. The loops and reports are `specdec_jax.distill.runs`'s.

Letters: N_train training-corpus tokens, N held-out windows, T = config.seq_len.
Training tokens are int32 [N_train]; held-out windows int32 [N, T+1]. With config.mesh
the target is sharded over the mesh (`step.commit`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from specdec_jax import loading

from specdec_jax.io import corpora, token_data

from specdec_jax.models import sharding
from specdec_jax.distill import chat_corpus
from specdec_jax.distill.step import DistillSettings, OptimizerSettings, commit
from specdec_jax.io import checkpoint as ckpt_lib
from specdec_jax.models.model import ModelConfig

Array = jax.Array
PyTree = Any


# --------------------------------------------------------------------------- run set-up

def load_target(config, tokenizer) -> tuple[ModelConfig, dict]:
  """(target_config, target_params) of config.target via `loading.load_target`.

  'smollm2' | '<path>.gguf' | 'hf:<dir>' | 'saved:<dir>' | 'random_tiny' (random params
  of config.target_model, final norm scaled by its logit_scale so that p is peaked).
  """
  return loading.load_target(config.target, tokenizer, dims=config.target_model)


def load_corpus(config, tokenizer) -> tuple[np.ndarray, np.ndarray]:
  """(train tokens, held-out tokens) of config.corpora, split by document, cached."""
  mixture = load_mixture(config, tokenizer)
  return mixture.train_tokens, mixture.heldout_tokens


def load_mixture(config, tokenizer, target: tuple[ModelConfig, PyTree] | None = None
                 ) -> token_data.Mixture:
  """The corpora of config.corpora ('bible', 'shakespeare', 'stdlib', 'chat'), each split
  by document and cached, with their weights (`token_data.parse_mixture`).

  'chat' is the target's own answers (`chat_corpus`): it needs `target` (config, params)
  and config.chat's settings; 'stdlib' is capped at config.stdlib_max_chars characters.
  """
  names, weights = token_data.parse_mixture(config.corpora)
  tag = f"{tokenizer.identity[:12]}-h{config.heldout_fraction:g}-s{config.split_seed}"
  train, held = [], []
  for corpus in names:
    if corpus == "chat":
      tr, he = _chat_split(config, tokenizer, target)
    else:
      docs = corpora.load_documents(
          corpus, max_chars=int(config.get("stdlib_max_chars", corpora.STDLIB_MAX_CHARS)))
      parts = corpora.split_documents(docs, config.heldout_fraction, seed=config.split_seed)
      version = corpora.corpus_version(corpus)
      tr, he = (token_data.tokenize_cached(
                    part, tokenizer, config.cache_dir,
                    f"{corpus}-{split}-{tag}" + (f"-{version}" * bool(version)),
                    tokenizer.eos_id, version=version).tokens
                for split, part in zip(("train", "heldout"), parts))
    train.append(tr)
    held.append(he)
  return token_data.Mixture(names, weights, tuple(train), tuple(held))


CHAT_DEFAULTS = dict(instructions=chat_corpus.INSTRUCTIONS, samples=1, max_new_tokens=256,
                     batch_size=16, temperature=0.7, top_p=1.0, seed=0, limit=0)


def _chat_split(config, tokenizer, target) -> tuple[np.ndarray, np.ndarray]:
  """(train, held-out) tokens of the 'chat' corpus, split by instruction."""
  if target is None:
    raise ValueError("corpus 'chat' is the target's own answers: it needs a target "
                     "(distillation), not pretraining from scratch")
  settings = {**CHAT_DEFAULTS, **dict(config.get("chat", None) or {})}
  if unknown := set(settings) - set(CHAT_DEFAULTS):
    raise ValueError(f"unknown config.chat settings {sorted(unknown)}; expected "
                     f"{sorted(CHAT_DEFAULTS)}")
  target_config, target_params = target
  instructions = chat_corpus.load_instructions(settings.pop("instructions"))
  limit = int(settings.pop("limit"))  # > 0: the first `limit` instructions (tiny runs)
  docs = chat_corpus.generate_chat_corpus(
      config.cache_dir, instructions[:limit] if limit > 0 else instructions,
      tokenizer=tokenizer, target_params=target_params, target_config=target_config,
      target_identity=ckpt_lib.target_identity(target_config, target_params), **settings)
  names = [corpora.Document(name, "") for name in docs]
  tr, he = corpora.split_documents(names, config.heldout_fraction, seed=config.split_seed)
  return tuple(np.concatenate([docs[d.name] for d in part]) for part in (tr, he))


def draft_config_from(config, target_config: ModelConfig, train_tokens=None,
                      always=()) -> ModelConfig:
  """The draft's ModelConfig: config.draft dims on the target's vocabulary and RoPE.

  config.draft.head_vocab = C > 0 gives a vocabulary-subset head on C ids: those in
  `always` (e.g. EOS) and the most frequent train_tokens (int32 [N_train], or a
  `token_data.Mixture`: frequencies weighted by corpus); 0 or absent: the full vocabulary.
  """
  head_vocab = int(config.draft.get("head_vocab", 0) or 0)
  head_tokens = ()
  if head_vocab:
    if train_tokens is None:
      raise ValueError("draft.head_vocab > 0 needs the training tokens to rank")
    if isinstance(train_tokens, token_data.Mixture):  # ranked over the whole weighted mix
      head_tokens = train_tokens.frequent_tokens(head_vocab, target_config.vocab_size,
                                                 always=always)
    else:
      head_tokens = token_data.frequent_tokens(train_tokens, head_vocab,
                                               target_config.vocab_size, always=always)
  feature = {}
  if config.draft.get("feature_layers"):  # a feature draft reads this target's width
    feature = dict(feature_width=target_config.embed_dim)
  return loading.model_config(config.draft, target_config.vocab_size,
                              rope_theta=target_config.rope_theta,
                              norm_eps=target_config.norm_eps, head_tokens=head_tokens,
                              **feature)


def _special_ids(tokenizer) -> tuple[int, ...]:
  """EOS / BOS ids of a tokenizer (those it has)."""
  ids = (getattr(tokenizer, name, None) for name in ("eos_id", "bos_id"))
  return tuple(int(i) for i in ids if i is not None and i >= 0)


def _optim(config, steps: int | None = None, lr: float | None = None,
           warmup: int | None = None) -> OptimizerSettings:
  return OptimizerSettings(lr=config.lr if lr is None else lr,
                           warmup=config.warmup if warmup is None else warmup,
                           steps=config.steps if steps is None else steps, clip=config.clip,
                           weight_decay=config.weight_decay)


def _named_keys(seed: int, *names: str) -> dict[str, Array]:
  root = jax.random.PRNGKey(seed)
  return dict(zip(names, jax.random.split(root, len(names))))


@dataclasses.dataclass(frozen=True)
class DistillSetup:
  """Everything a distillation run builds from its config before the loop."""

  tokenizer: Any
  target_config: ModelConfig
  target_params: PyTree
  draft_config: ModelConfig
  settings: DistillSettings
  optim: OptimizerSettings
  train_tokens: np.ndarray  # int32 [N_train]
  windows: np.ndarray  # int32 [E*eval_windows, seq_len+1], held-out documents (all sets)
  keys: dict[str, Array]  # 'draft_init', 'train'
  mesh: Any = None  # a ('data', 'model') jax.sharding.Mesh from config.mesh, or None
  mixture: token_data.Mixture | None = None  # the corpora, per corpus, with their weights
  eval_sets: dict[str, np.ndarray] | None = None  # {corpus or 'all': int32 [eval_windows, T+1]}


def setup_distillation(config) -> DistillSetup:
  """Tokenizer, target, draft config, step settings, corpus and keys of a config.

  config.mesh ('data,model', '' = one device) shards the target, the draft's train state
  and the batches (`sharding`); every process of a `jax.distributed` run calls this.
  """
  mesh = sharding.make_mesh(config.mesh) if config.get("mesh", "") else None
  tokenizer = loading.load_tokenizer(config.tokenizer)
  target_config, target_params = load_target(config, tokenizer)
  mixture = load_mixture(config, tokenizer, (target_config, target_params))
  settings = DistillSettings(
      loss=config.loss, temperature=config.temperature,
      greedy_temperature=config.greedy_temperature,
      prompt_len=config.prompt_len if config.on_policy_fraction > 0 else 0,
      vocab_size=getattr(tokenizer, "vocab_size", None), unroll=int(config.get("unroll", 1)))
  draft_config = draft_config_from(config, target_config, mixture,
                                   always=_special_ids(tokenizer))
  if draft_config.reads_target_features and config.on_policy_fraction > 0:
    raise ValueError(f"a feature draft trains teacher-forced on cached target outputs; set "
                     f"on_policy_fraction=0, got {config.on_policy_fraction}")
  if draft_config.reads_target_features and jax.process_count() > 1:
    raise ValueError("a feature draft's target-output cache is written by one process: "
                     f"run with one process (got {jax.process_count()}); a mesh is fine")
  eval_sets = mixture.heldout_windows(config.eval_windows, config.seq_len,
                                      seed=config.split_seed)
  return DistillSetup(
      tokenizer=tokenizer, target_config=target_config,
      target_params=commit(target_params, mesh),
      draft_config=draft_config, settings=settings,
      optim=_optim(config), train_tokens=mixture.train_tokens,
      windows=np.concatenate(list(eval_sets.values())),
      keys=_named_keys(config.seed, "draft_init", "train"), mesh=mesh, mixture=mixture,
      eval_sets=eval_sets)
