r"""Speculative vs autoregressive decoding, side by side in one process.

  python scripts/benchmark.py --config=configs/tiny.py [--gammas=1,2,4] [--out=FILE.json]
  python scripts/benchmark.py --config=configs/smollm2_135m.py --config.draft=truncate:2
  python scripts/benchmark.py --config=configs/smollm2_135m.py --verifiers=token,block
  python scripts/benchmark.py --config=configs/prompt_lookup_smollm2.py   # n-gram draft
  python scripts/benchmark.py --config=configs/smollm2_135m.py --gammas=auto,1,2,4
  python scripts/benchmark.py --config=configs/smollm2_135m.py \
      --config.draft=saved:drafts/smollm2_feature_v1 --config.gamma=3 --config.tree=2,2,1 \
      --config.tree_rule=topk
  python scripts/benchmark.py --config=configs/heldout_smollm2.py --out=FILE.json
  python scripts/benchmark.py --config=configs/tiny.py \
      --config.prompt_set=configs/prompts/heldout.json          # any config, any set

Same model, prompts, settings and seed for both samplers; compile time excluded
(a warm-up call each); the timed calls alternate and the median of
--config.repeats is reported. With --verifiers, each γ is run once per verifier
(each against its own interleaved autoregressive timing). Also prints the measured
acceptance, α and the step's compile time; where --gammas holds a fixed γ or a tree, also
the cost coefficient c, the verify-cost curve v(k) and the prediction from them. A
benchmark, not a test: nothing here asserts a speed.
With gamma 'auto' (γ chosen per row and step from this machine's cost table, measured
once into runs/costs/; `specdec_jax.gamma.machine_costs`) it also prints, and writes to the
JSON rows as gamma_histogram, how many steps chose each γ.

With --config.prompt_set (a JSON file, `specdec_jax.bench.prompt_sets`; '' = the config's own
prompts), every prompt of the set runs alone, as a batch of --config.batch_size copies of
itself (at T > 0 each row samples its own text), timed side by side as above,
and each γ prints one line per prompt and a table per domain and overall: speedup as
the geometric mean over prompts with the 95% Student-t interval of the mean log-ratio,
α and acceptance as means over prompts with 95% Student-t intervals
(`studies.side_by_side_per_prompt`). The JSON rows carry `prompts` and `domains`.
"""

import itertools
import os
import time

import _bootstrap  # repository root on sys.path; run(main)
import numpy as np
from absl import flags, logging
from ml_collections import config_flags

from specdec_jax.bench import prompt_sets, studies, timing
from specdec_jax.decoding import loop, step
from specdec_jax.decoding.spec import DecodeSpec, make_proposer, prepare, resolve_verifier
from specdec_jax import config_proposer
from specdec_jax.gamma import adaptive, cost_cache, machine_costs
from specdec_jax.io.atomic import atomic_write_json
from specdec_jax.io.machine import machine_stamp
from specdec_jax.loading import load_pair
from specdec_jax.verification.tree_shapes import parse_tree

CONFIG_FAMILY = "run"  # the config fields this script reads (scripts/_bootstrap.py)
CONFIG_READS = (
    "tokenizer", "target", "target_model", "draft", "feature_draft", "draft_model",
    "draft_head_tokens", "draft_head_size", "dtype",
    "max_seq_len", "unstacked", "chat", "prompts", "prompt_set", "gamma", "gamma_max",
    "gamma_prior", "costs", "verifier", "tree", "tree_rule", "temperature", "top_k", "top_p",
    "max_new_tokens", "batch_size", "seed", "repeats"
)
_CONFIG = config_flags.DEFINE_config_file("config", None, "a configs/*.py file", lock_config=True)
_GAMMAS = flags.DEFINE_list("gammas", None, "gammas to run, ints or 'auto' (default: "
                            "config.gamma)")
_VERIFIERS = flags.DEFINE_list("verifiers", None,
                               "verifiers to compare, e.g. token,block (default: config.verifier)")
_OUT = flags.DEFINE_string("out", None, "write the results as JSON here")
_PEER = flags.DEFINE_enum("peer", "", ["", "transformers"],
                          "also time this peer's plain and assisted generation on the same "
                          "GGUF pair, prompts and settings, after ours (batch 1 only)")
_PEER_PYTHON = flags.DEFINE_string("peer_python", ".venv-ref/bin/python",
                                   "the python of the peer's venv (make peer)")


def run_spec(pair, config, gamma: int | str, verifier: str, auto: dict) -> DecodeSpec:
  """The DecodeSpec of one benchmark row: gamma (an int, or 'auto' with `auto`'s table and
  gamma_max) or --config.tree ('2,2,1' = TreeShape.from_branching; 'paths:0,1,00' =
  from_paths; '' = a chain; `tree_shapes.parse_tree`) with tree_rule."""
  proposer = make_proposer(gamma, tree=parse_tree(config.get("tree", "")),
                           tree_rule=str(config.get("tree_rule", "sampled")),
                           **(auto if gamma == "auto" else {}))
  return DecodeSpec(config.max_new_tokens, proposer, sampling=pair.sampling, verifier=verifier,
                    vocab_size=pair.vocab_size)


def step_compile_seconds(pair, config, spec: DecodeSpec) -> float:
  """Seconds to lower and compile the jitted `speculative_step` alone (NaN for a tree,
  whose loop body is `tree_step.tree_step_fn`)."""
  if spec.tree is not None:
    return float("nan")
  prepared = prepare(pair.target, pair.draft, pair.prompts, spec, seed=config.seed)
  state = loop.prefill(pair.target, pair.draft_params, prepared)
  return timing.timed_call(lambda: step.speculative_step.lower(
      pair.target_params, pair.draft_params, state, prepared.costs,
      target_config=pair.target_config, draft=prepared.draft, spec=prepared.spec).compile())[0]


def predicted_speedup(alpha: float, histogram: dict, c: float, v: dict) -> float:
  """The prediction at α over the γ a run used ({γ: steps}):
  Σ_γ n_γ E[tokens](α, γ) / Σ_γ n_γ s(γ) (`adaptive.step_cost`); one γ:
  `studies.predicted_speedup`."""
  tokens = studies.expected_tokens_total(alpha, histogram)
  return tokens / sum(n * adaptive.step_cost(adaptive.draft_calls(g), c, v[g + 1])
                      for g, n in histogram.items())


def merged_histogram(histograms) -> dict:
  """{γ: steps} summed over runs."""
  total = {}
  for h in histograms:
    for g, n in h.items():
      total[g] = total.get(g, 0) + n
  return dict(sorted(total.items()))


def print_histogram(gamma, histogram: dict) -> None:
  if gamma == "auto":
    print("    steps per chosen gamma: " + " ".join(f"{g}:{n}" for g, n in histogram.items()))


def prompt_set_row(pair, config, records, prompts, gamma: int | str, verifier: str, c: float,
                   v: dict, auto: dict, tree) -> dict:
  """Every prompt of a set alone (config.batch_size copies of it); prints its lines and the
  per-domain table. tree: the run's TreeShape (config.tree), or None for chains."""
  res = studies.side_by_side_per_prompt(
      pair.target, pair.draft, prompts, domains=[r.domain for r in records],
      ids=[r.id for r in records], spec=run_spec(pair, config, gamma, verifier, auto),
      seed=config.seed, repeats=config.repeats, copies=int(config.batch_size),
      progress=f"gamma {gamma} {verifier}")
  for record, p in zip(records, res["prompts"]):
    p["chat"] = record.chat
  print(f"gamma {gamma}  verifier {verifier}")
  print("prompt | domain | prompt tokens | AR tok/s | SD tok/s | speedup | accept | alpha | "
        "tok/step")
  for p in res["prompts"]:
    print(f"{p['id']} | {p['domain']}{' (chat)' if p['chat'] else ''} | {p['prompt_tokens']} | "
          f"{p['ar_tokens_per_s']:.1f} | {p['sd_tokens_per_s']:.1f} | {p['speedup']:.2f}x | "
          f"{p['acceptance_rate']:.3f} | {p['alpha']:.3f} | {p['tokens_per_step']:.2f}")
  print(prompt_sets.format_summary(res["domains"]))
  alpha = res["domains"][-1]["alpha"]  # the mean over all prompts
  histogram = merged_histogram(p["gamma_histogram"] for p in res["prompts"])
  print_histogram(gamma, histogram)
  if tree is not None:  # a tree's α reads 0: predict from its tokens per step
    pred = tree_predicted_speedup(
        float(np.mean([p["tokens_per_step"] for p in res["prompts"]])), tree, c, v)
  elif gamma == "auto":
    pred = auto_predicted_speedup(alpha, histogram, auto["costs"])
  else:
    pred = predicted_speedup(alpha, histogram, c, v)
  return dict(gamma=gamma, verifier=verifier, c=c,
              v=None if gamma == "auto" else v[gamma + 1], gamma_histogram=histogram,
              predicted_speedup=pred, **res)


class Phases:
  """Wall seconds per phase of the run (printed at the end and written to the JSON)."""

  def __init__(self):
    self.seconds, self._t = {}, time.perf_counter()

  def done(self, name: str) -> None:
    now = time.perf_counter()
    self.seconds[name] = self.seconds.get(name, 0.0) + now - self._t
    self._t = now

  def line(self) -> str:
    return "phases (wall s): " + "  ".join(f"{k} {v:.1f}" for k, v in self.seconds.items())


def tree_predicted_speedup(tokens_per_step: float, tree, c: float, v: dict) -> float:
  """A tree row's prediction: measured tokens per target call over the cost of its D draft
  calls and one target call over N + 1 tokens, D c + v(N+1) (`adaptive.step_cost`)."""
  return tokens_per_step / adaptive.step_cost(tree.max_depth, c, v[tree.call_nodes + 1])


def auto_predicted_speedup(alpha: float, histogram: dict, table) -> float:
  """The prediction of a gamma 'auto' row from the cost table it chose by:
  Σ_γ n_γ E(α, γ) / Σ_γ n_γ s(γ) (s of the draft's steps; lookup steps cost about the same)."""
  s = table.as_array(max(histogram))
  return studies.expected_tokens_total(alpha, histogram) / sum(
      n * float(s[g]) for g, n in histogram.items())


def peer_pair(config) -> tuple[str, str]:
  """(target, draft) GGUF paths for the peer, checked before anything loads: the peer's
  venv must import torch and transformers, and both models must be GGUF files (a hybrid
  draft's model draft is the peer's assistant)."""
  import subprocess
  from specdec_jax.loading import gguf_file
  python = _PEER_PYTHON.value
  if not os.path.isfile(python):
    raise ValueError(f"--peer_python {python!r} not found: make the peer's venv with "
                     f"`make peer`")
  check = subprocess.run([python, "-c", "import torch, transformers, gguf"],
                         capture_output=True, text=True)
  if check.returncode:
    raise ValueError(f"--peer_python {python!r} cannot import torch, transformers and gguf: "
                     f"{(check.stderr.strip().splitlines() or ['?'])[-1]}")
  from specdec_jax.drafts import registry
  draft = registry.model_draft_name(config.draft, config.feature_draft)
  paths = [gguf_file(config.target), gguf_file(draft)]
  if None in paths:
    raise ValueError(f"--peer needs GGUF target and draft models, got target "
                     f"{config.target!r}, draft {draft!r}")
  if int(config.batch_size) != 1:
    raise ValueError(f"--peer times batch 1 (transformers' assisted generation decodes one "
                     f"row), got config.batch_size={int(config.batch_size)}")
  return paths[0], paths[1]


def run_peer(paths, prompts, config, workdir: str) -> dict:
  """The peer's figures (scripts/peer_transformers.py in --peer_python), per prompt."""
  import json
  import subprocess
  request = os.path.join(workdir, "peer_request.json")
  out = os.path.join(workdir, "peer_result.json")
  atomic_write_json(request, dict(target=paths[0], draft=paths[1],
                                  prompts=[list(map(int, p)) for p in prompts],
                                  max_new_tokens=int(config.max_new_tokens),
                                  temperature=float(config.temperature), seed=int(config.seed),
                                  repeats=int(config.repeats), threads=os.cpu_count()))
  proc = subprocess.run([_PEER_PYTHON.value, os.path.join(_bootstrap.ROOT, "scripts",
                                                          "peer_transformers.py"),
                         f"--request={request}", f"--out={out}"])
  if proc.returncode:
    raise RuntimeError(f"the peer stopped with exit status {proc.returncode}")
  with open(out) as f:
    return json.load(f)


def peer_table(rows, peer: dict) -> dict:
  """Ours (autoregressive and each row's speculative decoding) against the peer's plain
  and assisted generation, per prompt and as geometric means; printed and returned."""
  per_prompt = rows[0].get("prompts") or [rows[0]]
  peer_rows = peer["prompts"]
  if len(per_prompt) != len(peer_rows):
    raise RuntimeError(f"peer timed {len(peer_rows)} prompts, ours {len(per_prompt)}")

  def gmean(xs):
    return float(np.exp(np.mean(np.log(xs))))
  out = dict(versions=peer["versions"], prompts=[], rows=[])
  print(f"peer: transformers {peer['versions']['transformers']}, torch "
        f"{peer['versions']['torch']}, {peer['versions']['threads']} threads")
  for row in rows:
    ours = row.get("prompts") or [row]
    sd = [p["sd_tokens_per_s"] for p in ours]
    ar = [p["ar_tokens_per_s"] for p in ours]
    plain = [p["plain_tokens_per_s"] for p in peer_rows]
    assisted = [p["assisted_tokens_per_s"] for p in peer_rows]
    summary = dict(gamma=row["gamma"], verifier=row["verifier"], ours_ar=gmean(ar),
                   ours_sd=gmean(sd), peer_plain=gmean(plain), peer_assisted=gmean(assisted),
                   sd_over_assisted=gmean([a / b for a, b in zip(sd, assisted)]),
                   ar_over_plain=gmean([a / b for a, b in zip(ar, plain)]))
    out["rows"].append(summary)
    print(f"gamma {row['gamma']} {row['verifier']}: ours AR {summary['ours_ar']:.2f} / SD "
          f"{summary['ours_sd']:.2f} tok/s; transformers plain {summary['peer_plain']:.2f} / "
          f"assisted {summary['peer_assisted']:.2f} tok/s (geometric means); ours SD / "
          f"assisted {summary['sd_over_assisted']:.2f}x, ours AR / plain "
          f"{summary['ar_over_plain']:.2f}x")
  out["prompts"] = peer_rows
  return out


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint read/write at INFO
  phases = Phases()
  config = _CONFIG.value
  prompt_set = str(config.get("prompt_set", ""))
  records = prompt_sets.load_prompt_set(prompt_set) if prompt_set else None
  gammas = [config_proposer.parse_gamma(g) for g in (_GAMMAS.value or [config.gamma])]
  verifiers = list(_VERIFIERS.value or [config.verifier])
  for name in verifiers:
    resolve_verifier(name)  # a clear error for an unknown name, before any work
  if "auto" in gammas and config.tree:
    raise ValueError("config.tree needs a fixed gamma; drop 'auto' from --gammas")
  peer_paths = peer_pair(config) if _PEER.value else None
  pair = load_pair(config)
  if pair.draft_config is None:
    raise ValueError("benchmark needs a draft: set --config.draft")
  prompts = prompt_sets.encode(pair.tokenizer, records) if records else pair.prompts
  # a prompt set runs prompt by prompt, each as a batch of batch_size copies
  batch = int(config.batch_size) if records else len(prompts)
  phases.done("load")
  auto = {}
  if "auto" in gammas:
    gamma_max = int(config.gamma_max)
    width = (max(studies.prompt_bucket(len(p)) for p in prompts) if records
             else max(len(p) for p in prompts))
    rule = config_proposer.config_rule(config)
    table = machine_costs.run_table(  # where measured, timed in the run's own loop
        config, pair, gamma_max=gamma_max, batch=batch,
        directory=_bootstrap.COSTS_DIR,
        run=dict(context=width, max_new_tokens=int(config.max_new_tokens),
                 eos_id=None, rule=rule))
    auto = dict(gamma_max=gamma_max, costs=table, rule=rule)
    print(f"gamma auto: gamma_max {gamma_max}, prior alpha {rule.prior[adaptive.DRAFT]} "
          f"(draft), cost table {cost_cache.describe(table)}")
    if not table.drafting_pays(gamma_max):
      print("gamma auto: drafting does not pay on this machine even at alpha "
            f"{adaptive.PAYS_AT_ALPHA} (generate and run decode autoregressively); the "
            "gamma 'auto' rows below run the rule anyway: plain steps and the probes it takes")
    phases.done("cost table")
  tree = parse_tree(config.get("tree", ""))
  fixed = [g for g in gammas if g != "auto"]
  # c and v(k) feed the predictions of fixed-γ and tree rows; gamma 'auto' rows are
  # predicted from the cost table they chose by
  widest = max(fixed + ([tree.call_nodes] if tree is not None else []), default=0)
  context = int(np.mean([len(p) for p in prompts])) + config.max_new_tokens // 2
  c, v, target_ms = None, {}, None
  if widest:
    c = studies.cost_coefficient(pair.target_params, pair.target_config, pair.draft_params,
                                 pair.draft_config, batch=batch, context=context)
    v = studies.verify_cost_curve(pair.target_params, pair.target_config, batch=batch,
                                  context=context, max_tokens=widest + 1)
    target_ms = 1e3 * studies.call_seconds(pair.target_params, pair.target_config,
                                           batch=batch, tokens=1, context=context)
    phases.done("c and v(k)")
  print(f"target: {config.target}  draft: {config.draft}  batch {batch}  "
        f"T={pair.sampling.temperature} top_k={pair.sampling.top_k} top_p={pair.sampling.top_p}"
        f"  max_new_tokens {config.max_new_tokens}  seed {config.seed}  "
        f"verifiers {','.join(verifiers)}"
        + (f"  prompt set {prompt_set} ({len(records)} prompts, each alone)" if records else ""))
  if widest:
    print(f"target call {target_ms:.2f} ms  c = {c:.3f}  v(k) = "
          + " ".join(f"{k}:{x:.2f}" for k, x in v.items()))
  rows = []
  header = ("gamma", "verifier", "AR tok/s", "SD tok/s", "speedup", "accept", "alpha", "tok/step",
            "pred tok/step", "pred speedup", "step compile s")
  if not records:
    print(" | ".join(header))
  for gamma, verifier in itertools.product(gammas, verifiers):
    if records:
      rows.append(prompt_set_row(pair, config, records, prompts, gamma, verifier, c, v, auto,
                                 tree))
      continue
    spec = run_spec(pair, config, gamma, verifier, auto)
    compile_s = step_compile_seconds(pair, config, spec)
    res = studies.side_by_side(pair.target, pair.draft, pair.prompts, spec=spec,
                               seed=config.seed, repeats=config.repeats)
    fixed_gamma = gamma != "auto"
    if tree is not None:
      pred = tree_predicted_speedup(res.tokens_per_step, tree, c, v)
    elif fixed_gamma:
      pred = predicted_speedup(res.alpha, res.gamma_histogram, c, v)
    else:
      pred = auto_predicted_speedup(res.alpha, res.gamma_histogram, auto["costs"])
    row = {**res.to_dict(), "verifier": verifier, "c": c,
           "v": v[gamma + 1] if fixed_gamma else None, "predicted_speedup": pred,
           "leviathan_speedup": (studies.predicted_speedup(res.alpha, gamma, c, 1.0)
                                 if fixed_gamma else None),
           "step_compile_s": compile_s}
    rows.append(row)
    print(f"{gamma} | {verifier} | {res.ar_tokens_per_s:.1f} | {res.sd_tokens_per_s:.1f} | "
          f"{res.speedup:.2f}x | {res.acceptance_rate:.3f} | {res.alpha:.3f} | "
          f"{res.tokens_per_step:.2f} | {res.predicted_tokens_per_step:.2f} | {pred:.2f}x | "
          f"{compile_s:.2f}")
    print_histogram(gamma, res.gamma_histogram)
  phases.done("decode")
  peer = None
  if peer_paths is not None:  # one framework's copy of the pair at a time
    del pair
    import gc
    import tempfile
    import jax
    jax.clear_caches()
    gc.collect()
    with tempfile.TemporaryDirectory() as workdir:
      peer = peer_table(rows, run_peer(peer_paths, prompts, config, workdir))
    phases.done("peer")
  print(phases.line())
  if _OUT.value:
    meta = dict(config=config.to_dict(), target_call_ms=target_ms, c=c,
                verify_cost={str(k): x for k, x in v.items()}, phases_s=phases.seconds)
    meta["prompt_set"] = prompt_set
    if auto:  # the table gamma 'auto' chose from: --config.costs=<this file> replays it
      meta["auto_cost_table"] = dict(gamma_max=auto["gamma_max"], **auto["costs"].to_dict())
    atomic_write_json(_OUT.value, dict(stamp=machine_stamp(), meta=meta, rows=rows,
                                       peer=peer), default=str)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  _bootstrap.run(main)
