r"""`make results`: docs/results.md, the README's "What to expect" block and their plots,
generated from the stamped result JSON under docs/results/.

  python scripts/results.py            # write docs/results.md, README.md's block, PNGs
  python scripts/results.py --check    # exit 1 if a generated file differs from its JSON

Rendering is a pure function of the JSON (tools/results_page.py): running it twice,
or on another machine, gives the same Markdown byte for byte. New figures come from
`make results-measure` (scripts/measure_results.py).
"""

import sys

import _bootstrap  # repository root on sys.path; run(main)
from absl import flags

from tools import results_page

_CHECK = flags.DEFINE_bool("check", False, "only check that the generated files are current")
_PLOTS = flags.DEFINE_bool("plots", True, "also write the PNG plots")


def main(argv):
  del argv
  if _CHECK.value:
    stale = results_page.stale()
    if stale:
      print(f"stale: {', '.join(stale)} differ from {results_page.RESULTS_DIR}/*.json; "
            "run `make results`", file=sys.stderr)
      sys.exit(1)
    print(f"{results_page.PAGE} and {results_page.README} match {results_page.RESULTS_DIR}")
    return
  for path in results_page.write(plots=_PLOTS.value):
    print(f"wrote {path}")


if __name__ == "__main__":
  _bootstrap.run(main)
