"""Writes a kill cannot leave half done: a temporary file beside the target, fsync, rename.

A reader sees the old file or the new one, never a prefix of the new one; a write that
fails or is interrupted leaves no temporary file behind (a SIGKILL may leave one, named
`.<name>.*.tmp`, which nothing reads). `file_sha256` is the one hash of a file's bytes.
Standard library only: scripts outside the project's venv load this file by its path.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import pathlib
import tempfile
from typing import Any, Callable


def atomic_save(path: str | os.PathLike, save: Callable[[str], Any]) -> None:
  """Calls `save(temporary path)` on a temporary file beside `path` (a writer that takes a
  path: safetensors, a plot), fsyncs it, then renames it over `path`."""
  path = pathlib.Path(path)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  os.close(fd)
  try:
    save(tmp)
    with open(tmp, "rb+") as f:
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def atomic_write(path: str | os.PathLike, write: Callable[[io.BufferedWriter], Any]) -> None:
  """Calls `write(binary file)` on a temporary file beside `path`, then renames it over it."""
  def save(tmp):
    with open(tmp, "wb") as f:
      write(f)
  atomic_save(path, save)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
  atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def atomic_write_csv(path: str | os.PathLike, rows, lineterminator: str = "\r\n") -> None:
  """rows (a header, then the values, each a list) as CSV (`csv.writer`), atomically."""
  text = io.StringIO()
  csv.writer(text, lineterminator=lineterminator).writerows(rows)
  atomic_write_text(path, text.getvalue())


def atomic_write_json(path: str | os.PathLike, obj, **dump_kw) -> None:
  """json.dumps(obj, indent=1, **dump_kw) + a newline, atomically."""
  atomic_write_text(path, json.dumps(obj, indent=1, **dump_kw) + "\n")


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
  """The sha256 hex digest of a file's bytes, read `chunk` bytes at a time."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(chunk), b""):
      h.update(block)
  return h.hexdigest()
