r"""Acceptance and draft cost of vocabulary-subset heads of C ids, on a prompt set.

  python scripts/head_study.py --config=configs/heldout_qwen25_coder.py \
      --head_tokens=configs/head_tokens/qwen25_coder.json \
      --sizes=4096,8192,16384,32768,65536 --out=docs/results/head_subset_qwen25_coder.json

For the config's independent draft with its full head (whatever config.draft_head_size
says) and with that head cut to the C most frequent ids of --head_tokens for each C of
--sizes (`io.head_tokens`), on the prompts of config.prompt_set (else config.prompts) and
their greedy answers by the target (config.max_new_tokens each): α at temperatures 0 and 1
along those answers, the fraction of answer tokens inside the subset, c(C) and the
target's v(k), all timed in turn (`bench.head_study`), and the predicted speedup
E(α, γ) / s(γ) for γ = 1..--max_gamma.
Printed as a table and written to --out with the machine stamp. Run it alone.
"""

import _bootstrap  # repository root on sys.path; run(main)
import numpy as np
from absl import flags, logging
from ml_collections import config_flags

CONFIG_FAMILY = "run"  # the config fields this script reads (scripts/_bootstrap.py)
CONFIG_READS = (
    "tokenizer", "target", "target_model", "draft", "draft_model", "draft_head_tokens",
    "draft_head_size", "dtype", "max_seq_len", "unstacked", "chat", "prompts", "prompt_set",
    "max_new_tokens", "seed")
_CONFIG = config_flags.DEFINE_config_file("config", None, "a configs/*.py file", lock_config=True)
_HEAD = flags.DEFINE_string("head_tokens", None, "a head-tokens file (scripts/head_tokens.py)")
_SIZES = flags.DEFINE_list("sizes", ["4096", "8192", "16384", "32768", "65536"],
                           "head sizes C to study")
_MAX_GAMMA = flags.DEFINE_integer("max_gamma", 4, "predicted speedups for γ = 1..this")
_REPEATS = flags.DEFINE_integer("repeats", 9, "timed rounds (median)")
_OUT = flags.DEFINE_string("out", "", "write the figures as JSON here")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  from specdec_jax.bench import head_study, prompt_sets, studies
  from specdec_jax.io import head_tokens
  from specdec_jax.io.atomic import atomic_write_json
  from specdec_jax.io.machine import machine_stamp
  from specdec_jax.loading import encode_prompts, load_models
  from specdec_jax.models.model import Model, ModelConfig

  for name, flag, low in (("max_gamma", _MAX_GAMMA, 1), ("repeats", _REPEATS, 1)):
    if flag.value < low:
      raise ValueError(f"--{name} must be an int >= {low}, got {flag.value}")
  try:
    sizes = [int(s) for s in _SIZES.value]
  except ValueError:
    raise ValueError(f"--sizes must be ints, got {_SIZES.value}") from None
  record = head_tokens.read(_HEAD.value)  # a clear error before any model loads
  if not sizes or any(not 0 < s < record["vocab_size"] for s in sizes):
    raise ValueError(f"--sizes must lie in [1, {record['vocab_size']}), got {sizes}")
  prompt_set = str(config.get("prompt_set", ""))
  records = prompt_sets.load_prompt_set(prompt_set) if prompt_set else None

  full_head = config.copy_and_resolve_references()  # the draft as stored, whatever the
  full_head.draft_head_size = 0  # config's own head size: every C is cut from it here
  models = load_models(full_head, [("draft", config.draft)])
  _, draft_config, draft_params = models.drafts["draft"]
  if not isinstance(draft_config, ModelConfig) or draft_config.reads_target_features:
    raise ValueError(f"draft {config.draft!r} is not an independent model draft (a subset "
                     "head is cut from one)")
  tokenizer = models.tokenizer
  prompts = (prompt_sets.encode(tokenizer, records) if records else
             encode_prompts(tokenizer, list(config.prompts), chat=bool(config.chat)))
  subsets = [()] + [head_tokens.choose(_HEAD.value, s, vocab_size=draft_config.vocab_size,
                                       tokenizer_identity=tokenizer.identity) for s in sizes]
  vocab = models.vocab_size
  target = Model(models.target_config, models.target_params)
  draft = Model(draft_config, draft_params)
  print(f"{len(prompts)} prompts: the target's greedy answers ...", flush=True)
  answers = head_study.greedy_answers(target, prompts,
                                      max_new_tokens=int(config.max_new_tokens),
                                      eos_id=tokenizer.eos_id, vocab_size=vocab)
  print("α along the answers ...", flush=True)
  alphas = head_study.head_alphas(target, draft, prompts, answers, subsets,
                                  vocab_size=vocab)
  context = int(np.median([len(p) for p in prompts]))
  print(f"timing the calls at context {context} ...", flush=True)
  cs, v, unit = head_study.head_costs(target, draft, subsets, context=context,
                                      max_verify=_MAX_GAMMA.value + 1, repeats=_REPEATS.value)
  rows = []
  for size, alpha, c in zip([draft_config.vocab_size] + sizes, alphas, cs):
    speedups = {}
    for t in (0, 1):
      speedups[f"t{t}"] = {g: studies.predicted_speedup(alpha[f"alpha_t{t}"], g, c, v[g + 1])
                           for g in range(1, _MAX_GAMMA.value + 1)}
    rows.append(dict(head_size=size, full=size == draft_config.vocab_size,
                     alpha_t0=alpha["alpha_t0"], alpha_t1=alpha["alpha_t1"],
                     coverage=alpha["coverage"], c=c, predicted_speedup=speedups))
  print(f"target call {unit * 1e3:.1f} ms; v(k) " +
        " ".join(f"{k}:{x:.2f}" for k, x in v.items()))
  print(f"{'C':>7} {'α(T=0)':>7} {'α(T=1)':>7} {'cover':>6} {'c':>6}  predicted "
        f"speedup γ=1..{_MAX_GAMMA.value} (T=0 | T=1)")
  for r in rows:
    t0 = " ".join(f"{x:.2f}" for x in r["predicted_speedup"]["t0"].values())
    t1 = " ".join(f"{x:.2f}" for x in r["predicted_speedup"]["t1"].values())
    print(f"{r['head_size']:>7} {r['alpha_t0']:7.3f} {r['alpha_t1']:7.3f} "
          f"{r['coverage']:6.3f} {r['c']:6.3f}  {t0} | {t1}")
  if _OUT.value:
    atomic_write_json(_OUT.value, dict(
        stamp=machine_stamp(), head_tokens=_HEAD.value, prompt_set=prompt_set or None,
        prompts=len(prompts), max_new_tokens=int(config.max_new_tokens),
        answer_tokens=alphas[0]["positions"], context=context, repeats=_REPEATS.value,
        dtype=str(models.target_config.dtype), target_call_seconds=unit,
        verify_costs={str(k): x for k, x in v.items()}, rows=rows))
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  flags.mark_flag_as_required("head_tokens")
  _bootstrap.run(main)
