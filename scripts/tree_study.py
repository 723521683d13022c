r"""Tokens per target call of token trees against chains (SmolLM2, shipped feature draft).

  PYTHONPATH=. .venv/bin/python scripts/tree_study.py \
      --out=docs/results/tree_tokens_per_call.json
  # dynamic trees at T = 0 only, added to the committed rows (their rank table):
  PYTHONPATH=. .venv/bin/python scripts/tree_study.py --append --temperatures=0 \
      --chains= --shapes=dynamic:8:best:32,dynamic:16:best:64 --nocosts \
      --out=docs/results/tree_tokens_per_call.json

Every prompt of configs/prompts/heldout.json (30; chat prompts through the ChatML
template) in one batch, padded to the longest, 32 new tokens (no EOS stop), seed 0,
target SmolLM2-135M and the feature draft 'saved:drafts/smollm2_feature_v1' alone (no
lookup). Per configuration: tokens per target call = emitted tokens / steps of each row,
the mean over prompts and its 95% Student-t interval. Configurations: chains γ = 1..6
(block verifier, the default) at T=0 and T=1, and trees (`decoding.tree_step`) with rule 'topk'
at T=0 and both rules at T=1. A shape is a branching per depth ('3x2x1') or 'best:N':
the N-node tree of `tree_shapes.best_first` under the rank table a[d, r] (below), or
'dynamic:N:<shape>': those candidate nodes, of which each row sends its N likeliest
under the draft to the target each step (`TreeShape.budget`; rule 'topk' only).

The rank table (`--rank_table`, first): one T=0 run with rule 'topk' over a caterpillar
probe tree (K = 8 children on each rank-0 node, depth 6; `caterpillar`) records each
step's accepted path (`recorded_paths`). Per prompt it counts, at each depth d reached
along rank-0 nodes, which rank r the target's token was (hits) or none; the pooled
a[d, r] = hits / reached over prompts (depths reached fewer than MIN_REACHED times share
one last row). Trees are built from a mixture of per-prompt tables (`mixture`: each
shrunk to the pooled table by SHRINK pseudo-steps), since a pooled table averages away
how predictable text stays predictable for many tokens. 'best:N' is cross-fitted: the
prompts are split in two folds (alternating, so each holds half of every domain), and
each fold decodes with the best-first tree of the *other* fold's tables, so no prompt's
tree was fitted on that prompt. Every row at T = 0 also gets the rank model's
prediction under the whole set's mixture (`tree_shapes.expected_tokens`).

No timing is needed for the tokens per call, so the study may share the machine. It also
records v(k) = t(k tokens) / t(1 token) of the target (`studies.verify_cost_curve`,
batch 1, context 128, k up to the widest call, after the decoding runs) and c
(`studies.cost_coefficient`), and gives a predicted speedup tokens_per_call / (v(N+1) + D c)
per configuration (D draft calls per step, γ for a chain); those timings are only as good
as the machine was idle (the JSON's `timing_note`). Writes the JSON (with the machine
stamp) after every configuration and a CSV next to it. `--costs_only` keeps the rows of
--out and times v(k) and c again, for a machine that was busy during the study.
"""

import contextlib
import json
import os
import time

import _bootstrap  # repository root on sys.path; run(main)
from absl import flags, logging

import jax
import numpy as np
from configs import smollm2_135m
from specdec_jax.bench import prompt_sets, studies
from specdec_jax.decoding import loop, tree_step
from specdec_jax.decoding.spec import DecodeSpec, FixedGamma, TreeProposal
from specdec_jax.models.model import Model
from specdec_jax.verification import tree_shapes
from specdec_jax.io.atomic import atomic_write_csv, atomic_write_json
from specdec_jax.io.machine import machine_stamp
from specdec_jax.loading import load_models
from specdec_jax.models.sampling import SamplingConfig
from specdec_jax.verification.tree_shapes import TreeShape

_OUT = flags.DEFINE_string("out", "docs/results/tree_tokens_per_call.json", "JSON output")
_NEW = flags.DEFINE_integer("max_new_tokens", 32, "new tokens per prompt")
_SHAPES = flags.DEFINE_list("shapes", ["2x1x1", "2x2x1", "4x1x1", "3x2x1", "best:8",
                                       "best:12", "best:15", "dynamic:8:best:32",
                                       "dynamic:16:best:64"],
                            "tree shapes: branching per depth joined by 'x' "
                            "(TreeShape.from_branching), 'best:N' (best_first over the "
                            "rank table), or 'dynamic:N:<either>' (N of those candidates "
                            "per step, `TreeShape.budget`; rule 'topk' only)")
_CHAINS = flags.DEFINE_list("chains", ["1", "2", "3", "4", "5", "6"], "chain gammas")
_RANK_TABLE = flags.DEFINE_bool("rank_table", True, "measure the rank table a[d, r] first")
_RANK_TABLE_FROM = flags.DEFINE_string("rank_table_from", "", "take the rank table from this "
                                       "earlier study JSON instead of measuring it")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "sampling temperatures")
_APPEND = flags.DEFINE_bool("append", False, "add the rows to those of --out (same config, "
                            "rule and T: replaced), with the rank table of --out; each new "
                            "row records its own machine stamp")
PROBE_K, PROBE_DEPTH, MIN_REACHED, SHRINK = 8, 6, 30, 4
_LIMIT = flags.DEFINE_integer("limit", 0, "use only the first N prompts (0 = all)")
_COSTS = flags.DEFINE_bool("costs", True, "measure v(k) and c")
_COSTS_ONLY = flags.DEFINE_bool("costs_only", False, "keep the rows of --out and time v(k) "
                                "and c again (on an idle machine); its stamp goes to "
                                "'costs_stamp'")
PROMPT_SET = "configs/prompts/heldout.json"


def caterpillar(width: int, depth: int) -> TreeShape:
  """`width` children below the root and below each rank-0 node, `depth` levels."""
  parents, spine = [], -1
  for _ in range(depth):
    first = len(parents)
    parents += [spine] * width
    spine = first
  return TreeShape(tuple(parents))


@contextlib.contextmanager
def recorded_paths(log: list):
  """Within: every tree step appends (done [B], path [B,D], num_accepted [B]) to log
  (host callbacks in step order around `tree_step.tree_verify`)."""
  step_fn, verify = loop.tree_step_fn, tree_step.tree_verify
  done_at = []

  def recording_step(target_params, draft_params, state, **kw):
    jax.debug.callback(lambda d: done_at.append(np.asarray(d)), state.done, ordered=True)
    return step_fn(target_params, draft_params, state, **kw)

  def recording_verify(*args, **kw):
    path, block, n = verify(*args, **kw)
    jax.debug.callback(lambda p, m: log.append((done_at[len(log)], np.asarray(p),
                                                np.asarray(m))), path, n, ordered=True)
    return path, block, n

  loop.tree_step_fn, tree_step.tree_verify = recording_step, recording_verify
  try:
    yield log
  finally:
    loop.tree_step_fn, tree_step.tree_verify = step_fn, verify


def rank_table(generate) -> dict:
  """Per prompt, the hits and reached counts of one T=0 'topk' run over `caterpillar`
  (module docstring), and the pooled table a[d, r]."""
  shape = caterpillar(PROBE_K, PROBE_DEPTH)
  ranks = np.asarray(shape.child_rank)
  log = []
  with recorded_paths(log):
    out = generate(TreeProposal(shape, "topk"), 0.0, None)
  rows = out.tokens.shape[0]
  reached = np.zeros((rows, PROBE_DEPTH), np.int64)
  hits = np.zeros((rows, PROBE_DEPTH, PROBE_K), np.int64)
  for done, path, n in log:
    for b in np.flatnonzero(~done):
      for d in range(PROBE_DEPTH):  # depth d + 1, reached along rank-0 nodes
        reached[b, d] += 1
        if n[b] <= d:
          break
        hits[b, d, ranks[path[b, d]]] += 1
        if ranks[path[b, d]]:
          break
  return dict(probe=dict(width=PROBE_K, depth=PROBE_DEPTH, rule="topk", temperature=0.0),
              reached=reached.sum(0).tolist(), accept=pooled(hits, reached).tolist(),
              per_prompt=dict(hits=hits.tolist(), reached=reached.tolist()),
              min_reached=MIN_REACHED, shrink=SHRINK,
              probe_tokens_per_call=float(np.mean(out.lengths / out.steps_per_row)))


def pooled(hits: np.ndarray, reached: np.ndarray) -> np.ndarray:
  """[D', K]: a[d, r] over all given prompts; depths reached fewer than MIN_REACHED times
  share one last row."""
  h, n = hits.sum(0), reached.sum(0)
  own = int(max(1, np.sum(n >= MIN_REACHED)))
  table = [h[d] / max(n[d], 1) for d in range(own)]
  if own < len(n) and n[own:].sum():
    table.append(h[own:].sum(0) / n[own:].sum())
  return np.asarray(table)


def mixture(hits: np.ndarray, reached: np.ndarray) -> np.ndarray:
  """[P, D', K]: one table per prompt, each shrunk towards the pooled table by SHRINK
  pseudo-steps per depth, a[p, d] = (hits + SHRINK a_pool[d]) / (reached + SHRINK)."""
  pool = pooled(hits, reached)
  depth = pool.shape[0]
  h = np.concatenate([hits[:, :depth - 1], hits[:, depth - 1:].sum(1, keepdims=True)], 1)
  n = np.concatenate([reached[:, :depth - 1], reached[:, depth - 1:].sum(1, keepdims=True)], 1)
  return (h + SHRINK * pool[None]) / (n + SHRINK)[:, :, None]


def folds(count: int) -> list[np.ndarray]:
  """Two folds of prompt indices, alternating (the set lists each domain's prompts
  together, so each fold holds about half of every domain)."""
  index = np.arange(count)
  return [index[index % 2 == 0], index[index % 2 == 1]]


def cross_fitted(table: dict, num_nodes: int) -> list[tuple[np.ndarray, TreeShape]]:
  """Per fold: (its prompt indices, the best-first tree of the other fold's mixture)."""
  hits = np.asarray(table["per_prompt"]["hits"])
  reached = np.asarray(table["per_prompt"]["reached"])
  out = []
  for fold in folds(len(hits)):
    other = np.setdiff1d(np.arange(len(hits)), fold)
    out.append((fold, tree_shapes.best_first(mixture(hits[other], reached[other]), num_nodes)))
  return out


def plan(table):
  """[(label, kind, what, rule, temperature)] in run order; `what` is γ for a chain and a
  list of (prompt indices, TreeShape) for a tree (one entry: every prompt)."""
  out = []
  for t in [float(x) for x in _TEMPERATURES.value]:
    for g in _CHAINS.value:
      out.append((f"chain {g}", "chain", int(g), "block", t))
    for s in _SHAPES.value:
      budget, candidates = None, s
      if s.startswith("dynamic:"):
        budget, _, candidates = s[len("dynamic:"):].partition(":")
        budget = int(budget)
      if candidates.startswith("best:"):
        if table is None:
          raise ValueError(f"shape {s!r} needs the rank table (--rank_table)")
        what = cross_fitted(table, int(candidates[5:]))
        label = f"best-first {candidates[5:]}"
      else:
        what = [(None, tree_shapes.parse_tree(candidates))]
        label = f"tree {candidates}"
      if budget is not None:
        what = [(rows, shape.with_budget(budget)) for rows, shape in what]
        label = f"dynamic {budget} of {label}"
      rules = ("topk",) if t == 0 or budget is not None else ("sampled", "topk")
      for rule in rules:
        out.append((label, "tree", what, rule, t))
  return out


def main(_):
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint read at INFO
  config = smollm2_135m.get_config()
  config.draft = config.feature_draft
  models = load_models(config, [("draft", config.draft)])
  _, draft_cfg, draft_params = models.drafts["draft"]
  prompts = prompt_sets.load_prompt_set(PROMPT_SET)
  if _LIMIT.value:
    prompts = prompts[:_LIMIT.value]
  ids = prompt_sets.encode(models.tokenizer, prompts)
  width = max(len(p) for p in ids)
  new = _NEW.value
  if _COSTS_ONLY.value:
    with open(_OUT.value) as f:
      doc = json.load(f)
    doc["costs_stamp"] = machine_stamp()
    time_costs(doc, models, draft_cfg, draft_params)
    write_csv(doc)
    return
  doc = dict(stamp=machine_stamp(), meta=dict(
      prompt_set=PROMPT_SET, prompts=len(ids), prompt_width=width, max_new_tokens=new,
      target=config.target, draft=config.draft, dtype=config.dtype, seed=0, eos=None,
      chain_verifier="block",
      metric="tokens per target call = emitted tokens / loop steps, per prompt (row); "
             "mean over prompts with the 95% Student-t interval"), rows=[])

  def generate(proposer, temp, rows):
    """Decodes the prompts `rows` (None: all), padded to the whole set's width."""
    chosen = ids if rows is None else [ids[i] for i in rows]
    return loop.speculative_generate(
        Model(models.target_config, models.target_params), Model(draft_cfg, draft_params),
        chosen, spec=DecodeSpec(new, proposer, sampling=SamplingConfig(temp),
                                vocab_size=models.vocab_size),
        seed=0, row_ids=None if rows is None else np.asarray(rows), prompt_width=width)

  table = mix = None
  if _APPEND.value:
    with open(_OUT.value) as f:
      doc = json.load(f)
    table = doc["rank_table"]
    mix = mixture(np.asarray(table["per_prompt"]["hits"]),
                  np.asarray(table["per_prompt"]["reached"]))
  elif _RANK_TABLE_FROM.value:
    with open(_RANK_TABLE_FROM.value) as f:
      earlier = json.load(f)
    table = doc["rank_table"] = dict(earlier["rank_table"], source=_RANK_TABLE_FROM.value,
                                     source_stamp=earlier["stamp"])
    mix = mixture(np.asarray(table["per_prompt"]["hits"]),
                  np.asarray(table["per_prompt"]["reached"]))
  elif _RANK_TABLE.value:
    t0 = time.perf_counter()
    table = doc["rank_table"] = rank_table(generate)
    table["seconds"] = time.perf_counter() - t0
    mix = mixture(np.asarray(table["per_prompt"]["hits"]),
                  np.asarray(table["per_prompt"]["reached"]))
    print("rank table a[d, r] (pooled):\n" + "\n".join(
        " ".join(f"{x:.3f}" for x in row) for row in table["accept"]), flush=True)
    atomic_write_json(_OUT.value, doc)
  for label, kind, what, rule, temp in plan(table):
    t0 = time.perf_counter()
    if kind == "chain":
      per_row = generate(FixedGamma(what), temp, None)
      per_row = per_row.lengths / per_row.steps_per_row
      nodes = depth = what
      shapes = [TreeShape.chain(what)]
    else:
      per_row = np.zeros(len(ids))
      for rows, shape in what:
        out = generate(TreeProposal(shape, rule), temp, rows)
        per_row[slice(None) if rows is None else rows] = out.lengths / out.steps_per_row
      shapes = [shape for _, shape in what]
      nodes = shapes[0].call_nodes  # a dynamic tree's budget: the nodes of one target call
      depth = float(np.mean([sh.max_depth for sh in shapes]))  # folds' trees may differ
    mean, low, high = prompt_sets.mean_interval(per_row)
    row = dict(config=label, kind=kind, nodes=nodes, depth=depth, rule=rule,
               temperature=temp, tokens_per_call=mean, ci95=[low, high],
               per_prompt=[float(x) for x in per_row], seconds=time.perf_counter() - t0)
    if kind == "tree":
      row["paths"] = " | ".join(tree_shapes.paths_string(sh) for sh in shapes)
      if shapes[0].budget is not None:
        row["candidates"] = shapes[0].num_nodes
      if len(shapes) > 1:
        row["cross_fitted"] = "fold k (prompts i % 2 == k) decodes with the tree built from " \
                              "the other fold's rank tables"
    if mix is not None and temp == 0 and shapes[0].budget is None:
      row["model_tokens_per_call"] = float(np.mean(
          [tree_shapes.expected_tokens(sh, mix) for sh in shapes]))
    if _APPEND.value:
      row["stamp"] = machine_stamp()
      doc["rows"] = [r for r in doc["rows"] if (r["config"], r["rule"], r["temperature"])
                     != (label, rule, temp)]
    doc["rows"].append(row)
    print(f"{label:12s} N={nodes:2d} D={depth:g} {rule:7s} T={temp:g}: {mean:.3f} "
          f"[{low:.3f}, {high:.3f}]  ({row['seconds']:.0f} s)", flush=True)
    atomic_write_json(_OUT.value, doc)
  if _COSTS.value:  # after the decoding runs: v(k) up to the widest call, c
    time_costs(doc, models, draft_cfg, draft_params)
  write_csv(doc)


def time_costs(doc, models, draft_cfg, draft_params):
  """v(k) up to the widest call and c into doc['costs']; each row's predicted speedup."""
  widest = max(r["nodes"] for r in doc["rows"]) + 1
  t0 = time.perf_counter()
  v = studies.verify_cost_curve(models.target_params, models.target_config, batch=1,
                                context=128, max_tokens=widest, repeats=20)
  c = studies.cost_coefficient(models.target_params, models.target_config, draft_params,
                               draft_cfg, batch=1, context=128, repeats=20)
  doc["costs"] = dict(v={str(k): x for k, x in v.items()}, c=c, batch=1, context=128,
                      seconds=time.perf_counter() - t0)
  doc["timing_note"] = ("v(k) and c: load average (1, 5, 15 min) just before the timing "
                        "%s" % (tuple(round(x, 2) for x in os.getloadavg()),)
                        + ("; re-timed alone by `tree_study.py --costs_only` (costs_stamp)"
                           if "costs_stamp" in doc else ""))
  print(f"v = {doc['costs']['v']}\nc = {c:.3f}", flush=True)
  for row in doc["rows"]:
    row["predicted_speedup"] = row["tokens_per_call"] / (v[row["nodes"] + 1] + row["depth"] * c)
  atomic_write_json(_OUT.value, doc)


def write_csv(doc):
  """The rows of doc as a CSV beside --out."""
  header = ["config", "kind", "nodes", "depth", "rule", "temperature", "tokens_per_call",
            "ci95_low", "ci95_high", "predicted_speedup", "model_tokens_per_call", "paths"]
  atomic_write_csv(os.path.splitext(_OUT.value)[0] + ".csv", [header] + [
      [r["config"], r["kind"], r["nodes"], r["depth"], r["rule"], r["temperature"],
       f"{r['tokens_per_call']:.4f}", f"{r['ci95'][0]:.4f}", f"{r['ci95'][1]:.4f}",
       f"{r.get('predicted_speedup', float('nan')):.4f}",
       f"{r.get('model_tokens_per_call', float('nan')):.4f}", r.get("paths", "")]
      for r in doc["rows"]])


if __name__ == "__main__":
  _bootstrap.run(main)
