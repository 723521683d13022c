"""What a run config asks of the decode loop: its γ, and with gamma 'auto' this machine's
cost table and the decision whether drafting pays here at all.

`parse_gamma` reads config.gamma (the config contract checks it with the same function,
`config_checks.check_gamma`). `config_proposer` gives a run's proposer (`decoding.spec`):
a tree, a fixed γ, or gamma 'auto' over the table `machine_costs.run_table` gives, with the
config's γ rule (`config_rule`: the default rule, or its prior set by config.gamma_prior); where
that table says no γ pays even at a high acceptance it returns `PlainDecoding`, an
explicit decision with the line the scripts print, and they decode autoregressively.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable


@dataclasses.dataclass(frozen=True)
class PlainDecoding:
  """The decision that drafting does not pay on this machine: decode autoregressively.
  line: one line saying why, which the scripts print; table: the `adaptive.CostTable` it
  was decided on."""

  line: str
  table: object


def parse_gamma(value) -> int | str:
  """A config's gamma -> 'auto' or an int >= 1 (configs hold it as a string: 'auto', '4')."""
  if isinstance(value, str) and value.strip() == "auto":
    return "auto"
  if isinstance(value, str) and value.strip().isdigit():
    value = int(value.strip())
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"gamma must be 'auto' or an int >= 1, got {value!r}")
  return value


def config_proposer(config, pair, *, directory: str | os.PathLike,
                    prompt_width: int | None = None, log: Callable[[str], None] = print):
  """The proposer (`decoding.spec`) of a run config and `loading.Pair`: TreeProposal for a
  config.tree (with a fixed gamma only); FixedGamma for a fixed config.gamma;
  AutoGamma(table, gamma_max, rule) for 'auto' (the table from `machine_costs.run_table`,
  the rule from `config_rule`);
  `PlainDecoding` when the table says no γ >= 1 pays even at α = `adaptive.PAYS_AT_ALPHA`
  (decode with autoregressive_generate; the caller prints its line). prompt_width: the
  width the run pads its prompts to, if any (where a table is measured, its steps are
  timed in the run's own loop: `machine_costs.table_for`)."""
  from specdec_jax.decoding.spec import AutoGamma, FixedGamma, make_proposer
  from specdec_jax.gamma.adaptive import DEFAULT_GAMMA_MAX, PAYS_AT_ALPHA
  from specdec_jax.gamma.cost_cache import describe
  from specdec_jax.gamma.machine_costs import run_table
  from specdec_jax.verification.tree_shapes import parse_tree

  gamma = parse_gamma(config.gamma)
  tree = parse_tree(str(config.get("tree", "") or ""))
  if tree is not None:
    return make_proposer(gamma, tree=tree, tree_rule=str(config.get("tree_rule", "sampled")))
  if gamma != "auto":
    return FixedGamma(gamma)
  gamma_max = int(config.get("gamma_max", DEFAULT_GAMMA_MAX))
  rule = config_rule(config)
  run = dict(context=max([len(p) for p in pair.prompts] + [prompt_width or 0]),
             max_new_tokens=int(config.max_new_tokens), eos_id=pair.tokenizer.eos_id,
             rule=rule)
  table = run_table(config, pair, gamma_max=gamma_max, directory=directory, run=run, log=log)
  if not table.drafting_pays(gamma_max):
    return PlainDecoding(
        f"gamma=auto: drafting does not pay on this machine ({describe(table)}: no gamma "
        f"<= {gamma_max} beats a plain step even at alpha {PAYS_AT_ALPHA}); decoding is "
        f"plain autoregressive", table)
  return AutoGamma(table, gamma_max, rule)


def config_rule(config):
  """The γ rule of a config's gamma 'auto': the default `adaptive.BeliefRule`, with the
  draft source's prior acceptance α₀ set to config.gamma_prior where that is not 0 (a
  pair whose draft is known to agree with its target often: its rows draft from the first
  step and keep drafting through an early rejection or two)."""
  from specdec_jax.gamma.adaptive import DEFAULT_RULE, DRAFT

  prior = float(config.get("gamma_prior", 0.0) or 0.0)
  if not prior:
    return DEFAULT_RULE
  priors = list(DEFAULT_RULE.prior)
  priors[DRAFT] = prior
  return dataclasses.replace(DEFAULT_RULE, prior=tuple(priors))
