r"""Rules for choosing γ compared offline on the held-out set: replayed decodes.

  python scripts/gamma_policy_study.py --config=configs/heldout_smollm2.py \
      --out=docs/results/gamma_rules.json \
      --measured=docs/results/benchmark_heldout_smollm2.json
  python scripts/gamma_policy_study.py --config=configs/heldout_smollm2.py \
      --config.temperature=1 --out=docs/results/gamma_rules_t1.json \
      --measured=docs/results/benchmark_heldout_smollm2_t1.json

One greedy decode per prompt (the config's prompt set, `max_new_tokens`) records, for every
start, which of the draft's next G proposals the target's greedy tokens confirm (a feature
or independent draft, or a hybrid over one; `specdec_jax.gamma.gamma_replay`). Each rule
then replays every prompt under this machine's measured step costs
(`machine_costs.table_for`, the benchmark's cached table at batch 1), giving its predicted
speedup over autoregressive decoding per prompt. Rules:
  auto          the config's gamma='auto' rule (the default rule, with config.gamma_prior
                where set): one α̂ and one cost row per source; the rules below change it
                in one respect each
  one-estimate  one belief for both sources, every drafting step at the feature draft's
                full step costs
  fixed-memory  the mean's discount KEEP at every spread of β (noise_memory off): no
                shorter memory where β vary less than 0/1 draws (T > 0)
  short-memory  the mean over about the last 10 positions at every spread (keep 0.9,
                noise_memory off)
  no-optimism   the belief's mean alone (OPTIMISM = 0): a row below the threshold never
                drafts again
  no-forgetting evidence never fades (FORGET = 1): a row probes again only while its
                bound from the evidence it has still clears the threshold
  no-lookahead  a probe is taken even where its best outcome would not make the row draft
  bernoulli-width  the bound's width from α̂(1-α̂), not from the observed spread of β (the
                same rule at T = 0, where every β is 0 or 1)
  prior-spread  σ̂²'s spread within β averaged with the prior's pseudo-positions counted
                as 0/1 draws (evidence_spread off; the same rule at T = 0)
  short-width   the bound's width from the mean's own count (EVIDENCE_KEEP = KEEP, about
                10 positions): a row just below the threshold never stops probing
  default-prior the default rule's prior (where config.gamma_prior sets another)
  probe-k       the config's rule, but a probe (a step the mean alone would not draft)
                proposes at most k drafts (`SmallProbeRule`, a γ rule defined in this file)
  catch-up-aware  the config's rule choosing on each step's true costs: s(γ >= 1) plus the
                catch-up calls an independent draft owes for the tokens it skipped
                (only for such a draft)
  fixed-γ       every step proposes γ (γ = 1..G), at the source's step costs
  oracle        each step the γ of the most tokens per cost given its true depth (a bound)
At T > 0 (config.temperature) no replay is exact: one decode per prompt at fixed γ = G
records the exact β of every position it reached, and each rule walks that trace
--replicates times, drawing each draft's acceptance with probability β
(`gamma_replay.replay_sampled`, a model of sampled decoding); 'one-estimate' and 'oracle'
are left out, and the spread of β over positions against Bernoulli draws of the same mean
is reported.
--measured: a held-out benchmark JSON (scripts/benchmark.py) of the same config whose
per-prompt speedups the 'auto' replay is set beside (correlation, mean ratio).
Every replay counts an independent draft's catch-up: the calls that feed the tokens it
skipped before it drafts again, at their measured cost (`studies.catch_up_cost`,
`gamma_replay.CatchUp`), which the cost table's s(γ) leaves out.
The JSON holds the machine stamp, the cost table, and per rule the geometric mean with
its 95% interval, per domain, the prompts below 0.95x and 0.97x and every prompt's figure.
One greedy decode per prompt, plus the cost table if it is not cached yet.
Figures: docs/results.md#gamma-rules.
"""

import dataclasses
import os

import _bootstrap  # repository root on sys.path; run(main)
import jax.numpy as jnp
import numpy as np
from absl import flags, logging
from ml_collections import config_flags

from specdec_jax.gamma import adaptive, cost_cache, gamma_replay, machine_costs

from specdec_jax.bench import prompt_sets, studies
from specdec_jax.config_proposer import config_rule
from specdec_jax.decoding.spec import DecodeSpec, FixedGamma
from specdec_jax.io.atomic import atomic_write_json
from specdec_jax.io.machine import machine_stamp
from specdec_jax.loading import load_pair

CONFIG_FAMILY = "run"  # the config fields this script reads (scripts/_bootstrap.py)
CONFIG_READS = (
    "tokenizer", "target", "target_model", "draft", "feature_draft", "draft_model",
    "draft_head_tokens", "draft_head_size", "dtype",
    "max_seq_len", "unstacked", "chat", "prompts", "prompt_set", "gamma_max", "gamma_prior",
    "costs", "verifier", "temperature", "top_k", "top_p", "max_new_tokens", "seed"
)
_CONFIG = config_flags.DEFINE_config_file("config", "configs/heldout_smollm2.py",
                                          "a configs/*.py file with a prompt_set",
                                          lock_config=True)
_OUT = flags.DEFINE_string("out", None, "write the results as JSON here")
_MEASURED = flags.DEFINE_string("measured", None, "a held-out benchmark JSON to compare with")
_REPLICATES = flags.DEFINE_integer("replicates", 64, "at T > 0: replays of each prompt's trace "
                                   "per rule (each draws its own acceptances)")


@dataclasses.dataclass(frozen=True)
class SmallProbeRule(adaptive.BeliefRule):
  """The default rule whose probes (steps on which the mean alone would not draft) take at
  most `probe` drafts: a rejected probe observes one position whatever its γ, so a small
  probe buys the same news for less. A `GammaRule` of its own, defined here."""

  probe: int = 1

  def choose(self, belief, costs, source):
    # the default rule's own choice, not this one's (replace keeps the class)
    exploit = adaptive.BeliefRule.choose(dataclasses.replace(self, optimism=0.0), belief,
                                         costs, source)
    bound = super().choose(belief, costs, source)
    return jnp.where(exploit > 0, exploit, jnp.minimum(bound, self.probe))


def rules(gamma_max: int, base: adaptive.BeliefRule = adaptive.DEFAULT_RULE,
          sampled: bool = False, catch_up: bool = False
          ) -> dict[str, tuple[gamma_replay.Rule, bool]]:
  """name -> (rule, lookup steps at their own costs); base: the config's gamma 'auto' rule
  (`config_proposer.config_rule`), which every variant changes in one respect. sampled:
  the rules `gamma_replay.replay_sampled` runs (no 'one-estimate', no 'oracle', no
  'catch-up-aware'); catch_up: the draft defers its catch-up ('catch-up-aware' runs)."""
  fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
  out = {"auto": (gamma_replay.Rule(base), True),
         "one-estimate": (gamma_replay.Rule(base, by_source=False), False),
         "fixed-memory": (gamma_replay.Rule(dataclasses.replace(base, noise_memory=False)),
                          True),
         "short-memory": (gamma_replay.Rule(dataclasses.replace(base, keep=0.9,
                                                                noise_memory=False)), True),
         "no-optimism": (gamma_replay.Rule(dataclasses.replace(base, optimism=0.0)), True),
         "no-forgetting": (gamma_replay.Rule(dataclasses.replace(base, forget=1.0)), True),
         "short-width": (gamma_replay.Rule(dataclasses.replace(base, evidence_keep=base.keep)),
                         True),
         "no-lookahead": (gamma_replay.Rule(dataclasses.replace(base, lookahead=False)), True),
         "bernoulli-width": (gamma_replay.Rule(dataclasses.replace(base, observed_spread=False)),
                             True),
         "prior-spread": (gamma_replay.Rule(dataclasses.replace(base, evidence_spread=False)),
                          True),
         "probe-1": (gamma_replay.Rule(SmallProbeRule(**fields, probe=1)), True),
         "probe-2": (gamma_replay.Rule(SmallProbeRule(**fields, probe=2)), True)}
  if catch_up and not sampled:
    out["catch-up-aware"] = (gamma_replay.Rule(base, catch_up_aware=True), True)
  if base != adaptive.DEFAULT_RULE:
    out["default-prior"] = (gamma_replay.Rule(), True)
  for g in range(1, gamma_max + 1):
    out[f"fixed-{g}"] = (gamma_replay.Rule(fixed=g), True)
  if sampled:
    del out["one-estimate"]
  else:
    out["oracle"] = (gamma_replay.Rule(oracle=True), True)
  return out


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  if not config.get("prompt_set", ""):
    raise ValueError("gamma_policy_study needs a config with a prompt_set "
                     "(e.g. configs/heldout_smollm2.py)")
  if _REPLICATES.value < 1:
    raise ValueError(f"--replicates must be an int >= 1, got {_REPLICATES.value}")
  sampled = float(config.temperature) > 0
  records = prompt_sets.load_prompt_set(config.prompt_set)
  pair = load_pair(config)
  gamma_max = int(config.get("gamma_max", adaptive.DEFAULT_GAMMA_MAX))
  table = machine_costs.run_table(config, pair, gamma_max=gamma_max, batch=1,
                                  directory=_bootstrap.COSTS_DIR)
  print(f"cost table: {cost_cache.describe(table)}")
  costs = table.loop_costs(gamma_max)
  prompts = prompt_sets.encode(pair.tokenizer, records)
  max_new = int(config.max_new_tokens)
  catch_up = studies.catch_up_cost(
      pair.target_params, pair.target_config, pair.draft_params, pair.draft_config, batch=1,
      context=int(np.mean([len(p) for p in prompts])) + max_new // 2)
  if catch_up is not None:
    print(f"catch-up: {catch_up.width} tokens a call, {catch_up.cost:.3f} plain steps")
  traces, trace_rows = [], []
  spec = DecodeSpec(max_new, FixedGamma(gamma_max), sampling=pair.sampling,
                    verifier=pair.verifier, vocab_size=pair.vocab_size) if sampled else None
  for record, ids in zip(records, prompts):
    if sampled:
      trace = gamma_replay.sampled_trace(pair.target, pair.draft, ids, spec=spec,
                                         seed=int(config.seed))
      trace_rows.append(dict(id=record.id, positions=int(trace.beta.size),
                             alpha=float(trace.beta.mean()), spread=trace.spread))
      print(f"  {record.id:14s} {trace.beta.size} positions  alpha {trace.beta.mean():.3f}  "
            f"spread of beta / Bernoulli {trace.spread:.2f}")
    else:
      trace = gamma_replay.greedy_trace(pair.target_params, pair.target_config,
                                        pair.draft_params, pair.draft_config, ids,
                                        max_new_tokens=max_new, depth=gamma_max,
                                        vocab_size=pair.vocab_size)
      print(f"  {record.id:14s} mean depth {trace.depth.mean():.2f}  "
            f"lookup at {trace.lookup.mean():.0%} of starts")
    traces.append(trace)
  domains = [r.domain for r in records]
  rows = []
  for name, (rule, own_lookup_costs) in rules(gamma_max, config_rule(config), sampled,
                                              catch_up is not None).items():
    rule_costs = costs if own_lookup_costs else np.stack([costs[0], costs[0]])
    if sampled:
      runs = gamma_replay.replay_sampled(traces, rule, rule_costs, max_new_tokens=max_new,
                                         replicates=_REPLICATES.value, seed=int(config.seed),
                                         catch_up=catch_up)
    else:
      runs = [gamma_replay.replay(t, rule, rule_costs, max_new, catch_up=catch_up)
              for t in traces]
    speedups = [r["speedup"] for r in runs]
    summary = prompt_sets.domain_summary(domains, speedup=speedups)
    overall = summary[-1]
    rows.append(dict(rule=name, speedup=overall["speedup"],
                     below_095=int(sum(s < 0.95 for s in speedups)),
                     below_097=int(sum(s < 0.97 for s in speedups)),
                     lowest=float(min(speedups)), domains=summary,
                     prompts=[dict(id=r.id, domain=r.domain, speedup=s)
                              for r, s in zip(records, speedups)]))
    if catch_up is not None and not sampled:  # plain steps of catch-up calls per prompt
      rows[-1]["catch_up_per_prompt"] = float(np.mean([r["catch_up"] for r in runs]))
    if sampled:
      rows[-1]["drafting_steps"] = float(np.mean([r["drafting_steps"] for r in runs]))
    print(f"{name:13s} {overall['speedup']:.3f} [{overall['speedup_lo']:.3f}, "
          f"{overall['speedup_hi']:.3f}]  below 0.95x: {rows[-1]['below_095']}  "
          f"below 0.97x: {rows[-1]['below_097']}  "
          f"lowest {rows[-1]['lowest']:.2f}")
  meta = dict(config=config.to_dict(), gamma_max=gamma_max, max_new_tokens=max_new,
              temperature=float(config.temperature),
              costs=dict(step_costs=list(table.step_costs or ()),
                         lookup_step_costs=list(table.lookup_step_costs or ())),
              catch_up=None if catch_up is None else dataclasses.asdict(catch_up))
  if sampled:
    meta.update(replicates=_REPLICATES.value, traces=trace_rows,
                beta_spread=gamma_replay.pooled_spread(traces))
    print(f"spread of beta over positions / Bernoulli draws of the same mean, over the set: "
          f"{meta['beta_spread']:.2f}")
  if _MEASURED.value:
    meta["measured"] = compare(_MEASURED.value, records, rows[0]["prompts"])
  if _OUT.value:
    atomic_write_json(_OUT.value, dict(stamp=machine_stamp(), meta=meta, rows=rows))
    print(f"wrote {_OUT.value}")


def compare(path: str, records, replayed: list[dict]) -> dict:
  """The 'auto' replay beside a held-out benchmark's measured per-prompt speedups."""
  import json
  with open(path) as f:
    rows = json.load(f)["rows"]
  auto = next((r for r in rows if r.get("gamma") == "auto"), rows[0])
  measured = {p["id"]: p["speedup"] for p in auto["prompts"]}
  missing = [r.id for r in records if r.id not in measured]
  if missing:
    raise ValueError(f"--measured {path} lacks prompts {missing[:5]}")
  m = np.asarray([measured[r.id] for r in records])
  p = np.asarray([row["speedup"] for row in replayed])
  out = dict(file=path, correlation=float(np.corrcoef(m, p)[0, 1]),
             mean_ratio=float(np.mean(m / p)))
  print(f"measured vs replayed ('auto'): correlation {out['correlation']:.2f}, "
        f"measured / replayed {out['mean_ratio']:.3f} on average")
  return out


if __name__ == "__main__":
  _bootstrap.run(main)
