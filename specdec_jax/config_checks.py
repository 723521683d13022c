"""The checks of single config fields (`config_fields.Field.check`): model names, γ, trees,
meshes, prompt sets, cost tables and folders. Each raises ValueError with one line; a check
imports a module and loads a file only to see that it exists and parses.
`shapes_only` turns off the checks that need this machine (a fetched GGUF, a mesh's device
count) while a compile plan checks a config for other devices."""

from __future__ import annotations

import contextlib
import contextvars
import os

# a fixed γ or a tree compiles one step program of γ+1 (nodes+1) target positions
TREE_NODES_LIMIT = 64


def is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def choices(*allowed: str):
  def check(value, config):
    if value not in allowed:
      raise ValueError(f"must be one of {list(allowed)}, got {value!r}")
  return check


def named(name: str, check):
  """check with its message prefixed by config.<name>."""
  def wrapped(value, config):
    try:
      check(value, config)
    except ValueError as exc:
      message = str(exc).splitlines()[0] if str(exc) else repr(exc)
      if message.startswith("config."):
        raise
      if message.split(" ", 1)[0] == name:  # 'tree must be ...' -> 'config.tree must be ...'
        message = message.split(" ", 1)[1]
      raise ValueError(f"config.{name} {message}") from None
  return wrapped


def _existing_file(value: str, what: str) -> None:
  if not os.path.isfile(value):
    raise ValueError(f"{what} {value!r} is not a file")


def check_model_name(name: str, *, role: str) -> None:
  """Raises ValueError for a tokenizer / target / draft name (`loading`'s module docstring)
  that cannot load: a bad form, a missing file or folder, a bad draft kind argument. A
  missing 'saved:<dir>' draft is left to `loading` (make run distils it first)."""
  from specdec_jax.drafts import registry
  if not isinstance(name, str):
    raise ValueError(f"must be a string, got {name!r}")
  if role == "tokenizer" and name == "bytes":
    return
  if role == "target" and name == "random_tiny":
    return
  if role == "draft":
    if name in ("none", "random"):
      return
    if name.startswith("truncate:"):
      k = name.partition(":")[2]
      if not k.isdigit() or int(k) < 1:
        raise ValueError(f"'truncate:<k>' needs an int k >= 1, got {name!r}")
      return
    if registry.is_registered(name):
      registry.check_name(name)
      return
    if name.startswith("saved:") and name[len("saved:"):]:
      return
  if role == "target":
    for prefix in ("saved:", "hf:"):
      if name.startswith(prefix):
        if not os.path.isdir(name[len(prefix):]):
          raise ValueError(f"{name!r}: folder {name[len(prefix):]!r} not found")
        return
  if name == "smollm2" and role in ("tokenizer", "target"):
    return
  from specdec_jax.io import wheel_parts
  if name in wheel_parts.QWEN_NAMES:  # assembled by `make qwen`, never at load time
    if _ON_THIS_MACHINE.get():  # a compile plan reads the pinned header instead
      wheel_parts.qwen_path(name)
    return
  if name.endswith(".gguf"):
    _existing_file(name, "GGUF file")
    with open(name, "rb") as f:
      if f.read(4) != b"GGUF":
        raise ValueError(f"{name!r} is not a GGUF file (no GGUF magic)")
    return
  qwen = ", ".join(repr(n) for n in sorted(wheel_parts.QWEN_NAMES))
  forms = {"tokenizer": f"'bytes', 'smollm2', {qwen} or a .gguf path",
           "target": f"'smollm2', {qwen}, a .gguf path, 'hf:<dir>', 'saved:<dir>' or "
                     f"'random_tiny'",
           "draft": f"'none', 'saved:<dir>', 'truncate:<k>', 'random', {qwen}, a .gguf path "
                    f"or '<kind>:<n>' of a registered kind"}[role]
  raise ValueError(f"unknown {role} {name!r}: expected {forms}")


def model_name_check(role: str):
  def check(value, config):
    check_model_name(value, role=role)
  return check


def check_gamma(value, config):
  from specdec_jax.config_proposer import parse_gamma
  parse_gamma(value)


def check_tree(value, config):
  if not str(value).strip():
    return
  from specdec_jax.verification.tree_shapes import parse_tree
  shape = parse_tree(value)
  if shape.call_nodes > TREE_NODES_LIMIT:
    raise ValueError(f"has {shape.call_nodes} nodes per call; at most {TREE_NODES_LIMIT} "
                     f"(one compiled step verifies them all), got {value!r}")


# False while a shapes-only script's config is checked (`shapes_only`): the checks that
# need this machine (a Qwen GGUF fetched, the device count of a mesh) are skipped.
_ON_THIS_MACHINE = contextvars.ContextVar("on_this_machine", default=True)


@contextlib.contextmanager
def shapes_only(enabled: bool = True):
  """Checks inside skip what needs this machine: the config names models and meshes
  whose shapes a compile plan reads for other devices (scripts/tpu_plan.py)."""
  token = _ON_THIS_MACHINE.set(not enabled)
  try:
    yield
  finally:
    _ON_THIS_MACHINE.reset(token)


def check_mesh(value, config):
  if not str(value).strip():
    return
  from specdec_jax.models.sharding import parse_mesh_shape
  data, model = parse_mesh_shape(value)
  if not str(config.get("distributed", "")).strip() and _ON_THIS_MACHINE.get():
    # one process: its devices are known
    import jax
    if data * model != jax.device_count():
      raise ValueError(f"{value!r} needs {data * model} devices, {jax.device_count()} are "
                       f"available (CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N)")


def check_distributed(value, config):
  from specdec_jax.models.sharding import parse_distributed
  parse_distributed(value)


def check_prompt_set(value, config):
  if not value:
    return
  from specdec_jax.bench.prompt_sets import load_prompt_set  # 'FILE.json[:domain,...]'
  load_prompt_set(value)


def check_costs(value, config):
  if not value:
    return
  _existing_file(value, "cost table")
  from specdec_jax.gamma.cost_cache import load_pinned_table
  gamma_max = config.get("gamma_max", None)
  load_pinned_table(value, gamma_max=gamma_max if is_int(gamma_max) else None)


def check_head_tokens(value, config):
  """A head-tokens file (`io.head_tokens`) that parses and suits config.draft_head_size."""
  if not value:
    return
  from specdec_jax.io import head_tokens
  record = head_tokens.read(value)
  size = config.get("draft_head_size", 0)
  if is_int(size) and not 0 <= size < record["vocab_size"]:
    raise ValueError(f"{value!r} is for a vocabulary of {record['vocab_size']} ids: "
                     f"config.draft_head_size must lie in [0, {record['vocab_size']}), got {size}")


def check_head_size(value, config):
  """A subset head needs its file and a model draft to cut (a lookup has no head)."""
  from specdec_jax.drafts import registry
  if not value:
    return
  if not config.get("draft_head_tokens", ""):
    raise ValueError(f"= {value} needs config.draft_head_tokens (a file of "
                     "scripts/head_tokens.py)")
  draft = str(config.get("draft", ""))
  if draft == "none" or (registry.is_registered(draft) and not registry.needs_inner(draft)):
    raise ValueError(f"= {value} cuts a model draft's head, and draft {draft!r} has none")


def check_max_new_tokens(value, config):
  limit = config.get("max_seq_len", None)
  if is_int(limit) and value >= limit:
    raise ValueError(f"must be below max_seq_len {limit}, got {value}")


def check_top_p(value, config):
  if not 0 < value <= 1:
    raise ValueError(f"must lie in (0, 1], got {value!r}")


def check_drafts(value, config):
  if not value or not all(isinstance(p, (tuple, list)) and len(p) == 2 and
                          all(isinstance(s, str) and s for s in p) for p in value):
    raise ValueError(f"needs (name, draft) pairs of non-empty strings, got {value!r}")
  for _, spec in value:
    check_model_name(spec, role="draft")


def writable_dir(value, config):
  if not value:
    raise ValueError("must name a folder, got ''")
  folder = os.path.abspath(value)
  while not os.path.exists(folder):
    folder = os.path.dirname(folder)
  if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
    raise ValueError(f"{value!r} cannot be created or written")


def check_prompt_source(value, config):
  if value != "config" and not (value.startswith("heldout:") and value[len("heldout:"):]):
    raise ValueError(f"must be 'config' or 'heldout:<corpus>', got {value!r}")


def check_batch_draft(value, config):
  names = [pair[0] for pair in config.get("drafts", ()) if isinstance(pair, (tuple, list))]
  if value and value not in names:
    raise ValueError(f"must be '' or a name in config.drafts {names}, got {value!r}")
