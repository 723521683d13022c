r"""Exports a distilled draft for shipping: float16 params and a model.json of provenance.

  PYTHONPATH=. .venv/bin/python scripts/export_draft.py \
      --workdir=runs/distill_feature_shipped --out=drafts/smollm2_feature_v1

Reads workdir/draft (the finished draft of scripts/distill.py) and workdir/report.json
and writes --out with `save_params(..., params_dtype='float16')`; --out/model.json then
holds, besides the draft config, the tokenizer identity and the params' and files'
sha256 (checked on load):

  extra.target              the target identity the draft was trained against
  extra.target_file_sha256  sha256 of the target's weights file (the GGUF), if it has one
  extra.training            the training commands and the git commit of each start or
                            resume, steps, seconds, seeds and the whole run config
  extra.heldout_alpha       {set: {'t0'|'t1': {'d1', 'd2', ...}}} held-out α at the end of
                            training per drafted depth, temperature and corpus ('all' = the
                            mean over the corpora)
  extra.alpha_curve         every evaluation of the run (step, α per set/T/depth)

Refuses (exit 2) a draft whose float16 files exceed --max_mb, and reloads the export to
check it restores. --report_out also copies the run's report.json (for `make distill`:
docs/results/distill_shipped.json, the results page's α-vs-training curve).
"""

import json
import pathlib
import re
import shutil

import _bootstrap  # repository root on sys.path; run(main)
from absl import flags, logging

from specdec_jax.io import checkpoint as ckpt_lib
from specdec_jax.io.atomic import atomic_write_json, file_sha256

_WORKDIR = flags.DEFINE_string("workdir", None, "A scripts/distill.py workdir.")
_OUT = flags.DEFINE_string("out", None, "The directory to write (replaced if it exists).")
_MAX_MB = flags.DEFINE_float("max_mb", 25.0, "Largest allowed size of the params files.")
_COMMAND = flags.DEFINE_string("command", "", "The training command to record (default: "
                               "the commands the run recorded).")
_REPORT_OUT = flags.DEFINE_string("report_out", "", "Also copy the run's report.json here "
                                  "(docs/results/distill_shipped.json: the results page's "
                                  "α-vs-training curve).")
flags.mark_flags_as_required(["workdir", "out"])

_ALPHA = re.compile(r"^(?:(?P<set>[\w.-]+)/)?alpha_t(?P<t>[0-9.]+)(?:_d(?P<d>\d+))?$")


def alpha_table(measures: dict) -> dict:
  """{set: {'t<τ>': {'d<k>': α}}} from evaluation keys '[<set>/]alpha_t<τ>[_d<k>]'."""
  table: dict = {}
  for key, value in measures.items():
    m = _ALPHA.match(key)
    if m:
      row = table.setdefault(m["set"] or "all", {}).setdefault(f"t{m['t']}", {})
      row[f"d{m['d'] or 1}"] = round(float(value), 4)
  return table


def target_file(target: str) -> str | None:
  """The weights file of a config.target name, if it is one file."""
  if target == "smollm2":
    from specdec_jax.io.gguf import smollm2_path
    return smollm2_path()
  return target if target.endswith(".gguf") else None


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  workdir, out = pathlib.Path(_WORKDIR.value), pathlib.Path(_OUT.value)
  report_path = workdir / "report.json"
  if not report_path.exists():
    raise FileNotFoundError(f"{report_path} not found: run scripts/distill.py to the end first")
  report = json.loads(report_path.read_text("utf-8"))
  params, config, meta = ckpt_lib.load_params(workdir / "draft")
  weights = target_file(report["target"])
  starts = report.get("starts", [])
  extra = {
      "target": report["target_identity"], "target_name": report["target"],
      "target_file_sha256": file_sha256(weights) if weights else None,
      "training": {
          "command": _COMMAND.value or [s.get("command") for s in starts],
          "git_commit": starts[0].get("git_commit") if starts else None,
          "starts": starts, "steps": report["steps"],
          "training_time_s": report.get("training_time_s"),
          "feature_cache_s": report.get("feature_cache_s"), "seeds": report.get("seeds"),
          "loss": report.get("loss"), "temperature": report.get("temperature"),
          "config": report.get("config")},
      "heldout_alpha": alpha_table(report["eval_after"]),
      "alpha_curve": [{"step": e["step"], **alpha_table(e)} for e in report.get("evals", [])],
  }
  tmp = out.with_name(out.name + ".tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  ckpt_lib.save_params(tmp, params, config, tokenizer_identity=meta["tokenizer"], extra=extra,
                       params_dtype="float16")
  size_mb = sum(p.stat().st_size for p in (tmp / "params").rglob("*") if p.is_file()) / 2**20
  if size_mb > _MAX_MB.value:
    shutil.rmtree(tmp)
    raise ValueError(f"the float16 draft is {size_mb:.1f} MB, over --max_mb={_MAX_MB.value}")
  ckpt_lib.load_params(tmp, tokenizer_identity=meta["tokenizer"])  # it restores
  shutil.rmtree(out, ignore_errors=True)
  tmp.rename(out)
  if _REPORT_OUT.value:  # paths relative to the repository: the copy is committed
    root = str(pathlib.Path(_bootstrap.ROOT).resolve()) + "/"
    atomic_write_json(_REPORT_OUT.value, json.loads(json.dumps(report).replace(root, "")))
  print(json.dumps({"out": str(out), "size_mb": round(size_mb, 2),
                    "heldout_alpha": extra["heldout_alpha"].get("all")}, indent=1))


if __name__ == "__main__":
  _bootstrap.run(main)
