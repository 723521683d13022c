"""Corrupt and hostile inputs get a ValueError naming the file and the problem.

GGUF (truncated, wrong tensor shape, unsupported architecture) and safetensors
(missing tensor, corrupt or mistyped weights) cases live in test_gguf.py and
test_safetensors.py; prompts longer than the cache in test_speculative.py. This file
covers saved drafts (edited or truncated), names of missing files, undecodable prompt
bytes, and checks that no loader can execute code from a file (no pickle).
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from helpers import noise_params, tiny_config
from specdec_jax.io import checkpoint as ckpt_lib
from specdec_jax.loading import ByteTokenizer, encode_prompts, load_draft

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def saved_draft(tmp_path):
  config = tiny_config(layers=1, width=16)
  directory = tmp_path / "draft"
  ckpt_lib.save_params(directory, noise_params(config), config,
                       tokenizer_identity=ByteTokenizer.identity)
  return directory, config


def _edit_model_json(directory, edit):
  path = directory / "model.json"
  meta = json.loads(path.read_text())
  edit(meta)
  path.write_text(json.dumps(meta))


def test_a_saved_draft_loads_back(saved_draft):
  directory, config = saved_draft
  _, loaded, _ = ckpt_lib.load_params(directory, tokenizer_identity=ByteTokenizer.identity)
  assert loaded == config


def test_model_json_with_another_width(saved_draft):
  directory, _ = saved_draft
  _edit_model_json(directory, lambda m: m["config"].update(embed_dim=32, head_dim=8))
  with pytest.raises(ValueError, match=r"params cannot be restored as the model of model.json"):
    ckpt_lib.load_params(directory)


def test_model_json_with_another_tokenizer(saved_draft):
  directory, _ = saved_draft
  _edit_model_json(directory, lambda m: m.update(tokenizer="smollm2-other"))
  with pytest.raises(ValueError, match=r"was trained with tokenizer smollm2-other"):
    ckpt_lib.load_params(directory, tokenizer_identity=ByteTokenizer.identity)


@pytest.mark.parametrize("text,match", [
    ("{not json", "is not a valid model.json: JSONDecodeError"),
    ('{"config": {}, "tokenizer": "t", "params_sha256": "x"}',
     "is not a valid model.json: TypeError"),
    ('{"config": {"vocab_size": 0}}', "is not a valid model.json: KeyError"),
])
def test_unreadable_model_json(saved_draft, text, match):
  directory, _ = saved_draft
  (directory / "model.json").write_text(text)
  with pytest.raises(ValueError, match=match):
    ckpt_lib.load_params(directory)


def _truncate_data_files(directory, largest_only=False):
  chunks = [p for p in (directory / "params").rglob("*") if p.is_file() and p.parent.name == "d"]
  assert chunks  # orbax's OCDBT data files
  if largest_only:  # the arrays' data, not the metadata: orbax fails while reading them
    chunks = sorted(chunks, key=lambda p: p.stat().st_size)[-1:]
  for chunk in chunks:  # cut to half its length, as a full disk leaves them
    chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])


def _without_files_sha256(directory):
  """A save as made before model.json recorded its files: orbax itself meets the damage."""
  _edit_model_json(directory, lambda m: m.pop("files_sha256"))


def test_truncated_params_are_refused_before_orbax_reads_them(saved_draft, monkeypatch):
  directory, _ = saved_draft
  _truncate_data_files(directory)
  monkeypatch.setattr(ckpt_lib.ocp, "StandardCheckpointer", None)  # never reached
  with pytest.raises(ValueError, match=r"params differs from model.json in .*truncated"):
    ckpt_lib.load_params(directory)


def test_truncated_params_without_recorded_files(saved_draft):
  directory, _ = saved_draft
  _truncate_data_files(directory)
  _without_files_sha256(directory)
  with pytest.raises(ValueError, match=r"params cannot be restored"):
    ckpt_lib.load_params(directory)


RUNS = 20


def test_data_file_truncated_without_recorded_files(saved_draft):
  """One data file cut, nothing recorded to catch it: a ValueError, or (where orbax's
  layout put nothing the restore reads in that file) the params as saved."""
  directory, config = saved_draft
  _truncate_data_files(directory, largest_only=True)
  _without_files_sha256(directory)
  try:
    params, _, _ = ckpt_lib.load_params(directory)
  except ValueError as e:
    assert "params cannot be restored" in str(e)
  else:
    assert ckpt_lib.params_checksum(params) == ckpt_lib.params_checksum(noise_params(config))


@pytest.mark.slow  # 4 x RUNS processes
@pytest.mark.parametrize("damage", ["truncated", "truncated_unrecorded",
                                    "data_file_truncated_unrecorded", "other_width"])
def test_corrupt_saved_draft_gives_one_line_every_time(saved_draft, damage):
  """`generate.py --config.draft=saved:<dir>` on a damaged save: one line and exit 2 in
  each of RUNS runs. (A failed orbax restore leaves tensorstore callbacks, read
  coroutines and futures that report themselves after the error in some runs; the files'
  hashes and shapes are checked before orbax reads them, and load_params drops those
  reports where orbax still fails.)"""
  directory, _ = saved_draft
  if damage == "other_width":
    _edit_model_json(directory, lambda m: m["config"].update(embed_dim=32, head_dim=8))
  else:
    _truncate_data_files(directory, largest_only=damage.startswith("data_file"))
  if damage.endswith("unrecorded"):
    _without_files_sha256(directory)
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  args = [sys.executable, str(REPO / "scripts" / "generate.py"), "--config=configs/tiny.py",
          "--prompt=abc", f"--config.draft=saved:{directory}"]
  for run in range(RUNS):
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    if damage == "data_file_truncated_unrecorded" and proc.returncode == 0:
      assert "Traceback" not in proc.stderr, f"run {run + 1}: {proc.stderr[-2000:]}"
      continue  # the cut file held nothing the restore reads (see the fast test)
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), \
        f"run {run + 1}: {proc.stderr[-2000:]}"


def test_params_changed_after_saving(saved_draft):
  directory, config = saved_draft
  ckpt_lib.save_params(directory / "other", noise_params(config, seed=1), config,
                       tokenizer_identity=ByteTokenizer.identity)
  sha = json.loads((directory / "other" / "model.json").read_text())["params_sha256"]
  _edit_model_json(directory, lambda m: m.update(params_sha256=sha))
  with pytest.raises(ValueError, match="do not match the sha256 in model.json"):
    ckpt_lib.load_params(directory)


def test_missing_saved_draft_names_the_directory(tmp_path):
  missing = tmp_path / "nope"
  with pytest.raises(ValueError, match=f"{re.escape(str(missing))} does not exist"):
    load_draft(f"saved:{missing}", ByteTokenizer(), tiny_config(), None)
  with pytest.raises(FileNotFoundError, match="model.json not found"):
    ckpt_lib.load_params(tmp_path)


def test_undecodable_prompt_bytes():
  text = b"abc\xff\xfedef".decode("utf-8", errors="surrogateescape")  # what argv gives
  with pytest.raises(ValueError, match="prompt 1 is not valid UTF-8: undecodable byte at "
                                       "character 3"):
    encode_prompts(ByteTokenizer(), ["fine", text], chat=False)


def test_no_loader_can_execute_code_from_a_file():
  """No pickle anywhere: every np.load passes allow_pickle=False; no pickle/torch.load."""
  sources = list((REPO / "specdec_jax").rglob("*.py")) + list((REPO / "scripts").glob("*.py"))
  for path in sources:
    text = path.read_text()
    assert not re.search(r"^\s*import pickle|cPickle|torch\.load|\bdill\b", text, re.M), path
    for call in re.finditer(r"np\.load\(([^)]*)\)", text):
      assert "allow_pickle=False" in call.group(1), f"{path}: {call.group(0)}"
  np.testing.assert_(len(sources) > 20)
