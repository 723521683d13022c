r"""Text in, text out: speculative (or, with --config.draft=none, plain) decoding.

  python scripts/generate.py --config=configs/smollm2_135m.py \
      [--config.key=value ...] --prompt "The capital of France is" [--json]

Prints the continuation, then tokens/s, acceptance rate, tokens per step,
α = mean Σ min(p,q) and, with gamma 'auto', how often each γ was chosen (this machine's
cost table is measured once into runs/costs/; `specdec_jax.gamma.machine_costs`). With --json,
one JSON object (text, tokens, statistics, seed).

On a device mesh (params sharded over 'model', rows over 'data'; `specdec_jax.models.sharding`),
on one host or several (`jax.distributed`; every process runs this same command with
its own process id, and process 0 prints):

  XLA_FLAGS=--xla_force_host_platform_device_count=4 python scripts/generate.py \
      --config=configs/tiny.py --config.mesh=2,2 --prompt "abc"
  python scripts/generate.py --config=configs/tiny.py --config.mesh=2,2 \
      --config.distributed=HOST:PORT,2,<process id> --prompt "abc"
"""

import json
import os
import time

import _bootstrap  # repository root on sys.path; run(main)
import jax
from absl import flags, logging
from ml_collections import config_flags

from specdec_jax import config_proposer
from specdec_jax.gamma import adaptive

from specdec_jax.models import sharding
from specdec_jax.loading import load_pair
from specdec_jax.decoding.parallel import mesh_generate
from specdec_jax.decoding.loop import autoregressive_generate, speculative_generate
from specdec_jax.decoding.spec import AutoGamma, DecodeSpec

CONFIG_FAMILY = "run"  # the config fields this script reads (scripts/_bootstrap.py)
CONFIG_READS = (
    "tokenizer", "target", "target_model", "draft", "feature_draft", "draft_model",
    "draft_head_tokens", "draft_head_size", "dtype",
    "max_seq_len", "unstacked", "chat", "prompts", "gamma", "gamma_max", "gamma_prior", "costs",
    "verifier", "tree", "tree_rule", "temperature", "top_k", "top_p", "max_new_tokens",
    "batch_size", "seed", "mesh", "distributed"
)
_CONFIG = config_flags.DEFINE_config_file("config", None, "a configs/*.py file", lock_config=True)
_PROMPT = flags.DEFINE_multi_string("prompt", None, "prompt text (repeatable); default: config")
_JSON = flags.DEFINE_bool("json", False, "print one JSON object instead of text")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint read/write at INFO
  config = _CONFIG.value
  sharding.initialize_distributed(config.get("distributed", ""))  # before any other JAX work
  drafting = str(config.get("draft", "none")).strip() != "none"
  if config.get("mesh", "") and drafting and (
      config_proposer.parse_gamma(config.gamma) == "auto" or str(config.get("tree", "")).strip()):
    raise ValueError("gamma 'auto' and trees run on one device; pass --config.gamma=<int> "
                     "and no --config.tree with --config.mesh")  # before any model loads
  pair = load_pair(config, _PROMPT.value)
  tok = pair.tokenizer
  proposer, decided_on = None, None  # decided_on: the cost table of gamma 'auto', if any
  if pair.draft_config is not None:  # None: config.draft is 'none'
    proposer = config_proposer.config_proposer(
        config, pair, directory=_bootstrap.COSTS_DIR)
    if isinstance(proposer, config_proposer.PlainDecoding):
      print(proposer.line)
      decided_on = proposer.table
      proposer, pair.draft_config = None, None
    elif isinstance(proposer, AutoGamma):
      decided_on = proposer.costs
  spec = DecodeSpec(config.max_new_tokens, proposer, sampling=pair.sampling,
                    verifier=pair.verifier, eos_id=tok.eos_id, vocab_size=pair.vocab_size)
  kw = dict(seed=config.seed, pad_id=tok.eos_id)
  if config.get("mesh", ""):
    mesh = sharding.make_mesh(config.mesh)
    target = pair.target._replace(params=sharding.shard_params(pair.target_params, mesh))
    draft = pair.draft
    if draft is not None and draft.params is not None:
      draft = draft._replace(params=sharding.shard_params(draft.params, mesh))

    def run():
      return mesh_generate(target, draft, pair.prompts, mesh=mesh, spec=spec, **kw)
  elif pair.draft_config is None:
    def run():
      return autoregressive_generate(pair.target, pair.prompts, spec=spec, **kw)
  else:
    def run():
      return speculative_generate(pair.target, pair.draft, pair.prompts, spec=spec, **kw)
  t0 = time.perf_counter()
  out = run()  # includes compilation
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  out = run()  # timed without compilation
  seconds = time.perf_counter() - t0
  rows = []
  for b in range(len(pair.prompts)):
    ids = [i for i in out.row(b) if i != tok.eos_id]
    rows.append(dict(text=tok.decode(ids), tokens=out.row(b)))
  if jax.process_index() != 0:  # every process holds the result; one prints it
    return
  speculative = pair.draft_config is not None
  result = dict(
      text=rows[0]["text"], tokens=rows[0]["tokens"], rows=rows if len(rows) > 1 else None,
      mode="speculative" if speculative else "autoregressive",
      target=config.target, draft=config.draft if speculative else "none",
      gamma=(("auto" if spec.adaptive else spec.gamma) if speculative and spec.tree is None
             else 0),
      gamma_max=spec.gamma if spec.adaptive else None,
      tree=config.get("tree", "") if spec.tree is not None else None,
      gamma_histogram=(adaptive.gamma_histogram(out.gammas) if speculative else None),
      # the table gamma 'auto' chose from (or decided plain decoding on):
      # --config.costs=<this JSON> replays the run
      cost_table=decided_on.to_dict() if decided_on is not None else None,
      temperature=config.temperature,
      top_k=config.top_k, top_p=config.top_p, seed=config.seed, mesh=config.get("mesh", ""),
      processes=jax.process_count(), devices=jax.device_count(),
      generated_tokens=int(out.lengths.sum()), steps=out.num_steps,
      tokens_per_second=float(out.lengths.sum() / seconds),
      first_call_seconds=first,
      acceptance_rate=out.acceptance_rate() if speculative else None,
      tokens_per_step=out.tokens_per_step(),
      alpha=out.alpha() if speculative else None)
  if _JSON.value:
    print(json.dumps(result))
    return
  for b, row in enumerate(rows):
    print(f"--- row {b}: {row['text']}")
  print(f"--- {result['mode']}: {result['generated_tokens']} tokens, "
        f"{result['tokens_per_second']:.1f} tokens/s (first call {first:.1f} s)")
  if speculative:
    print(f"    acceptance rate {result['acceptance_rate']:.3f}, "
          f"tokens/step {result['tokens_per_step']:.2f}, alpha {result['alpha']:.3f}")
    if result["tree"] is not None:
      print(f"    tree {result['tree']} ({config.tree_rule} children)")
    else:
      print(f"    gamma {result['gamma']}: steps per chosen gamma "
            + " ".join(f"{g}:{n}" for g, n in result["gamma_histogram"].items()))


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  _bootstrap.run(main)
