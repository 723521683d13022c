"""Markdown cells and machine stamps for docs/results.md: the floor under `results_tables`
and `results_page`, importing neither.

A stamp is `io.machine.machine_stamp()`'s dict. Two rules of the pages rest on it: a
table's figures come from one machine (`machine_of`: CPU model, ISA flags, cores, memory,
accelerator), and the README quotes only figures measured on a clean commit (`unclean`).
"""

from __future__ import annotations

import math

ALL = "all"  # the overall row of a prompt set's domains; the unprefixed α of a report
MACHINE_KEYS = ("cpu", "isa", "cores", "memory_gb", "accelerator")


# --------------------------------------------------------------------------- cells

def table(header: list[str], rows: list[list[str]]) -> list[str]:
  """A Markdown table."""
  return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
          + ["| " + " | ".join(r) + " |" for r in rows])


def num(x, fmt: str) -> str:
  """x formatted, or '–' when missing (None or NaN)."""
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "–"
  return format(x, fmt)


def with_interval(row: dict, name: str, fmt: str, suffix: str = "") -> str:
  """'0.88x [0.84, 0.93]' from row[name], row[name_lo], row[name_hi] (bounds optional)."""
  est = num(row.get(name), fmt)
  if est == "–":
    return est
  lo, hi = num(row.get(f"{name}_lo"), fmt), num(row.get(f"{name}_hi"), fmt)
  bounds = f" [{lo}, {hi}]" if "–" not in (lo, hi) else ""
  return f"{est}{suffix}{bounds}"


def minutes(seconds: float) -> str:
  m, s = divmod(int(round(seconds)), 60)
  return f"{m} min {s} s" if m else f"{s} s"


# --------------------------------------------------------------------------- stamps

def stamp_of(doc: dict) -> dict:
  """The machine stamp of a result file (top level, or a sweep's meta)."""
  stamp = doc.get("stamp") or doc.get("meta", {}).get("stamp")
  if not stamp:
    raise ValueError("result file has no machine stamp ('stamp' or 'meta.stamp'); "
                     "re-measure it with a script that writes one")
  return stamp


def isa_summary(isa: list[str]) -> str:
  """The widest vector extension: 'AMX', 'AVX-512', 'AVX2', 'AVX, no AVX2' or 'no AVX'."""
  if any(f.startswith("amx") for f in isa):
    return "AVX-512 and AMX"
  if "avx512f" in isa:
    return "AVX-512"
  if "avx2" in isa:
    return "AVX2, no AVX-512"
  return "AVX, no AVX2" if "avx" in isa else "no AVX"


def machine_short(stamp: dict) -> str:
  """'AMD EPYC, 2 cores, AVX-512' (+ the accelerator)."""
  text = f"{stamp['cpu']}, {stamp['cores']} cores, {isa_summary(stamp['isa'])}"
  return text + (f", {stamp['accelerator']}" if stamp.get("accelerator") else "")


def machine_of(stamp: dict) -> tuple:
  """What makes two stamps one machine: equal MACHINE_KEYS (not the OS build, the commit,
  the date or the command)."""
  return tuple(repr(stamp.get(k)) for k in MACHINE_KEYS)


def commit_short(stamp: dict) -> str:
  commit = stamp.get("git_commit")
  if not commit:
    return "unknown commit"
  return commit[:7] + (" (uncommitted changes)" if stamp.get("git_dirty") else "")


def unclean(stamp: dict) -> str | None:
  """Why no commit reproduces what the stamp measured, or None for a clean commit."""
  if not stamp.get("git_commit"):
    return "measured at an unknown commit"
  if stamp.get("git_dirty") is not False:
    return f"measured at {stamp['git_commit'][:7]} with uncommitted changes"
  return None


def absolute_paths(command: str) -> list[str]:
  """The absolute paths a stamped command line names (a word, or a flag's value, that
  starts with '/'): a committed command must name the repository's files relative to its
  root, never a path of the machine that ran it."""
  words = command.split()[1:]  # the interpreter itself may be named by its path
  values = [w.split("=", 1)[1] if w.startswith("-") and "=" in w else w for w in words]
  return [v for v in values if v.startswith(("/", "~"))]


def stamp_lines(stamp: dict, result_path: str) -> list[str]:
  """The provenance list under each section's heading."""
  devices = ", ".join(f"{d['count']} x {d['kind']}" for d in stamp["devices"])
  memory = f"{stamp['memory_gb']:g} GiB" if stamp.get("memory_gb") else "memory unknown"
  return [
      f"- Command: `{stamp['command']}`",
      f"- Machine: {stamp['cpu']}; {stamp['cores']} cores; ISA "
      f"{', '.join(stamp['isa']) or 'flags unknown'}; {memory}; devices {devices}; "
      f"{stamp['os']}",
      f"- Code: commit {commit_short(stamp)}; jax {stamp['jax']}, jaxlib {stamp['jaxlib']}, "
      f"Python {stamp['python']}",
      f"- Date: {stamp['date_utc']}",
      f"- Result file: [results/{result_path}](results/{result_path})",
  ]


def machine_groups(doc: dict) -> list[tuple[dict, list[dict]]]:
  """[(stamp, rows)]: doc['rows'] grouped by the machine that measured each (a row's own
  'stamp', else the file's), the file's machine first, then in order of appearance."""
  groups: dict[tuple, tuple[dict, list[dict]]] = {}
  top = stamp_of(doc)
  groups[machine_of(top)] = (top, [])
  for r in doc.get("rows", []):
    stamp = r.get("stamp") or top
    groups.setdefault(machine_of(stamp), (stamp, []))[1].append(r)
  return [g for g in groups.values() if g[1]]


def costs_stamp(doc: dict) -> dict:
  """The stamp of the machine that timed doc['costs'] (its 'costs_stamp', else the file's)."""
  return doc.get("costs_stamp") or stamp_of(doc)


def quoted_stamps(doc: dict) -> list[dict]:
  """Every stamp behind the figures the README quotes from `doc`: the file's, and those of
  its costs and rows where measured on the file's machine (the only ones quoted)."""
  top = stamp_of(doc)
  extra = [costs_stamp(doc)] + [r["stamp"] for r in doc.get("rows", []) if r.get("stamp")]
  return [top] + [s for s in extra if s is not top and machine_of(s) == machine_of(top)]
