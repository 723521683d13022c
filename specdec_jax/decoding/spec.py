"""The static choices of a run (`DecodeSpec`) and the host-side checks of every argument.

Letters: B batch, P longest prompt, G the drafted positions a step holds (γ, γ_max or a
tree's N nodes), L a draft's skip lag.

A `DecodeSpec` is one frozen, hashable value: sampling, verifier, max_new_tokens, eos,
vocabulary and the proposer, which is one of
  FixedGamma(γ)                    every row proposes γ drafts every step;
  AutoGamma(costs, gamma_max, rule) each row and step picks γ_b in 0..γ_max by a γ rule
                                   (`gamma.adaptive.GammaRule`) from the cost table;
  TreeProposal(shape, rule)        a token tree every step (`decoding.tree_step`);
  None                             autoregressive decoding.
Each name means one thing at every layer: `gamma` is always an int, the cost table is
always a `CostTable` (the loop's traced [2,G+1] array is `costs_array`).

`prepare` checks everything a generate call is given and raises ValueError naming the
offending value (docs/errors.md), before anything is compiled: prompts, vocabularies, the
verifier, the proposer against the draft, seeds and row ids, and the caches' room for
P + max_new_tokens + G (+ L) tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.drafts.base import Draft
from specdec_jax.drafts.registry import as_draft
from specdec_jax.gamma.adaptive import (DEFAULT_GAMMA_MAX, DEFAULT_RULE, CostTable, GammaRule,
                                        check_rule)
from specdec_jax.models.model import ModelConfig, check_params
from specdec_jax.models.sampling import SamplingConfig
from specdec_jax.verification.tree_shapes import TreeShape
from specdec_jax.verification.verify import block_verify, verify

Array = jax.Array
# (xs, qs, ps, keys, num_proposed=None) -> (tokens, n): `verification.verify`'s contract.
Verifier = Callable[..., tuple[Array, Array]]
# The verifiers a config or script names: token-wise (Leviathan et al.) or block (Sun et al.).
VERIFIERS: dict[str, Verifier] = {"token": verify, "block": block_verify}
# Block verification is the default: it accepts the same tokens greedily, and never fewer
# in expectation when sampling (Sun et al. 2025; docs/exactness.md).
DEFAULT_VERIFIER = "block"


def _check_positive_int(name: str, value) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class FixedGamma:
  """Every row proposes `gamma` drafts every step. Like every proposer it answers the
  decode loop's questions (`Proposer`): G, its call widths, its per-row state (none), each
  row's γ_b and its observation (nothing)."""

  gamma: int
  takes_costs: ClassVar[bool] = False

  def __post_init__(self):
    _check_positive_int("gamma", self.gamma)

  @property
  def positions(self) -> int:
    return self.gamma

  def call_widths(self, may_propose_nothing: bool) -> tuple[int, ...]:
    """G+1, and 1 as well when a draft may propose nothing (a lookup without a match)."""
    return (1, self.gamma + 1) if may_propose_nothing else (self.gamma + 1,)

  def init(self, batch: int) -> None:
    return None

  def choose(self, rule_state, costs, source: Array) -> Array:
    return jnp.full(source.shape, self.gamma, jnp.int32)

  def observe(self, rule_state, **step):
    return rule_state


@dataclasses.dataclass(frozen=True)
class AutoGamma:
  """γ per row and step in 0..gamma_max by a `GammaRule` (`gamma.adaptive`; `BeliefRule`
  by default) from the cost table; costs None only in the spec a compiled loop holds
  (`DecodeSpec.static`), where the table is a traced input. rule: a static of the loop."""

  costs: CostTable | None
  gamma_max: int = DEFAULT_GAMMA_MAX
  rule: GammaRule = DEFAULT_RULE
  takes_costs: ClassVar[bool] = True

  def __post_init__(self):
    _check_positive_int("gamma_max", self.gamma_max)
    check_rule(self.rule, self.gamma_max)
    if self.costs is not None and not isinstance(self.costs, CostTable):
      raise ValueError(f"gamma='auto' needs a cost table (gamma.adaptive.CostTable; the "
                       f"scripts measure one with specdec_jax.gamma.machine_costs), got "
                       f"{type(self.costs).__name__}")

  @property
  def positions(self) -> int:
    return self.gamma_max

  def call_widths(self, may_propose_nothing: bool) -> tuple[int, ...]:
    """The rule's widths (`GammaRule.call_widths`)."""
    return tuple(self.rule.call_widths(self.gamma_max))

  def init(self, batch: int):
    return self.rule.init(batch)

  def choose(self, rule_state, costs: Array, source: Array) -> Array:
    """The rule's γ_b, held to 0..G (a wider choice would name no compiled width)."""
    chosen = self.rule.choose(rule_state, costs, source)
    return jnp.clip(jnp.asarray(chosen, jnp.int32), 0, self.gamma_max)

  def observe(self, rule_state, **step):
    return self.rule.observe(rule_state, **step)


@dataclasses.dataclass(frozen=True)
class TreeProposal:
  """A token tree of `shape` every step, its children chosen by `rule` ('sampled', SpecInfer's
  i.i.d. children, or 'topk', the draft's top-k): G = N nodes, one call width N+1, no
  per-row state (`decoding.tree_step`)."""

  shape: TreeShape
  rule: str = "sampled"
  takes_costs: ClassVar[bool] = False

  def __post_init__(self):
    if not isinstance(self.shape, TreeShape):
      raise ValueError(f"tree must be a TreeShape (tree_shapes), got "
                       f"{type(self.shape).__name__}")

  @property
  def positions(self) -> int:
    return self.shape.num_nodes

  def call_widths(self, may_propose_nothing: bool) -> tuple[int, ...]:
    return (self.shape.num_nodes + 1,)

  def init(self, batch: int) -> None:
    return None

  def choose(self, rule_state, costs, source: Array) -> Array:
    return jnp.full(source.shape, self.shape.num_nodes, jnp.int32)

  def observe(self, rule_state, **step):
    return rule_state


# Each proposer answers: positions (G), call_widths(may_propose_nothing), init(batch) (its
# per-row state in `DecodeState.rule_state`), choose(rule_state, costs, source) (γ_b, int32
# [B]), observe(rule_state, **step) and takes_costs (the loop takes a cost table).
Proposer = FixedGamma | AutoGamma | TreeProposal | None


def make_proposer(gamma: int | str | None, *, gamma_max: int | None = None,
                  costs: CostTable | None = None, tree: TreeShape | None = None,
                  tree_rule: str = "sampled", rule: GammaRule | None = None) -> Proposer:
  """A config's fields -> the proposer: gamma an int or 'auto' (with costs, gamma_max and
  its γ rule, `DEFAULT_RULE` when None),
  or a tree (gamma then unused); None for autoregressive decoding. Raises ValueError on a
  combination that means nothing (a tree with gamma 'auto', costs without 'auto')."""
  if tree is not None:
    if gamma == "auto":
      raise ValueError(f"gamma='auto' cannot be combined with a token tree (tree={tree!r}); "
                       f"a tree drafts its fixed N nodes every step")
    return TreeProposal(tree, tree_rule)
  if gamma == "auto":
    return AutoGamma(costs, DEFAULT_GAMMA_MAX if gamma_max is None else gamma_max,
                     DEFAULT_RULE if rule is None else rule)
  if costs is not None or rule is not None:
    raise ValueError(f"a cost table and a gamma rule are used with gamma='auto' only, got "
                     f"gamma={gamma!r}")
  return None if gamma is None else FixedGamma(gamma)


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
  """The static choices of a run (module docstring). Hashable: a jit static."""

  max_new_tokens: int
  proposer: Proposer = None
  sampling: SamplingConfig = SamplingConfig()
  verifier: str | Verifier = DEFAULT_VERIFIER
  eos_id: int | None = None
  vocab_size: int | None = None  # None: the models' own (prepare resolves it)

  @property
  def gamma(self) -> int:
    """G: the drafted positions one step holds (γ, γ_max, a tree's N; 0 autoregressive)."""
    return 0 if self.proposer is None else self.proposer.positions

  @property
  def adaptive(self) -> bool:
    """The proposer takes a cost table (gamma 'auto')."""
    return self.proposer is not None and self.proposer.takes_costs

  @property
  def tree(self) -> TreeProposal | None:
    return self.proposer if isinstance(self.proposer, TreeProposal) else None

  @property
  def verify_fn(self) -> Verifier:
    return resolve_verifier(self.verifier)

  def lag(self, draft: Draft | None) -> int:
    """A draft's skip lag under gamma 'auto' (`Draft.skip_lag`: it may be skipped and
    catches up that many positions a call), else 0."""
    return draft.skip_lag if self.adaptive and draft is not None else 0

  def static(self) -> "DecodeSpec":
    """The spec a compiled loop holds: gamma 'auto' without its table (a traced input)."""
    if self.adaptive:
      return dataclasses.replace(self, proposer=dataclasses.replace(self.proposer, costs=None))
    return self

  def costs_array(self) -> np.ndarray | None:
    """float32 [2,G+1] (`CostTable.loop_costs`) for gamma 'auto', else None."""
    if not self.adaptive:
      return None
    return self.proposer.costs.loop_costs(self.proposer.gamma_max)


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


def resolve_vocab(target: ModelConfig, draft: Draft | None, vocab_size: int | None) -> int:
  """The vocabulary p and q live on. Padded rows past it are cut (exact zeros)."""
  own = None if draft is None else draft.vocab_size
  sizes = [target.vocab_size] + ([own] if own is not None else [])
  if vocab_size is None:
    if len(set(sizes)) != 1:
      raise ValueError(
          f"draft/target vocabulary mismatch: target has {target.vocab_size} tokens, draft "
          f"{own}; pass vocab_size=<true vocabulary> if one is only padded")
    return target.vocab_size
  _check_positive_int("vocab_size", vocab_size)
  if vocab_size > min(sizes):
    raise ValueError(f"vocab_size={vocab_size} exceeds a model's vocabulary {sizes}")
  return vocab_size


def row_keys(seed, row_ids: np.ndarray) -> np.ndarray:
  """uint32 [B,2]: fold_in(PRNGKey(seed[b]), row_ids[b]), the root of row b's keys."""
  seeds = np.broadcast_to(np.asarray(seed, np.int64), row_ids.shape)
  if seeds.min() < 0 or seeds.max() >= 2**32:
    raise ValueError(f"seed must lie in [0, 2**32), got {seed!r}")
  make = jax.vmap(lambda s, r: jax.random.fold_in(jax.random.PRNGKey(s), r))
  return np.asarray(make(jnp.asarray(seeds, jnp.uint32), jnp.asarray(row_ids, jnp.uint32)))


class Prepared(NamedTuple):
  """Validated, host-side inputs of one generate call."""

  tokens: np.ndarray  # int32 [B,P]
  prompt_len: np.ndarray  # int32 [B]
  row_keys: np.ndarray  # uint32 [B,2]
  draft: Draft | None  # the draft as a Draft (a ModelConfig becomes its model draft)
  spec: DecodeSpec  # the static spec: vocab_size resolved, no cost table
  costs: np.ndarray | None  # float32 [2,G+1] for gamma 'auto'
  pad_id: int


def prepare(target, draft, prompts, spec: DecodeSpec, *, seed=0, row_ids=None, pad_id: int = 0,
            prompt_width: int | None = None) -> Prepared:
  """Checks every argument of a generate call and raises ValueError naming the offending
  one. target: a `Model`; draft: a `Model` whose config is a Draft (or a model draft's
  ModelConfig), or None (autoregressive); both models' params are checked against
  their configs."""
  if not isinstance(spec, DecodeSpec):
    raise ValueError(f"spec must be a DecodeSpec, got {type(spec).__name__}")
  target_config = target.config
  drafter = None if draft is None else as_draft(draft.config)
  check_params(target.params, target_config, "target")
  if drafter is not None:
    drafter.check(draft.params, target_config)
  proposer = spec.proposer
  if (drafter is None) != (proposer is None):
    raise ValueError("a draft needs a proposer (FixedGamma, AutoGamma or TreeProposal) and "
                     f"a proposer needs a draft; got draft {type(drafter).__name__} and "
                     f"proposer {proposer!r}")
  if spec.adaptive and proposer.costs is None:
    raise ValueError("gamma='auto' needs a cost table (gamma.adaptive.CostTable; the scripts "
                     "measure one with specdec_jax.gamma.machine_costs), got None")
  _check_positive_int("max_new_tokens", spec.max_new_tokens)
  if not isinstance(spec.sampling, SamplingConfig):
    raise ValueError(f"sampling must be a SamplingConfig, got {type(spec.sampling).__name__}")
  resolve_verifier(spec.verifier)
  vocab = resolve_vocab(target_config, drafter, spec.vocab_size)
  if spec.tree is not None:
    drafter.check_tree(spec.tree.shape, spec.tree.rule, vocab)
  costs = spec.costs_array()
  tokens, prompt_len = prepare_prompts(prompts, pad_id, prompt_width)
  if tokens.min() < 0 or tokens.max() >= vocab:
    raise ValueError(f"prompt token ids must lie in [0, {vocab}), got range "
                     f"[{tokens.min()}, {tokens.max()}]")
  if spec.eos_id is not None and not 0 <= spec.eos_id < vocab:
    raise ValueError(f"eos_id must lie in [0, {vocab}), got {spec.eos_id!r}")
  g, lag = spec.gamma, spec.lag(drafter)
  need = tokens.shape[1] + spec.max_new_tokens + g + lag
  for name, limit in (("target", target_config.max_seq_len),
                      ("draft", None if drafter is None else drafter.max_seq_len)):
    if limit is not None and need > limit:
      raise ValueError(
          f"prompt ({tokens.shape[1]} tokens) + max_new_tokens ({spec.max_new_tokens}) + gamma "
          f"({g}) " + (f"+ the draft's skip lag ({lag}) " if lag else "")
          + f"= {need} exceeds the {name} cache (max_seq_len={limit})")
  batch = tokens.shape[0]
  row_ids = np.arange(batch) if row_ids is None else np.asarray(row_ids)
  if row_ids.shape != (batch,) or not np.issubdtype(row_ids.dtype, np.integer):
    raise ValueError(f"row_ids must be {batch} ints, got {row_ids!r}")
  static = dataclasses.replace(spec.static(), vocab_size=vocab)
  return Prepared(tokens, prompt_len, row_keys(seed, row_ids), drafter, static, costs, pad_id)

