"""Draft kinds by config name: the one place a name becomes a `Draft`.

A config or command line names a draft as '<kind>' or '<kind>:<argument>' ('ngram:3',
'hybrid:3'); model drafts loaded from disk ('saved:<dir>', 'truncate:<k>', 'random') are
built by `loading`, which hands their ModelConfig to `from_model_config`. A new kind
registers its constructor once:

    registry.register("mine", lambda argument, inner: MyDraft(...))

`inner` is the draft a wrapping kind wraps (a hybrid's), or None. A wrapping kind
(`base.WrappingDraft`, registered with wraps=True) is built around the model draft that
`config.feature_draft` names; nothing outside `drafts/` tests a name's kind: scripts ask
`needs_inner` and `model_draft_name`.
"""

from __future__ import annotations

from typing import Callable

from specdec_jax.drafts.base import Draft
from specdec_jax.drafts.feature import FeatureDraft
from specdec_jax.drafts.hybrid import HybridDraft
from specdec_jax.drafts.independent import IndependentDraft
from specdec_jax.drafts.ngram import NgramDraft
from specdec_jax.models.model import ModelConfig

Factory = Callable[[str, "Draft | None"], Draft]
_KINDS: dict[str, tuple[Factory, bool]] = {}
_CHECKS: dict[str, Callable[[str], object]] = {}


def register(kind: str, factory: Factory, *, wraps: bool = False,
             check: Callable[[str], object] | None = None) -> None:
  """Makes '<kind>[:<argument>]' build factory(argument, inner); wraps: the kind needs an
  inner draft (`needs_inner`). check(argument) raises ValueError for a bad argument
  without building anything (`check_name`; default: factory(argument, None) for a kind
  that wraps nothing)."""
  if not kind.isidentifier():
    raise ValueError(f"a draft kind's name must be an identifier, got {kind!r}")
  _KINDS[kind] = (factory, wraps)
  if check is not None:
    _CHECKS[kind] = check


def kinds() -> list[str]:
  """The registered kind names."""
  return sorted(_KINDS)


def kind_of(name: str) -> str:
  return name.partition(":")[0]


def is_registered(name: str) -> bool:
  return kind_of(name) in _KINDS


def needs_inner(name: str) -> bool:
  """True if `name` is of a registered kind that wraps another draft (a hybrid); False
  for every other name (a model draft's, 'none', an unknown one)."""
  kind = kind_of(name)
  return kind in _KINDS and _KINDS[kind][1]


def model_draft_name(draft: str, feature_draft: str) -> str:
  """The name of the model draft a config loads: a wrapping kind's inner model draft
  (`config.feature_draft`) where `draft` wraps one, else `draft` itself."""
  return feature_draft if needs_inner(draft) else draft


def make(name: str, inner: Draft | None = None) -> Draft:
  """'<kind>[:<argument>]' -> the Draft; raises ValueError naming the name if unknown."""
  kind, _, argument = name.partition(":")
  if kind not in _KINDS:
    raise ValueError(f"unknown draft kind {kind!r} in {name!r}; registered: {kinds()}")
  factory, wraps = _KINDS[kind]
  if wraps and inner is None:
    raise ValueError(f"draft {name!r} wraps another draft; none was given")
  return factory(argument, inner) if wraps else factory(argument, None)


def check_name(name: str) -> None:
  """Raises ValueError for an unknown kind or a bad argument in '<kind>[:<argument>]'
  (before any model is loaded)."""
  kind, _, argument = name.partition(":")
  if kind not in _KINDS:
    raise ValueError(f"unknown draft kind {kind!r} in {name!r}; registered: {kinds()}")
  factory, wraps = _KINDS[kind]
  if kind in _CHECKS:
    _CHECKS[kind](argument)
  elif not wraps:
    factory(argument, None)


def from_model_config(config: ModelConfig) -> Draft:
  """A model draft's ModelConfig -> its Draft: a FeatureDraft when it fuses target
  features (`feature_layers`), else an IndependentDraft."""
  return FeatureDraft(config) if config.feature_layers else IndependentDraft(config)


def as_draft(draft) -> Draft | None:
  """A Draft as it is; a ModelConfig as its model draft; None stays None."""
  if draft is None or isinstance(draft, Draft):
    return draft
  if isinstance(draft, ModelConfig):
    return from_model_config(draft)
  raise ValueError(f"a draft must be a Draft (specdec_jax.drafts) or a ModelConfig, got "
                   f"{type(draft).__name__}")


register("ngram", lambda argument, inner: NgramDraft.from_name(f"ngram:{argument}"))
register("hybrid", lambda argument, inner: HybridDraft.from_name(f"hybrid:{argument}", inner),
         wraps=True, check=lambda argument: HybridDraft.parse_n(f"hybrid:{argument}"))
