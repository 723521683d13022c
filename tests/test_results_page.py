"""docs/results.md and the README's "What to expect" block are generated from the stamped
result JSON of docs/results/ (specdec_jax/results_page.py); no jax needed."""

import copy
import io
import json
import pathlib

import pytest

from specdec_jax import results_page

REPO = pathlib.Path(__file__).resolve().parent.parent

STAMP = dict(cpu="AMD EPYC", isa=["avx", "fma"], cores=2, memory_gb=23.5, os="Linux-6-x86_64",
             devices=[dict(platform="cpu", kind="cpu", count=1)], accelerator=None,
             python="3.11.7", jax="0.10.2", jaxlib="0.10.2", git_commit="ab12cd3" + "0" * 33,
             git_dirty=True, date_utc="2026-11-30T18:00:00Z",
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


def test_every_result_file_has_a_stamp_and_a_section():
  for s in results_page.SECTIONS:
    path = REPO / results_page.RESULTS_DIR / s.path
    if path.exists():
      stamp = results_page.stamp_of(json.loads(path.read_text()))
      assert stamp["command"].startswith("python ") and stamp["cpu"] and stamp["git_commit"]


def test_page_names_command_machine_and_commit(tmp_path):
  root = make_root(tmp_path, {"benchmark_tiny.json": BENCHMARK})
  files = results_page.expected_files(root)
  page, readme = files[results_page.PAGE], files[results_page.README]
  assert f"- Command: `{STAMP['command']}`" in page
  assert "AMD EPYC; 2 cores; ISA avx, fma" in page
  assert "commit ab12cd3 (uncommitted changes)" in page
  assert "| 2 | block | 100.0 | 150.0 | **1.25x** |" in page
  assert "| AMD EPYC, 2 cores, AVX, no AVX2 | ab12cd3 (uncommitted changes) |" in readme
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
