"""The prompt-set, distillation-curve, token-tree, γ-rule and soak sections of docs/results.md
(`results_page` puts them on the page).

  prompt_set     scripts/benchmark.py --config=configs/heldout_smollm2.py --out: {'stamp',
                 'meta', 'rows': [one per γ, verifier, each with 'prompts' and 'domains']}
  distill_curve  scripts/distill.py's workdir/report.json: {'stamp', 'config', 'eval_before',
                 'evals': [{'step', 'alpha_t0', '<corpus>/alpha_t0', ...}], ...}
  tree_study     scripts/tree_study.py --out: {'stamp', 'meta', 'rows': [one per chain or
                 tree, rule and T: 'tokens_per_call', 'ci95', 'predicted_speedup'], 'costs'}
  gamma_rules    scripts/gamma_policy_study.py --out: {'stamp', 'meta', 'rows': [one per
                 rule: 'speedup', 'below_095', ['below_097'], 'lowest', 'domains', 'prompts']}
  soak           scripts/soak.py --out: {'stamp', 'summary', 'record', 'config'}

Pure functions of the JSON, as the rest of the page; a missing optional field renders
as '–' or is left out, never an error.
"""

from __future__ import annotations

import re

from tools.results_format import (ALL, commit_short, costs_stamp, machine_groups, machine_of,
                                  machine_short, num, stamp_of, table, with_interval)


# --------------------------------------------------------------------------- prompt sets

def tree_of(doc: dict) -> str | None:
  """The token tree a prompt-set run drafted (config.tree), or None for chains."""
  return doc.get("meta", {}).get("config", {}).get("tree") or None


def prompt_set_settings(doc: dict) -> str:
  """The settings line: models, sampling, γ, prompt set, the machine's c and v(k)."""
  meta = doc["meta"]
  config = meta.get("config", {})
  def named(g):
    if g == "auto" and config.get("gamma_max") is not None:
      return f"auto (at most {config['gamma_max']})"
    return str(g)
  row_gammas = list(dict.fromkeys(str(r.get("gamma")) for r in doc.get("rows", [])))
  if len(row_gammas) > 1:  # a --gammas run: the rows, not the config's γ, say what ran
    gamma = "per row: " + ", ".join(named(g) for g in row_gammas)
  else:
    gamma = named(config.get("gamma", "–"))
  if tree_of(doc):  # a tree row drafts token trees instead of γ-token chains
    gamma = f"– (token tree `{config['tree']}`, rule `{config.get('tree_rule', '?')}`)"
  prompts = len(doc["rows"][0].get("prompts", [])) if doc.get("rows") else 0
  text = (f"Target `{config.get('target', '?')}`, draft `{config.get('draft', '?')}`, "
          f"temperature {num(config.get('temperature'), 'g')}, γ {gamma}, verifier "
          f"`{config.get('verifier', '?')}`, {config.get('max_new_tokens', '?')} new tokens, "
          f"seed {config.get('seed', '?')}, median of {config.get('repeats', '?')}; prompt set "
          f"`{meta.get('prompt_set') or config.get('prompt_set', '?')}` ({prompts} prompts, "
          f"each alone at batch {config.get('batch_size', 1)}"
          + (" as copies of itself" if config.get("batch_size", 1) != 1 else "") + ").")
  if meta.get("target_call_ms") is not None:
    text += f" One target call {meta['target_call_ms']:.2f} ms;"
  text += f" draft cost c = {num(meta.get('c'), '.3f')}"
  v = meta.get("verify_cost") or {}
  if v:
    text += ("; verify cost v(k) = " + ", ".join(f"{x:.2f}" for x in v.values())
             + f" for k = 1..{len(v)}")
  text += "."
  auto = meta.get("auto_cost_table")
  if auto and auto.get("step_costs"):
    text += (" γ auto chose from this machine's step costs s(γ) = "
             + ", ".join(f"{x:.2f}" for x in auto["step_costs"]) + " for γ = 0.."
             + f"{len(auto['step_costs']) - 1}.")
  elif auto:
    text += (f" γ auto chose from this machine's cost table: c = {num(auto.get('c'), '.3f')}, "
             "v(k) = " + ", ".join(f"{x:.2f}" for x in auto.get("verify_costs", [])) + ".")
  return text


def slowest(prompts: list[dict], domain: str) -> dict | None:
  """The prompt of `domain` (every prompt for 'all') with the lowest speedup, or None."""
  chosen = [p for p in prompts if domain == ALL or p.get("domain") == domain]
  chosen = [p for p in chosen if num(p.get("speedup"), "g") != "–"]
  return min(chosen, key=lambda p: p["speedup"]) if chosen else None


def _slowest_cell(prompts: list[dict], domain: str) -> str:
  p = slowest(prompts, domain)
  return "–" if p is None else f"{p['speedup']:.2f}x ({p.get('id', '?')})"


def histogram_line(histogram: dict | None) -> str | None:
  """'Steps per γ over all prompts: γ = 0: 1100, ...', or None without a histogram."""
  if not histogram:
    return None
  steps = sorted(histogram.items(), key=lambda kv: int(kv[0]))
  return ("Steps per γ over all prompts: "
          + ", ".join(f"γ = {g}: {n}" for g, n in steps) + ".")


def per_prompt_table(prompts: list[dict]) -> list[str]:
  """Every prompt, collapsed (a <details> block)."""
  rows = []
  for p in prompts:
    width = f" ({p['prompt_width']})" if p.get("prompt_width") is not None else ""
    domain = p.get("domain", "?") + (" (chat)" if p.get("chat") else "")
    rows.append([f"`{p.get('id', '?')}`", domain, f"{p.get('prompt_tokens', '?')}{width}",
                 str(p.get("tokens", "–")), with_interval(p, "speedup", ".2f", "x"),
                 num(p.get("acceptance_rate"), ".3f"),
                 num(p.get("alpha"), ".3f"), num(p.get("tokens_per_step"), ".2f")])
  return ([f"<details><summary>Per prompt ({len(prompts)})</summary>", ""]
          + table(["prompt", "domain", "prompt tokens (padded)", "new tokens", "speedup",
                   "accept", "α", "tokens/step"], rows) + ["", "</details>"])


# A prompt "loses" below this speedup: within timing noise of 1 it is not a loss.
LOSS_BELOW = 0.97


def _overall(r: dict) -> dict | None:
  """A row's overall (all prompts) domain entry, or None."""
  return next((d for d in r.get("domains", []) if d.get("domain") == ALL), None)


def _losses(r: dict) -> str:
  """'k of n' prompts of a row below LOSS_BELOW."""
  speedups = [p["speedup"] for p in r.get("prompts", [])
              if num(p.get("speedup"), "g") != "–"]
  return f"{sum(x < LOSS_BELOW for x in speedups)} of {len(speedups)}"


def gamma_comparison(doc: dict) -> list[str]:
  """Several γ rows run side by side: one line each (overall speedup, prompts below
  LOSS_BELOW, slowest prompt), then every prompt's speedup per γ (collapsed)."""
  rows = doc["rows"]
  label = [f"γ {r.get('gamma', '?')} ({r.get('verifier', '?')})" for r in rows]
  summary = []
  for name, r in zip(label, rows):
    overall = _overall(r) or {}
    summary.append([name, with_interval(overall, "speedup", ".2f", "x"),
                    with_interval(overall, "alpha", ".3f"), _losses(r),
                    _slowest_cell(r.get("prompts", []), ALL)])
  lines = ["", "Side by side, in one run (each prompt's samplers interleaved):", ""]
  lines += table(["γ", "speedup (geo. mean, 95%)", "α (mean, 95%)",
                  f"prompts below {LOSS_BELOW}x", "slowest prompt"], summary)
  by_id = [{p.get("id"): p for p in r.get("prompts", [])} for r in rows]
  ids = [p.get("id") for p in rows[0].get("prompts", [])]
  per = [[f"`{i}`", by_id[0][i].get("domain", "?")]
         + [num(table_.get(i, {}).get("speedup"), ".2f") for table_ in by_id] for i in ids]
  lines += ["", f"<details><summary>Speedup per prompt and γ ({len(ids)})</summary>", ""]
  lines += table(["prompt", "domain", *label], per) + ["", "</details>"]
  return lines


def prompt_set_table(doc: dict) -> list[str]:
  """Settings, the side-by-side comparison where several γ ran, then per γ and verifier:
  the per-domain table, the γ histogram, every prompt."""
  lines = [prompt_set_settings(doc)]
  if len(doc["rows"]) > 1:
    lines += gamma_comparison(doc)
  tree = tree_of(doc)
  for r in doc["rows"]:
    prompts = r.get("prompts", [])
    label = f"token tree `{tree}`" if tree else f"γ {r.get('gamma', '?')}"
    lines += ["", f"{label}, verifier `{r.get('verifier', '?')}`; predicted "
              f"speedup {num(r.get('predicted_speedup'), '.2f')}x.", ""]
    rows = []
    for d in r.get("domains", []):
      name = d.get("domain", "?")
      rows.append([f"**{name}**" if name == ALL else name, str(d.get("prompts", "–")),
                   with_interval(d, "speedup", ".2f", "x"), with_interval(d, "alpha", ".3f"),
                   num(d.get("acceptance"), ".3f"), _slowest_cell(prompts, name)])
    lines += table(["domain", "prompts", "speedup (geo. mean, 95%)", "α (mean, 95%)",
                    "accept", "slowest prompt"], rows)
    hist = histogram_line(r.get("gamma_histogram"))
    lines += ["", hist] if hist else []
    lines += ["", *per_prompt_table(prompts)] if prompts else []
  lines += peer_lines(doc.get("peer"))
  return lines


def peer_lines(peer: dict | None) -> list[str]:
  """`benchmark.py --peer` figures: ours against the peer's plain and assisted generation
  on the same pair, prompts and settings (geometric means over prompts, tokens/s)."""
  if not peer:
    return []
  v = peer.get("versions", {})
  rows = [[f"γ {r.get('gamma', '?')}", num(r.get("ours_ar"), ".2f"), num(r.get("ours_sd"), ".2f"),
           num(r.get("peer_plain"), ".2f"), num(r.get("peer_assisted"), ".2f"),
           num(r.get("sd_over_assisted"), ".2f") + "x", num(r.get("ar_over_plain"), ".2f") + "x"]
          for r in peer.get("rows", [])]
  return ["", f"Against transformers {v.get('transformers', '?')} (torch {v.get('torch', '?')}, "
          f"{v.get('threads', '?')} threads) on the same GGUF pair, token ids and settings, "
          f"timed after ours in the same run (`--peer=transformers`); tokens/s, geometric "
          f"means over prompts:", "",
          *table(["ours", "AR", "speculative", "transformers plain", "transformers assisted",
                  "ours spec. / assisted", "ours AR / plain"], rows)]


def prompt_set_headline(title: str, doc: dict) -> list[tuple[str, str]]:
  """Per γ and verifier: the overall speedup and α with intervals, and the slowest prompt."""
  out = []
  for r in doc["rows"]:
    overall = next((d for d in r.get("domains", []) if d.get("domain") == ALL), None)
    if overall is None and r.get("domains"):
      overall = r["domains"][-1]
    value = "no prompts"
    if overall is not None:
      tree = tree_of(doc)  # a tree records no α
      value = (f"{with_interval(overall, 'speedup', '.2f', 'x')} over "
               f"{overall.get('prompts', '?')} prompts, "
               + (f"acceptance {with_interval(overall, 'acceptance', '.3f')}" if tree
                  else f"α {with_interval(overall, 'alpha', '.3f')}"))
      worst = slowest(r.get("prompts", []), ALL)
      if worst is not None:
        value += f"; slowest prompt `{worst.get('id', '?')}` {worst['speedup']:.2f}x"
      if len(doc["rows"]) > 1:
        value += f"; {_losses(r)} prompts below {LOSS_BELOW}x"
    figure = f"{title}: speedup over autoregressive (geometric mean, 95%)"
    if len(doc["rows"]) > 1:
      figure += f" at γ = {r.get('gamma', '?')} ({r.get('verifier', '?')})"
    out.append((figure, value))
  return out


# --------------------------------------------------------------------------- distillation

ALPHA_KEY = re.compile(r"^(?:(?P<corpus>[^/]+)/)?alpha_t(?P<t>[0-9.]+)$")


def distill_points(doc: dict) -> list[dict]:
  """[{step, tokens (or None), alpha: {(corpus, T): α}}]: before training (step 0, from
  eval_before) and every evaluation; corpus 'all' = the unprefixed mean."""
  config = doc.get("config", {})
  per_step = (config["batch_size"] * config["seq_len"]
              if config.get("batch_size") and config.get("seq_len") else None)
  evals = ([{"step": 0, **doc["eval_before"]}] if doc.get("eval_before") else [])
  evals += doc.get("evals", [])
  points = []
  for e in evals:
    alpha = {}
    for k, v in e.items():
      m = ALPHA_KEY.match(k)
      if m and v is not None:
        alpha[(m["corpus"] or ALL, float(m["t"]))] = v
    points.append(dict(step=int(e.get("step", 0)), alpha=alpha,
                       tokens=None if per_step is None else int(e.get("step", 0)) * per_step))
  return points


def curve_axes(points: list[dict]) -> tuple[list[str], list[float]]:
  """(corpora in order of first appearance, 'all' last; temperatures ascending)."""
  corpora = list(dict.fromkeys(c for p in points for c, _ in p["alpha"] if c != ALL))
  if any(c == ALL for p in points for c, _ in p["alpha"]):
    corpora.append(ALL)
  temps = sorted({t for p in points for _, t in p["alpha"]})
  return corpora, temps


def _duration(seconds: float) -> str:
  return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _tokens(n: int | None) -> str:
  return "–" if n is None else f"{n:,}"


def distill_settings(doc: dict) -> str:
  """What was trained, on what, for how long."""
  config = doc.get("config", {})
  text = (f"Draft kind `{doc.get('draft_kind', '?')}` ({num(doc.get('draft_params'), ',')} "
          f"params), loss `{doc.get('loss', config.get('loss', '?'))}` at training temperature "
          f"{num(doc.get('temperature', config.get('temperature')), 'g')}, target "
          f"`{doc.get('target', config.get('target', '?'))}`; {doc.get('steps', '?')} steps of "
          f"{config.get('batch_size', '?')} x {config.get('seq_len', '?')} target tokens")
  if config.get("corpora"):
    text += f" from `{config['corpora']}`"
  if doc.get("training_time_s") is not None:
    text += f"; {_duration(doc['training_time_s'])} of training"
    if doc.get("feature_cache_s"):
      text += f" after {_duration(doc['feature_cache_s'])} building the target-output cache"
  text += (f". Held-out α = mean Σ min(p, q) over {config.get('eval_windows', '?')} windows per "
           "corpus at the first drafted position; step 0 is before training.")
  return text


def depth_line(points: list[dict], doc: dict) -> str | None:
  """α at deeper drafted positions at the last evaluation ('all'), if the report has them."""
  if not doc.get("evals"):
    return None
  last = doc["evals"][-1]
  found = sorted((float(m[1]), int(m[2]), v) for k, v in last.items()
                 if (m := re.match(r"^alpha_t([0-9.]+)_d(\d+)$", k)) and v is not None)
  if not found:
    return None
  return ("At the last evaluation, α over all corpora at drafted depth k: "
          + "; ".join(f"T = {t:g}, k = {k}: {v:.3f}" for t, k, v in found) + ".")


def distill_table(doc: dict) -> list[str]:
  """Settings, then one table per temperature: α per corpus against steps and tokens."""
  points = distill_points(doc)
  corpora, temps = curve_axes(points)
  lines = [distill_settings(doc)]
  for t in temps:
    rows = [[f"{p['step']}" + (" (before)" if p["step"] == 0 else ""), _tokens(p["tokens"])]
            + [num(p["alpha"].get((c, t)), ".3f") for c in corpora] for p in points]
    lines += ["", f"α at T = {t:g}{' (greedy)' if t == 0 else ''}:", ""]
    lines += table(["step", "target tokens"] + [f"**{c}**" if c == ALL else c for c in corpora],
                   rows)
  depth = depth_line(points, doc)
  lines += ["", depth] if depth else []
  return lines


def distill_headline(title: str, doc: dict) -> list[tuple[str, str]]:
  """The final α per corpus at T = 0 (the lowest temperature the report has)."""
  points = [p for p in distill_points(doc) if p["alpha"]]
  if not points:
    return [(title, "no evaluation")]
  corpora, temps = curve_axes(points)
  last, t = points[-1], temps[0]
  value = ", ".join(f"{c} {num(last['alpha'].get((c, t)), '.3f')}" for c in corpora)
  value += f" after {last['step']} steps"
  value += f" ({_tokens(last['tokens'])} target tokens)" if last["tokens"] is not None else ""
  return [(f"{title}: final held-out α at T = {t:g}", value)]


def plot_distill_curve(ax, doc: dict) -> None:
  """α against training tokens (steps without the config), one line per corpus and T."""
  points = distill_points(doc)
  corpora, temps = curve_axes(points)
  shown = [c for c in corpora if c != ALL] or corpora
  use_tokens = all(p["tokens"] is not None for p in points)
  colours = {c: f"C{i}" for i, c in enumerate(shown)}
  for c in shown:
    for j, t in enumerate(temps):
      xy = [(p["tokens"] if use_tokens else p["step"], p["alpha"][(c, t)])
            for p in points if (c, t) in p["alpha"]]
      if xy:
        ax.plot(*zip(*xy), "o-" if j == 0 else "x--", color=colours[c], label=f"{c} T={t:g}")
  ax.set_xlabel("target tokens seen in training" if use_tokens else "training step")
  ax.set_ylabel("held-out α")
  ax.set_ylim(0, 1)


# --------------------------------------------------------------------------- token trees

def _tree_cell(row: dict) -> str:
  low, high = (row.get("ci95") or [None, None])[:2]
  est = num(row.get("tokens_per_call"), ".2f")
  return est if low is None else f"{est} [{num(low, '.2f')}, {num(high, '.2f')}]"


def _tree_rows(rows: list[dict], costs: dict, timed: bool) -> list[str]:
  """One table of chains and trees; v(N+1) and the prediction only where `timed` (the rows
  were counted on the machine that timed the costs)."""
  header = ["shape", "nodes N", "depth D", "rule", "T", "tokens per target call [95%]",
            "rank model"] + (["v(N+1)", "predicted speedup"] if timed else [])
  body = []
  for r in rows:
    row = [r["config"], str(r["nodes"]), str(r["depth"]), r["rule"], f"{r['temperature']:g}",
           _tree_cell(r), num(r.get("model_tokens_per_call"), ".2f")]
    if timed:
      speedup = r.get("predicted_speedup")
      row += [num(costs.get("v", {}).get(str(r["nodes"] + 1)), ".2f"),
              num(speedup, ".2f") + ("x" if speedup else "")]
    body.append(row)
  return table(header, body)


def tree_table(doc: dict) -> list[str]:
  """Tokens per target call (95% interval over prompts), the rank model's prediction at
  T = 0 and the predicted speedup from v(N+1) and c, per chain or tree, rule and
  temperature, one table per machine that counted them (the prediction only beside rows
  of the machine that timed v and c); then the rank table a[d, r] the best-first trees
  come from."""
  meta, costs = doc.get("meta", {}), doc.get("costs", {})
  top, timer = stamp_of(doc), costs_stamp(doc)
  lines = [f"Prompt set `{meta.get('prompt_set', '?')}` ({meta.get('prompts', '?')} prompts "
           f"in one batch), {meta.get('max_new_tokens', '?')} new tokens, draft "
           f"`{meta.get('draft', '?')}` alone (no lookup), seed {meta.get('seed', '?')}."]
  groups = machine_groups(doc)
  untimed = [s for s, _ in groups if machine_of(s) != machine_of(timer)]
  split = len(groups) > 1 or bool(untimed)  # then each table names its machine
  for stamp, rows in groups:
    timed = machine_of(stamp) == machine_of(timer)
    if split:
      commits = ", ".join(dict.fromkeys(commit_short(r.get("stamp") or top) for r in rows))
      lines += ["", f"Counted on {machine_short(stamp)}, at {commits}"
                + ("." if timed else f"; no v(N+1) or predicted speedup: v(k) and c were "
                   f"timed on another machine ({machine_short(timer)}), and one table "
                   "holds one machine's figures.")]
    lines += ["", *_tree_rows(rows, costs, timed)]
  best = [r for r in doc.get("rows", []) if r.get("paths") and r["config"].startswith("best")]
  if best:
    lines += ["", "Best-first trees (rank paths, `tree_shapes.parse_tree`; where two are given, "
              "each fold of the prompts decodes with the tree built from the other fold's "
              "rank tables): "
              + "; ".join(f"{r['config']}: `{r['paths']}`" for r in best
                          if r["temperature"] == best[0]["temperature"])]
  dynamic = [r for r in doc.get("rows", []) if r.get("candidates")]
  if dynamic:
    lines += ["", "Dynamic trees (`TreeShape.budget`, rule 'topk'): each step a row sends to "
              "the target only the N of the candidate tree's nodes with the largest draft "
              "path probability (logits / `tree_drafting.SELECTION_TEMPERATURE`); the "
              "candidates are the best-first tree named, cross-fitted as above; D is the "
              "deepest candidate, and D c undercounts their draft calls, which cover every "
              "candidate of a depth. Rows added by `tree_study.py --append` carry their own "
              "stamp (commit, command): "
              + "; ".join(f"{r['config']}: {commit_short(r['stamp'])}"
                          for r in dynamic if r.get("stamp"))]
  ranks = doc.get("rank_table")
  if ranks:
    acc = ranks["accept"]
    probe = ranks.get("probe", {})
    header = ["depth"] + [f"rank {k}" for k in range(len(acc[0]))]
    body = []
    pooled_last = len(acc) < len(ranks.get("reached", acc))
    for d, row in enumerate(acc, 1):
      label = f"{d}+" if pooled_last and d == len(acc) else str(d)
      body.append([label] + [num(x, ".3f") for x in row])
    where = f", counted on {machine_short(top)}" if split else ""
    lines += ["", f"Rank table a[d, r] = P(the target's token is the draft's rank-r choice at "
              f"depth d | depth d reached), T = 0, from a caterpillar probe tree "
              f"({probe.get('width', '?')} children per rank-0 node, depth "
              f"{probe.get('depth', '?')}; depths reached by fewer than "
              f"{ranks.get('min_reached', '?')} steps pooled), over all prompts{where}; depths "
              f"reached: {ranks.get('reached')}.", ""]
    lines += table(header, body)
  if costs:
    lines += ["", f"Predicted speedup{_costs_note(doc)} = tokens per call / (v(N+1) + D c), c = "
              f"{num(costs.get('c'), '.3f')}, v(k) of the target at batch "
              f"{costs.get('batch', '?')}, context {costs.get('context', '?')}. Rank model = "
              f"`tree_shapes.expected_tokens` under the rank table."]
    if untimed:
      lines[-1] += (" The v(k) timed: " + ", ".join(
          f"v({k}) = {num(x, '.2f')}" for k, x in costs.get("v", {}).items()) + ".")
  if doc.get("timing_note"):
    lines += ["", doc["timing_note"]]
  return lines


def _costs_note(doc: dict) -> str:
  """' (timed on <machine> at <commit>)' where v(k) and c were re-timed apart from the rows."""
  stamp = doc.get("costs_stamp")
  return f" (timed on {machine_short(stamp)}, at {commit_short(stamp)})" if stamp else ""


def tree_headline(title: str, doc: dict) -> list[tuple[str, str]]:
  """The best tree's tokens per call over the best chain's, at each temperature, among the
  rows counted on the file's machine; the same for the predicted speedup where that machine
  also timed v and c."""
  top = stamp_of(doc)
  rows = [r for r in doc.get("rows", [])
          if machine_of(r.get("stamp") or top) == machine_of(top)]
  keys = [("tokens_per_call", "best tree's tokens per target call over the best chain's",
           _tree_cell)]
  if machine_of(costs_stamp(doc)) == machine_of(top):
    keys.append(("predicted_speedup", "predicted speedup from v(N+1) and c, fastest tree "
                 "over fastest chain", lambda r: f"{r['predicted_speedup']:.2f}x"))
  out = []
  for t in sorted({r["temperature"] for r in rows}):
    at_t = [r for r in rows if r["temperature"] == t]
    chains = [r for r in at_t if r["kind"] == "chain"]
    trees = [r for r in at_t if r["kind"] == "tree"]
    if not chains or not trees:
      continue
    for key, what, cell in keys:
      if not all(r.get(key) for r in at_t):
        continue
      chain = max(chains, key=lambda r: r[key])
      tree = max(trees, key=lambda r: r[key])
      out.append((f"{title}, T = {t:g}: {what}",
                  f"{tree[key] / chain[key]:.2f}x ({tree['config']} {tree['rule']}: "
                  f"{cell(tree)}; {chain['config']}: {cell(chain)})"))
  return out or [(title, "no rows")]


# --------------------------------------------------------------------------- γ rules

def gamma_rules_table(doc: dict) -> list[str]:
  """Each γ rule's replayed speedup over the held-out set (geometric mean, 95% interval),
  per domain, the prompts below 0.95x; then the costs it used and the check against a
  measured benchmark."""
  meta = doc.get("meta", {})
  config = meta.get("config", {})
  rows = doc.get("rows", [])
  domains = [d["domain"] for d in rows[0]["domains"] if d["domain"] != ALL] if rows else []
  temperature = float(meta.get("temperature", 0.0) or 0.0)
  sampled = temperature > 0
  how = (f"T = {temperature:g}, each prompt's trace walked {meta.get('replicates', '?')} times"
         if sampled else "greedy")
  lines = [f"Prompt set `{config.get('prompt_set', '?')}`, draft `{config.get('draft', '?')}`, "
           f"{how}, {meta.get('max_new_tokens', '?')} new tokens, γ at most "
           f"{meta.get('gamma_max', '?')}; predicted speedup = tokens / Σ s(γ) over each "
           "replayed decode" + (" (geometric mean over the walks)." if sampled else "."), ""]
  body = []
  for r in rows:
    by = {d["domain"]: d for d in r["domains"]}
    body.append([r["rule"], with_interval(by.get(ALL, {}), "speedup", ".2f", "x")]
                + [num(by[d]["speedup"], ".2f") for d in domains]
                + [str(r["below_095"]), str(r.get("below_097", "–")), num(r["lowest"], ".2f")]
                + ([num(r.get("drafting_steps"), ".1f")] if sampled else []))
  lines += table(["rule", "speedup [95%]"] + domains
                 + ["prompts < 0.95x", "prompts < 0.97x", "lowest"]
                 + (["drafting steps per prompt"] if sampled else []), body)
  if sampled and meta.get("traces"):
    traces = meta["traces"]
    spreads = [t["spread"] for t in traces]
    lines += ["", f"Spread of β over a prompt's drafted positions, as a share of α(1 − α): "
              f"{num(meta.get('beta_spread'), '.2f')} over the set (per prompt "
              f"{min(spreads):.2f} to {max(spreads):.2f}); α per prompt "
              f"{min(t['alpha'] for t in traces):.2f} to {max(t['alpha'] for t in traces):.2f}, "
              f"{min(t['positions'] for t in traces)} to "
              f"{max(t['positions'] for t in traces)} positions each."]
  costs = meta.get("costs", {})
  if costs:
    lookup = costs.get("lookup_step_costs") or []  # none for a draft with no lookup
    lines += ["", "Step costs s(γ) in plain steps, γ = 0, 1, ...: draft model "
              + " / ".join(num(x, ".2f") for x in costs.get("step_costs", []))
              + ("; lookup steps " + " / ".join(num(x, ".2f") for x in lookup) if lookup else "")
              + "."]
  catch_up = meta.get("catch_up")
  if catch_up:
    owed = [r.get("catch_up_per_prompt") for r in rows if r["rule"] == "auto"]
    lines += ["", f"Catch-up: the draft feeds the tokens it skipped in calls of "
              f"{catch_up['width']} tokens, each {num(catch_up['cost'], '.3f')} plain steps, "
              "charged to the step on which it drafts again"
              + (f" ({num(owed[0], '.2f')} plain steps per prompt under 'auto')"
                 if owed and owed[0] is not None else "") + "."]
  measured = meta.get("measured")
  if measured:
    lines += ["", f"Against the measured per-prompt speedups of `{measured.get('file')}`: "
              f"correlation {num(measured.get('correlation'), '.2f')}, measured / replayed "
              f"{num(measured.get('mean_ratio'), '.3f')} on average (rule 'auto')."]
  return lines


def gamma_rules_headline(title: str, doc: dict) -> list[tuple[str, str]]:
  """The committed rule's replayed speedup beside the best fixed γ and the oracle."""
  rows = {r["rule"]: r for r in doc.get("rows", [])}
  if "auto" not in rows:
    return [(title, "no rows")]

  def overall(r):
    return next(d for d in r["domains"] if d["domain"] == ALL)

  fixed = [r for name, r in rows.items() if re.fullmatch(r"fixed-\d+", name)]  # fixed-γ
  parts = [f"'auto' {with_interval(overall(rows['auto']), 'speedup', '.2f', 'x')}"]
  if fixed:
    best = max(fixed, key=lambda r: r["speedup"])
    parts.append(f"best fixed γ ({best['rule']}) {best['speedup']:.2f}x")
  for name in ("one-estimate", "oracle"):
    if name in rows:
      parts.append(f"'{name}' {rows[name]['speedup']:.2f}x")
  return [(title + ": predicted speedup over the set", "; ".join(parts))]


def profile_step_table(doc: dict) -> list[str]:
  """scripts/profile_step.py --out: each timed piece, then the step's split."""
  unit = doc["plain_steps"]
  lines = [f"γ {doc['gamma']}, context {doc['context']} tokens, T = {doc['temperature']:g}, "
           f"{doc['steps']} loop steps per timed call, median of {doc['repeats']} rounds; "
           f"{doc['tokens_per_step']:.2f} tokens per step in the timed steps.", ""]
  lines += table(["piece", "ms", "plain steps"],
                 [[name, num(s * 1e3, ".2f"), num(unit[name], ".3f")]
                  for name, s in doc["seconds"].items()])
  step = unit["chain step"]
  lines += ["", f"The chain step, {step:.2f} plain steps, split:", ""]
  lines += table(["part", "plain steps", "share"],
                 [[name, num(value, ".3f"), f"{value / step:.0%}"]
                  for name, value in doc["split"].items()])
  model = doc["modelled_step"]  # `adaptive.step_cost`, as the script computed it
  per_call = step / unit["target call, 1 token"]
  lines += ["", f"c = {doc['c']:.3f}, v({doc['gamma'] + 1}) = {doc['v']:.2f}: γc + v = "
            f"{model:.2f} target-call times, and the step takes {per_call:.2f} of them "
            f"({per_call / model - 1:+.0%})."]
  prefill = doc["prefill"]
  lines += ["", f"Prefill at {prefill['width']} tokens: the target's {prefill['target']:.2f} "
            f"plain steps, the draft's {prefill['draft']:.2f} more. A prompt that never "
            f"drafts after one probe step decodes its {prefill['new_tokens']} tokens at "
            f"about {prefill['never_drafting_floor']:.3f}x plain decoding's speed: the "
            f"floor of gamma 'auto' in a whole-generation timing."]
  return lines


def profile_step_headline(title: str, doc: dict) -> list[tuple[str, str]]:
  """The step in plain steps, its model's figure and the rest."""
  unit, split = doc["plain_steps"], doc["split"]
  per_call = unit["chain step"] / unit["target call, 1 token"]
  model = doc["modelled_step"]
  rest = next(v for k, v in split.items() if k.startswith("the rest"))
  return [(title, f"step {per_call:.2f} target-call times against γc + v = {model:.2f}; "
                  f"target call {split['target call'] / unit['chain step']:.0%}, draft calls "
                  f"{split['draft calls'] / unit['chain step']:.0%}, the rest "
                  f"{rest / unit['chain step']:.0%}")]


def head_study_table(doc: dict) -> list[str]:
  """scripts/head_study.py --out: α, coverage, c and the predicted speedup per head size."""
  v = " ".join(f"{k}: {x:.2f}" for k, x in doc["verify_costs"].items())
  lines = [f"{doc['prompts']} prompts ({doc['prompt_set'] or 'the config prompts'}), their "
           f"greedy answers of up to {doc['max_new_tokens']} tokens ({doc['answer_tokens']} "
           f"answer tokens); calls timed at context {doc['context']}, median of "
           f"{doc['repeats']} rounds; target call {doc['target_call_seconds'] * 1e3:.1f} ms, "
           f"v(k) {v}; head tokens from `{doc['head_tokens']}`.", ""]

  def best(speedups):
    g = max(speedups, key=speedups.get)
    return f"{speedups[g]:.2f}x at γ = {g}"

  lines += table(["head", "answer tokens inside", "α at T = 0", "α at T = 1", "c",
                  "predicted, T = 0", "predicted, T = 1"],
                 [["full (" + f"{r['head_size']:,}" + ")" if r["full"] else f"{r['head_size']:,}",
                   f"{r['coverage']:.1%}", num(r["alpha_t0"], ".3f"), num(r["alpha_t1"], ".3f"),
                   num(r["c"], ".3f"), best(r["predicted_speedup"]["t0"]),
                   best(r["predicted_speedup"]["t1"])] for r in doc["rows"]])
  lines += ["", "Predicted: E(α, γ) / (γc + v(γ+1)) at the best γ of 1..4 (a chain of the "
            "independent draft; a prediction from the measured α, c and v, not a timed run)."]
  return lines


def head_study_headline(title: str, doc: dict) -> list[tuple[str, str]]:
  """The full head beside the subset with the best predicted speedup at T = 0."""
  def pred(r):
    return max(r["predicted_speedup"]["t0"].values())

  full = next(r for r in doc["rows"] if r["full"])
  top = max((r for r in doc["rows"] if not r["full"]), key=pred)
  return [(title, f"C = {top['head_size']:,}: c {top['c']:.3f} against {full['c']:.3f} for the "
                  f"full head, α at T = 0 {top['alpha_t0']:.3f} against "
                  f"{full['alpha_t0']:.3f}; predicted {pred(top):.2f}x against "
                  f"{pred(full):.2f}x")]


# --------------------------------------------------------------------------- soak

def soak_table(doc: dict) -> list[str]:
  """scripts/soak.py --out: {'stamp', 'summary', 'record': [one per call], 'config'}. The
  summary in one row: the decode loops compiled and the resident memory after the first
  call and at the end."""
  s, config = doc["summary"], doc["config"]
  lines = [f"Target `{config['target']}`, draft `{config['draft']}`, γ `{config['gamma']}`, "
           f"batch {config['batch_size']}, {config['max_new_tokens']} new tokens a call, "
           f"temperature {config['temperature']:g}; acceptance in the last call "
           f"{s['acceptance']:.3f}.", ""]
  return lines + table(
      ["calls", "steps", "tokens", "seconds", "decode loops compiled (after call 1 / at the end)",
       "resident memory (after call 1 → end)", "largest drift"],
      [[str(s["calls"]), str(s["steps"]), str(s["tokens"]), f"{s['seconds']:.0f}",
        f"{s['compiled_after_first_call']} / {s['compiled_at_end']}",
        f"{s['rss_after_first_call_mb']:.0f} → {s['rss_at_end_mb']:.0f} MB",
        f"{s['rss_max_drift']:.2%}"]])


def soak_headline(title: str, doc: dict) -> list[tuple[str, str]]:
  """Compiles and memory drift over the run."""
  s = doc["summary"]
  return [(title, f"{s['tokens']} tokens in {s['calls']} calls: decode loops compiled "
                  f"{s['compiled_after_first_call']} after call 1, {s['compiled_at_end']} at "
                  f"the end; resident memory drift at most {s['rss_max_drift']:.2%}")]
