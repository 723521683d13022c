"""Prompt sets: prompts in a JSON file, each with a domain, and per-domain summaries.

A prompt set (e.g. configs/prompts/heldout.json) is

  {"name": ..., "description": ..., "licence": ...,
   "prompts": [{"id": "code-01", "domain": "code", "chat": false, "text": "...",
                "source": "..."}, ...]}

`chat` says whether the text is sent through the tokenizer's chat template (a user
turn) or continued as raw text. Benchmarks run every prompt on its own (batch 1) and
summarise per domain and over all prompts (`domain_summary`):

  speedup  geometric mean over prompts, with the 95% Student-t interval of the mean
           log-ratio mapped back by exp (ratios multiply, so their logs are averaged);
  α        arithmetic mean over prompts of each prompt's α (mean β = Σ min(p, q) over its
           reached drafted positions), with the 95% Student-t interval of that mean
           cut to [0, 1] (acceptance likewise).

Prompts are the independent units: the positions within one prompt are not. The
intervals treat a set's prompts as a sample of the text users send; they say nothing of
text unlike the set's.

`find_leaks` checks that no 40-byte window of a prompt occurs in a training text (case
and whitespace runs ignored).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from typing import Iterable, Sequence

import numpy as np

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_FIELDS = ("id", "domain", "chat", "text", "source")
DOMAINS = ("prose", "chat", "code", "scripture", "drama")  # the domains of heldout.json
ALL = "all"  # the summary row over every prompt of a set


@dataclasses.dataclass(frozen=True)
class Prompt:
  """One prompt of a set."""

  id: str
  domain: str
  chat: bool  # True: sent through the chat template as a user turn
  text: str
  source: str  # where the text comes from and under which licence


def resolve_path(path: str | os.PathLike) -> pathlib.Path:
  """`path` as given if it exists, else relative to the repository root."""
  p = pathlib.Path(path)
  if p.exists() or p.is_absolute():
    return p
  return _ROOT / p


def load_prompt_set(path: str | os.PathLike) -> list[Prompt]:
  """The prompts of a set file; ValueError naming the offending file, prompt and field.
  'FILE.json:code,chat' keeps the prompts of those domains, in file order."""
  text = os.fspath(path)
  name, sep, wanted = text.rpartition(":")
  if sep and name.endswith(".json") and wanted and not resolve_path(text).exists():
    domains = [d.strip() for d in wanted.split(",")]
    prompts = load_prompt_set(name)
    unknown = sorted(set(domains) - {p.domain for p in prompts})
    if unknown or "" in domains:
      raise ValueError(f"prompt set {name!r} has no domain {unknown or ['']}; it has "
                       f"{sorted({p.domain for p in prompts})}")
    return [p for p in prompts if p.domain in domains]
  p = resolve_path(path)
  if not p.is_file():
    raise ValueError(f"prompt set {os.fspath(path)!r} does not exist")
  try:
    doc = json.loads(p.read_text("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"prompt set {os.fspath(path)!r} is not UTF-8 JSON: {e}") from None
  items = doc.get("prompts") if isinstance(doc, dict) else None
  if not isinstance(items, list) or not items:
    raise ValueError(f"prompt set {os.fspath(path)!r} needs a non-empty list 'prompts'")
  out, seen = [], set()
  for i, item in enumerate(items):
    if not isinstance(item, dict) or set(item) != set(_FIELDS):
      got = sorted(item) if isinstance(item, dict) else type(item).__name__
      raise ValueError(f"prompt {i} of {os.fspath(path)!r} needs exactly the fields "
                       f"{list(_FIELDS)}, got {got}")
    for name in ("id", "domain", "text", "source"):
      if not isinstance(item[name], str) or not item[name].strip():
        raise ValueError(f"prompt {i} of {os.fspath(path)!r}: {name!r} must be a non-empty "
                         f"string, got {item[name]!r}")
    if not isinstance(item["chat"], bool):
      raise ValueError(f"prompt {item['id']!r}: 'chat' must be true or false, got "
                       f"{item['chat']!r}")
    if item["id"] in seen:
      raise ValueError(f"prompt id {item['id']!r} occurs twice in {os.fspath(path)!r}")
    seen.add(item["id"])
    out.append(Prompt(**{name: item[name] for name in _FIELDS}))
  return out


def encode(tokenizer, prompts: Sequence[Prompt]) -> list[list[int]]:
  """Token ids of each prompt, through the chat template where its `chat` says so."""
  from specdec_jax.loading import encode_prompts
  return [encode_prompts(tokenizer, [p.text], chat=p.chat)[0] for p in prompts]


# --------------------------------------------------------------------------- leak check

_ANCHOR = 8  # bytes: one little-endian uint64


def normalise(text: str | bytes) -> bytes:
  """UTF-8 bytes with ASCII letters lower-cased and every run of whitespace made one
  space (a copy that differs in case, indentation or line breaks still matches)."""
  data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
  return b" ".join(data.lower().split())


def _words(data: bytes, offset: int) -> np.ndarray:
  """uint64 [n]: the 8-byte words of `data` starting at offset, offset + 8, ... (a view)."""
  return np.frombuffer(data, "<u8", count=(len(data) - offset) // _ANCHOR, offset=offset)


def find_leaks(prompts: Sequence[Prompt], texts: Iterable[str | bytes], *,
               width: int = 40) -> list[tuple[str, str]]:
  """(prompt id, shared text) for every stretch of at least `width` bytes that a prompt
  and one of `texts` share after `normalise`; [] when there is none.

  A `width`-character window holds at least `width` bytes, so [] means no
  `width`-character window of a prompt occurs in the texts. Every `width`-byte window of
  a prompt contains one of its 8-byte anchors (taken every width - 7 bytes); the texts
  are searched for the anchors and each hit is extended both ways byte by byte.
  """
  if width < _ANCHOR:
    raise ValueError(f"width must be >= {_ANCHOR} bytes, got {width}")
  stride = width - _ANCHOR + 1
  anchors: dict[int, list[tuple[str, bytes, int]]] = {}
  for p in prompts:
    data = normalise(p.text)
    for a in range(0, len(data) - _ANCHOR + 1, stride):
      word = int(np.frombuffer(data, "<u8", count=1, offset=a)[0])
      anchors.setdefault(word, []).append((p.id, data, a))
  keys = np.array(sorted(anchors), np.uint64)
  found = set()
  for text in texts:
    data = normalise(text)
    for offset in range(min(_ANCHOR, len(data))):
      words = _words(data, offset)
      idx = np.minimum(np.searchsorted(keys, words), len(keys) - 1)
      for i in np.flatnonzero(keys[idx] == words).tolist():
        c = offset + _ANCHOR * i
        for pid, prompt, a in anchors[int(words[i])]:
          left = 0
          while left < min(a, c) and prompt[a - left - 1] == data[c - left - 1]:
            left += 1
          right = _ANCHOR
          while (a + right < len(prompt) and c + right < len(data)
                 and prompt[a + right] == data[c + right]):
            right += 1
          if left + right >= width:
            found.add((pid, prompt[a - left:a + right].decode("utf-8", "replace")))
  return sorted(found)


# --------------------------------------------------------------------------- summaries

def mean_interval(values, confidence: float = 0.95, *,
                  limits: tuple[float, float] = (-math.inf, math.inf)
                  ) -> tuple[float, float, float]:
  """(mean, low, high): the Student-t interval of the mean of `values` (NaNs dropped),
  cut to `limits` (where the quantity lies, e.g. (0, 1) for a probability); NaN bounds
  with fewer than 2 values, NaN everywhere with none."""
  from scipy import stats
  x = np.asarray(values, np.float64)
  x = x[~np.isnan(x)]
  if x.size == 0:
    return math.nan, math.nan, math.nan
  mean = float(x.mean())
  if x.size < 2:
    return mean, math.nan, math.nan
  half = float(stats.t.ppf(0.5 + confidence / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
  return mean, max(mean - half, limits[0]), min(mean + half, limits[1])


def geometric_mean_interval(ratios, confidence: float = 0.95) -> tuple[float, float, float]:
  """(geometric mean, low, high) of positive ratios: exp of `mean_interval` of their logs
  (NaNs dropped). ValueError for a ratio <= 0."""
  x = np.asarray(ratios, np.float64)
  if np.any(x[~np.isnan(x)] <= 0):
    raise ValueError(f"ratios must be > 0 for a geometric mean, got {x[x <= 0].tolist()}")
  return tuple(math.exp(v) if not math.isnan(v) else math.nan
               for v in mean_interval(np.log(x), confidence))


def domain_summary(domains: Sequence[str], *, speedup=None, alpha=None,
                   acceptance=None) -> list[dict]:
  """One dict per domain (in order of first appearance) and one for ALL prompts.

  domains [P]: each prompt's domain; speedup, alpha, acceptance [P] (or None): per-prompt
  values. Keys: domain, prompts, and for each given quantity its estimate and 95% bounds
  (speedup: geometric mean; alpha and acceptance: arithmetic mean, the interval cut to
  [0, 1]), e.g. speedup, speedup_lo, speedup_hi.
  """
  domains = list(domains)
  columns = {name: np.asarray(v, np.float64) for name, v in
             (("speedup", speedup), ("alpha", alpha), ("acceptance", acceptance))
             if v is not None}
  for name, v in columns.items():
    if v.shape != (len(domains),):
      raise ValueError(f"{name} needs one value per prompt ({len(domains)}), got shape "
                       f"{v.shape}")
  rows = []
  for domain in [*dict.fromkeys(domains), ALL]:
    mask = np.array([domain in (d, ALL) for d in domains])
    row = dict(domain=domain, prompts=int(mask.sum()))
    for name, v in columns.items():
      if name == "speedup":
        row[name], row[f"{name}_lo"], row[f"{name}_hi"] = geometric_mean_interval(v[mask])
      else:
        row[name], row[f"{name}_lo"], row[f"{name}_hi"] = mean_interval(v[mask], limits=(0, 1))
    rows.append(row)
  return rows


def format_summary(rows: Sequence[dict]) -> str:
  """The rows of `domain_summary` as a text table, one line per domain."""
  def cell(row, name, fmt):
    if name not in row:
      return ""
    est, lo, hi = row[name], row[f"{name}_lo"], row[f"{name}_hi"]
    return f"{est:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"
  lines = [f"{'domain':<10} {'n':>3}  {'speedup (geo. mean, 95%)':<26} "
           f"{'alpha (mean, 95%)':<24} {'accept (mean, 95%)':<24}"]
  for r in rows:
    lines.append(f"{r['domain']:<10} {r['prompts']:>3}  {cell(r, 'speedup', '.2f'):<26} "
                 f"{cell(r, 'alpha', '.3f'):<24} {cell(r, 'acceptance', '.3f'):<24}")
  return "\n".join(lines)
