"""Checks of a training config's numbers before any work: `check_hyperparameters`.

A NaN learning rate or a negative step count must stop a run at once with one line that
names the field and its value, not train for an hour and save a draft of NaN (or save
nothing and exit 0). Every rule is a range; fields a config does not have are skipped,
so one check serves distillation (configs/distill_*.py) and pretraining (`pretrain.*`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

# field -> (kind, low, high, low inclusive); kind 'int' or 'float'; None = unbounded.
RULES: dict[str, tuple[str, float | None, float | None, bool]] = {
    "lr": ("float", 0.0, None, False),
    "warmup": ("int", 0, None, True),
    "steps": ("int", 1, None, True),
    "batch_size": ("int", 1, None, True),
    "eval_batch_size": ("int", 1, None, True),
    "eval_windows": ("int", 1, None, True),
    "seq_len": ("int", 2, None, True),
    "temperature": ("float", 0.0, None, True),
    "greedy_temperature": ("float", 0.0, None, False),
    "clip": ("float", 0.0, None, False),
    "weight_decay": ("float", 0.0, None, True),
    "unroll": ("int", 1, None, True),
    "on_policy_fraction": ("float", 0.0, 1.0, True),
    "prompt_len": ("int", 0, None, True),
    "checkpoint_every": ("int", 1, None, True),
    "keep": ("int", 1, None, True),
    "eval_every": ("int", 0, None, True),
    "log_every": ("int", 1, None, True),
    "heldout_fraction": ("float", 0.0, 1.0, False),
    "feature_cache_windows": ("int", 0, None, True),
    "eval_depth": ("int", 1, None, True),
    "stop_after": ("int", 0, None, True),
}
PRETRAIN_FIELDS = ("steps", "lr", "warmup", "batch_size", "seq_len")


def check_range(name: str, value: Any, rule) -> None:
  """Raises ValueError naming config.<name> when value is not of rule's kind and range."""
  kind, low, high, low_inclusive = rule
  if kind == "int":
    ok_type = isinstance(value, int) and not isinstance(value, bool)
    want = "an int"
  else:
    ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
    want = "a finite number"
  if not ok_type or (kind == "float" and not math.isfinite(value)):
    raise ValueError(f"config.{name} must be {want}, got {value!r}")
  too_low = low is not None and (value < low if low_inclusive else value <= low)
  too_high = high is not None and value > high
  if too_low or too_high:
    bounds = (("[" if low_inclusive else "(") + f"{low}, " if low is not None else "(-inf, ")
    bounds += f"{high}]" if high is not None else "inf)"
    raise ValueError(f"config.{name} must lie in {bounds}, got {value!r}")


def check_hyperparameters(config: Mapping[str, Any]) -> None:
  """Raises ValueError naming the first field of `config` outside its range (`RULES`),
  then the cross-field rule prompt_len < seq_len when on-policy steps are on (a warmup
  at or past `steps` is legal: the schedule then never decays).
  config.pretrain's fields are checked under their own names (pretrain.<field>)."""
  for name, rule in RULES.items():
    if name in config:
      check_range(name, config[name], rule)
  if config.get("on_policy_fraction", 0) > 0 and "prompt_len" in config and \
      config["prompt_len"] >= config.get("seq_len", math.inf):
    raise ValueError(f"config.prompt_len ({config['prompt_len']}) must be below "
                     f"config.seq_len ({config['seq_len']}) for on-policy steps")
  pretrain = config.get("pretrain")
  if pretrain:
    for name in PRETRAIN_FIELDS:
      if name in pretrain:
        check_range(f"pretrain.{name}", pretrain[name], RULES[name])
