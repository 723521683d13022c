"""Arguments of the generate entry points: checked on the host, before any compile.

Letters: B batch, P longest prompt, G = γ (or γ_max), L the feature draft's lag.

`prepare_generate` checks every argument of `speculative.speculative_generate` and
`autoregressive_generate` and raises ValueError naming the offending value (docs/errors.md):
prompts (`prepare_prompts`), vocabularies (`resolve_vocab`), the verifier by name
(`VERIFIERS`), gamma and gamma='auto' with its cost table, a token tree, seeds and row
ids (`row_keys`), and the caches' room for P + max_new_tokens + G (+ L) tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.gamma import adaptive
from specdec_jax.drafts.drafting import DraftConfig, feature_part
from specdec_jax.models.model import ModelConfig
from specdec_jax.models.sampling import SamplingConfig
from specdec_jax.verification.verify import block_verify, verify

Array = jax.Array
# (xs, qs, ps, keys) -> (tokens, n), and the keyword num_proposed where rows may propose
# fewer than G (gamma 'auto', prompt lookups): both verifiers of `verify` take it.
Verifier = Callable[..., tuple[Array, Array]]
# The verifiers a config or script names: token-wise (Leviathan et al.) or block (Sun et al.).
VERIFIERS: dict[str, Verifier] = {"token": verify, "block": block_verify}
# gamma='auto' with a feature draft: plain steps (no row proposes) may skip the draft for up
# to this many positions beyond the G+1 its re-read covers; the re-read and `features` are
# then FEATURE_LAG positions wider (`speculative`'s docstring, "Plain steps skip the draft"),
# and a row's draft runs (its probe) on every FEATURE_LAG-th plain step. A probe step costs
# 1.17 plain steps with the shipped draft on a 2-core AMD EPYC without AVX-512 (a skipped
# one 0.98): 8 halves what 4 cost a row that decodes plainly. Replayed greedy decodes of
# the held-out set (`gamma_replay`, s(0) from those two costs) gave 1.44x / 1.15x with 8
# against 1.42x / 1.14x with 4 under an AVX-512 / AVX2 machine's step costs, and fewer
# prompts below 0.95x on both (1 / 5 against 2 / 7).
FEATURE_LAG = 8
# Block verification is the default: it accepts the same tokens greedily, and never fewer
# in expectation when sampling (exact tests; README: +2-6% tokens per call at T=1).
DEFAULT_VERIFIER = "block"


def resolve_verifier(verifier) -> Verifier:
  """None -> DEFAULT_VERIFIER; 'token' | 'block' (`VERIFIERS`); or a function with its
  signature."""
  if verifier is None:
    return VERIFIERS[DEFAULT_VERIFIER]
  if isinstance(verifier, str):
    if verifier not in VERIFIERS:
      raise ValueError(f"unknown verifier {verifier!r}; expected one of {sorted(VERIFIERS)}")
    return VERIFIERS[verifier]
  if not callable(verifier):
    raise ValueError(f"verifier must be a name in {sorted(VERIFIERS)} or a function, got "
                     f"{type(verifier).__name__}")
  return verifier


def feature_lag(draft_config, adaptive_gamma: bool) -> int:
  """Positions a feature draft may fall behind on plain steps: FEATURE_LAG with
  gamma='auto', else 0 (a fixed γ drafts every step)."""
  return FEATURE_LAG if adaptive_gamma and feature_part(draft_config) is not None else 0


def _check_positive_int(name: str, value) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def prepare_prompts(prompts, pad_id: int = 0,
                    width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """A list of token-id sequences (or an int array [B,P]) -> (tokens[B,P], lengths[B]).

  width: pad to at least this P (one compiled loop serves every prompt up to it; a row's
  tokens do not depend on the padding past its prompt).
  """
  if isinstance(prompts, (np.ndarray, jax.Array)):
    arr = np.asarray(prompts)
    if arr.ndim != 2:
      raise ValueError(f"prompts array must be 2-D [B,P], got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
      raise ValueError(f"prompts must hold integer token ids, got dtype {arr.dtype}")
    rows = list(arr)
  else:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
      raise ValueError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    rows = list(prompts)
  if not rows:
    raise ValueError("prompts is empty: need at least one prompt")
  lengths = []
  for i, row in enumerate(rows):
    row = np.asarray(row)
    if row.ndim != 1:
      raise ValueError(f"prompt {i} must be a 1-D sequence of token ids, got shape {row.shape}")
    if row.size == 0:
      raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
    if not np.issubdtype(row.dtype, np.integer):
      raise ValueError(f"prompt {i} must hold integer token ids, got dtype {row.dtype}")
    lengths.append(row.size)
  if width is not None:
    _check_positive_int("prompt_width", width)
  out = np.full((len(rows), max(lengths + [width or 0])), pad_id, np.int32)
  for i, row in enumerate(rows):
    out[i, : lengths[i]] = row
  return out, np.asarray(lengths, np.int32)


def resolve_vocab(target: ModelConfig, draft: DraftConfig | None,
                  vocab_size: int | None) -> int:
  """The vocabulary p and q live on. Padded rows past it are cut (exact zeros)."""
  has_vocab = draft is not None and draft.kind != "ngram"
  sizes = [target.vocab_size] + ([draft.vocab_size] if has_vocab else [])
  if vocab_size is None:
    if len(set(sizes)) != 1:
      raise ValueError(
          f"draft/target vocabulary mismatch: target has {target.vocab_size} tokens, draft "
          f"{draft.vocab_size}; pass vocab_size=<true vocabulary> if one is only padded")
    return target.vocab_size
  _check_positive_int("vocab_size", vocab_size)
  if vocab_size > min(sizes):
    raise ValueError(f"vocab_size={vocab_size} exceeds a model's vocabulary {sizes}")
  return vocab_size


def _row_keys(seed, row_ids: np.ndarray) -> np.ndarray:
  seeds = np.broadcast_to(np.asarray(seed, np.int64), row_ids.shape)
  if seeds.min() < 0 or seeds.max() >= 2**32:
    raise ValueError(f"seed must lie in [0, 2**32), got {seed!r}")
  make = jax.vmap(lambda s, r: jax.random.fold_in(jax.random.PRNGKey(s), r))
  return np.asarray(make(jnp.asarray(seeds, jnp.uint32), jnp.asarray(row_ids, jnp.uint32)))


@dataclasses.dataclass(frozen=True)
class GenerateArgs:
  """Validated, host-side arguments shared by every generate entry point."""

  tokens: np.ndarray
  prompt_len: np.ndarray
  row_keys: np.ndarray
  statics: dict[str, Any]
  pad_id: int
  costs: np.ndarray | None = None  # float32 [G+1] for gamma='auto' (`decode_loop`)


def prepare_generate(prompts, *, target_config: ModelConfig, draft_config: DraftConfig | None,
                     gamma: int | str, max_new_tokens: int, sampling: SamplingConfig | None,
                     seed, row_ids, eos_id: int | None, pad_id: int, vocab_size: int | None,
                     verifier: Verifier | None, gamma_max: int | None = None,
                     costs: adaptive.CostTable | None = None,
                     prompt_width: int | None = None, tree=None,
                     tree_rule: str = "sampled") -> GenerateArgs:
  """Checks every argument and raises ValueError naming the offending one.

  gamma='auto' (with a draft) takes gamma_max (default `adaptive.DEFAULT_GAMMA_MAX`) and
  a cost table; the statics then hold gamma = γ_max. A tree (`TreeShape`) replaces gamma
  by its N nodes (the state's widths, `tree_decode`); gamma='auto' with a tree is an error.
  """
  cost_array = None
  if tree is not None:
    from specdec_jax.decoding import tree_decode  # it imports `speculative`, which imports this
    if gamma == "auto":
      raise ValueError(f"gamma='auto' cannot be combined with a token tree (tree={tree!r}); "
                       f"a tree drafts its fixed N nodes every step")
    tree_decode.check_tree(tree, tree_rule, draft_config,
                           target_config.vocab_size if vocab_size is None else vocab_size)
    gamma = tree.num_nodes
  if gamma == "auto" and draft_config is not None:
    gamma = adaptive.DEFAULT_GAMMA_MAX if gamma_max is None else gamma_max
    _check_positive_int("gamma_max", gamma)
    if not isinstance(costs, adaptive.CostTable):
      raise ValueError(f"gamma='auto' needs a cost table (adaptive.CostTable; the scripts "
                       f"measure one with specdec_jax.gamma.machine_costs), got {type(costs).__name__}")
    cost_array = costs.loop_costs(gamma)
  elif costs is not None:
    raise ValueError(f"a cost table is used with gamma='auto' only, got gamma={gamma!r}")
  if draft_config is not None:
    _check_positive_int("gamma", gamma)
    check_feature_draft(draft_config, target_config)
  _check_positive_int("max_new_tokens", max_new_tokens)
  sampling = SamplingConfig() if sampling is None else sampling
  if not isinstance(sampling, SamplingConfig):
    raise ValueError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
  vocab = resolve_vocab(target_config, draft_config, vocab_size)
  tokens, prompt_len = prepare_prompts(prompts, pad_id, prompt_width)
  if tokens.min() < 0 or tokens.max() >= vocab:
    raise ValueError(f"prompt token ids must lie in [0, {vocab}), got range "
                     f"[{tokens.min()}, {tokens.max()}]")
  if eos_id is not None and not 0 <= eos_id < vocab:
    raise ValueError(f"eos_id must lie in [0, {vocab}), got {eos_id!r}")
  g = gamma if draft_config is not None else 0
  lag = feature_lag(draft_config, cost_array is not None)
  need = tokens.shape[1] + max_new_tokens + g + lag
  for name, cfg in (("target", target_config), ("draft", draft_config)):
    if cfg is not None and cfg.kind != "ngram" and need > cfg.max_seq_len:
      raise ValueError(
          f"prompt ({tokens.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) + gamma ({g}) "
          + (f"+ the feature draft's lag ({lag}) " if lag else "")
          + f"= {need} exceeds the {name} cache (max_seq_len={cfg.max_seq_len})")
  batch = tokens.shape[0]
  row_ids = np.arange(batch) if row_ids is None else np.asarray(row_ids)
  if row_ids.shape != (batch,) or not np.issubdtype(row_ids.dtype, np.integer):
    raise ValueError(f"row_ids must be {batch} ints, got {row_ids!r}")
  statics = dict(target_config=target_config, draft_config=draft_config, gamma=g,
                 sampling=sampling, vocab_size=vocab, eos_id=eos_id,
                 max_new_tokens=max_new_tokens, verifier=resolve_verifier(verifier))
  if tree is not None:
    statics.update(tree=tree, tree_rule=tree_rule)
  return GenerateArgs(tokens, prompt_len, _row_keys(seed, row_ids), statics, pad_id,
                      cost_array)


def _check_params(params, config: DraftConfig, name: str) -> None:
  if config.kind == "ngram":  # no params: anything passed is ignored
    return
  config = feature_part(config) or config  # a hybrid's params are its feature draft's
  if not isinstance(params, dict):
    raise ValueError(f"{name} params must be a dict pytree, got {type(params).__name__}")
  if config.kind == "feature":
    fuse = params.get("fuse")
    want = (len(config.feature_layers) * config.feature_width, config.embed_dim)
    if fuse is None or fuse.shape != want:
      got = None if fuse is None else fuse.shape
      raise ValueError(f"{name} params do not match its feature-draft config: fuse is {got}, "
                       f"expected {want}")
    return
  embed = params.get("embed")
  if embed is None or embed.shape != (config.vocab_size, config.embed_dim):
    got = None if embed is None else embed.shape
    raise ValueError(f"{name} params do not match its config: embed is {got}, expected "
                     f"{(config.vocab_size, config.embed_dim)}")


def check_feature_draft(draft_config: DraftConfig, target_config: ModelConfig) -> None:
  """Raises ValueError if a feature draft cannot read this target's hidden states."""
  draft_config = feature_part(draft_config)
  if draft_config is None:
    return
  if draft_config.feature_width != target_config.embed_dim:
    raise ValueError(f"feature draft reads target width {draft_config.feature_width}, the "
                     f"target has embed_dim {target_config.embed_dim}")
  if max(draft_config.feature_layers) > target_config.num_layers:
    raise ValueError(f"feature draft fuses target layers {draft_config.feature_layers}; the "
                     f"target has {target_config.num_layers}")
