"""docs/results.md and the README's "What to expect" block are generated from the stamped
result JSON of docs/results/ (tools/results_page.py); no jax needed."""

import copy
import io
import json
import pathlib

import pytest

from tools import results_format, results_page

REPO = pathlib.Path(__file__).resolve().parent.parent

STAMP = dict(cpu="AMD EPYC", isa=["avx", "fma"], cores=2, memory_gb=23.5, os="Linux-6-x86_64",
             devices=[dict(platform="cpu", kind="cpu", count=1)], accelerator=None,
             python="3.11.7", jax="0.10.2", jaxlib="0.10.2", git_commit="ab12cd3" + "0" * 33,
             git_dirty=False, date_utc="2026-11-30T18:00:00Z",
             command="python scripts/benchmark.py --config=configs/tiny.py --gammas=1,2 "
                     "--out=docs/results/benchmark_tiny.json")
ROW = dict(gamma=1, verifier="block", ar_tokens_per_s=100.0, sd_tokens_per_s=150.0, speedup=1.5,
           acceptance_rate=0.5, alpha=0.5, tokens_per_step=1.5, predicted_tokens_per_step=1.5,
           predicted_speedup=1.4)
BENCHMARK = dict(stamp=STAMP, rows=[ROW, dict(ROW, gamma=2, speedup=1.25)], meta=dict(
    target_call_ms=2.5, c=0.5, verify_cost={"1": 1.0, "2": 1.2, "3": 1.4},
    config=dict(target="random_tiny", draft="truncate:1", temperature=1.0, top_k=0, top_p=1.0,
                batch_size=4, max_new_tokens=64, seed=0, repeats=5, gamma=2)))


def make_root(tmp_path, docs: dict) -> pathlib.Path:
  """A repository-shaped folder: a README with the markers and the given result files."""
  (tmp_path / "README.md").write_text(
      f"# x\n\n{results_page.BEGIN}\n{results_page.END}\n\nafter\n")
  for rel, doc in docs.items():
    path = tmp_path / results_page.RESULTS_DIR / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
  return tmp_path


def test_committed_page_and_readme_match_their_json():
  """`make results` on the committed JSON gives the committed Markdown, byte for byte."""
  assert results_page.stale(REPO) == [], "run `make results` and commit the result"


# Result files that a doc cites instead of a section of the page: {file: the doc citing it}.
CITED_ONLY = {"matrix_products_cpu2.json": "docs/design.md"}


def test_every_result_file_has_a_stamp_and_a_section():
  """Every JSON under docs/results/ is a section's file, or one a doc cites (CITED_ONLY),
  and carries a stamp naming its command, machine and commit."""
  directory = REPO / results_page.RESULTS_DIR
  files = {p.relative_to(directory).as_posix() for p in directory.rglob("*.json")}
  assert files - {s.path for s in results_page.SECTIONS} == set(CITED_ONLY)
  for name, doc in CITED_ONLY.items():
    assert f"{results_page.RESULTS_DIR}/{name}" in (REPO / doc).read_text()
  for name in sorted(files):
    stamp = results_format.stamp_of(json.loads((directory / name).read_text()))
    assert stamp["command"].startswith("python ") and stamp["cpu"] and stamp["git_commit"], name


def test_page_names_command_machine_and_commit(tmp_path):
  root = make_root(tmp_path, {"benchmark_tiny.json": BENCHMARK})
  files = results_page.expected_files(root)
  page, readme = files[results_page.PAGE], files[results_page.README]
  assert f"- Command: `{STAMP['command']}`" in page
  assert "AMD EPYC; 2 cores; ISA avx, fma" in page
  assert "commit ab12cd3; jax 0.10.2" in page
  assert "| 2 | block | 100.0 | 150.0 | **1.25x** |" in page
  assert "| AMD EPYC, 2 cores, AVX, no AVX2 | ab12cd3 |" in readme
  assert "1.25x at the config's γ = 2; best 1.50x at γ = 1" in readme
  assert readme.startswith("# x\n\n") and readme.endswith(f"{results_page.END}\n\nafter\n")
  assert "Not measured yet: `python scripts/measure_results.py --only=smollm2`" in page
  # regenerating is a pure function of the JSON; an edited figure shows up
  assert results_page.expected_files(root) == files
  edited = copy.deepcopy(BENCHMARK)
  edited["rows"][1]["speedup"] = 1.3
  other = results_page.expected_files(make_root(tmp_path, {"benchmark_tiny.json": edited}))
  assert other[results_page.PAGE] != page


def test_stale_page_is_reported(tmp_path):
  root = make_root(tmp_path, {"benchmark_tiny.json": BENCHMARK})
  results_page.write(root, plots=False)
  assert results_page.stale(root) == []
  (root / results_page.PAGE).write_text("typed by hand\n")
  assert results_page.stale(root) == [results_page.PAGE]


def test_result_without_stamp_or_readme_without_markers_is_refused(tmp_path):
  unstamped = {k: v for k, v in BENCHMARK.items() if k != "stamp"}
  with pytest.raises(ValueError, match="no machine stamp"):
    results_page.expected_files(make_root(tmp_path, {"benchmark_tiny.json": unstamped}))
  (tmp_path / "README.md").write_text("no markers\n")
  with pytest.raises(ValueError, match="results:begin"):
    results_page.with_readme_block("no markers\n", "block")


def test_plot_bytes_depend_only_on_the_json():
  section = next(s for s in results_page.SECTIONS if s.anchor == "tiny")
  images = []
  for _ in range(2):
    buf = io.BytesIO()
    results_page.plot(section, BENCHMARK, buf)
    images.append(buf.getvalue())
  assert images[0] == images[1] and images[0].startswith(b"\x89PNG")


# --------------------------------------------------------------------------- prompt sets

def _prompt(pid, domain, speedup, alpha, **kw):
  return dict(id=pid, domain=domain, prompt_tokens=40, prompt_width=64, tokens=64,
              speedup=speedup, acceptance_rate=alpha, alpha=alpha, tokens_per_step=1.5,
              gamma_histogram={"0": 3, "2": 5}, chat=False, **kw)


def _domain(name, n, speedup, lo, hi, alpha, alpha_lo, alpha_hi):
  return dict(domain=name, prompts=n, speedup=speedup, speedup_lo=lo, speedup_hi=hi,
              alpha=alpha, alpha_lo=alpha_lo, alpha_hi=alpha_hi, acceptance=alpha,
              acceptance_lo=alpha_lo, acceptance_hi=alpha_hi)


PROMPT_SET = dict(
    stamp=dict(STAMP, command="python scripts/benchmark.py --config=configs/heldout_smollm2.py "
               "--out=docs/results/benchmark_heldout_smollm2.json"),
    meta=dict(target_call_ms=30.25, c=0.056, verify_cost={"1": 1.0, "2": 1.34, "3": 1.31},
              prompt_set="configs/prompts/heldout.json",
              auto_cost_table=dict(gamma_max=2, c=0.084, verify_costs=[1.0, 1.38, 1.24]),
              config=dict(target="smollm2", draft="saved:artifacts/draft", temperature=0.0,
                          gamma="auto", gamma_max=2, verifier="block", max_new_tokens=64,
                          seed=0, repeats=3, top_k=0, top_p=1.0, batch_size=1)),
    rows=[dict(gamma="auto", verifier="block", c=0.056, v=None, predicted_speedup=0.95,
               gamma_histogram={"0": 12, "2": 20, "1": 4},
               prompts=[_prompt("prose-01", "prose", 0.9, 0.3),
                        _prompt("prose-02", "prose", 0.8, 0.2),
                        _prompt("code-01", "code", 0.7, 0.1),
                        _prompt("code-02", "code", 1.2, 0.5)],
               domains=[_domain("prose", 2, 0.85, 0.61, 1.17, 0.25, 0.0, 0.89),
                        _domain("code", 2, 0.92, 0.31, 2.71, 0.3, 0.0, 1.0),
                        _domain("all", 4, 0.88, 0.63, 1.23, 0.275, 0.04, 0.51)])])


def rendered(tmp_path, docs: dict) -> tuple[str, str]:
  """(docs/results.md, README.md) as `make results` would write them from `docs`."""
  files = results_page.expected_files(make_root(tmp_path, docs))
  return files[results_page.PAGE], files[results_page.README]


def test_prompt_set_page_shows_domains_intervals_and_the_overall_row(tmp_path):
  page, readme = rendered(tmp_path, {"benchmark_heldout_smollm2.json": PROMPT_SET})
  assert "temperature 0, γ auto (at most 2), verifier `block`, 64 new tokens, seed 0" in page
  assert "prompt set `configs/prompts/heldout.json` (4 prompts" in page
  assert "c = 0.056; verify cost v(k) = 1.00, 1.34, 1.31 for k = 1..3" in page
  assert "| prose | 2 | 0.85x [0.61, 1.17] | 0.250 [0.000, 0.890] | 0.250 | 0.80x (prose-02) |" \
      in page
  assert "| code | 2 | 0.92x [0.31, 2.71] | 0.300 [0.000, 1.000] | 0.300 | 0.70x (code-01) |" \
      in page
  assert "| **all** | 4 | 0.88x [0.63, 1.23] | 0.275 [0.040, 0.510] | 0.275 | 0.70x (code-01) |" \
      in page
  assert "Steps per γ over all prompts: γ = 0: 12, γ = 1: 4, γ = 2: 20." in page
  assert "<details><summary>Per prompt (4)</summary>" in page
  assert "| `code-02` | code | 40 (64) | 64 | 1.20x | 0.500 | 0.500 | 1.50 |" in page
  assert ("0.88x [0.63, 1.23] over 4 prompts, α 0.275 [0.040, 0.510]; slowest prompt "
          "`code-01` 0.70x") in readme
  # the sections whose file is missing still say how to make it
  assert "Not measured yet: `python scripts/measure_results.py --only=heldout-t1`" in page
  assert "Not measured yet: `make distill` writes `docs/results/distill_shipped.json`" in page
  assert "not measured yet (`make distill`)" in readme


def test_gammas_side_by_side_are_compared(tmp_path):
  """Several γ in one run: the settings line names each row's γ, one summary line each with
  the prompts below 0.97x, a table of every prompt's speedup per γ, and one README figure
  per γ naming its losses."""
  doc = copy.deepcopy(PROMPT_SET)
  fixed = copy.deepcopy(doc["rows"][0])
  fixed["gamma"] = 2
  for p, speedup in zip(fixed["prompts"], (1.1, 0.96, 0.99, 1.3)):
    p["speedup"] = speedup
  doc["rows"].append(fixed)
  page, readme = rendered(tmp_path, {"benchmark_heldout_smollm2.json": doc})
  # the settings line names what each row ran, not the config's own γ
  assert "temperature 0, γ per row: auto (at most 2), 2, verifier `block`" in page
  assert "γ auto (at most 2), verifier" not in page
  assert "| γ auto (block) | 0.88x [0.63, 1.23] | 0.275 [0.040, 0.510] | 3 of 4 | 0.70x " \
      "(code-01) |" in page
  assert "| γ 2 (block) | 0.88x [0.63, 1.23] | 0.275 [0.040, 0.510] | 1 of 4 | 0.96x " \
      "(prose-02) |" in page
  assert "| `prose-02` | prose | 0.80 | 0.96 |" in page
  assert "slowest prompt `code-01` 0.70x; 3 of 4 prompts below 0.97x" in readme


def test_prompt_set_without_optional_fields_renders(tmp_path):
  """An older file: no auto cost table, prompt widths, histograms or bounds (one prompt)."""
  doc = copy.deepcopy(PROMPT_SET)
  del doc["meta"]["auto_cost_table"], doc["rows"][0]["gamma_histogram"]
  for p in doc["rows"][0]["prompts"]:
    del p["prompt_width"]
  doc["rows"][0]["domains"][0].update(speedup_lo=float("nan"), speedup_hi=float("nan"))
  del doc["rows"][0]["domains"][1]["alpha_lo"]
  root = make_root(tmp_path, {"benchmark_heldout_smollm2.json": doc})
  page = results_page.expected_files(root)[results_page.PAGE]
  assert "| prose | 2 | 0.85x | 0.250 [0.000, 0.890] |" in page
  assert "| code | 2 | 0.92x [0.31, 2.71] | 0.300 | 0.300 |" in page
  assert "Steps per γ" not in page and "chose from this machine" not in page
  assert "| `prose-01` | prose | 40 | 64 |" in page
  doc["rows"][0]["prompts"] = []  # no per-prompt rows: no slowest prompt, no details
  page = results_page.expected_files(make_root(tmp_path, {
      "benchmark_heldout_smollm2.json": doc}))[results_page.PAGE]
  assert "| **all** | 4 | 0.88x [0.63, 1.23] | 0.275 [0.040, 0.510] | 0.275 | – |" in page
  assert "<details>" not in page


# --------------------------------------------------------------------------- distillation

def _eval(step, scale):
  out = dict(step=step, positions=256, alpha_t0=0.9 * scale, alpha_t1=0.6 * scale,
             alpha_t0_d2=0.8 * scale, top1=0.9 * scale)
  for i, corpus in enumerate(("bible", "chat")):
    out |= {f"{corpus}/alpha_t0": (0.85 + 0.1 * i) * scale,
            f"{corpus}/alpha_t1": (0.55 + 0.1 * i) * scale, f"{corpus}/top1": 0.5}
  return out


DISTILL = dict(
    stamp=dict(STAMP, command="python scripts/distill.py "
               "--config=configs/distill_feature_shipped.py --workdir=runs/x"),
    config=dict(batch_size=32, seq_len=128, steps=600, eval_windows=16, loss="fkl",
                corpora="chat:0.5,bible:0.5", target="smollm2", temperature=0.7),
    eval_before={k: v for k, v in _eval(0, 0.1).items() if k != "step"},
    evals=[_eval(300, 0.5), _eval(600, 1.0)], steps=600, loss="fkl", draft_kind="feature",
    draft_params=123456, target="smollm2", temperature=0.7, training_time_s=1800.0,
    feature_cache_s=30.0)


def test_distill_curve_lists_every_eval_step_per_corpus_and_temperature(tmp_path):
  root = make_root(tmp_path, {"distill_shipped.json": DISTILL})
  files = results_page.expected_files(root)
  page, readme = files[results_page.PAGE], files[results_page.README]
  assert "`feature` (123,456 params)" in page and "600 steps of 32 x 128" in page
  assert "30 min of training after 30 s building" in page
  assert "α at T = 0 (greedy):" in page and "α at T = 1:" in page
  assert "| step | target tokens | bible | chat | **all** |" in page
  assert "| 0 (before) | 0 | 0.085 | 0.095 | 0.090 |" in page  # T = 0
  assert "| 300 | 1,228,800 | 0.425 | 0.475 | 0.450 |" in page
  assert "| 600 | 2,457,600 | 0.850 | 0.950 | 0.900 |" in page
  assert "| 600 | 2,457,600 | 0.550 | 0.650 | 0.600 |" in page  # T = 1
  assert "T = 0, k = 2: 0.800" in page
  assert "![The shipped feature draft" in page
  assert ("final held-out α at T = 0 | bible 0.850, chat 0.950, all 0.900 after 600 steps "
          "(2,457,600 target tokens)") in readme


def test_distill_curve_without_optional_fields_renders(tmp_path):
  """No eval_before, config, times, depths or per-corpus figures, a missing T = 1 value."""
  doc = dict(stamp=DISTILL["stamp"], evals=[dict(step=50, alpha_t0=0.5, alpha_t1=0.4),
                                            dict(step=100, alpha_t0=0.7)])
  root = make_root(tmp_path, {"distill_shipped.json": doc})
  files = results_page.expected_files(root)
  page, readme = files[results_page.PAGE], files[results_page.README]
  assert "| step | target tokens | **all** |" in page
  assert "| 50 | – | 0.500 |" in page and "| 100 | – | 0.700 |" in page
  assert "| 100 | – | – |" in page  # T = 1 not measured at step 100
  assert "all 0.700 after 100 steps |" in readme
  buf = io.BytesIO()
  section = next(s for s in results_page.SECTIONS if s.kind == "distill_curve")
  results_page.plot(section, doc, buf)  # steps on the x axis when tokens are unknown
  assert buf.getvalue().startswith(b"\x89PNG")


def test_new_sections_are_stale_checked_and_plotted(tmp_path):
  root = make_root(tmp_path, {"benchmark_heldout_smollm2.json": PROMPT_SET,
                              "distill_shipped.json": DISTILL})
  written = results_page.write(root, plots=True)
  assert "docs/figures/results_distill.png" in written
  assert (root / "docs/figures/results_distill.png").read_bytes().startswith(b"\x89PNG")
  assert results_page.stale(root) == []
  edited = copy.deepcopy(DISTILL)
  edited["evals"][-1]["chat/alpha_t0"] = 0.5  # the README quotes the final α per corpus
  (root / results_page.RESULTS_DIR / "distill_shipped.json").write_text(json.dumps(edited))
  assert results_page.stale(root) == [results_page.PAGE, results_page.README]
  results_page.write(root, plots=False)
  assert "chat 0.500" in (root / results_page.README).read_text()


def test_heldout_sections_measure_the_prompt_set_config():
  by_anchor = {s.anchor: s for s in results_page.SECTIONS}
  anchors = [s.anchor for s in results_page.SECTIONS]
  assert anchors.index("smollm2-t1") < anchors.index("heldout") < anchors.index("heldout-t1") \
      < anchors.index("prompt-lookup")
  for anchor, extra in (("heldout", ()), ("heldout-t1", ("--config.temperature=1",))):
    s = by_anchor[anchor]
    assert s.kind == "prompt_set" and s.needs_draft
    assert s.argv == ("scripts/benchmark.py", "--config=configs/heldout_smollm2.py",
                      "--gammas=auto,1,2,3,4", *extra,
                      f"--out={results_page.RESULTS_DIR}/{s.path}")
  assert by_anchor["distill"].argv == () and by_anchor["distill"].kind == "distill_curve"


TREES = dict(
    stamp=DISTILL["stamp"],
    meta=dict(prompt_set="configs/prompts/heldout.json", prompts=30, max_new_tokens=32,
              draft="saved:drafts/smollm2_feature_v1", seed=0),
    rows=[dict(config="chain 4", kind="chain", nodes=4, depth=4, rule="block", temperature=0.0,
               tokens_per_call=1.6, ci95=[1.5, 1.7], predicted_speedup=1.1),
          dict(config="tree 3x2x1", kind="tree", nodes=15, depth=3, rule="topk",
               temperature=0.0, tokens_per_call=2.0, ci95=[1.9, 2.1], predicted_speedup=0.9,
               model_tokens_per_call=2.05),
          dict(config="best-first 3", kind="tree", nodes=3, depth=2, rule="topk",
               temperature=0.0, tokens_per_call=1.7, ci95=[1.6, 1.8], predicted_speedup=1.21,
               paths="paths:0,1,00"),
          dict(config="chain 1", kind="chain", nodes=1, depth=1, rule="block", temperature=1.0,
               tokens_per_call=1.4, ci95=[1.3, 1.5])],
    costs=dict(v={"2": 1.3, "4": 1.3, "5": 1.4, "16": 2.1}, c=0.05, batch=1, context=128),
    rank_table=dict(probe=dict(width=2, depth=4), reached=[300, 120, 40, 20], min_reached=30,
                    accept=[[0.4, 0.1], [0.45, 0.12], [0.5, 0.1]]))


def test_tree_study_table_and_headline(tmp_path):
  """Per row its tokens per call with the interval, v(N+1) and the prediction; the README
  quotes the best tree over the best chain where a temperature has both."""
  page, readme = rendered(tmp_path, {"tree_tokens_per_call.json": TREES})
  assert "| tree 3x2x1 | 15 | 3 | topk | 0 | 2.00 [1.90, 2.10] | 2.05 | 2.10 | 0.90x |" in page
  assert "| chain 1 | 1 | 1 | block | 1 | 1.40 [1.30, 1.50] | – | 1.30 | – |" in page
  assert "c = 0.050" in page
  assert "best-first 3: `paths:0,1,00`" in page
  assert "| 2 | 0.450 | 0.120 |" in page and "| 3+ | 0.500 | 0.100 |" in page
  assert ("T = 0: predicted speedup from v(N+1) and c, fastest tree over fastest chain | "
          "1.10x (best-first 3 topk: 1.21x; chain 4: 1.10x)") in readme
  assert ("T = 0: best tree's tokens per target call over the best chain's | 1.25x (tree "
          "3x2x1 topk: 2.00 [1.90, 2.10]; chain 4: 1.60 [1.50, 1.70])") in readme
  assert "T = 1: best tree" not in readme  # no tree at T = 1


def test_readme_quotes_only_figures_of_a_clean_commit(tmp_path):
  """A file measured with uncommitted changes (or at an unknown commit) gives no README row;
  the README says why, and docs/results.md still shows its table, marked."""
  dirty = dict(BENCHMARK, stamp=dict(STAMP, git_dirty=True))
  unknown = dict(BENCHMARK, stamp=dict(STAMP, git_commit=None, git_dirty=None))
  page, readme = rendered(tmp_path, {"benchmark_tiny.json": BENCHMARK,
                                     "benchmark_smollm2_t1.json": dirty,
                                     "benchmark_prompt_lookup_smollm2.json": unknown})
  rows = [line for line in readme.splitlines() if line.startswith("| ")]
  assert [r for r in rows if "#tiny" in r] and not [r for r in rows if "(uncommitted" in r]
  assert not [r for r in rows if "#smollm2-t1" in r or "#prompt-lookup" in r]
  assert "Left out: the table quotes only figures measured on a clean commit." in readme
  assert ("- [SmolLM2-135M with the config's draft at fixed γ, temperature 1]"
          "(docs/results.md#smollm2-t1): measured at ab12cd3 with uncommitted changes") in readme
  assert "(docs/results.md#prompt-lookup): measured at an unknown commit" in readme
  assert "commit ab12cd3 (uncommitted changes)" in page
  assert "- Not quoted in the README: measured at ab12cd3 with uncommitted changes." in page
  assert page.count("| 2 | block | 100.0 | 150.0 | **1.25x** |") == 3  # every table kept
  # the re-timed costs a tree study's README rows quote must be clean too
  trees = dict(TREES, costs_stamp=dict(STAMP, git_commit="ef56" + "0" * 36, git_dirty=True))
  _, readme = rendered(tmp_path, {"tree_tokens_per_call.json": trees})
  assert "(docs/results.md#trees): measured at ef56000 with uncommitted changes" in readme
  assert "T = 0: best tree" not in readme


def test_tree_tables_hold_one_machine_each(tmp_path):
  """Tokens per call counted on one CPU kind and v(k), c timed on another are never one
  table: each machine's rows get their own labelled table, the prediction only where the
  same machine timed the costs; the README quotes the file's machine alone."""
  avx512 = dict(STAMP, isa=["avx", "avx2", "fma", "avx512f"], git_commit="ef56" + "0" * 36)
  dynamic = dict(config="dynamic 4 of best-first 8", kind="tree", nodes=4, depth=3.0,
                 rule="topk", temperature=0.0, tokens_per_call=2.5, ci95=[2.4, 2.6],
                 predicted_speedup=1.3, candidates=8, stamp=avx512)
  doc = dict(TREES, rows=TREES["rows"] + [dynamic], costs_stamp=avx512)
  page, readme = rendered(tmp_path, {"tree_tokens_per_call.json": doc})
  assert ("Counted on AMD EPYC, 2 cores, AVX, no AVX2, at ab12cd3; no v(N+1) or "
          "predicted speedup: v(k) and c were timed on another machine (AMD EPYC, 2 cores, "
          "AVX-512)") in page
  assert "| tree 3x2x1 | 15 | 3 | topk | 0 | 2.00 [1.90, 2.10] | 2.05 |\n" in page
  assert "Counted on AMD EPYC, 2 cores, AVX-512, at ef56000." in page
  assert "| dynamic 4 of best-first 8 | 4 | 3.0 | topk | 0 | 2.50 [2.40, 2.60] | – | 1.40 | " \
      "1.30x |" in page
  assert "The v(k) timed: v(2) = 1.30, v(4) = 1.30, v(5) = 1.40, v(16) = 2.10." in page
  tables = [block for block in page.split("\n\n") if block.startswith("| shape |")]
  assert len(tables) == 2
  assert "predicted speedup" not in readme  # tokens from one machine, costs from another
  assert ("T = 0: best tree's tokens per target call over the best chain's | 1.25x (tree "
          "3x2x1 topk: 2.00 [1.90, 2.10]; chain 4: 1.60 [1.50, 1.70])") in readme
  # one machine throughout: one table, with the prediction, as before
  page, _ = rendered(tmp_path, {"tree_tokens_per_call.json": dict(
      doc, rows=TREES["rows"] + [dict(dynamic, stamp=STAMP)], costs_stamp=STAMP)})
  assert "Counted on" not in page and "| dynamic 4 of best-first 8 |" in page
  assert len([b for b in page.split("\n\n") if b.startswith("| shape |")]) == 1


SOAK = dict(stamp=dict(STAMP, command="python scripts/soak.py --config=configs/tiny.py "
                       "--steps=1000 --out=docs/results/soak_tiny.json"),
            summary=dict(calls=20, steps=1036, tokens=5120, seconds=6.2,
                         compiled_after_first_call=1, compiled_at_end=1,
                         rss_after_first_call_mb=571.4, rss_at_end_mb=571.5,
                         rss_max_drift=0.0001, acceptance=0.31),
            record=[], config=dict(target="random_tiny", draft="truncate:1", gamma="auto",
                                   batch_size=4, max_new_tokens=64, temperature=1.0))


def test_soak_section_and_headline(tmp_path):
  files = results_page.expected_files(make_root(tmp_path, {"soak_tiny.json": SOAK}))
  page, readme = files[results_page.PAGE], files[results_page.README]
  assert "| 20 | 1036 | 5120 | 6 | 1 / 1 | 571 → 572 MB | 0.01% |" in page
  assert "Target `random_tiny`, draft `truncate:1`, γ `auto`" in page
  assert "5120 tokens in 20 calls: decode loops compiled 1 after call 1, 1 at the end" in readme


def test_gamma_rules_headline_takes_the_best_fixed_gamma_only():
  """The headline's 'best fixed γ' is among the rows named fixed-<γ>: a rule variant whose
  name only starts with 'fixed' (fixed-memory) is not a fixed γ."""
  from tools import results_tables

  def row(rule, speedup):
    return dict(rule=rule, speedup=speedup,
                domains=[dict(domain=results_format.ALL, speedup=speedup, speedup_lo=speedup,
                              speedup_hi=speedup)])
  doc = dict(rows=[row("auto", 1.3), row("fixed-memory", 1.4), row("fixed-2", 1.1),
                   row("fixed-3", 1.2)])
  (_, text), = results_tables.gamma_rules_headline("rules", doc)
  assert "best fixed γ (fixed-3) 1.20x" in text and "fixed-memory" not in text


def test_committed_commands_name_no_path_of_the_machine():
  """Every committed result's stamped command names repository files relative to its root:
  an output written to a scratch path outside it (--out=/tmp/...) is caught, the negative
  control."""
  assert results_format.absolute_paths(
      "python scripts/x.py --out=/tmp/gamma_rules.json --config=configs/a.py") == [
          "/tmp/gamma_rules.json"]
  assert results_format.absolute_paths(STAMP["command"]) == []
  found = {}
  for path in sorted((REPO / results_page.RESULTS_DIR).rglob("*.json")):
    doc = json.loads(path.read_text())
    stamps = [doc.get("stamp")] + [run.get("stamp") for run in doc.get("runs", [])
                                   if isinstance(run, dict)]
    for stamp in stamps:
      if isinstance(stamp, dict) and stamp.get("command"):
        bad = results_format.absolute_paths(stamp["command"])
        if bad:
          found[path.name] = bad
  assert not found


def test_superseded_section_keeps_its_table_but_gives_no_readme_row(tmp_path):
  """A section a later one supersedes (Section.superseded_by) is listed under "Superseded"
  in the README, not quoted, and its table stays on the page, marked; the later one is
  quoted."""
  old = next(s for s in results_page.SECTIONS if s.superseded_by)
  new = next(s for s in results_page.SECTIONS if s.anchor == old.superseded_by)
  page, readme = rendered(tmp_path, {old.path: PROMPT_SET, new.path: PROMPT_SET})
  rows = [line for line in readme.splitlines() if line.startswith("| ")]
  assert not [r for r in rows if f"#{old.anchor})" in r]
  assert [r for r in rows if f"#{new.anchor})" in r]
  assert (f"- [{old.title}](docs/results.md#{old.anchor}): superseded by "
          f"[{new.title}](docs/results.md#{new.anchor})") in readme
  assert f"- Superseded by [{new.title}](#{new.anchor})" in page
  assert page.count("| **all** | 4 | 0.88x [0.63, 1.23]") == 2  # both tables shown


def test_fresh_clone_headline_says_a_failed_command_and_its_failures(tmp_path):
  """A fresh-clone `make test` that failed: the README names its exit status, and the
  figure scripts/measure_results.py quotes from its output keeps the failure count."""
  import ast
  import re
  tree = ast.parse((REPO / "scripts" / "measure_results.py").read_text())
  printed = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", "") == "PRINTED" for t in node.targets))
  output = "F....\nFAILED tests/x.py::y\n1 failed, 809 passed, 1 skipped in 473.37s (0:07:53)\n"
  figures = re.findall(printed["make test"], output)
  assert figures == ["1 failed, 809 passed, 1 skipped in 473.37s (0:07:53)"]
  doc = dict(stamp=dict(STAMP, command="python scripts/measure_results.py --only=fresh-clone"),
             runs=[dict(command="make test", seconds=476.0, returncode=2, figures=figures,
                        output_tail=[])])
  _, readme = rendered(tmp_path, {"fresh_clone.json": doc})
  assert ("| `make test` on a fresh clone | 7 min 56 s; exit status 2; printed 1 failed, 809 "
          "passed, 1 skipped in 473.37s (0:07:53) |") in readme
