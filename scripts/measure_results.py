r"""`make results-measure`: runs the measurements behind docs/results.md and writes their
stamped JSON under docs/results/; `make results` then regenerates the page.

  python scripts/measure_results.py                        # every section but fresh-clone
  python scripts/measure_results.py --only=smollm2,tiny    # some sections
  python scripts/measure_results.py --only=fresh-clone     # make run + make test, timed
  python scripts/measure_results.py --only=fresh-clone-cpu2  # the same, on a second CPU kind

Each section of `tools.results_page.SECTIONS` names its command; this script runs
them one after another (each a subprocess, so each stamps its own command line) and prints
the wall time of each. Timings are only worth committing from a machine with nothing else
running. The SmolLM2 sections measure the draft of configs/smollm2_135m.py, which
is shipped in drafts/ (`make distill` trains it again).

The sweep measures acceptance only (32 windows, γ = 1..4, T = 0 and 1); fresh-clone is a
`git clone` of HEAD, then `make run` and `make test` in it, installation included. Each
result file records its phases' times (`phases_s`; fresh-clone's: docs/results.md#fresh-clone).
"""

import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import _bootstrap  # repository root on sys.path; run(main)
from absl import flags

from specdec_jax.io.atomic import atomic_write_json
from specdec_jax.io.machine import machine_stamp
from tools import results_page

_ONLY = flags.DEFINE_list("only", None, "section anchors to measure (default: all but "
                          "fresh-clone); one of " + ", ".join(s.anchor for s in
                                                                results_page.SECTIONS))


def sections(names):
  """The sections named (all but fresh-clone by default), in page order."""
  known = {s.anchor: s for s in results_page.SECTIONS}
  if names is None:
    return [s for s in results_page.SECTIONS if s.argv]
  unknown = [n for n in names if n not in known]
  if unknown:
    raise ValueError(f"unknown section(s) {unknown}; known: {sorted(known)}")
  made_elsewhere = [n for n in names if not known[n].argv and known[n].kind != "fresh_clone"]
  if made_elsewhere:
    raise ValueError(f"section(s) {made_elsewhere} are not measured here: "
                     + "; ".join(f"{n}: {known[n].made_by or 'see its section'}"
                                 for n in made_elsewhere))
  return [known[n] for n in names]


def default_draft() -> str:
  """The draft of configs/smollm2_135m.py (what `make run` uses and the page measures)."""
  from configs import smollm2_135m
  config = smollm2_135m.get_config()  # a hybrid's feature draft: what the sweep can load
  from specdec_jax.drafts import registry
  return registry.model_draft_name(config.draft, config.feature_draft)


def check_draft(draft: str, root: pathlib.Path) -> None:
  """A clear error when a 'saved:<dir>' draft has not been made yet."""
  if draft.startswith("saved:"):
    path = root / draft[len("saved:"):]
    if not (path / "model.json").exists():
      raise ValueError(f"draft {draft!r} does not exist: the SmolLM2 sections measure it "
                       "(the shipped one is restored by `git checkout -- drafts/`)")


def run_script(section, root: pathlib.Path, draft: str) -> float:
  """Runs the section's command from the repository root; returns its wall time (s)."""
  argv = [a.replace("{draft}", draft) for a in section.argv]
  cmd = [sys.executable, *argv]
  print(f"[{section.anchor}] python {' '.join(argv)}", flush=True)
  env = {**os.environ, "PYTHONPATH": str(root)}
  clock = time.perf_counter()
  subprocess.run(cmd, cwd=root, env=env, check=True)
  return time.perf_counter() - clock


PRINTED = {  # what a command prints that the results page quotes, by regular expression
    "make run": r"acceptance rate [0-9.]+ \| alpha [0-9.]+ \| tokens/step [0-9.]+"
                r"|speedup [0-9.]+x",
    "make test": r"(?:\d+ \w+, )*\d+ passed[^\n]*",  # "1 failed, 809 passed, ..." whole
}


def fresh_clone(root: pathlib.Path, out: pathlib.Path) -> float:
  """`git clone` of HEAD into a temporary directory, then `make run` and `make test` there,
  each timed; writes `out` with the stamp (commit = HEAD, clean) and what each printed."""
  clock = time.perf_counter()
  stamp = machine_stamp()
  stamp["git_dirty"] = False  # the clone holds HEAD exactly, whatever the working tree holds
  runs = []
  with tempfile.TemporaryDirectory(prefix="specdec_fresh_clone_") as tmp:
    clone = pathlib.Path(tmp) / "specdec_jax"
    subprocess.run(["git", "clone", "--quiet", str(root), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    for target in ("run", "test"):
      print(f"[fresh-clone] make {target} (in a fresh clone of HEAD)", flush=True)
      start = time.perf_counter()
      proc = subprocess.run(["make", target], cwd=clone, env=env, capture_output=True,
                            text=True)
      seconds = time.perf_counter() - start
      output = (proc.stdout + proc.stderr).replace(str(clone), ".")
      figures = re.findall(PRINTED[f"make {target}"], output)
      runs.append(dict(command=f"make {target}", seconds=seconds,
                       returncode=proc.returncode, figures=figures,
                       output_tail=output.splitlines()[-20:]))
      print(f"[fresh-clone] make {target}: {seconds:.0f} s, exit {proc.returncode}: "
            f"{'; '.join(figures)}", flush=True)
  atomic_write_json(out, dict(stamp=stamp, runs=runs))
  return time.perf_counter() - clock


def main(argv):
  del argv
  root = pathlib.Path(_bootstrap.ROOT)
  chosen = sections(_ONLY.value)
  draft = default_draft()
  if any(s.needs_draft for s in chosen):
    check_draft(draft, root)
  (root / results_page.RESULTS_DIR).mkdir(parents=True, exist_ok=True)
  for section in chosen:
    if section.kind == "fresh_clone":
      seconds = fresh_clone(root, root / results_page.RESULTS_DIR / section.path)
    else:
      seconds = run_script(section, root, draft)
    print(f"[{section.anchor}] done in {seconds:.0f} s", flush=True)
  print("now `make results` regenerates docs/results.md and the README block")


if __name__ == "__main__":
  _bootstrap.run(main)
