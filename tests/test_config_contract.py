"""The config contract (specdec_jax.config_fields, scripts/_bootstrap.py): every script x
every field it reads x bad values by kind ends in one line or in the value honoured;
unknown and unread fields are refused; gamma 'auto' replays from a pinned cost table.

The walk reads the scripts' CONFIG_READS declarations and the fields' kinds, so a new
field or script is covered without editing this file."""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from specdec_jax import config_fields

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import _bootstrap  # noqa: E402

# the smallest config file of each family (every field of the family set)
TINY = {"run": "configs/tiny.py", "distill": "configs/distill_tiny.py",
        "sweep": "configs/sweep_tiny.py"}

# bad values by kind: (case, text on the command line, must it be refused)
NUMBER_CASES = [("negative", "-1", True), ("zero", "0", False), ("huge", "1000000000", False),
                ("wrong type", "abc", True)]
FLOAT_CASES = [("nan", "nan", True), ("inf", "inf", True)]
STR_CASES = [("empty", "", False), ("unknown name", "bogus:name", False)]
PATH_CASES = {
    "model": [("missing path", "missing/none.gguf", True), ("corrupt file", "{corrupt}.gguf",
                                                             True)],
    "read": [("missing path", "missing/none.json", True), ("corrupt file", "{corrupt}.json",
                                                           True)],
    "write": [("unwritable path", "{corrupt}.json/cache", True)],  # under a file
}


def cases(field: config_fields.Field):
  """(case, value text, must refuse) for one field's kind."""
  if field.kind == "int":
    out = list(NUMBER_CASES) + [("wrong type", "1.5", True)]
  elif field.kind == "float":
    out = list(NUMBER_CASES) + FLOAT_CASES
  elif field.kind == "bool":
    out = [("wrong type", "maybe", True)]
  elif field.kind == "str":
    out = list(STR_CASES) + PATH_CASES.get(field.path, [])
  elif field.kind == "texts":
    out = [("empty", "()", True), ("empty text", "('',)", True)]
  elif field.kind == "dims":
    out = [("negative", "{sub}=-1", True), ("unknown name", "{sub_unknown}=3", True)]
  elif field.kind == "seq":
    out = [("empty", "()", False)]
  else:
    out = []
  if field.low is not None and field.low < 0:  # a field where negatives are legal
    out = [(c, v, refuse and c != "negative") for c, v, refuse in out]
  return out


def tiny_fields(family) -> set:
  return set(_bootstrap.load_config_args([f"--config={TINY[family]}"]).keys())


def walk():
  """Every script x every field it reads that its family's tiny config sets (a field
  the file lacks cannot be set on the command line: that is refused as such)."""
  for script, (family, reads) in sorted(_bootstrap.declarations().items()):
    fields = config_fields.FAMILIES[family]
    present = tiny_fields(family)
    for name in reads:
      if name not in present:
        continue
      for case, text, refuse in cases(fields[name]):
        yield script, family, reads, name, case, text, refuse


def argv_of(family, name, text, corrupt, dims_key="num_layers"):
  text = text.replace("{corrupt}", str(corrupt))
  if text.startswith("{sub}"):
    return [f"--config={TINY[family]}", f"--config.{name}.{dims_key}{text[5:]}"]
  if text.startswith("{sub_unknown}"):
    return [f"--config={TINY[family]}", f"--config.{name}.no_such_size{text[13:]}"]
  return [f"--config={TINY[family]}", f"--config.{name}={text}"]


def outcome(script, family, reads, argv):
  """The one-line refusal, or None (accepted)."""
  try:
    _bootstrap.check_config_args(argv, script, family, reads)
  except ValueError as exc:
    return str(exc)
  return None


def test_every_script_with_a_config_declares_its_fields():
  declared = _bootstrap.declarations()
  for path in sorted((REPO / "scripts").glob("*.py")):
    if "config_flags.DEFINE_config_file(" in path.read_text() and path.name != "_bootstrap.py":
      assert path.name in declared, f"{path.name} takes --config but declares no CONFIG_READS"
  for script, (family, reads) in declared.items():
    unknown = set(reads) - set(config_fields.FAMILIES[family])
    assert not unknown, f"{script} reads fields of no family: {unknown}"
  assert "run.py" in declared  # make run's script, too


HEAVY = (("specdec_jax.loading", "load_models"), ("specdec_jax.loading", "load_target"),
         ("specdec_jax.loading", "load_draft"), ("specdec_jax.io.gguf", "load_gguf"),
         ("specdec_jax.io.checkpoint", "load_params"),
         ("specdec_jax.gamma.machine_costs", "measure_steps"))


def test_walk_every_script_and_field(tmp_path, monkeypatch):
  """Every case is refused with one line, or is a value the field admits (zero, huge,
  empty, a free name), and no check loads a model or times anything (the loaders and the
  step-cost harness raise if called). Report: how many cases ran."""
  import importlib
  monkeypatch.chdir(REPO)
  for module, name in HEAVY:
    def heavy(*args, _name=f"{module}.{name}", **kwargs):
      raise AssertionError(f"a config check called {_name}: heavy work before main")
    monkeypatch.setattr(importlib.import_module(module), name, heavy)
  corrupt = tmp_path / "corrupt"
  for suffix in (".gguf", ".json"):
    pathlib.Path(f"{corrupt}{suffix}").write_bytes(b"\x00not what it claims\xff")
  for script, (family, reads) in _bootstrap.declarations().items():  # the baseline passes
    assert outcome(script, family, reads, [f"--config={TINY[family]}"]) is None, script
  ran, refused, problems = 0, 0, []
  for script, family, reads, name, case, text, refuse in walk():
    ran += 1
    got = outcome(script, family, reads, argv_of(family, name, text, corrupt))
    if got is None:
      if refuse:
        problems.append(f"{script} {name}={text!r} ({case}): accepted")
      continue
    refused += 1
    if "\n" in got or not got.strip():
      problems.append(f"{script} {name}={text!r}: not one line: {got!r}")
  print(f"config contract walk: {ran} cases, {refused} refused")
  assert ran > 300
  assert not problems, "\n".join(problems)


@pytest.mark.parametrize("script,flag,expect", [
    ("generate.py", "--config.no_such_field=3", "unknown config field 'no_such_field'"),
    ("sweep.py", "--config.no_such_field=3", "unknown config field 'no_such_field'"),
    ("generate.py", "--config.repeats=2", "generate.py does not read config.repeats; "
     "scripts that do: benchmark.py"),
    ("mesh_benchmark.py", "--config.tree=2,2", "mesh_benchmark.py does not read config.tree"),
    ("generate.py", "--config.gamma_max=500", "config.gamma_max must lie in [0, 16]"),
    ("generate.py", "--config.tree_rule=topk", "config.tree_rule is set but not used"),
    ("generate.py", "--config.gamma_prior=0.8", "config.gamma_prior is set but not used"),
    ("benchmark.py", "--config.gamma_prior=1.5", "config.gamma_prior must lie in [0, 1]"),
])
def test_refusals_name_the_field(script, flag, expect):
  family, reads = _bootstrap.declarations()[script]
  config = TINY[family]
  got = outcome(script, family, reads, [f"--config={config}", flag])
  assert got is not None and expect in got, got


def test_tree_with_gamma_auto_is_refused_at_once():
  family, reads = _bootstrap.declarations()["generate.py"]
  got = outcome("generate.py", family, reads, ["--config=configs/tiny.py",
                                               "--config.gamma=auto", "--config.tree=2,2"])
  assert "config.tree needs a fixed gamma" in got


def test_a_config_file_field_of_another_script_is_refused_unless_off(tmp_path):
  """configs/heldout_smollm2.py sets prompt_set: generate.py does not read it."""
  family, reads = _bootstrap.declarations()["generate.py"]
  got = outcome("generate.py", family, reads, ["--config=configs/heldout_smollm2.py"])
  assert got is not None and "does not read config.prompt_set" in got
  assert outcome("generate.py", family, reads, ["--config=configs/heldout_smollm2.py",
                                                "--config.prompt_set="]) is not None  # given


def _script(name, *args, env=None, timeout=120):
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", **(env or {})}
  t0 = time.perf_counter()
  proc = subprocess.run([sys.executable, str(REPO / "scripts" / name), *args], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=timeout)
  return proc, time.perf_counter() - t0


@pytest.mark.parametrize("flag", ["--config.gamma_max=500", "--config.tree=x",
                                  "--config.mesh=a,b", "--config.seed=-3",
                                  "--config.no_such_field=3", "--config.seed=abc"])
def test_the_command_line_says_one_line_and_exits_2_within_10_s(flag):
  proc, seconds = _script("generate.py", "--config=configs/tiny.py", "--prompt=abc", flag)
  assert proc.returncode == _bootstrap.USAGE_ERROR, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
  assert seconds < 10


def test_a_scripts_default_config_is_checked_as_a_given_one():
  """scripts/run.py with no --config= runs its default file (configs/smollm2_135m.py): a
  field set but not used is refused before anything loads, as with --config= (a check
  that let it through would start `make run`'s work and time out)."""
  proc, _ = _script("run.py", "--config.tree_rule=topk", timeout=60)
  assert proc.returncode == _bootstrap.USAGE_ERROR, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines() == [
      "error: config.tree_rule is set but not used: no tree is set (config.tree)"]


@pytest.mark.parametrize("args,message", [
    ((), "--config must have a value other than None"),  # generate.py has no default file
    (("--config", "configs/tiny.py", "--config.tree_rule=topk"),  # the space-separated form
     "error: config.tree_rule is set but not used: no tree is set (config.tree)"),
])
def test_a_config_named_either_way_or_none_is_one_line(args, message):
  proc, _ = _script("generate.py", "--prompt=abc", *args, timeout=60)
  assert proc.returncode == _bootstrap.USAGE_ERROR, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_gamma_auto_replays_from_a_pinned_table_with_no_cached_one(tmp_path):
  """generate.py with gamma 'auto' measures a table into an empty cache and records it;
  a second run pinned to that record (--config.costs), with another empty cache, gives
  the same tokens and measures nothing."""
  first_cache, second_cache = tmp_path / "costs1", tmp_path / "costs2"
  common = ["--config=configs/tiny.py", "--prompt=abc", "--prompt=hello there",
            "--config.gamma=auto", "--config.batch_size=2", "--config.max_new_tokens=24",
            "--json"]
  proc, _ = _script("generate.py", *common, env={"SPECDEC_COSTS_DIR": str(first_cache)},
                    timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  first = json.loads(proc.stdout.strip().splitlines()[-1])
  assert first["cost_table"]["step_costs"], first
  assert list(first_cache.iterdir())  # measured and cached
  record = tmp_path / "first.json"
  record.write_text(json.dumps(first))
  proc, _ = _script("generate.py", *common, f"--config.costs={record}",
                    env={"SPECDEC_COSTS_DIR": str(second_cache)}, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  second = json.loads(proc.stdout.strip().splitlines()[-1])
  assert not second_cache.exists() or not list(second_cache.iterdir())  # nothing measured
  assert second["cost_table"] == first["cost_table"]
  assert second["mode"] == first["mode"]  # speculative, or plain where drafting cannot pay
  assert [r["tokens"] for r in second["rows"]] == [r["tokens"] for r in first["rows"]]
  assert second["gamma_histogram"] == first["gamma_histogram"]


def test_gamma_auto_records_the_table_it_decided_plain_decoding_on(tmp_path):
  """Pinned to a table in which no γ pays, generate.py says so in one line, decodes
  autoregressively and records that table, so its result replays the decision."""
  record = tmp_path / "costly.json"
  record.write_text(json.dumps({"cost_table": {"step_costs": [1.0, 9.0, 9.5, 10.0, 10.5,
                                                              11.0, 11.5]}}))
  proc, _ = _script("generate.py", "--config=configs/tiny.py", "--prompt=abc",
                    "--config.gamma=auto", "--config.max_new_tokens=8",
                    f"--config.costs={record}", "--json", timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  assert any("drafting does not pay" in line for line in lines), proc.stdout[-2000:]
  result = json.loads(lines[-1])
  assert result["mode"] == "autoregressive" and result["gamma_histogram"] is None
  assert result["cost_table"]["step_costs"][:3] == [1.0, 9.0, 9.5]


@pytest.mark.slow
def test_every_refusal_through_the_real_command_line(tmp_path):
  """The walk's refused cases, each run as its script's real command: one stderr line,
  exit 2, within 10 s (slow: one process per case)."""
  corrupt = tmp_path / "corrupt"
  for suffix in (".gguf", ".json"):
    pathlib.Path(f"{corrupt}{suffix}").write_bytes(b"\x00not what it claims\xff")
  problems = []
  for script, family, reads, name, case, text, refuse in walk():
    argv = argv_of(family, name, text, corrupt)
    if outcome(script, family, reads, argv) is None:
      continue
    extra = {"sweep.py": [f"--workdir={tmp_path / 'w'}"], "distill.py": [
        f"--workdir={tmp_path / 'w'}"], "train.py": [f"--workdir={tmp_path / 'w'}"],
        "distill_table.py": [f"--workdir={tmp_path / 'w'}"]}.get(script, [])
    proc, seconds = _script(script, *argv, *extra, timeout=60)
    lines = proc.stderr.strip().splitlines()
    if proc.returncode != 2 or len(lines) != 1 or seconds > 10:
      problems.append(f"{script} {argv[-1]}: exit {proc.returncode}, {len(lines)} lines, "
                      f"{seconds:.1f} s: {proc.stderr[-300:]!r}")
  assert not problems, "\n".join(problems)


@pytest.mark.parametrize("draft", [
    ["--config.draft=ngram:3"],
    pytest.param(["--config.draft=hybrid:3", "--config.feature_draft=truncate:1"],
                 marks=pytest.mark.slow)])  # in make test: tests/test_hybrid.py in process
def test_lookup_drafts_decode_with_gamma_auto_from_an_empty_cost_cache(tmp_path, draft):
  """'ngram:<n>' and 'hybrid:<n>' with gamma 'auto' measure their table into an empty
  cache and decode; greedy, the text equals plain decoding's."""
  common = ["--config=configs/tiny.py", "--prompt=abcabcabc", "--config.batch_size=1",
            "--config.temperature=0", "--config.max_new_tokens=16", "--json"]
  env = {"SPECDEC_COSTS_DIR": str(tmp_path / "costs")}
  proc, _ = _script("generate.py", *common, *draft, "--config.gamma=auto", env=env,
                    timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  spec = json.loads(proc.stdout.strip().splitlines()[-1])
  assert spec["cost_table"] is not None or spec["mode"] == "autoregressive"
  plain, _ = _script("generate.py", *common, "--config.draft=none", env=env, timeout=300)
  assert plain.returncode == 0, plain.stderr[-3000:]
  assert spec["tokens"] == json.loads(plain.stdout.strip().splitlines()[-1])["tokens"]
