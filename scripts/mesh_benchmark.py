r"""Decoding on a ('data', 'model') device mesh against one device, side by side.

  XLA_FLAGS=--xla_force_host_platform_device_count=2 python scripts/mesh_benchmark.py \
      --config=configs/smollm2_135m.py --config.gamma=2 --config.mesh=1,2 [--out=FILE.json]

Same model, prompts, settings and seed on both layouts: autoregressive decoding, and
speculative decoding when the config has a draft, each with the vocabulary (embedding
and head) replicated and split over 'model'. Compile time is excluded (a warm-up call
each); the timed calls alternate and the median of --config.repeats is reported, with
whether the tokens equal one device's. A benchmark, not a test: nothing here asserts
a speed. On a CPU the forced devices share the same cores, so expect a loss there.
"""

import _bootstrap  # repository root on sys.path; run(main)
import jax
from absl import flags, logging
from ml_collections import config_flags

from specdec_jax import config_proposer

from specdec_jax.models import sharding

from specdec_jax.bench import timing
from specdec_jax.io.atomic import atomic_write_json
from specdec_jax.io.machine import machine_stamp
from specdec_jax.loading import load_pair
from specdec_jax.decoding.parallel import mesh_generate
from specdec_jax.decoding.loop import autoregressive_generate, speculative_generate
from specdec_jax.decoding.spec import DecodeSpec, FixedGamma

CONFIG_FAMILY = "run"  # the config fields this script reads (scripts/_bootstrap.py)
CONFIG_READS = (
    "tokenizer", "target", "target_model", "draft", "feature_draft", "draft_model",
    "draft_head_tokens", "draft_head_size", "dtype",
    "max_seq_len", "unstacked", "chat", "prompts", "gamma", "verifier", "temperature",
    "top_k", "top_p", "max_new_tokens", "batch_size", "seed", "mesh", "distributed", "repeats"
)
_CONFIG = config_flags.DEFINE_config_file("config", None, "a configs/*.py file", lock_config=True)
_OUT = flags.DEFINE_string("out", None, "write the results as JSON here")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  sharding.initialize_distributed(config.get("distributed", ""))  # before other JAX work
  if not config.get("mesh", ""):
    raise ValueError("mesh_benchmark needs --config.mesh=data,model")
  gamma = config_proposer.parse_gamma(config.gamma)
  if gamma == "auto":
    raise ValueError("gamma 'auto' runs on one device; pass --config.gamma=<int> with "
                     "--config.mesh")
  pair = load_pair(config)
  mesh = sharding.make_mesh(config.mesh)
  spec = DecodeSpec(config.max_new_tokens, FixedGamma(gamma), sampling=pair.sampling,
                    verifier=pair.verifier, vocab_size=pair.vocab_size)
  modes = [("autoregressive", None)]
  if pair.draft_config is not None:
    modes.append(("speculative", pair.draft))
  rows = []
  if jax.process_index() == 0:
    print(f"target {config.target}  draft {config.draft}  mesh {config.mesh}  "
          f"devices {jax.device_count()}  batch {len(pair.prompts)}  "
          f"T={pair.sampling.temperature}  gamma {config.gamma}  seed {config.seed}")
    print("mode | vocab | 1-device tok/s | mesh tok/s | mesh / 1 device | same tokens | split")
  for mode, draft in modes:
    if draft is None:
      def one():
        return autoregressive_generate(pair.target, pair.prompts, spec=spec, seed=config.seed)
    else:
      def one():
        return speculative_generate(pair.target, draft, pair.prompts, spec=spec,
                                    seed=config.seed)
    for shard_vocab in (False, True):
      target = pair.target._replace(params=sharding.shard_params(pair.target_params, mesh,
                                                                 shard_vocab=shard_vocab))
      placed = None if draft is None else draft._replace(
          params=sharding.shard_params(draft.params, mesh, shard_vocab=shard_vocab))

      def on_mesh():
        return mesh_generate(target, placed, pair.prompts, mesh=mesh, spec=spec,
                             seed=config.seed)
      first = {"one": one(), "mesh": on_mesh()}  # compile both
      med, _ = timing.interleaved_seconds({"one": one, "mesh": on_mesh}, config.repeats)
      tokens = int(first["one"].lengths.sum())
      row = dict(mode=mode, shard_vocab=shard_vocab, mesh=config.mesh,
                 one_tokens_per_s=tokens / med["one"], mesh_tokens_per_s=tokens / med["mesh"],
                 ratio=med["one"] / med["mesh"],
                 same_tokens=bool((first["one"].tokens == first["mesh"].tokens).all()),
                 split=sharding.describe(pair.target_params, mesh,
                                         shard_vocab=shard_vocab)["split"])
      rows.append(row)
      if jax.process_index() == 0:
        print(f"{mode} | {'split' if shard_vocab else 'replicated'} | "
              f"{row['one_tokens_per_s']:.1f} | {row['mesh_tokens_per_s']:.1f} | "
              f"{row['ratio']:.2f}x | {row['same_tokens']} | {','.join(row['split'])}")
  if _OUT.value and jax.process_index() == 0:
    meta = dict(config=config.to_dict(), process_count=jax.process_count())
    atomic_write_json(_OUT.value, dict(stamp=machine_stamp(), meta=meta, rows=rows),
                      default=str)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  _bootstrap.run(main)
