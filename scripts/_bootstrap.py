"""Puts the repository root on sys.path so `python scripts/<name>.py` works from anywhere,
and `run(main)`: absl's app.run where bad user input exits with one line and status 2."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

USAGE_ERROR = 2  # the exit status of a run stopped by bad input (as argparse uses)
_OWN_CODE = tuple(os.path.join(ROOT, d) + os.sep
                  for d in ("specdec_jax", "scripts", "configs", "tools"))


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


def _flag_values(argv: list[str], name: str) -> list[str]:
  """The values given to --name in argv (`--name=v` or `--name v`)."""
  out = []
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{name}="):
      out.append(arg.split("=", 1)[1])
    elif arg == f"--{name}" and i + 1 < len(argv):
      out.append(argv[i + 1])
  return out


def check_path_flags(argv: list[str]) -> str | None:
  """The one-line problem with the command line's files, or None: a --config file that
  does not exist (config_flags' 'path.py:args' form is allowed), a --workdir that cannot
  be created or written, an --out whose directory cannot be."""
  for value in _flag_values(argv, "config"):
    path = value.split(":", 1)[0]
    if not os.path.isfile(path):
      return f"--config file {path!r} not found"
  targets = [("--workdir", v, v) for v in _flag_values(argv, "workdir")]
  targets += [("--out", v, os.path.dirname(v) or ".") for v in _flag_values(argv, "out")]
  for flag, value, directory in targets:
    try:
      os.makedirs(directory, exist_ok=True)
    except OSError as exc:
      return f"{flag} {value!r} cannot be created: {exc.strerror or exc}"
    if not os.access(directory, os.W_OK | os.X_OK):
      return f"{flag} {value!r} is not writable"
  return None


def run(main):
  """app.run(main); a user error prints `error: <message>` to stderr and exits 2.

  Before absl parses the flags, a missing --config file or an unwritable --workdir / --out
  directory is reported the same way (`check_path_flags`).
  """
  from absl import app

  if problem := check_path_flags(sys.argv[1:]):
    print(f"error: {problem}", file=sys.stderr, flush=True)
    sys.exit(USAGE_ERROR)

  def checked(argv):
    try:
      return main(argv)
    except (ValueError, FileNotFoundError) as exc:
      if not is_user_error(exc):
        raise
      print(f"error: {exc}", file=sys.stderr, flush=True)
      sys.exit(USAGE_ERROR)
  app.run(checked)
