r"""Where one speculative step's time goes: the run's own compiled loop beside its pieces.

  python scripts/profile_step.py --config=configs/qwen25_coder.py [--gamma=3] [--out=FILE.json]
  python scripts/profile_step.py --config=configs/qwen25_coder.py --config.dtype=bfloat16 \
      --random_weights=160 --step_costs=4   # random weights of the same shapes (a device
                                            # without the files), and s(0..4)

In one process, each timed once in every round (median of --repeats, compile excluded by a
first call each; `bench.timing.interleaved_seconds`), on the config's first prompt at batch 1:
  plain step   the autoregressive loop (`loop.run_steps_jit`), --steps steps from a
               prefilled state, per step;
  chain step   the speculative loop at a fixed γ, --steps steps from the same state, per
               step (every row proposes γ each step);
  pieces       each compiled alone at the prompt's context: the target call over 1 and over
               γ+1 tokens, the draft call over one token and over two (the head at the
               second: an independent draft's first call in a step after one that
               accepted all γ, which also writes that x_γ), and the verifier the step runs
               (`greedy_verify` at T = 0) on γ drafts; the target's γ+1-token call and the
               draft's two-token call also with every matmul a `jnp.dot`
               (`models.matmul.dot_products_only`: what the few-row multiply-sum of
               `out_major_matmul` saves);
  prefills     the starting state of the plain loop and of the chain (`loop.prefill`) on
               the prompt padded as the held-out runs pad it (`studies.prompt_bucket`):
               the target's prefill alone, and with the draft's. Their difference is
               what a prompt pays for drafting before its first step; with the chain
               step as the probe and N = max_new_tokens they give the floor under gamma
               'auto' of a whole-generation timing such as `benchmark.py`'s, for a prompt
               whose rows never draft after that probe (`studies.never_drafting_floor`).
Every figure is in plain steps (seconds / plain step), so the step's split reads
  step = c_first + (γ-1)·c + v(γ+1)·t(1) + verifier + the rest,
c_first being, for an independent draft (alone or in a hybrid), the two-token call in the
share of timed steps that follow a step which accepted all γ and c in the others; c for
other kinds (a feature draft's first call re-reads its window: its own cost, not timed),
the rest being the sampling and warps, the caches' bookkeeping and the loop itself: what
the pieces alone do not show. A piece called alone also pays one host dispatch (a fraction
of a millisecond), which the loop does not: the split is for pairs whose calls take tens of
milliseconds (the Qwen pair), not for configs/tiny.py, where the rest comes out negative.
Printed as a table and written to --out with the machine stamp.
"""

import _bootstrap  # repository root on sys.path; run(main)
import jax
import jax.numpy as jnp
import numpy as np
from absl import flags, logging
from ml_collections import config_flags

CONFIG_FAMILY = "run"  # the config fields this script reads (scripts/_bootstrap.py)
CONFIG_SHAPES_ONLY = "random_weights"  # with it, the models' shapes alone are read
CONFIG_READS = (
    "tokenizer", "target", "target_model", "draft", "feature_draft", "draft_model",
    "draft_head_tokens", "draft_head_size", "dtype", "max_seq_len", "max_new_tokens",
    "unstacked", "chat", "prompts", "verifier", "temperature", "top_k", "top_p", "seed")
_CONFIG = config_flags.DEFINE_config_file("config", None, "a configs/*.py file", lock_config=True)
_GAMMA = flags.DEFINE_integer("gamma", 3, "drafts per chain step")
_STEPS = flags.DEFINE_integer("steps", 8, "loop steps per timed call")
_REPEATS = flags.DEFINE_integer("repeats", 9, "timed rounds (median)")
_OUT = flags.DEFINE_string("out", "", "write the figures as JSON here")
_STEP_COSTS = flags.DEFINE_integer(
    "step_costs", 0, "if >= 1: also time the cost table's s(0..G) for this G "
    "(`machine_costs.measure_steps`, gamma 'auto''s own harness) at the same context")
_RANDOM = flags.DEFINE_integer(
    "random_weights", 0, "if > 0: the config's models with random weights (its shapes and "
    "dtype, nothing loaded) on a random prompt of this many tokens, for a device the "
    "weights cannot reach (the timings do not depend on the weights' values)")


def _checked_flags():
  for name, flag, low in (("gamma", _GAMMA, 1), ("steps", _STEPS, 1), ("repeats", _REPEATS, 1),
                          ("random_weights", _RANDOM, 0), ("step_costs", _STEP_COSTS, 0)):
    if flag.value < low:
      raise ValueError(f"--{name} must be an int >= {low}, got {flag.value}")


def verifier_call(verify_fn, *, gamma: int, vocab: int, seed: int):
  """() -> the verifier's tokens on γ drafts from random laws over the vocabulary."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  qs = jax.nn.softmax(jax.random.normal(keys[0], (1, gamma, vocab)), -1)
  ps = jax.nn.softmax(jax.random.normal(keys[1], (1, gamma + 1, vocab)), -1)
  xs = jax.random.categorical(keys[2], jnp.log(qs)).astype(jnp.int32)
  verify_keys = jax.random.split(keys[3], 1)
  run = jax.jit(verify_fn)
  return lambda: jax.block_until_ready(run(xs, qs, ps, verify_keys))


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  _checked_flags()
  config = _CONFIG.value
  from specdec_jax.bench import studies, timing
  from specdec_jax.decoding import loop
  from specdec_jax.decoding.spec import DecodeSpec, FixedGamma, prepare
  from specdec_jax.drafts.independent import IndependentDraft
  from specdec_jax.drafts.registry import as_draft
  from specdec_jax.gamma import adaptive
  from specdec_jax.gamma.machine_costs import steps_from
  from specdec_jax.io.atomic import atomic_write_json
  from specdec_jax.io.machine import machine_stamp
  from specdec_jax.loading import load_pair
  from specdec_jax.verification.verify import greedy_verify

  if config.draft == "none":
    raise ValueError("config.draft is 'none': a step profile needs a draft")
  pair = random_pair(config, _RANDOM.value) if _RANDOM.value else load_pair(config)
  gamma, steps = _GAMMA.value, _STEPS.value
  prompt = pair.prompts[0]
  context = len(prompt)
  greedy = pair.sampling.temperature == 0
  # room for every timed step to emit γ+1 tokens: no row is done before the steps are run
  spec = DecodeSpec(steps * (gamma + 1) + 1, FixedGamma(gamma), sampling=pair.sampling,
                    verifier=pair.verifier, vocab_size=pair.vocab_size)
  plain_spec = DecodeSpec(spec.max_new_tokens, sampling=pair.sampling,
                          vocab_size=pair.vocab_size)
  chain = prepare(pair.target, pair.draft, [prompt], spec, seed=config.seed)
  plain = prepare(pair.target, None, [prompt], plain_spec, seed=config.seed)
  draft = as_draft(pair.draft_config)
  model = draft.model_config
  width = studies.prompt_bucket(context)  # the padded width of the held-out runs
  padded = {name: prepare(pair.target, d, [prompt], s, seed=config.seed, prompt_width=width)
            for name, d, s in (("plain", None, plain_spec), ("chain", pair.draft, spec))}
  target_prefill, both_prefills = f"target prefill, {width} tokens", \
      f"target and draft prefill, {width} tokens"
  fns = {
      "plain step": steps_from(pair.target, None, plain,
                               loop.prefill(pair.target, None, plain), steps),
      "chain step": steps_from(pair.target, pair.draft_params, chain,
                               loop.prefill(pair.target, pair.draft_params, chain), steps),
      "target call, 1 token": studies.forward_call(
          pair.target_params, pair.target_config, batch=1, tokens=1, context=context),
      f"target call, {gamma + 1} tokens": studies.forward_call(
          pair.target_params, pair.target_config, batch=1, tokens=gamma + 1, context=context),
      f"target call, {gamma + 1} tokens, dot products": studies.forward_call(
          pair.target_params, pair.target_config, batch=1, tokens=gamma + 1, context=context,
          dot_products=True),
      "verifier": verifier_call(greedy_verify if greedy else chain.spec.verify_fn,
                                gamma=gamma, vocab=pair.vocab_size, seed=config.seed),
      target_prefill: lambda: loop.prefill(pair.target, None, padded["plain"]),
      both_prefills: lambda: loop.prefill(pair.target, pair.draft_params, padded["chain"]),
  }
  feature = dict(input_embed=pair.target_params["embed"]) if model is not None and \
      model.feature_layers else {}
  if model is not None:
    fns["draft call"] = studies.forward_call(pair.draft_params, model, batch=1, tokens=1,
                                             context=context, **feature)
    # one call over two tokens, the head at the second: an independent draft's first call
    fns["draft call, 2 tokens"] = studies.forward_call(
        pair.draft_params, model, batch=1, tokens=2, context=context, logits_at_last=True,
        **feature)
    fns["draft call, 2 tokens, dot products"] = studies.forward_call(
        pair.draft_params, model, batch=1, tokens=2, context=context, logits_at_last=True,
        dot_products=True, **feature)
  print(f"target {config.target}  draft {config.draft}  gamma {gamma}  context {context}  "
        f"T={pair.sampling.temperature:g}  {steps} loop steps per call, median of "
        f"{_REPEATS.value}")
  seconds, results = timing.interleaved_seconds(fns, _REPEATS.value, warmup=True)
  for name in ("plain step", "chain step"):  # per step: every row ran `steps` steps
    ran = int(results[name].step) - (spec.max_new_tokens - steps)
    if ran != steps:
      raise RuntimeError(f"{name}: the loop ran {ran} steps, meant {steps}")
    seconds[name] /= steps
  plain_s = seconds["plain step"]
  unit = {name: s / plain_s for name, s in seconds.items()}
  tokens = np.asarray(results["chain step"].accepted)[0, -steps:] + 1
  # a chain: γ draft calls; an independent draft's first one takes two tokens in a step
  # after one that accepted all γ (the first timed step follows the prefill: one token)
  two_token_share = 0.0
  if isinstance(getattr(draft, "inner", draft), IndependentDraft):
    two_token_share = float(np.mean(np.concatenate([[False], tokens[:-1] == gamma + 1])))
  first = (two_token_share * unit.get("draft call, 2 tokens", 0.0)
           + (1 - two_token_share) * unit.get("draft call", 0.0))
  split = {
      "draft calls": first + (gamma - 1) * unit.get("draft call", 0.0),
      "target call": unit[f"target call, {gamma + 1} tokens"],
      "verifier": unit["verifier"],
  }
  split["the rest (sampling, bookkeeping, loop)"] = unit["chain step"] - sum(split.values())
  print("piece | seconds | plain steps")
  for name, s in seconds.items():
    print(f"{name} | {s * 1e3:.2f} ms | {unit[name]:.3f}")
  print(f"chain step = {unit['chain step']:.3f} plain steps, split:")
  for name, value in split.items():
    print(f"  {name}: {value:.3f} ({value / unit['chain step']:.0%})")
  c = unit.get("draft call", 0.0) / unit["target call, 1 token"]
  v = unit[f"target call, {gamma + 1} tokens"] / unit["target call, 1 token"]
  model_cost = adaptive.step_cost(adaptive.draft_calls(gamma), c, v)
  print(f"c = {c:.3f}  v({gamma + 1}) = {v:.2f}  gamma c + v = {model_cost:.2f} target-call "
        f"times; the step is {unit['chain step'] / unit['target call, 1 token']:.2f} of them "
        f"({unit['chain step'] / unit['target call, 1 token'] / model_cost - 1:+.0%}); "
        f"tokens per step in the timed steps {tokens.mean():.2f}, first draft calls over two "
        f"tokens {two_token_share:.0%}")
  new_tokens = int(config.max_new_tokens)
  prefill = dict(width=width, target=unit[target_prefill],
                 draft=unit[both_prefills] - unit[target_prefill], new_tokens=new_tokens)
  prefill["never_drafting_floor"] = studies.never_drafting_floor(
      prefill["target"], prefill["draft"], new_tokens, unit["chain step"])
  print(f"prefill at {width} tokens: target {prefill['target']:.2f} plain steps, draft "
        f"{prefill['draft']:.2f}; a prompt that never drafts after one probe step, "
        f"{new_tokens} new tokens: {prefill['never_drafting_floor']:.3f}x plain decoding")
  table = None
  if _STEP_COSTS.value >= 1:
    from specdec_jax.gamma.machine_costs import measure_steps
    table = measure_steps(pair.target, pair.draft, gamma_max=_STEP_COSTS.value, batch=1,
                          sampling=pair.sampling, verifier=pair.verifier, context=context)
    print("step costs s(0..G) in plain steps: "
          + "  ".join(f"s({g}) = {x:.3f}" for g, x in enumerate(table.step_costs))
          + ("" if table.lookup_step_costs is None else "; lookup: " + "  ".join(
              f"{x:.3f}" for x in table.lookup_step_costs)))
  if _OUT.value:
    atomic_write_json(_OUT.value, dict(
        step_costs=None if table is None else table.to_dict(),
        stamp=machine_stamp(), gamma=gamma, steps=steps, repeats=_REPEATS.value,
        random_weights=bool(_RANDOM.value), dtype=str(pair.target_config.dtype),
        context=context, temperature=pair.sampling.temperature,
        seconds=seconds, plain_steps=unit, split=split, c=c, v=v, modelled_step=model_cost,
        prefill=prefill,
        tokens_per_step=float(tokens.mean()), two_token_first_calls=two_token_share))
    print(f"wrote {_OUT.value}")


def random_pair(config, context: int):
  """A `loading.Pair` of the config's models with random weights (`compile_plan.plan_models`,
  `init_params`) and one random prompt of `context` tokens; no tokenizer."""
  import dataclasses

  from specdec_jax.bench.compile_plan import plan_models
  from specdec_jax.decoding.spec import resolve_vocab
  from specdec_jax.loading import Pair
  from specdec_jax.models.model import init_params
  from specdec_jax.models.sampling import SamplingConfig

  target_config, drafts = plan_models(config)
  draft, has_params = next(iter(drafts.values()))  # the config's own draft comes first
  target_params = init_params(target_config, jax.random.PRNGKey(0))
  draft_params = init_params(draft.model_config, jax.random.PRNGKey(1)) if has_params else None
  vocab = resolve_vocab(target_config, draft, None)
  prompt = np.random.default_rng(0).integers(0, vocab, context).tolist()
  sampling = SamplingConfig(temperature=float(config.temperature), top_k=int(config.top_k),
                            top_p=float(config.top_p))

  @dataclasses.dataclass
  class RandomPair(Pair):
    vocab_size: int = vocab  # no tokenizer to ask

  return RandomPair(None, target_config, target_params, draft, draft_params, [prompt],
                    sampling, str(config.get("verifier", "block")))


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  _bootstrap.run(main)
