"""Compile plans: every decode path of a run config compiled from shapes alone.

Letters: B batch, P prompt width, M max_new_tokens, G drafted positions, k tokens of one
target call, V vocabulary, D devices.

`decode_programs`, `mesh_program`, `pmap_program` and `train_program` lower and compile,
for a list of devices (a TPU topology's from `jax.experimental.topologies`, or this
machine's), the programs a config can run (scripts/tpu_plan.py assembles them):
prefill and the loop of steps for autoregressive decoding and for each draft kind the
config names (its draft, the model draft inside a wrapping one, a prompt lookup, a hybrid
over a model draft) under each proposer (a fixed γ, γ 'auto', a tree); the pmap and the
mesh paths on several devices; and the distillation train step. No weights are read:
params are `jax.ShapeDtypeStruct`s from `models.model.param_shapes` of the configs that
`loading.model_config_of` reads from headers.

Each program's record: compile seconds; `memory_analysis()` bytes per device (arguments,
outputs, temporaries, aliases, generated code) and their total; for a loop of steps, the
caches' bytes and `in_place` (no copy of a cache's shape in HBM inside the loop's
iterations: `cache_copies`); and `cost_analysis()` flops and
bytes, which count one iteration of each loop.

`step_pieces` compiles the pieces of one step alone (a target call over k = 1..K tokens
after a full cache, one draft call, the verifier), unrolled per layer so that their costs
are whole: the roofline's inputs (`roofline`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.decoding import loop, parallel
from specdec_jax.decoding.spec import VERIFIERS, AutoGamma, DecodeSpec, FixedGamma, TreeProposal
from specdec_jax.decoding.state import init_state
from specdec_jax.drafts import registry
from specdec_jax.gamma.adaptive import DEFAULT_RULE
from specdec_jax.loading import HeadSubset, draft_config_of, model_config_of
from specdec_jax.models import sharding
from specdec_jax.models.layouts import SERVING_MATMULS, unstack_layers
from specdec_jax.models.model import ModelConfig, forward, init_cache, param_shapes
from specdec_jax.models.sampling import SamplingConfig
from specdec_jax.verification.tree_shapes import TreeShape
from specdec_jax.verification.verify import greedy_verify

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class PlanShapes:
  """The sizes every program of a plan is compiled at."""

  batch: int
  prompt_width: int
  max_new_tokens: int
  gamma: int  # the fixed γ
  gamma_max: int  # γ 'auto''s widest step
  tree: str  # a branching, e.g. '2,2,1'
  temperature: float
  verifier: str
  train_batch: int = 8
  train_len: int = 256


def nbytes(tree) -> int:
  return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize
                 for x in jax.tree.leaves(tree)))


def placed(tree, sharding_of: Callable | jax.sharding.Sharding | None):
  """ShapeDtypeStructs of tree's leaves with a sharding (one for all, or leaf -> sharding)."""
  def one(x):
    s = sharding_of(x) if callable(sharding_of) else sharding_of
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
  return jax.tree.map(one, tree)


def _computations(hlo: str) -> dict[str, str]:
  """{computation name: its text} of optimized HLO text; the entry's name is 'ENTRY'."""
  out = {}
  for block in re.split(r"\n(?=\S)", hlo):
    m = re.match(r"(ENTRY )?%?([\w.\-]+)", block)
    if m and "{" in block.splitlines()[0]:
      out["ENTRY" if m.group(1) else m.group(2)] = block
  return out


def _per_step(computations: dict[str, str]) -> set[str]:
  """The computations that run once per loop iteration: every `while` body, and what a
  body calls (fusions, branches, nested loops), transitively."""
  refs = re.compile(r"(?:body|calls|to_apply|condition)=%?([\w.\-]+)|"
                    r"branch_computations=\{([^}]*)\}")
  seen = set()
  todo = [m for text in computations.values() for m in re.findall(r"body=%?([\w.\-]+)", text)]
  while todo:
    name = todo.pop()
    if name in seen or name not in computations:
      continue
    seen.add(name)
    for one, many in refs.findall(computations[name]):
      todo += [one] if one else [n.strip().lstrip("%") for n in many.split(",")]
  return seen


_DEFINITION = re.compile(r"^\s*(?:ROOT )?(%[\w.\-]+) = \(?\w+\[[0-9,]*\](\{[^}]*\})?")
_COPY = re.compile(r"= \(?\w+(\[[0-9,]*\])(\{[^}]*\})?\S* (?:copy|copy-start)\("
                   r"(?:\w+\[[0-9,]*\](\{[^}]*\})? )?(%[\w.\-]+)")


def _memory_space(layout: str | None) -> int:
  """The memory space of an HLO layout ('{4,3,2,1,0:T(8,128)S(1)}' -> 1): 0 is the
  device's main memory (HBM); another is the alternate memory of XLA's memory-space
  assignment (on a TPU, on-chip memory)."""
  m = re.search(r"S\((\d+)\)", layout or "")
  return int(m.group(1)) if m else 0


def cache_copies(hlo: str, shapes) -> tuple[int, int, int]:
  """(per step, per call, per step on chip): copy instructions in optimized HLO text whose
  result has one of `shapes` (a cache's [L,B,S,K,H]), inside the loop's iterations and
  outside them (a layout change on entry or exit). A copy whose source and result both lie
  in the alternate memory (a small cache that XLA keeps on chip for the loop and relays
  out there) moves no HBM bytes: it counts as on chip, not per step. A loop that keeps its
  caches in place has no copy per step."""
  wanted = {f"[{','.join(str(d) for d in s)}]" for s in shapes}
  computations = _computations(hlo)
  per_step = _per_step(computations)
  space = {m.group(1): _memory_space(m.group(2)) for text in computations.values()
           for line in text.splitlines() if (m := _DEFINITION.match(line))}
  counts = [0, 0, 0]
  for name, text in computations.items():
    # a fusion's result is the only buffer it writes: a copy inside it lands where it does
    root = re.search(r"^\s*ROOT %[\w.\-]+ = \w+\[[0-9,]*\](\{[^}]*\})", text, re.M)
    for line in text.splitlines():
      m = _COPY.search(line)
      if not m or m.group(1) not in wanted:
        continue
      source = _memory_space(m.group(3)) if m.group(3) else space.get(m.group(4), 0)
      result = _memory_space(m.group(2)) or _memory_space(root.group(1) if root else None)
      on_chip = result != 0 and source != 0
      counts[2 if name in per_step and on_chip else name not in per_step] += 1
  return counts[0], counts[1], counts[2]


def largest_copies(hlo: str, count: int = 3) -> list[dict]:
  """The `count` largest copy instructions of the program, outside the loop iterations
  ({'shape', 'bytes'}): what a call's temporaries hold when its loop copies nothing."""
  sizes = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1}
  found = []
  for line in _computations(hlo).get("ENTRY", "").splitlines():
    m = re.search(r"= \(?(\w+)\[([0-9,]*)\]\S* (copy|copy-start)\(", line)
    if m and m.group(2) and m.group(1) in sizes:
      dims = [int(d) for d in m.group(2).split(",")]
      found.append(dict(shape=f"{m.group(1)}[{m.group(2)}]",
                        bytes=int(np.prod(dims)) * sizes[m.group(1)]))
  return sorted(found, key=lambda c: -c["bytes"])[:count]


def compile_program(name: str, jitted, *args, cache_shapes=None, **statics) -> dict:
  """Lowers and compiles jitted(*args, **statics); its record (module docstring). With
  cache_shapes {'target': [shapes], 'draft': [shapes]}, also each cache's copies per
  step and per call (`cache_copies`) and the largest per-call copies."""
  t0 = time.perf_counter()
  compiled = jitted.lower(*args, **statics).compile()
  seconds = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
  record = dict(name=name, compile_seconds=round(seconds, 2),
                argument_bytes=int(mem.argument_size_in_bytes),
                output_bytes=int(mem.output_size_in_bytes),
                temp_bytes=int(mem.temp_size_in_bytes),
                alias_bytes=int(mem.alias_size_in_bytes),
                code_bytes=int(mem.generated_code_size_in_bytes),
                flops=float(cost.get("flops", 0.0)),
                bytes_accessed=float(cost.get("bytes accessed", 0.0)))
  if cache_shapes:
    hlo = compiled.as_text()
    for which, shapes in cache_shapes.items():
      (record[f"{which}_cache_copies"], record[f"{which}_cache_copies_per_call"],
       record[f"{which}_cache_copies_on_chip"]) = (
          cache_copies(hlo, shapes) if shapes else (0, 0, 0))
    record["largest_copies_per_call"] = largest_copies(hlo)
  record["total_bytes"] = (record["argument_bytes"] + record["output_bytes"]
                           + record["temp_bytes"] - record["alias_bytes"] + record["code_bytes"])
  return record


def plan_models(config, dtype: str | None = None):
  """(target ModelConfig, {label: (Draft, has_params)}) of a run config, from headers:
  its draft, the model draft a wrapping draft holds, a prompt lookup and a hybrid over
  the model draft (labels name the kind and the config's name for it)."""
  dtype = dtype or config.dtype
  vocab = None
  if config.target == "random_tiny":
    vocab = (257 if config.tokenizer == "bytes" else
             model_config_of(config.tokenizer, dtype=dtype).vocab_size)
  target = model_config_of(config.target, vocab_size=vocab, dims=config.target_model,
                           dtype=dtype, max_seq_len=config.max_seq_len)
  names = [config.draft]
  feature_draft = config.get("feature_draft", "") or ""
  model_name = registry.model_draft_name(config.draft, feature_draft)
  if config.draft == "none" or registry.is_registered(model_name):
    model_name = None
  if model_name and model_name != config.draft:
    names.append(model_name)
  lookup = "ngram:3"
  if lookup not in names:
    names.append(lookup)
  if model_name and not registry.needs_inner(config.draft):
    names.append("hybrid:3")
    feature_draft = model_name
  drafts = {}
  for name in names:
    if name == "none":
      continue
    cfg, has_params = draft_config_of(name, target, dims=config.draft_model,
                                      feature_draft=feature_draft, head=HeadSubset.of(config))
    draft = registry.as_draft(cfg)
    kind = ("lookup" if not has_params else "hybrid" if registry.needs_inner(name) else
            "feature" if draft.model_config.reads_target_features else "independent")
    drafts[f"{kind} ({name}" + (f" over {feature_draft})" if kind == "hybrid" else ")")] = (
        draft, has_params)
  return target, drafts


def plan_spec(shapes: PlanShapes, proposer, vocab: int) -> DecodeSpec:
  """The static spec of a planned path (eos 0: any id compiles the same program)."""
  return DecodeSpec(shapes.max_new_tokens, proposer,
                    sampling=SamplingConfig(temperature=shapes.temperature),
                    verifier=shapes.verifier, eos_id=0, vocab_size=vocab).static()


def proposers(shapes: PlanShapes, rule=DEFAULT_RULE) -> dict:
  """The planned paths' proposers; rule: gamma 'auto''s γ rule (`config_proposer.config_rule`)."""
  return {f"gamma={shapes.gamma}": FixedGamma(shapes.gamma),
          f"gamma=auto<={shapes.gamma_max}": AutoGamma(None, shapes.gamma_max, rule),
          f"tree={shapes.tree}": TreeProposal(TreeShape.from_branching(
              [int(b) for b in shapes.tree.split(",")]))}


def lookup_branching(tree: str) -> list[int]:
  """The tree a prompt lookup can draft in place of `tree` (a branching such as '2,2,1'):
  as wide at the root, chains below it (a lookup's candidates are a set of continuations,
  so its trees take rule 'topk' and are chains below the root)."""
  branching = [int(b) for b in tree.split(",")]
  return branching[:1] + [1] * (len(branching) - 1)


def _inputs(shapes: PlanShapes, spec: DecodeSpec, one):
  b, p = shapes.batch, shapes.prompt_width
  ins = [jax.ShapeDtypeStruct((b, p), jnp.int32, sharding=one),
         jax.ShapeDtypeStruct((b,), jnp.int32, sharding=one),
         jax.ShapeDtypeStruct((b, 2), jnp.uint32, sharding=one)]
  costs = (jax.ShapeDtypeStruct((2, spec.gamma + 1), jnp.float32, sharding=one)
           if spec.adaptive else None)
  return ins, costs


def decode_programs(label: str, target: ModelConfig, draft, has_params: bool, spec: DecodeSpec,
                    shapes: PlanShapes, device) -> list[dict]:
  """Prefill and the loop of steps (state donated) of one path on one device."""
  one = jax.sharding.SingleDeviceSharding(device)
  tp = placed(param_shapes(target), one)
  dp = placed(param_shapes(draft.model_config), one) if has_params else None
  ins, costs = _inputs(shapes, spec, one)
  statics = dict(target_config=target, draft=draft, gamma=spec.gamma,
                 max_new_tokens=spec.max_new_tokens, lag=spec.lag(draft),
                 proposer=spec.static().proposer)
  prefill = compile_program(f"{label}: prefill", loop.init_state_jit, tp, dp, *ins, **statics)
  state = placed(jax.eval_shape(functools.partial(init_state, **statics), tp, dp, *ins), one)
  def kv(tree):  # the k and v of a cache, [L,B,S,K,H]
    return [x for x in jax.tree.leaves(tree) if x.ndim == 5]
  caches = dict(target=[x.shape for x in kv(state.target_cache)],
                draft=[x.shape for x in kv(state.draft_state)
                       if x.shape not in [y.shape for y in kv(state.target_cache)]])
  run = compile_program(f"{label}: loop", loop.run_steps_jit, tp, dp, state, costs,
                        cache_shapes=caches, target_config=target, draft=draft, spec=spec)
  target_cache = nbytes(kv(state.target_cache))
  draft_leaf = nbytes(kv(state.draft_state)[:1])
  run.update(target_cache_bytes=target_cache, state_bytes=nbytes(state),
             draft_state_bytes=nbytes(state.draft_state),
             cache_copy_bytes_per_step=(run["target_cache_copies"] * target_cache // 2
                                        + run["draft_cache_copies"] * draft_leaf),
             temp_below_cache=run["temp_bytes"] < target_cache,
             in_place=run["target_cache_copies"] + run["draft_cache_copies"] == 0)
  return [prefill, run]


def mesh_program(label: str, target: ModelConfig, draft, has_params: bool, spec: DecodeSpec,
                 shapes: PlanShapes, mesh) -> dict:
  """`parallel.mesh_generate`'s program (prefill and loop in one) on a ('data','model') mesh."""
  batch = -(-shapes.batch // mesh.shape["data"]) * mesh.shape["data"]
  tp = sharding.abstract(param_shapes(target), mesh)
  dp = sharding.abstract(param_shapes(draft.model_config), mesh) if has_params else None
  ins = [jax.ShapeDtypeStruct(s, d, sharding=sharding.batch_sharding(s, mesh)) for s, d in (
      ((batch, shapes.prompt_width), jnp.int32), ((batch,), jnp.int32),
      ((batch, 2), jnp.uint32))]
  record = compile_program(f"{label}: mesh {mesh.shape['data']}x{mesh.shape['model']}",
                           loop.decode_loop_jit, tp, dp, *ins, None, mesh=mesh,
                           target_config=target, draft=draft, spec=spec)
  record["batch"] = batch
  return record


def pmap_program(label: str, target: ModelConfig, draft, has_params: bool, spec: DecodeSpec,
                 shapes: PlanShapes, devices) -> dict:
  """`parallel.pmap_generate`'s program: params replicated, shapes.batch rows per device."""
  d, b = len(devices), shapes.batch
  fn = parallel.pmapped_loop(target, draft, spec, devices)
  tp = param_shapes(target)
  dp = param_shapes(draft.model_config) if has_params else None
  ins = [jax.ShapeDtypeStruct(s, t) for s, t in (
      ((d, b, shapes.prompt_width), jnp.int32), ((d, b), jnp.int32), ((d, b, 2), jnp.uint32),
      ((d, b), jnp.bool_))]
  costs = (jax.ShapeDtypeStruct((2, spec.gamma + 1), jnp.float32) if spec.adaptive else None)
  record = compile_program(f"{label}: pmap over {d}", fn, tp, dp, *ins, costs)
  record["batch"] = d * b
  return record


def train_program(label: str, target: ModelConfig, draft, shapes: PlanShapes, device) -> dict:
  """The distillation train step of the model draft (`distill.step`), state donated."""
  from specdec_jax.distill import step as distill
  one = jax.sharding.SingleDeviceSharding(device)
  cfg = draft.model_config
  optim = distill.OptimizerSettings()
  key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=one)
  state = placed(jax.eval_shape(lambda p, k: distill.init_train_state(p, k, optim),
                                param_shapes(cfg), key), one)
  b, t = shapes.train_batch, shapes.train_len
  tokens = jax.ShapeDtypeStruct((b, t), jnp.int32, sharding=one)
  if cfg.reads_target_features:
    settings = distill.DistillSettings(unroll=2)
    cols = cfg.head_size
    batch = dict(tokens=tokens, target_argmax=tokens,
                 features=jax.ShapeDtypeStruct((b, t, len(cfg.feature_layers) * cfg.feature_width),
                                               cfg.jnp_dtype, sharding=one),
                 target_logp=jax.ShapeDtypeStruct((b, t, cols), jnp.float32, sharding=one))
    embed = jax.ShapeDtypeStruct((target.vocab_size, target.embed_dim), target.jnp_dtype,
                                 sharding=one)
    return compile_program(f"{label}: distill train step", distill.feature_train_step,
                           state, embed, batch, key, draft_config=cfg, settings=settings,
                           optim=optim)
  settings = distill.DistillSettings()
  batch = dict(tokens=tokens, on_policy=jax.ShapeDtypeStruct((), jnp.bool_, sharding=one))
  return compile_program(f"{label}: distill train step", distill.train_step, state,
                         placed(param_shapes(target), one), batch, key, draft_config=cfg,
                         target_config=target, settings=settings, optim=optim)


def _forward_program(name, params, config: ModelConfig, *, batch: int, tokens: int,
                     context: int, one, input_embed=None) -> dict:
  """One cached forward of `tokens` new tokens after `context` ones (per-layer params)."""
  cache = placed(jax.eval_shape(lambda: init_cache(config, batch, context + tokens)), one)
  toks = jax.ShapeDtypeStruct((batch, tokens), jnp.int32, sharding=one)
  extra = {}
  if config.feature_layers:
    extra = dict(input_embed=input_embed, hidden_layers=(config.num_layers,),
                 context=jax.ShapeDtypeStruct((batch, tokens, config.embed_dim),
                                              config.jnp_dtype, sharding=one))
  return compile_program(name, _forward_donating_cache, params, toks, toks, cache,
                         config=config, **extra)


# the piece programs' forward: the cache donated, updated in place as in the decode loop
_forward_donating_cache = jax.jit(forward, donate_argnums=(3,),
                                  static_argnames=("config", "return_logits", "hidden_layers"))


def per_layer(params, layout: str = "input_major"):
  """Abstract params per layer (`unstack_layers`), optionally in the serving layout."""
  unstacked = jax.eval_shape(unstack_layers, params)
  if layout != "serving":
    return unstacked
  out = dict(unstacked)  # `layouts.serving_layout`'s shapes: matmuls [out, in]
  for key in [k for k in out if k.startswith("layers_")]:
    layer = dict(out[key])
    for name, inputs in SERVING_MATMULS.items():
      if name in layer:
        w = layer.pop(name)
        size = int(np.prod(w.shape[:inputs]))
        layer[name + "_t"] = jax.ShapeDtypeStruct((int(np.prod(w.shape)) // size, size), w.dtype)
    out[key] = layer
  if "head" in out:
    w = out.pop("head")
    out["head_t"] = jax.ShapeDtypeStruct(w.shape[::-1], w.dtype)
  return out


def hbm_traffic(record: dict, gathered: int = 0) -> int:
  """The bytes a program moves through HBM, as the smaller of two upper bounds: XLA's
  'bytes accessed' (which counts an operand again at each fused use, e.g. a weight at
  each tile of a matrix-vector fusion at batch 1, so it overstates a memory-bound call
  several times over), and every argument read and every output written once (an output
  aliased to a donated argument, as the cache is, written in place). The second leaves
  out temporaries: in one decode call they hold activations, small at these widths, and
  relayouts of the loop-invariant weights, which the decode loop makes once per call.
  gathered: argument bytes the program only gathers rows from (`gathered_table_bytes`;
  XLA counts a gather's rows alone)."""
  touched = (record["argument_bytes"] + record["output_bytes"] - record["alias_bytes"]
             - gathered)
  return int(min(record["bytes_accessed"], touched) if record["bytes_accessed"] > 0
             else touched)


def gathered_table_bytes(table: ModelConfig, rows: int) -> int:
  """Argument bytes of an embedding table that a call only gathers `rows` rows from: the
  table, less those rows. An untied model's own embedding
  (its head is another matrix), and the target's embedding that a feature draft reads
  its input from; a tied table is read whole by the head anyway (0)."""
  row = table.embed_dim * np.dtype(table.jnp_dtype).itemsize
  return (table.vocab_size - rows) * row


def _layered_cost(name, params_of, config: ModelConfig, keep, gathered: int = 0, **kw) -> dict:
  """Costs of a forward of `config`, from programs of 1 and 2 layers (per-layer params,
  no loop): cost(L) = cost(1) + (L - 1) (cost(2) - cost(1)), since every block is the
  same program. Compiling the L-layer program unrolled gives the same up to fusion at
  the layers' seams, at L/2 times the compile time."""
  one, two = (keep(_forward_program(f"{name}, {n} layer{'s' * (n > 1)}",
                                    params_of(config.replace(num_layers=n)),
                                    config.replace(num_layers=n), **kw), gathered)
              for n in (1, 2))
  return {k: one[k] + (config.num_layers - 1) * (two[k] - one[k]) for k in one}


def step_pieces(target: ModelConfig, draft, has_params: bool, shapes: PlanShapes, device, *,
                max_tokens: int, context: int, progress=None) -> dict:
  """Costs {'flops', 'bytes'} of a target call over k = 1..max_tokens tokens, one draft
  call (None without a model) and the verifier at γ = 1..max_tokens-1, each after
  `context` cached tokens (`_layered_cost`); and the one-token target call's 2-layer
  programs in the two layouts (input-major, the CPU serving layout)."""
  one = jax.sharding.SingleDeviceSharding(device)
  b = shapes.batch
  out = dict(target={}, draft=None, verify={}, programs=[])

  def keep(record, gathered=0):
    out["programs"].append(record)
    if progress is not None:
      progress(record)
    return dict(flops=record["flops"], bytes=hbm_traffic(record, gathered),
                xla_bytes=record["bytes_accessed"])

  def params_of(layout="input_major"):
    return lambda cfg: placed(per_layer(param_shapes(cfg), layout), one)

  for k in range(1, max_tokens + 1):
    out["target"][k] = _layered_cost(
        f"target call k={k}", params_of(), target, keep, batch=b, tokens=k, context=context,
        one=one, gathered=0 if target.tie_embeddings else gathered_table_bytes(target, b * k))
  if has_params:
    cfg = draft.model_config
    embed = jax.ShapeDtypeStruct((target.vocab_size, target.embed_dim), target.jnp_dtype,
                                 sharding=one)
    table = target if cfg.reads_target_features else None if cfg.tie_embeddings else cfg
    out["draft"] = _layered_cost(
        "draft call", params_of(), cfg, keep, batch=b, tokens=1, context=context, one=one,
        input_embed=embed, gathered=0 if table is None else gathered_table_bytes(table, b))
  verify = jax.jit(greedy_verify if shapes.temperature == 0 else VERIFIERS[shapes.verifier])
  v = target.vocab_size
  for g in range(1, max_tokens):
    args = (jax.ShapeDtypeStruct((b, g), jnp.int32, sharding=one),
            jax.ShapeDtypeStruct((b, g, v), jnp.float32, sharding=one),
            jax.ShapeDtypeStruct((b, g + 1, v), jnp.float32, sharding=one),
            jax.ShapeDtypeStruct((b, 2), jnp.uint32, sharding=one))
    out["verify"][g] = keep(compile_program(f"verify gamma={g}", verify, *args))
  two = target.replace(num_layers=2)
  out["layouts"] = {
      layout: _forward_program(f"target call k=1, 2 layers, {layout}", params_of(layout)(two),
                               two, batch=b, tokens=1, context=context, one=one)
      for layout in ("input_major", "serving")}
  return out
