"""The tables of compile plans (scripts/tpu_plan.py --out: kind 'tpu_plan') for
docs/results.md and the README block (tools/results_page.py).

A plan: {'stamp', 'meta', 'programs': [one per compiled program], 'failures',
'pieces', 'layouts', 'chips': {key: figures and source}, 'roofline': {key: v, c, s(γ),
'predicted'}}.
"""

from __future__ import annotations

from tools.results_format import num, table


def _gb(n: float) -> str:
  return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _yes(value) -> str:
  return "–" if value is None else "yes" if value else "**no**"


def tpu_plan_table(doc: dict) -> list[str]:
  meta = doc["meta"]
  shapes = meta["shapes"]
  lines = [f"Config `{meta['config']}` on `{meta['topology']}` ({meta['devices']} × "
           f"{meta['device_kind']}), {meta['dtype']}, batch {shapes['batch']}, prompt width "
           f"{shapes['prompt_width']}, {shapes['max_new_tokens']} new tokens, T = "
           f"{shapes['temperature']:g}; compiled from shapes by libtpu on a CPU, nothing run"
           + (f"; mesh {meta['mesh']}" if meta.get("mesh") else "") + ".", ""]
  rows = []
  for p in doc["programs"]:
    place = "–"
    if "in_place" in p:
      place = (f"{_yes(p['in_place'])}: copies per step {p['target_cache_copies']} of the "
               f"target cache, {p['draft_cache_copies']} of the draft's"
               + (f" ({_gb(p['cache_copy_bytes_per_step'])} a step)" if not p["in_place"]
                  else "")
               + f"; per call {p['target_cache_copies_per_call']} and "
               f"{p['draft_cache_copies_per_call']}")
      on_chip = p.get("target_cache_copies_on_chip", 0) + p.get("draft_cache_copies_on_chip", 0)
      if on_chip:
        place += f"; relaid out on chip per step {on_chip} (no HBM bytes)"
      if not p["temp_below_cache"]:
        big = ", ".join(f"{c['shape']} {_gb(c['bytes'])}" for c in p["largest_copies_per_call"][:2])
        place += (f"; temporaries {_gb(p['temp_bytes'])} ≥ one cache "
                  f"{_gb(p['target_cache_bytes'])} (largest per-call copies: {big})")
    rows.append([p["name"], num(p["compile_seconds"], ".1f") + " s", _gb(p["argument_bytes"]),
                 _gb(p["temp_bytes"]), _gb(p["total_bytes"]), _yes(p.get("fits")), place])
  lines += table(["program", "compile", "arguments", "temporaries", "total per chip",
                  "fits HBM", "caches in place"], rows)
  if doc["failures"]:
    lines += ["", "Paths not compiled:", ""]
    lines += [f"- {f['path']}: " + (f"refused by the draft ({f['refused']})" if "refused" in f
                                    else f"**failed** ({f['error']})") for f in doc["failures"]]
  lay = doc.get("layouts", {})
  if {"input_major", "serving"} <= set(lay):
    a, b = lay["input_major"], lay["serving"]
    lines += ["", "Layouts of the one-token target call (2 layers, per layer): input-major "
              f"{_gb(a['traffic'])} of HBM traffic, {_gb(a['bytes_accessed'])} by XLA's count, "
              f"{a['flops'] / 1e6:.1f} Mflop; the CPU serving layout {_gb(b['traffic'])}, "
              f"{_gb(b['bytes_accessed'])}, {b['flops'] / 1e6:.1f} Mflop."]
  lines += ["", f"Roofline of one step (`{meta.get('roofline_draft')}` as the draft; context "
            f"{shapes['prompt_width'] + shapes['max_new_tokens']} tokens; per-call term "
            f"{meta.get('call_overhead_us', 0):g} µs)"
            + (f", predicted at the α and tokens per step of `{meta['from_file']}`"
               if meta.get("from_file") else "") + ":", ""]
  rows = []
  for key, entry in doc["roofline"].items():
    chip = doc["chips"][key]
    v = entry["v"]
    g = entry.get("predicted", {}).get("geomean", {})
    rows.append([f"[{chip['name']}]({chip['source']})", entry["bound"],
                 num(entry["target_seconds"] * 1e6, ".1f"), num(entry["c"], ".3f"),
                 *[num(v[k], ".2f") if k in v else "–" for k in ("2", "4", "8", "17")],
                 num(entry["step_costs"][min(3, len(entry["step_costs"]) - 1)], ".2f"),
                 num(g.get("auto"), ".2f") + "x" if g.get("auto") else "–",
                 num(g.get("fixed"), ".2f") + "x" if g.get("fixed") else "–",
                 num(g.get("cpu_speedup"), ".2f") + "x" if g.get("cpu_speedup") else "–"])
  lines += table(["chip", "bound", "t(1) µs", "c", "v(2)", "v(4)", "v(8)", "v(17)", "s(3)",
                  "predicted γ auto", "predicted the file's γ", "measured on CPU"], rows)
  if meta.get("measured_on_device") is None:
    lines += ["", "No TPU or GPU was available to this run: the roofline is not checked "
              "against a timing on any chip."]
  return lines


def tpu_plan_headline(title: str, doc: dict) -> list[tuple[str, str]]:
  programs = doc["programs"]
  failed = sum("error" in f for f in doc["failures"])
  loops = [p for p in programs if "in_place" in p]
  target_kept = sum(p["target_cache_copies"] == 0 for p in loops)
  fits = [p for p in programs if p.get("fits") is not None]
  value = (f"{len(programs)} programs compile, {failed} fail; {sum(p['fits'] for p in fits)} "
           f"of {len(fits)} fit; target cache in place in {target_kept} of {len(loops)} loops, "
           f"both caches in {sum(p['in_place'] for p in loops)}")
  chip = next((k for k, c in doc["chips"].items() if c["name"] == doc["meta"]["chip"]), None)
  predicted = doc["roofline"].get(chip, {}).get("predicted") if chip else None
  if predicted:
    g = predicted["geomean"]
    value += (f"; roofline γ auto {g['auto']:.2f}x on {doc['meta']['chip']} (CPU measured "
              f"{g['cpu_speedup']:.2f}x)")
  return [(title, value)]
