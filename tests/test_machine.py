"""The machine stamp of result files (specdec_jax/io/machine.py)."""

import json
import re
import subprocess

import jax

from specdec_jax.io import machine

CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse4_2 avx fma avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse4_2 avx fma avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8
"""


def test_cpu_model_and_isa_flags_from_cpuinfo():
  model, isa = machine.cpu_info(CPUINFO)
  assert model == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"
  assert isa == ["avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16",
                 "amx_int8"]  # in ISA_FLAGS order, without fpu / sse4_2


def test_cpu_without_readable_flags_degrades_to_no_isa():
  model, isa = machine.cpu_info("")
  assert model and isa == []
  assert machine.cpu_info("model name : AMD EPYC\nflags : fpu avx fma\n") == (
      "AMD EPYC", ["avx", "fma"])  # an AMD EPYC without AVX2


def test_memory_from_meminfo():
  assert machine.memory_gb("MemTotal:       24576000 kB\nMemFree: 1 kB\n") == 23.4
  assert machine.memory_gb("nothing here\n") is None


def test_git_state_commit_and_dirty_flag(tmp_path):
  assert machine.git_state(tmp_path) == (None, None)  # not a repository
  git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
  subprocess.run(git + ["init", "-q"], check=True)
  (tmp_path / "a.txt").write_text("one\n")
  subprocess.run(git + ["add", "a.txt"], check=True)
  subprocess.run(git + ["commit", "-q", "-m", "one"], check=True)
  head = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True,
                        text=True).stdout.strip()
  assert machine.git_state(tmp_path) == (head, False)
  (tmp_path / "untracked.txt").write_text("x\n")
  assert machine.git_state(tmp_path) == (head, False)  # untracked files do not count
  (tmp_path / "a.txt").write_text("two\n")
  assert machine.git_state(tmp_path) == (head, True)


def test_command_line_paths_inside_the_repository_are_relative(tmp_path):
  root = tmp_path / "repo"
  cmd = machine.command_line([f"{root}/scripts/benchmark.py", f"--out={root}/docs/r.json",
                              "--prompt", "a b"], root=root)
  assert cmd == "python scripts/benchmark.py --out=docs/r.json --prompt 'a b'"


def test_stamp_has_every_field_and_is_json():
  stamp = machine.machine_stamp(["scripts/benchmark.py", "--config=configs/tiny.py"])
  assert set(stamp) == {"cpu", "isa", "cores", "memory_gb", "os", "devices", "accelerator",
                        "python", "jax", "jaxlib", "git_commit", "git_dirty", "date_utc",
                        "command"}
  assert json.loads(json.dumps(stamp)) == stamp
  assert stamp["jax"] == jax.__version__ and stamp["cores"] >= 1
  assert sum(d["count"] for d in stamp["devices"]) == jax.device_count()
  assert stamp["accelerator"] is None or stamp["accelerator"] != "cpu"
  assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp["date_utc"])
  assert stamp["command"] == "python scripts/benchmark.py --config=configs/tiny.py"
  assert stamp["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40}", stamp["git_commit"])
