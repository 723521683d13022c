r"""Mutation check: break one piece of the algorithm at a time and show that a fast test
(one `make test` runs, not marked slow) fails.

  python tools/mutations.py [--only=NAME,...] [--out=FILE.json] [--workers=N]

Each mutation replaces one exact piece of text in one file (it must occur exactly once)
and names the fast test files that should catch it. For each, the working tree is copied
(tracked and untracked files that git does not ignore) into a temporary folder, the
mutation is applied there, and `pytest -m "not slow"` runs the named files; the report
lists, per mutation, the tests that failed. A mutation that no test catches is a gap in
the suite, and the script exits 1. A first run of the same files without any mutation
must pass (else the report would mean nothing). The copies share this checkout's JAX
compilation cache (.pytest_cache/jax_compile), so only the mutated programs compile anew.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Mutation:
  name: str
  what: str  # what the mutation breaks, in words
  path: str  # relative to the repository root
  old: str
  new: str
  tests: tuple[str, ...]  # test files (or node ids) that should catch it


MUTATIONS = (
    Mutation("token_residual", "the token verifier's correction drawn from p, not "
             "norm(max(0, p - q))", "specdec_jax/verification/verify.py",
             "  residual = jnp.maximum(p - q, 0.0)\n", "  residual = jnp.maximum(p, 0.0)\n",
             ("tests/test_verify.py",)),
    Mutation("block_weights", "block verification's weights w_i = min(1, p_i/q_i) without "
             "the running w_{i-1}", "specdec_jax/verification/verify.py",
             "    w = jnp.where(wp > q_i, 1.0, wp / jnp.maximum(q_i, jnp.finfo(jnp.float32).tiny))",
             "    w = jnp.where(p_i > q_i, 1.0, p_i / jnp.maximum(q_i, jnp.finfo(jnp.float32).tiny))",
             ("tests/test_block_verify.py",)),
    Mutation("tree_residual", "the tree verifier keeps p after a rejected child instead of "
             "the residual", "specdec_jax/verification/tree_verify.py",
             "    return jnp.where(ok, residual_fn(p_run, q), p_run), (p_x, q_x)",
             "    return p_run, (p_x, q_x)", ("tests/test_tree_verify.py",)),
    Mutation("draft_rollback", "the independent draft's cache length left at the step's "
             "start instead of the new length", "specdec_jax/drafts/independent.py",
             "    return with_length(draft_state, new_length)\n",
             "    return with_length(draft_state, length)\n",
             ("tests/test_adaptive_gamma.py",)),
    Mutation("feature_rollback", "the feature draft's re-read starts at the new pending "
             "token instead of right after the step's pending token",
             "specdec_jax/drafts/feature.py",
             "    return draft_state.replace(cache=with_length(draft_state.cache, length + 1))\n",
             "    return draft_state.replace(cache=with_length(draft_state.cache, new_length))\n",
             ("tests/test_feature_draft.py",)),
    Mutation("hybrid_source", "the hybrid proposes the lookup's tokens on the rows without "
             "a match (and the draft's where it matched)", "specdec_jax/drafts/hybrid.py",
             "    looked, found = plan.lookup[0][:, :gamma], plan.lookup[1]\n",
             "    looked, found = plan.lookup[0][:, :gamma], ~plan.lookup[1]\n",
             ("tests/test_hybrid.py",)),
    Mutation("auto_observe", "gamma 'auto' never takes in what it observes",
             "specdec_jax/gamma/adaptive.py",
             "    observed = proposes[:, None] & (j <= num_accepted[:, None]) & (j < chosen[:, None])\n",
             "    observed = proposes[:, None] & (j < 0)\n", ("tests/test_adaptive_gamma.py",)),
    Mutation("independent_catch_up", "the independent draft's catch-up call marks every "
             "skipped token fed, however many it fed", "specdec_jax/drafts/independent.py",
             "    return with_length(cache, jnp.minimum(base + CATCH_UP_WIDTH, state.num_tokens - 1))\n",
             "    return with_length(cache, state.num_tokens - 1)\n",
             ("tests/test_adaptive_gamma.py",)),
    Mutation("rule_observe", "the step tells the γ rule that no row proposed, whatever it "
             "drafted", "specdec_jax/decoding/step.py",
             "      state.rule_state, chosen=chosen, proposes=plan.proposes, num_accepted=",
             "      state.rule_state, chosen=chosen, proposes=plan.proposes & False, num_accepted=",
             ("tests/test_custom_gamma_rule.py",)),
    Mutation("key_schedule", "every step of a row draws with the same key (no fold_in of the "
             "step)", "specdec_jax/decoding/state.py",
             "  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(state.row_keys, state.step)",
             "  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(state.row_keys, 0)",
             ("tests/test_exactness.py",)),
    Mutation("cache_length", "the target cache's length after a step left at the step's "
             "start", "specdec_jax/decoding/step.py",
             "  return state.replace(target_cache=with_length(target_cache, new_length),",
             "  return state.replace(target_cache=with_length(target_cache, length),",
             ("tests/test_adaptive_gamma.py",)),
    Mutation("warp_temperature", "the warp leaves the temperature out",
             "specdec_jax/models/sampling.py", "  logits = logits / temperature\n",
             "  logits = logits\n", ("tests/test_sampling.py",)),
    Mutation("warp_nucleus", "top-p keeps a token only if the mass up to and including it "
             "is within p (it drops the token that reaches p)",
             "specdec_jax/models/sampling.py", "    keep = mass_before < top_p\n",
             "    keep = mass_before + sorted_probs <= top_p\n", ("tests/test_sampling.py",)),
    Mutation("greedy_verifier", "a T = 0 step verifies with the spec's sampled verifier "
             "instead of argmax matching", "specdec_jax/decoding/step.py",
             "  verify_fn = greedy_verify if greedy else spec.verify_fn\n",
             "  verify_fn = spec.verify_fn\n", ("tests/test_verify.py",)),
)


def tree_files() -> list[str]:
  """Tracked and untracked, not ignored files of the checkout."""
  out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                       capture_output=True, text=True, check=True).stdout
  return [f for f in out.split("\0") if f and (ROOT / f).is_file()]


def copy_tree(dest: pathlib.Path) -> None:
  for rel in tree_files():
    target = dest / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / rel, target)
  (ROOT / ".pytest_cache").mkdir(exist_ok=True)
  (dest / ".pytest_cache").symlink_to(ROOT / ".pytest_cache")  # the shared compile cache
  venv = ROOT / ".venv"
  if venv.exists():
    (dest / ".venv").symlink_to(venv)


def apply(dest: pathlib.Path, mutation: Mutation) -> None:
  path = dest / mutation.path
  text = path.read_text()
  if text.count(mutation.old) != 1:
    raise SystemExit(f"error: mutation {mutation.name}: its text occurs "
                     f"{text.count(mutation.old)} times in {mutation.path} (needs 1)")
  path.write_text(text.replace(mutation.old, mutation.new))


def run_tests(dest: pathlib.Path, tests, workers: int) -> tuple[list[str], int, float]:
  """(failed test ids, tests run, seconds) of `pytest -m "not slow" tests` in dest."""
  report = dest / "junit.xml"
  report.unlink(missing_ok=True)
  args = [sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider",
          f"--junitxml={report}", *tests]
  if workers > 1:
    args += ["-n", str(workers), "--dist", "loadfile"]
  env = {**os.environ, "PYTHONPATH": str(dest)}
  start = time.perf_counter()
  subprocess.run(args, cwd=dest, env=env, capture_output=True, text=True)
  seconds = time.perf_counter() - start
  if not report.exists():
    return ["(pytest wrote no report: collection failed)"], 0, seconds
  failed, total = [], 0
  for case in ET.parse(report).getroot().iter("testcase"):
    total += 1
    if case.find("failure") is not None or case.find("error") is not None:
      failed.append(f"{case.get('classname')}::{case.get('name')}")
  return failed, total, seconds


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--only", default="", help="comma-separated mutation names")
  parser.add_argument("--out", default="", help="write the report as JSON here")
  parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers")
  args = parser.parse_args()
  chosen = [m for m in MUTATIONS if not args.only or m.name in args.only.split(",")]
  unknown = set(filter(None, args.only.split(","))) - {m.name for m in MUTATIONS}
  if unknown:
    print(f"error: unknown mutation(s) {sorted(unknown)}; known: "
          f"{[m.name for m in MUTATIONS]}", file=sys.stderr)
    return 2
  rows = []
  with tempfile.TemporaryDirectory(prefix="mutations-") as tmp:
    base = pathlib.Path(tmp) / "tree"
    copy_tree(base)
    files = sorted({t for m in chosen for t in m.tests})
    failed, total, seconds = run_tests(base, files, args.workers)
    print(f"unmutated: {total} tests of {', '.join(files)}, {len(failed)} failed "
          f"({seconds:.0f} s)", flush=True)
    if failed or not total:
      print(f"error: the unmutated suite must pass first: {failed[:5]}", file=sys.stderr)
      return 1
    for mutation in chosen:
      work = pathlib.Path(tmp) / mutation.name
      shutil.copytree(base, work, symlinks=True)
      apply(work, mutation)
      failed, total, seconds = run_tests(work, mutation.tests, args.workers)
      rows.append(dict(name=mutation.name, what=mutation.what, path=mutation.path,
                       tests=list(mutation.tests), ran=total, failed=failed,
                       seconds=round(seconds, 1)))
      print(f"{mutation.name:15s} {'caught' if failed else 'MISSED'} by {len(failed)} of "
            f"{total} tests ({seconds:.0f} s): {mutation.what}", flush=True)
      for test in failed:
        print(f"    {test}", flush=True)
      shutil.rmtree(work)
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(dict(mutations=rows), indent=1) + "\n")
  missed = [r["name"] for r in rows if not r["failed"]]
  print(f"{len(rows) - len(missed)} of {len(rows)} mutations caught"
        + (f"; missed: {missed}" if missed else ""))
  return 1 if missed else 0


if __name__ == "__main__":
  sys.exit(main())
