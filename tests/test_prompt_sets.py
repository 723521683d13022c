"""Prompt sets: the held-out set's schema and domains, no leak from the training text, the
per-domain statistics on known numbers, and the per-domain benchmark end to end."""

import json
import math
import os
import pathlib
import subprocess
import sys
import sysconfig
from collections import Counter

import numpy as np
import pytest

from specdec_jax.io import corpora

from specdec_jax.bench import prompt_sets
from specdec_jax.loading import ByteTokenizer

REPO = pathlib.Path(__file__).resolve().parent.parent
HELDOUT = "configs/prompts/heldout.json"


@pytest.fixture(scope="module")
def heldout():
  return prompt_sets.load_prompt_set(HELDOUT)


def test_heldout_set_schema_and_domain_counts(heldout):
  assert len(heldout) >= 30
  counts = Counter(p.domain for p in heldout)
  assert set(counts) == set(prompt_sets.DOMAINS)
  assert min(counts.values()) >= 5, counts
  for p in heldout:
    assert p.chat == (p.domain == "chat"), p.id  # chat instructions, and only they, templated
    assert p.id.startswith(p.domain), p.id
    assert 60 <= len(p.text) <= 400, (p.id, len(p.text))  # what users send, not documents
    if p.domain == "code":
      assert 3 <= len(p.text.strip().splitlines()) <= 12, p.id
  doc = json.loads((REPO / HELDOUT).read_text("utf-8"))
  assert doc["licence"] and doc["description"]


class _TemplatingTokenizer(ByteTokenizer):
  def apply_chat_template(self, messages, add_generation_prompt=True):
    return "<user>" + messages[0]["content"] + "<assistant>"


def test_chat_prompts_and_only_they_go_through_the_template(heldout):
  ids = prompt_sets.encode(_TemplatingTokenizer(), heldout)
  for p, row in zip(heldout, ids):
    text = bytes(row).decode("utf-8")
    assert text == (f"<user>{p.text}<assistant>" if p.chat else p.text), p.id


def _leak_control(heldout, doc_text):
  """A prompt that quotes 60 characters of a training text: find_leaks must flag it."""
  quote = doc_text[len(doc_text) // 2:len(doc_text) // 2 + 60]
  bad = prompt_sets.Prompt("leak-01", "prose", False, "As the old text says, " + quote, "test")
  leaks = prompt_sets.find_leaks([heldout[0], bad], [doc_text])
  assert leaks and {pid for pid, _ in leaks} == {"leak-01"}


def test_no_window_of_a_prompt_occurs_in_the_bible_or_shakespeare(heldout):
  texts = [d.text for corpus in corpora.CORPORA for d in corpora.load_documents(corpus)]
  assert prompt_sets.find_leaks(heldout, texts) == []
  _leak_control(heldout, texts[5])  # negative control: a real quote is caught
  _leak_control(heldout, texts[-1])


def test_no_window_of_a_prompt_occurs_in_the_python_standard_library(heldout):
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
  assert len(files) > 500, root  # the source is there to scan
  source = b"\0".join(p.read_bytes() for p in files)  # \0 is in no prompt: no match spans files
  assert prompt_sets.find_leaks(heldout, [source]) == []
  _leak_control(heldout, (root / "textwrap.py").read_text("utf-8"))


def test_leaks_ignore_case_and_whitespace():
  text = "x" * 100 + "The Quick   brown fox\n\tjumps over the lazy dog and runs far away" + "y" * 50
  p = prompt_sets.Prompt("p", "prose", False,
                         "the quick brown fox jumps over the lazy dog and runs", "test")
  assert prompt_sets.find_leaks([p], [text]) == [
      ("p", "the quick brown fox jumps over the lazy dog and runs")]
  q = prompt_sets.Prompt("q", "prose", False, "the quick brown fox leaps over the lazy dog", "t")
  assert prompt_sets.find_leaks([q], [text]) == []


def test_leaks_of_exactly_the_width_are_found_at_every_alignment():
  shared = "abcdefghijklmnopqrstuvwxyz0123456789ABCD"  # 40 bytes (lower-cased: still distinct)
  for text_shift in range(9):
    for prompt_shift in range(9):
      text = "#" * text_shift + shared + "%" * 5
      for length, expect in ((40, True), (39, False)):
        prompt = prompt_sets.Prompt("p", "prose", False,
                                    "@" * prompt_shift + shared[:length] + "&", "t")
        assert bool(prompt_sets.find_leaks([prompt], [text])) == expect, (
            text_shift, prompt_shift, length)


@pytest.mark.parametrize("edit,message", [
    (lambda p: p.update(chat="yes"), "'chat' must be true or false, got 'yes'"),
    (lambda p: p.update(text=""), "'text' must be a non-empty string, got ''"),
    (lambda p: p.pop("source"), "needs exactly the fields"),
])
def test_bad_prompt_set_is_a_value_error_naming_the_value(tmp_path, edit, message):
  prompt = dict(id="a-01", domain="prose", chat=False, text="Some text.", source="test")
  edit(prompt)
  path = tmp_path / "set.json"
  path.write_text(json.dumps({"prompts": [prompt]}))
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    prompt_sets.load_prompt_set(path)
  with pytest.raises(ValueError, match="does not exist"):
    prompt_sets.load_prompt_set(tmp_path / "missing.json")


# --------------------------------------------------------------------------- statistics

T975 = {2: 4.302652729911275, 3: 3.182446305284263}  # Student t quantiles, 2 and 3 d.o.f.


def test_mean_interval_on_known_numbers():
  mean, lo, hi = prompt_sets.mean_interval([1.0, 2.0, 3.0, 4.0, math.nan])  # NaN dropped
  half = T975[3] * np.std([1, 2, 3, 4], ddof=1) / 2
  assert (mean, lo, hi) == pytest.approx((2.5, 2.5 - half, 2.5 + half))
  assert lo == pytest.approx(0.445740, abs=1e-6)
  assert prompt_sets.mean_interval([1, 2, 3, 4], limits=(0, 3)) == pytest.approx((2.5, lo, 3))
  assert prompt_sets.mean_interval([0.7])[0] == 0.7
  assert all(math.isnan(x) for x in prompt_sets.mean_interval([0.7])[1:])


def test_geometric_mean_interval_on_known_numbers():
  gmean, lo, hi = prompt_sets.geometric_mean_interval([1.0, 2.0, 4.0])
  half = T975[2] * math.log(2) / math.sqrt(3)  # logs 0, a, 2a: mean a, sd a
  assert (gmean, lo, hi) == pytest.approx((2.0, 2 * math.exp(-half), 2 * math.exp(half)))
  assert prompt_sets.geometric_mean_interval([1.5, 1.5, 1.5]) == pytest.approx((1.5, 1.5, 1.5))
  # Ratios and their inverses: the geometric mean inverts exactly, the arithmetic does not.
  inv = prompt_sets.geometric_mean_interval([1.0, 0.5, 0.25])
  assert inv == pytest.approx((0.5, 1 / hi, 1 / lo))
  with pytest.raises(ValueError, match=r"ratios must be > 0.*\[0.0\]"):
    prompt_sets.geometric_mean_interval([1.0, 0.0])


def test_domain_summary_groups_by_domain_and_over_all():
  rows = prompt_sets.domain_summary(["code", "chat", "code", "code"],
                                    speedup=[1.0, 3.0, 2.0, 4.0], alpha=[0.2, 0.9, 0.4, 0.6])
  assert [(r["domain"], r["prompts"]) for r in rows] == [("code", 3), ("chat", 1), ("all", 4)]
  code, chat, everything = rows
  assert code["speedup"] == pytest.approx(2.0) and code["alpha"] == pytest.approx(0.4)
  assert code["alpha_hi"] == pytest.approx(0.4 + T975[2] * 0.2 / math.sqrt(3))
  assert code["alpha_lo"] == 0.0  # 0.4 - 0.497, cut to where a probability lies
  assert chat["speedup"] == pytest.approx(3.0) and math.isnan(chat["speedup_hi"])
  assert everything["speedup"] == pytest.approx(24 ** 0.25)
  assert "acceptance" not in code
  with pytest.raises(ValueError, match=r"alpha needs one value per prompt \(4\)"):
    prompt_sets.domain_summary(["a"] * 4, alpha=[0.5])
  assert "speedup" in prompt_sets.format_summary(rows).splitlines()[0]


# --------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory):
  """(path, prompts) of a 4-prompt set in 2 domains, all of one byte length (one compile
  per sampler at batch 1)."""
  texts = {"prose": ("The cat sat on a mat.", "A dog ran in the sun."),
           "code": ("x = [i*2 for i in ys]", "def g(a):\n   return a")}
  assert len({len(t) for ts in texts.values() for t in ts}) == 1
  prompts = [dict(id=f"{d}-{i}", domain=d, chat=(d == "code" and i == 1), text=t,
                  source="test") for d, ts in texts.items() for i, t in enumerate(ts)]
  path = tmp_path_factory.mktemp("set") / "set.json"
  path.write_text(json.dumps({"prompts": prompts}))
  return path, prompts


def test_benchmark_reports_per_domain_over_a_prompt_set(tmp_path, tiny_set):
  """scripts/benchmark.py on the tiny random pair over the 4-prompt set: per-prompt rows,
  per-domain and overall summaries in the JSON; --config.batch_size runs each prompt as a
  batch of that many copies of itself."""
  path, prompts = tiny_set
  out = tmp_path / "bench.json"
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(
      [sys.executable, str(REPO / "scripts" / "benchmark.py"), "--config=configs/tiny.py",
       f"--config.prompt_set={path}", "--config.max_new_tokens=6", "--config.repeats=1",
       "--config.batch_size=2", "--gammas=1",
       f"--out={out}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "scripture" not in proc.stdout and "prose" in proc.stdout
  doc = json.loads(out.read_text())
  assert doc["meta"]["prompt_set"] == str(path)
  (row,) = doc["rows"]  # one gamma, one verifier
  assert [p["id"] for p in row["prompts"]] == [p["id"] for p in prompts]
  for p in row["prompts"]:
    assert p["batch"] == 2 and p["speedup"] > 0 and 0 <= p["alpha"] <= 1
    assert p["chat"] == (p["id"] == "code-1")
    assert p["tokens"] == 2 * 6
  assert [d["domain"] for d in row["domains"]] == ["prose", "code", "all"]
  for d in row["domains"]:
    for name in ("speedup", "alpha", "acceptance"):
      assert d[f"{name}_lo"] <= d[name] <= d[f"{name}_hi"], (d, name)
    assert 0 <= d["alpha_lo"] and d["alpha_hi"] <= 1
  assert row["domains"][-1]["prompts"] == 4
  assert row["domains"][-1]["speedup"] == pytest.approx(
      math.exp(np.mean([math.log(p["speedup"]) for p in row["prompts"]])))


@pytest.mark.slow  # a whole tiny sweep (make test-all); the benchmark above runs in make test
def test_sweep_reports_per_domain_over_a_prompt_set(tmp_path, tiny_set):
  """The tiny sweep over the 4-prompt set: each prompt timed alone, α and speedup per
  domain and overall in results.json; the pooled grid row agrees with the per-prompt α."""
  from configs import sweep_tiny
  from specdec_jax.bench import sweep, sweep_tables
  path, prompts = tiny_set
  c = sweep_tiny.get_config()
  c.drafts = (("trunc2", "truncate:2"),)
  c.gammas, c.temperatures = (2,), (1.0,)
  c.max_new_tokens, c.repeats, c.cost_repeats = 6, 1, 2
  c.batch_sizes, c.plots = (), False
  c.prompt_set = str(path)
  c.lock()
  results = sweep.run_sweep(c, tmp_path, progress=False)
  doc = json.loads((tmp_path / "results.json").read_text())
  (grid,) = doc["grid"]
  assert grid["batch"] == 1 and grid["num_prompts"] == 4 and grid["prompt_set"] == str(path)
  per = doc["per_prompt"]
  assert [p["id"] for p in per] == [p["id"] for p in prompts]
  assert all(p["time_speedup"] > 0 and 0 <= p["alpha"] <= 1 for p in per)
  assert [d["domain"] for d in doc["domains"]] == ["prose", "code", "all"]
  everything = doc["domains"][-1]
  assert everything["prompts"] == 4 and everything["draft_name"] == "trunc2"
  assert everything["alpha"] == pytest.approx(np.mean([p["alpha"] for p in per]), abs=1e-5)
  assert everything["time_speedup"] == pytest.approx(
      math.exp(np.mean([math.log(p["time_speedup"]) for p in per])), rel=1e-4)
  for d in doc["domains"]:
    assert d["alpha_lo"] <= d["alpha"] <= d["alpha_hi"]
    assert d["time_speedup_lo"] <= d["time_speedup"] <= d["time_speedup_hi"]
  table = sweep_tables.domain_tables(results["domains"])
  assert "trunc2" in table and "prose" in table and "all" in table
