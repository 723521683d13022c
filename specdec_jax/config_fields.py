"""The config contract: every field a script reads is declared, checked before any heavy
work, and honoured; every other field is refused.

A config file belongs to one family: 'run' (configs/smollm2_135m.py, tiny.py: one target
and draft decoding prompts), 'distill' (configs/distill_*.py: training a draft) or 'sweep'
(configs/sweep_*.py: the γ x temperature x draft grid). `FAMILIES` holds each family's
fields, each a `Field`: its kind and range, the check of its value, the value that means
"off" (a script that does not read the field accepts that value from a shared config
file), and the condition under which a run uses it at all (`gamma_max` only with gamma
'auto', say).

Each script declares the fields it reads (`CONFIG_FAMILY`, `CONFIG_READS`, literals that
scripts/_bootstrap.py finds in every script). `check_config` then refuses, with one line:
  - a field of no script of the family (a typo, a field of another family);
  - a field given on the command line that this script does not read, naming the
    scripts that do;
  - a field of the config file that this script does not read, where the field has an
    "off" value and is set to another (a field with no "off" value, such as a model name
    or `repeats`, is ignored by the scripts that do not read it);
  - a bad value, and a field given on the command line that the run would not use
    (`--config.gamma_max` with a fixed gamma).
It imports models and loads files only to check that they exist and parse.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

from specdec_jax import config_checks as checks
from specdec_jax.config_checks import is_int
from specdec_jax.distill.hyperparameters import RULES as DISTILL_RULES, check_range

_NO_OFF = object()  # a field with no "off" value: a script that does not read it ignores it

# gamma 'auto' compiles one inner while_loop per call width 1..gamma_max+1 into the decode
# loop, each holding a whole speculative step: compile time and program size grow with
# every width (docs/design.md#the-config-contract).
GAMMA_MAX_LIMIT = 16
BATCH_LIMIT = 4096
SEQ_LEN_LIMIT = 1 << 17
SEED_LIMIT = 2 ** 31 - 1


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field. kind: 'int' | 'float' | 'bool' | 'str' | 'texts' (non-empty
  strings) | 'dims' (a dict of model sizes) | 'seq' (a tuple) | 'any'. low/high: an
  inclusive range of numbers. check(value, config) raises ValueError naming a bad value.
  off: the value meaning "not used". used(config): None when a run uses the field, else
  the reason it does not (a field given on the command line must be used)."""

  kind: str
  low: float | None = None
  high: float | None = None
  check: Callable[[Any, Mapping], None] | None = None
  off: Any = _NO_OFF
  used: Callable[[Mapping], str | None] | None = None
  path: str | None = None  # 'read' (a file read), 'write' (a folder written), 'model'


def check_value(name: str, field: Field, value, config: Mapping) -> None:
  """Raises ValueError (one line, naming config.<name>) for a value of the wrong kind, out
  of range, or refused by the field's own check."""
  kind = field.kind
  if kind == "int":
    if not is_int(value):
      raise ValueError(f"config.{name} must be an int, got {value!r}")
  elif kind == "float":
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
        not math.isfinite(value):
      raise ValueError(f"config.{name} must be a finite number, got {value!r}")
  elif kind == "bool":
    if not isinstance(value, bool):
      raise ValueError(f"config.{name} must be True or False, got {value!r}")
  elif kind == "str":
    if not isinstance(value, str):
      raise ValueError(f"config.{name} must be a string, got {value!r}")
  elif kind == "texts":
    if isinstance(value, str) or not isinstance(value, (tuple, list)) or not value or \
        not all(isinstance(t, str) and t for t in value):
      raise ValueError(f"config.{name} must be a non-empty tuple of non-empty strings, got "
                       f"{value!r}")
  elif kind == "dims":
    _check_dims(name, value)
  elif kind == "seq":
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
      raise ValueError(f"config.{name} must be a tuple, got {value!r}")
  if kind in ("int", "float") and (
      (field.low is not None and value < field.low) or
      (field.high is not None and value > field.high)):
    low = "-inf" if field.low is None else field.low
    high = "inf" if field.high is None else field.high
    raise ValueError(f"config.{name} must lie in [{low}, {high}], got {value!r}")
  if field.check is not None:
    field.check(value, config)


_DIM_KEYS = ("num_layers", "embed_dim", "mlp_dim", "num_heads", "num_kv_heads", "head_dim",
             "max_seq_len")


def _check_dims(name: str, value) -> None:
  if hasattr(value, "to_dict"):  # a ConfigDict
    value = value.to_dict()
  if not isinstance(value, Mapping):
    raise ValueError(f"config.{name} must be a dict of model sizes, got {value!r}")
  for key in _DIM_KEYS:
    if key in value and (not is_int(value[key]) or value[key] < 1):
      raise ValueError(f"config.{name}.{key} must be an int >= 1, got {value[key]!r}")
  if "logit_scale" in value and not (isinstance(value["logit_scale"], (int, float))
                                     and math.isfinite(value["logit_scale"])):
    raise ValueError(f"config.{name}.logit_scale must be a finite number, got "
                     f"{value['logit_scale']!r}")


def _numbers(low=None, high=None, kind="float"):
  def check(value, config):
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)) or not value:
      raise ValueError(f"needs a non-empty tuple of numbers, got {value!r}")
    for v in value:
      check_value("item", Field(kind, low, high), v, config)
  return check


# ---- when a field is used --------------------------------------------------------------

def _gamma_is_auto(config) -> bool:
  return str(config.get("gamma", "")).strip() == "auto"


def _only_with_auto(config):
  return None if _gamma_is_auto(config) else "gamma is fixed (it applies to gamma 'auto')"


def _only_with_tree(config):
  return None if str(config.get("tree", "")).strip() else "no tree is set (config.tree)"


def _only_with_wrapping_draft(config):
  from specdec_jax.drafts import registry
  draft = str(config.get("draft", ""))
  return None if registry.needs_inner(draft) else \
      f"draft {draft!r} wraps no model draft (config.feature_draft is the model draft " \
      f"inside a wrapping kind such as 'hybrid:<n>')"


def _only_with_head_size(config):
  return None if config.get("draft_head_size", 0) else \
      "config.draft_head_size is 0 (the draft keeps its full head)"


def _only_with_random_draft(config):
  return None if config.get("draft", "") == "random" else \
      "the draft is not 'random' (the dims are those of a random draft)"


def _only_with_random_target(config):
  return None if config.get("target", "") == "random_tiny" else \
      "the target is not 'random_tiny' (the dims are those of a random target)"


def _f(kind, low=None, high=None, check=None, off=_NO_OFF, used=None, path=None,
       name=None) -> Field:
  return Field(kind, low, high, None if check is None else checks.named(name, check), off, used,
               path)


def _family(spec: dict) -> dict[str, Field]:
  return {name: _f(*args, name=name, **kw) for name, (args, kw) in spec.items()}


RUN = _family({
    "tokenizer": (("str",), dict(path="model", check=checks.model_name_check("tokenizer"))),
    "target": (("str",), dict(path="model", check=checks.model_name_check("target"))),
    "target_model": (("dims",), dict(used=_only_with_random_target)),
    "draft": (("str",), dict(path="model", check=checks.model_name_check("draft"))),
    "feature_draft": (("str",), dict(path="model",
                                     check=lambda v, c: v and checks.model_name_check("draft")(v, c),
                                     off="", used=_only_with_wrapping_draft)),
    "draft_model": (("dims",), dict(used=_only_with_random_draft)),
    # like `draft`, no "off" value: a script that loads no draft ignores a config file's
    # subset head (every script that loads one reads both)
    "draft_head_tokens": (("str",), dict(path="read", check=checks.check_head_tokens,
                                         used=_only_with_head_size)),
    "draft_head_size": (("int", 0, None), dict(check=checks.check_head_size)),
    "dtype": (("str",), dict(check=checks.choices("float32", "bfloat16", "float16"))),
    "max_seq_len": (("int", 8, SEQ_LEN_LIMIT), {}),
    "unstacked": (("bool",), {}),
    "chat": (("bool",), {}),
    "prompts": (("texts",), {}),
    "prompt_set": (("str",), dict(path="read", check=checks.check_prompt_set, off="")),
    "gamma": (("str",), dict(check=checks.check_gamma)),
    "gamma_max": (("int", 0, GAMMA_MAX_LIMIT), dict(used=_only_with_auto)),
    "costs": (("str",), dict(path="read", check=checks.check_costs, off="", used=_only_with_auto)),
    # the draft source's prior acceptance of gamma 'auto' (`config_proposer.config_rule`; 0 =
    # the rule's default); like gamma_max, no "off" value: a script with no gamma 'auto'
    # ignores a config file's prior
    "gamma_prior": (("float", 0, 1), dict(used=_only_with_auto)),
    "verifier": (("str",), dict(check=checks.choices("block", "token"))),
    "tree": (("str",), dict(check=checks.check_tree, off="")),
    "tree_rule": (("str",), dict(check=checks.choices("sampled", "topk"), used=_only_with_tree)),
    "temperature": (("float", 0, 1e4), {}),
    "top_k": (("int", 0, None), {}),
    "top_p": (("float",), dict(check=checks.check_top_p)),
    "max_new_tokens": (("int", 1, SEQ_LEN_LIMIT), dict(check=checks.check_max_new_tokens)),
    "batch_size": (("int", 1, BATCH_LIMIT), {}),
    "seed": (("int", 0, SEED_LIMIT), {}),
    "mesh": (("str",), dict(check=checks.check_mesh, off="")),
    "distributed": (("str",), dict(check=checks.check_distributed, off="")),
    "repeats": (("int", 1, 1000), {}),
})

_SHARED_MODELS = {k: RUN[k] for k in ("tokenizer", "target", "target_model", "seed", "mesh",
                                       "distributed", "chat", "prompts", "top_k", "top_p",
                                       "verifier", "dtype", "unstacked", "max_seq_len",
                                       "draft_model", "prompt_set", "repeats")}


def _distill_family() -> dict[str, Field]:
  fields = {k: _SHARED_MODELS[k] for k in ("tokenizer", "target", "seed", "mesh",
                                            "distributed")}
  fields["chat"] = Field("any")  # the chat corpus's settings (distill.run_setup)
  fields["target_model"] = Field("dims")
  fields["draft"] = Field("dims")  # the draft's dims and feature_layers
  for name, (kind, low, high, _) in DISTILL_RULES.items():
    fields[name] = Field(kind, check=checks.named(name, _range_rule(name)))
  fields.update(_family({
      "draft_init": (("str",), dict(check=lambda v, c: v in ("random", "svd", "copy") or
                                    checks.model_name_check("draft")(v, c))),
      "loss": (("str",), dict(check=checks.choices("fkl", "rkl", "jsd", "tvd"))),
      "corpora": (("any",), {}),  # names, or 'name:weight,...' (distill.run_setup)
      "split_seed": (("int", 0, SEED_LIMIT), {}),
      "cache_dir": (("str",), dict(check=checks.writable_dir, path="write")),
      "pretrain": (("any",), {}),
      "stdlib_max_chars": (("int", 0, None), {}),
  }))
  return fields


def _range_rule(name):
  def check(value, config):
    check_range(name, value, DISTILL_RULES[name])
  return check


def _sweep_family() -> dict[str, Field]:
  fields = dict(_SHARED_MODELS)
  fields.update(_family({
      "drafts": (("seq",), dict(check=checks.check_drafts)),
      "prompt_source": (("str",), dict(check=checks.check_prompt_source)),
      "num_prompts": (("int", 1, None), {}),
      "prompt_tokens": (("int", 1, None), {}),
      "heldout_fraction": (("float", 0, 1), {}),
      "split_seed": (("int", 0, SEED_LIMIT), {}),
      "gammas": (("seq",), dict(check=_numbers(1, 64, "int"))),
      "temperatures": (("seq",), dict(check=_numbers(0, 1e4))),
      "max_new_tokens": (("int", 1, SEQ_LEN_LIMIT), dict(check=checks.check_max_new_tokens)),
      "stop_at_eos": (("bool",), {}),
      "grid_batch": (("int", 0, BATCH_LIMIT), {}),
      "cost_repeats": (("int", 1, 1000), {}),
      "batch_sizes": (("seq",), dict(check=_numbers(1, BATCH_LIMIT, "int"))),
      "batch_draft": (("str",), dict(check=checks.check_batch_draft)),
      "batch_gamma": (("int", 1, 64), {}),
      "batch_temperature": (("float", 0, 1e4), {}),
      "plots": (("bool",), {}),
  }))
  fields["repeats"] = Field("int", 0, 1000)  # 0: acceptance only
  return fields


FAMILIES: dict[str, dict[str, Field]] = {"run": RUN, "distill": _distill_family(),
                                         "sweep": _sweep_family()}


def check_given(given, *, family: str, reads, script: str = "this script",
                readers: Callable[[str], list[str]] = lambda name: []) -> None:
  """Raises ValueError (one line) for a field set on the command line that no script of
  the family reads (a typo) or that `script` does not read (naming the ones that do)."""
  for name in given:
    if name not in FAMILIES[family]:
      raise ValueError(f"unknown config field {name!r}: no {family} script reads it")
    if name not in reads:
      who = readers(name)
      raise ValueError(f"{script} does not read config.{name}" +
                       (f"; scripts that do: {', '.join(who)}" if who else ""))


def check_config(config: Mapping, *, family: str, reads, given=(), script: str = "this script",
                 readers: Callable[[str], list[str]] = lambda name: []) -> None:
  """Raises ValueError (one line) for the first field of `config` that breaks the contract
  (module docstring). reads: the fields the script reads; given: the top-level fields set
  on the command line; readers(name): the scripts of the family that read `name`."""
  fields = FAMILIES[family]
  reads = set(reads)
  check_given(given, family=family, reads=reads, script=script, readers=readers)
  for name in config:
    if name not in fields:
      raise ValueError(f"unknown config field {name!r}: no {family} script reads it "
                       f"(fields: {', '.join(sorted(fields))})")
    field = fields[name]
    if name not in reads:
      if field.off is not _NO_OFF and config[name] != field.off:
        who = readers(name)
        raise ValueError(f"{script} does not read config.{name} (set to {config[name]!r}; "
                         f"{field.off!r} turns it off)" +
                         (f"; scripts that do: {', '.join(who)}" if who else ""))
  checked = sorted(reads & set(config))
  for name in checked:  # kinds and ranges first: a field's own check may read another's
    check_value(name, dataclasses.replace(fields[name], check=None), config[name], config)
  for name in checked:
    check_value(name, fields[name], config[name], config)
  for name in given:
    reason = fields[name].used(config) if fields[name].used else None
    if reason:
      raise ValueError(f"config.{name} is set but not used: {reason}")
  if family == "run" and _gamma_is_auto(config) and str(config.get("tree", "")).strip() \
      and "tree" in reads:
    raise ValueError("config.tree needs a fixed gamma (a tree is one fixed shape per step); "
                     "pass --config.gamma=<int> with --config.tree")
