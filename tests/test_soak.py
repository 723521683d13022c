"""Soak (slow): 1000 speculative steps on the tiny pair compile once and hold memory flat.

`make test-all` runs it; docs/reliability.md gives its figures and the SmolLM2 soak's
(`scripts/soak.py --config=configs/smollm2_135m.py --tokens=2000`).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_thousand_steps_compile_once_and_memory_stays_flat(tmp_path):
  out = tmp_path / "soak.json"
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, str(REPO / "scripts" / "soak.py"),
                         "--config=configs/tiny.py", "--steps=1000", f"--out={out}"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads(out.read_text())["summary"]
  assert summary["steps"] >= 1000
  assert summary["compiled_after_first_call"] == summary["compiled_at_end"] == 1
  assert summary["rss_max_drift"] < 0.05, summary
