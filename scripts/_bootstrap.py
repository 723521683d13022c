"""Puts the repository root on sys.path so `python scripts/<name>.py` works from anywhere,
and `run(main)`: absl's app.run where bad user input exits with one line and status 2."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

USAGE_ERROR = 2  # the exit status of a run stopped by bad input (as argparse uses)
_OWN_CODE = tuple(os.path.join(ROOT, d) + os.sep for d in ("specdec_jax", "scripts", "configs"))


def is_user_error(exc: BaseException) -> bool:
  """A ValueError / FileNotFoundError raised by this repository's own code: by convention
  a check of the user's input (configs, flags, files) that names the offending value.
  One raised inside a library is not: its traceback is kept (it may be a bug)."""
  if not isinstance(exc, (ValueError, FileNotFoundError)):
    return False
  tb = exc.__traceback__
  while tb is not None and tb.tb_next is not None:
    tb = tb.tb_next
  return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_OWN_CODE)


def run(main):
  """app.run(main); a user error prints `error: <message>` to stderr and exits 2."""
  from absl import app

  def checked(argv):
    try:
      return main(argv)
    except (ValueError, FileNotFoundError) as exc:
      if not is_user_error(exc):
        raise
      print(f"error: {exc}", file=sys.stderr, flush=True)
      sys.exit(USAGE_ERROR)
  app.run(checked)
