"""The machine stamp every result file carries: what ran it, on what, at which commit.

Speed depends on the CPU kind as much as on the code (the same code's verify cost v(k)
differs widely between two 2-core x86 machines: docs/results_archive.md and
docs/design.md#verify-cost), so a figure without its machine is not a result.
`machine_stamp()` returns a JSON-ready dict:

  cpu          CPU model string ('/proc/cpuinfo' on Linux, else platform.processor())
  isa          the ISA flags that matter for XLA:CPU matmuls, of those present:
               avx, avx2, fma, avx512f, avx512_bf16, avx512_vnni, amx_tile, amx_bf16,
               amx_int8 (an empty list where the flags cannot be read)
  cores        logical CPUs this process may run on (sched_getaffinity, else cpu_count)
  memory_gb    total memory in GiB ('/proc/meminfo'; None where unknown)
  os           platform.platform(terse=True)
  devices      [{'platform', 'kind', 'count'}] from jax.devices(), grouped
  accelerator  the first non-CPU device kind, or None
  python, jax, jaxlib     versions
  git_commit   `git rev-parse HEAD` of the repository (None without git)
  git_dirty    whether tracked files differ from that commit (None without git)
  date_utc     'YYYY-MM-DDTHH:MM:SSZ'
  command      the command line, paths inside the repository made relative to it
"""

from __future__ import annotations

import datetime
import os
import pathlib
import platform
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile",
             "amx_bf16", "amx_int8")


def cpu_info(cpuinfo: str | None = None) -> tuple[str, list[str]]:
  """(CPU model, ISA flags of ISA_FLAGS present) from /proc/cpuinfo text (read if None)."""
  if cpuinfo is None:
    try:
      cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
      cpuinfo = ""
  model, flags = "", set()
  for line in cpuinfo.splitlines():
    key, _, value = line.partition(":")
    key = key.strip()
    if key == "model name" and not model:
      model = value.strip()
    elif key in ("flags", "Features") and not flags:  # x86 | arm
      flags = set(value.split())
  model = model or platform.processor() or platform.machine() or "unknown"
  return model, [f for f in ISA_FLAGS if f in flags]


def memory_gb(meminfo: str | None = None) -> float | None:
  """Total memory in GiB from /proc/meminfo text (read if None); None if unknown."""
  if meminfo is None:
    try:
      meminfo = pathlib.Path("/proc/meminfo").read_text()
    except OSError:
      return None
  for line in meminfo.splitlines():
    if line.startswith("MemTotal:"):
      return round(int(line.split()[1]) / 2**20, 1)  # kB -> GiB
  return None


def cores() -> int:
  """Logical CPUs this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    return os.cpu_count() or 0


def git_state(root: str | os.PathLike = ROOT) -> tuple[str | None, bool | None]:
  """(HEAD commit, whether tracked files are modified); (None, None) without git."""
  def git(*args):
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                          timeout=20, check=True).stdout
  try:
    commit = git("rev-parse", "HEAD").strip() or None
    dirty = bool(git("status", "--porcelain", "--untracked-files=no").strip())
  except (OSError, subprocess.SubprocessError):
    return None, None
  return commit, dirty


def command_line(argv: list[str] | None = None, root: str | os.PathLike = ROOT) -> str:
  """`python` + argv (sys.argv if None), with paths inside `root` made relative to it."""
  prefix = str(pathlib.Path(root)) + os.sep
  args = [a.replace(prefix, "") for a in (sys.argv if argv is None else argv)]
  return shlex.join(["python", *args])


def devices() -> list[dict]:
  """jax.devices() grouped by (platform, device kind), in order of first appearance."""
  import jax
  groups: dict[tuple[str, str], int] = {}
  for d in jax.devices():
    key = (d.platform, str(getattr(d, "device_kind", d.platform)))
    groups[key] = groups.get(key, 0) + 1
  return [dict(platform=p, kind=k, count=n) for (p, k), n in groups.items()]


def machine_stamp(argv: list[str] | None = None) -> dict:
  """The stamp described in the module docstring (JSON-ready)."""
  import jax
  import jaxlib

  model, isa = cpu_info()
  devs = devices()
  accelerators = [d["kind"] for d in devs if d["platform"] != "cpu"]
  commit, dirty = git_state()
  return dict(
      cpu=model, isa=isa, cores=cores(), memory_gb=memory_gb(),
      os=platform.platform(terse=True), devices=devs,
      accelerator=accelerators[0] if accelerators else None,
      python=platform.python_version(), jax=jax.__version__, jaxlib=jaxlib.__version__,
      git_commit=commit, git_dirty=dirty,
      date_utc=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
      command=command_line(argv))
