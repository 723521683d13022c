"""Puts the repository root on sys.path so `python scripts/<name>.py` works from anywhere,
and `run(main)`: absl's app.run where bad user input exits with one line and status 2.

A script that takes --config declares the config fields it reads, as literals:

  CONFIG_FAMILY = "run"                       # specdec_jax.config_fields.FAMILIES
  CONFIG_READS = ("tokenizer", "target", ...)  # or "*": every field of the family

and `run(main)` checks the command line and the config against them before main runs
(`check_config_args`): nothing is loaded or compiled before a bad field is refused.
"""

import ast
import functools
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# where gamma 'auto' caches this machine's measured cost tables (tests point it elsewhere)
COSTS_DIR = os.environ.get("SPECDEC_COSTS_DIR") or os.path.join(ROOT, "runs", "costs")
# JAX's persistent compilation cache: a second run of a script (another prompt, another
# seed) loads its decode loops instead of compiling them again. 'off' disables it.
COMPILE_CACHE = os.environ.get("SPECDEC_COMPILE_CACHE") or os.path.join(ROOT, "runs",
                                                                        "jax_compile")
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


@functools.cache
def _script_constants(path: str) -> dict:
  """The CONFIG_* constants a script assigns at its top level (read from the source)."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  found = {}
  for node in tree.body:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
        isinstance(node.targets[0], ast.Name) and node.targets[0].id.startswith("CONFIG_"):
      try:
        found[node.targets[0].id] = ast.literal_eval(node.value)
      except ValueError:  # not a literal (e.g. the config flag itself)
        continue
  return found


def shapes_only(script: str, argv: list[str] = ()) -> bool:
  """True for a script that declares CONFIG_SHAPES_ONLY = True: it reads models' shapes
  alone and compiles for devices other than this machine's (scripts/tpu_plan.py), or
  CONFIG_SHAPES_ONLY = '<flag>' and argv sets that flag above 0 (profile_step.py's
  --random_weights): its config is checked without the machine
  (`config_checks.shapes_only`)."""
  path = os.path.join(ROOT, "scripts", script)
  if not os.path.exists(path):
    return False
  declared = _script_constants(path).get("CONFIG_SHAPES_ONLY")
  if isinstance(declared, str):
    return any(v.strip() not in ("", "0") for v in _flag_values(argv, declared))
  return declared is True


def declarations() -> dict[str, tuple[str, tuple[str, ...]]]:
  """{script file name: (CONFIG_FAMILY, CONFIG_READS)} of every script in scripts/ that
  declares them (read from the source, nothing imported)."""
  out = {}
  for path in sorted(glob.glob(os.path.join(ROOT, "scripts", "*.py"))):
    found = _script_constants(path)
    if found:
      family, reads = found["CONFIG_FAMILY"], found["CONFIG_READS"]
      if reads == "*":  # every field of the family
        from specdec_jax.config_fields import FAMILIES
        reads = tuple(FAMILIES[family])
      out[os.path.basename(path)] = (family, tuple(reads))
  return out


def readers(family: str, field: str) -> list[str]:
  """The scripts of `family` that read config.<field>."""
  return [name for name, (fam, reads) in declarations().items()
          if fam == family and field in reads]


def given_fields(argv: list[str], flag: str = "config") -> list[str]:
  """The top-level config fields set on the command line (`--config.a.b=v` -> 'a')."""
  out = []
  for arg in argv:
    if arg.startswith(f"--{flag}."):
      name = arg[len(flag) + 3:].split("=", 1)[0].split(".", 1)[0]
      if name not in out:
        out.append(name)
  return out


def load_config_args(argv: list[str], flag: str = "config"):
  """The config of argv's --<flag> file with its --<flag>.* overrides, parsed by
  ml_collections on a private flag set (one line for a value of the wrong type)."""
  from absl import flags
  from ml_collections import config_flags

  mine = [a for a in argv if a.startswith((f"--{flag}=", f"--{flag}."))]
  if not any(a.startswith(f"--{flag}=") for a in mine):
    return None
  mine = [sys.argv[0] if sys.argv else "script", *mine]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file(flag, None, "", flag_values=values, lock_config=True,
                                  sys_argv=mine)  # it finds the overrides' names there
  try:
    values(mine)
  except flags.Error as exc:
    message = str(exc).splitlines()[0]
    raise ValueError(message.replace(f"flag --{flag}.", f"--{flag}.")) from None
  except (AttributeError, KeyError) as exc:  # a field the config file lacks
    path = next(a for a in mine if a.startswith(f"--{flag}=")).split("=", 1)[1]
    raise ValueError(f"--{flag}: {path} has no field {str(exc).strip(chr(34))} to set "
                     f"(the script's default applies; add the field to the file to change "
                     f"it)") from None
  return values[flag].value


def with_default_config(argv: list[str], flag: str = "config") -> list[str]:
  """argv with its config file as one `--<flag>=FILE`: `--<flag> FILE` joined, or the
  script's default file put in front where argv names none and the flag has one
  (`scripts/run.py`), so that a default or space-separated config is checked as a given
  one is. Unchanged where the flag is not defined or has no default."""
  from absl import flags

  if flag not in flags.FLAGS:
    return argv
  if _flag_values(argv, flag):
    rest = iter(argv)
    return [f"--{flag}={next(rest, '')}" if arg == f"--{flag}" else arg for arg in rest]
  default = flags.FLAGS[flag].default_unparsed
  if not isinstance(default, str) or not default:
    return argv
  return [f"--{flag}={default}", *argv]


def check_config_args(argv: list[str], script: str, family: str, reads) -> None:
  """Raises ValueError (one line) when argv's config breaks `script`'s declaration
  (`specdec_jax.config_fields.check_config`): unknown or unread fields given, bad
  values, fields given that the run would not use."""
  from specdec_jax import config_checks, config_fields

  given = given_fields(argv)
  # before parsing: a typo is named as such, not as a parse failure
  config_fields.check_given(given, family=family, reads=reads, script=script,
                            readers=lambda name: readers(family, name))
  config = load_config_args(argv)
  if config is None:
    return
  with config_checks.shapes_only(shapes_only(script, argv)):
    config_fields.check_config(config, family=family, reads=reads, given=given,
                               script=script, readers=lambda name: readers(family, name))


def restrict(config, reads) -> None:
  """Removes the fields `reads` leaves out from a ConfigDict in place: a script reads only
  what it declared (reading anything else is an AttributeError, a bug to fix)."""
  with config.unlocked():
    for name in list(config.keys()):
      if name not in reads:
        del config[name]


def one_line(message: str) -> str:
  """A message on one line (a value's repr may span several)."""
  return " ".join(message.split())


def _flags_parser(argv):
  """absl's flag parsing, with a bad flag reported as one line and exit 2."""
  from absl import flags
  try:
    return flags.FLAGS(argv)
  except flags.Error as exc:
    print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
    sys.exit(USAGE_ERROR)


def run(main):
  """app.run(main); a user error prints `error: <message>` to stderr and exits 2.

  Before absl parses the flags, a missing --config file or an unwritable --workdir / --out
  directory is reported the same way (`check_path_flags`), and so is a config that
  breaks the script's CONFIG_FAMILY / CONFIG_READS declaration (`check_config_args`).
  The config main sees holds the declared fields only (`restrict`).
  """
  from absl import app, flags

  declared = getattr(sys.modules["__main__"], "CONFIG_READS", None)
  family = getattr(sys.modules["__main__"], "CONFIG_FAMILY", None)
  if declared == "*":
    from specdec_jax.config_fields import FAMILIES
    declared = tuple(FAMILIES[family])
  script = os.path.basename(sys.argv[0]) if sys.argv else "script"
  try:
    argv = with_default_config(sys.argv[1:])
    problem = check_path_flags(argv)
    if problem is None and declared is not None:
      check_config_args(argv, script, family, declared)
  except ValueError as exc:
    if not is_user_error(exc):
      raise
    problem = str(exc)
  if problem:
    print(f"error: {one_line(problem)}", file=sys.stderr, flush=True)
    sys.exit(USAGE_ERROR)
  if COMPILE_CACHE != "off":
    import jax
    jax.config.update("jax_compilation_cache_dir", COMPILE_CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)

  def checked(argv):
    if declared is not None and "config" in flags.FLAGS and flags.FLAGS["config"].value:
      restrict(flags.FLAGS["config"].value, declared)
    try:
      return main(argv)
    except (ValueError, FileNotFoundError) as exc:
      if not is_user_error(exc):
        raise
      print(f"error: {one_line(str(exc))}", file=sys.stderr, flush=True)
      sys.exit(USAGE_ERROR)
  app.run(checked, flags_parser=_flags_parser)
