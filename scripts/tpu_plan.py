r"""Plan a TPU run on a CPU: every decode path of a config compiled for a TPU topology from
shapes alone, with its memory per chip, whether its caches stay in place, and a roofline
of the speedup per chip (docs/tpu_plan.md).

  make tpu-plan     # .venv-tpu (jax[tpu] at the project's jax version), then this script
  .venv-tpu/bin/python scripts/tpu_plan.py --config=configs/qwen25_coder.py \
      --topology=v5e:2x2 --from=docs/results/heldout_qwen25_coder_t0_gammas.json \
      --out=docs/results/tpu_plan_qwen25_coder_v5e.json

--topology: a TPU topology name ('v5e:2x2', 'v6e:2x2', 'v5p:2x2x1', 'v5e:4x4', ...; libtpu
compiles for it on any machine) or 'local' (this machine's own devices: no libtpu needed).
--from: a stored result file; its per-prompt α and tokens per step give the predicted
speedups printed beside its measured CPU figures. A file of several columns side by side
(`benchmark.py --gammas=...`) gives the column of the config's γ and verifier
(`roofline.prompt_rows`). No weights are read and nothing runs.
"""

import dataclasses
import json
import math
import os
import re
import sys
import time

import _bootstrap  # repository root on sys.path; run(main)
from absl import flags, logging
from ml_collections import config_flags

CONFIG_FAMILY = "run"
CONFIG_SHAPES_ONLY = True  # models' shapes and meshes for other devices (config_fields)
CONFIG_READS = (
    "tokenizer", "target", "target_model", "draft", "feature_draft", "draft_model",
    "draft_head_tokens", "draft_head_size", "dtype",
    "max_seq_len", "gamma", "gamma_max", "gamma_prior", "verifier", "tree", "temperature",
    "max_new_tokens", "batch_size", "mesh")
_CONFIG = config_flags.DEFINE_config_file("config", None, "a configs/*.py run config",
                                          lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", "v5e:2x2", "a TPU topology name, or 'local'")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32", "config"],
                           "params, activations and caches ('config': the config's dtype)")
_FROM = flags.DEFINE_string("from", "", "a result file whose α and tokens/step to predict at")
_OUT = flags.DEFINE_string("out", "", "the plan JSON (default: runs/tpu_plan/<config>_<topology>.json)")
_PROMPT_WIDTH = flags.DEFINE_integer("prompt_width", 128, "P: the prompt width compiled for")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 17, "the widest target call of the roofline")
_MESH = flags.DEFINE_string("mesh", "", "'data,model' for the mesh path (default: the config's "
                            "mesh if it fits the topology, else one that does)")
_OVERHEAD = flags.DEFINE_float("call_overhead_us", 0.0,
                               "a fixed time added to every program of the roofline (µs)")
_ONLY = flags.DEFINE_string("only", "", "compile only the paths whose name holds this text")

_TOPOLOGY_NAME = re.compile(r"^(local|v[0-9][a-z]*:[0-9]+(x[0-9]+){1,2})$")


def _checked_flags(config):
  """The flags' values, each checked before any compile (one line, exit 2, otherwise)."""
  topology = _TOPOLOGY.value
  if not _TOPOLOGY_NAME.match(topology):
    raise ValueError(f"--topology must be a TPU topology such as 'v5e:2x2' or 'v5p:2x2x1', or "
                     f"'local', got {topology!r}")
  rows = None
  if _FROM.value:
    from specdec_jax.bench import roofline
    try:
      with open(_FROM.value) as f:
        doc = json.load(f)
      rows = roofline.prompt_rows(doc, gamma=config.gamma, verifier=config.verifier)
    except (OSError, ValueError) as e:
      raise ValueError(f"--from={_FROM.value}: {e}") from None
  if not 2 <= _MAX_TOKENS.value <= 64:
    raise ValueError(f"--max_tokens must lie in 2..64, got {_MAX_TOKENS.value}")
  if _OVERHEAD.value < 0 or not math.isfinite(_OVERHEAD.value):
    raise ValueError(f"--call_overhead_us must be >= 0, got {_OVERHEAD.value}")
  return topology, rows


def _devices(topology: str):
  import jax
  if topology == "local":
    return jax.devices()
  from jax.experimental import topologies
  try:
    import libtpu  # noqa: F401  (jax[tpu]; `make tpu-plan` installs it)
  except ImportError:
    raise ValueError(f"--topology={topology} needs libtpu: run `make tpu-plan` (.venv-tpu) or "
                     f"use --topology=local") from None
  try:
    return topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
  except Exception as e:  # libtpu's own message for a topology it does not know
    raise ValueError(f"--topology={topology}: libtpu refused it "
                     f"({str(e).strip().splitlines()[0][:200]})") from None


def _one_host(topology: str, devices):
  """The devices of one host, for the pmap path (it runs on one host's chips). On a
  topology of several hosts, libtpu compiles a pmap over a subset of its chips with that
  subset's global ids, which it then refuses as replica ids; one host's chips are the
  same chips as a topology of their own (4 per host: '<chip>:2x2', or '2x2x1' for a
  3-d topology)."""
  host = [d for d in devices if d.process_index == devices[0].process_index]
  if len(host) == len(devices) or len(host) != 4:
    return host
  from jax.experimental import topologies
  chip, dims = topology.split(":")
  name = f"{chip}:{'2x2x1' if dims.count('x') == 2 else '2x2'}"
  return topologies.get_topology_desc(platform="tpu", topology_name=name).devices


def _mesh_shape(config, devices, target) -> str:
  n = len(devices)
  wanted = _MESH.value or config.get("mesh", "")
  if wanted:
    from specdec_jax.models.sharding import parse_mesh_shape
    data, model = parse_mesh_shape(wanted)
    if data * model == n:
      return f"{data},{model}"
    if _MESH.value:
      raise ValueError(f"--mesh={wanted} needs {data * model} devices; {_TOPOLOGY.value} has {n}")
  model = math.gcd(n, target.num_kv_heads, 4)
  return f"{n // model},{model}"


def _bytes(n) -> str:
  return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def main(argv):
  del argv
  logging.set_verbosity(logging.ERROR)
  config = _CONFIG.value
  topology, rows = _checked_flags(config)
  config_file = config_flags.get_config_filename(flags.FLAGS["config"])
  stem = os.path.splitext(os.path.basename(config_file))[0]
  devices = _devices(topology)
  import jax
  from tqdm import tqdm

  from specdec_jax.config_proposer import config_rule
  from specdec_jax.bench import compile_plan as cp
  from specdec_jax.bench import roofline
  from specdec_jax.io.atomic import atomic_write_json
  from specdec_jax.io.machine import machine_stamp
  from specdec_jax.models import sharding

  jax.config.update("jax_enable_compilation_cache", False)  # nothing here runs a program
  dtype = config.dtype if _DTYPE.value == "config" else _DTYPE.value
  target, drafts = cp.plan_models(config, dtype)
  gamma = int(config.gamma) if str(config.gamma).isdigit() else 3
  shapes = cp.PlanShapes(
      batch=int(config.batch_size), prompt_width=_PROMPT_WIDTH.value,
      max_new_tokens=int(config.max_new_tokens), gamma=gamma,
      gamma_max=int(config.gamma_max), tree=config.get("tree", "") or "2,2,1",
      temperature=float(config.temperature), verifier=str(config.get("verifier", "block")))
  room = shapes.prompt_width + shapes.max_new_tokens + max(shapes.gamma_max, 5, gamma) + 1
  if room > target.max_seq_len:
    raise ValueError(f"--prompt_width={shapes.prompt_width} + max_new_tokens + gamma = {room} "
                     f"exceeds max_seq_len={target.max_seq_len}")
  chip = roofline.chip_of(devices[0].device_kind)
  mesh_shape = _mesh_shape(config, devices, target) if len(devices) > 1 else None
  print(f"{topology}: {len(devices)} x {devices[0].device_kind}; target {config.target} "
        f"({target.num_layers} layers, d={target.embed_dim}, V={target.vocab_size}), {dtype}, "
        f"B={shapes.batch} P={shapes.prompt_width} M={shapes.max_new_tokens}", flush=True)

  dev = devices[0]
  jobs = [("autoregressive", lambda: cp.decode_programs(
      "autoregressive", target, None, False, cp.plan_spec(shapes, None, target.vocab_size),
      shapes, dev))]
  for label, (draft, has_params) in drafts.items():
    for pname, proposer in cp.proposers(shapes, config_rule(config)).items():
      def job(label=label, draft=draft, has_params=has_params, proposer=proposer, pname=pname):
        spec = cp.plan_spec(shapes, proposer, target.vocab_size)
        if spec.tree is not None:
          try:
            draft.check_tree(spec.tree.shape, spec.tree.rule, target.vocab_size)
          except ValueError:  # a lookup's trees: 'topk' children, chains below the root
            branching = cp.lookup_branching(shapes.tree)
            proposer = cp.TreeProposal(cp.TreeShape.from_branching(branching), "topk")
            pname = f"tree={','.join(map(str, branching))} topk"
            spec = cp.plan_spec(shapes, proposer, target.vocab_size)
            draft.check_tree(spec.tree.shape, spec.tree.rule, target.vocab_size)
        return cp.decode_programs(f"{label} {pname}", target, draft, has_params, spec,
                                  shapes, dev)
      jobs.append((f"{label} {pname}", job))
  main_label, (main_draft, main_params) = next(iter(drafts.items()))
  fixed = cp.plan_spec(shapes, cp.FixedGamma(gamma), target.vocab_size)
  if mesh_shape:
    mesh = sharding.make_mesh(mesh_shape, devices)
    ar_spec = cp.plan_spec(shapes, None, target.vocab_size)
    jobs.append((f"autoregressive mesh {mesh_shape}", lambda: [cp.mesh_program(
        "autoregressive", target, None, False, ar_spec, shapes, mesh)]))
    jobs.append((f"{main_label} gamma={gamma} mesh {mesh_shape}", lambda: [cp.mesh_program(
        f"{main_label} gamma={gamma}", target, main_draft, main_params, fixed, shapes, mesh)]))
    local = _one_host(topology, devices)
    jobs.append((f"{main_label} gamma={gamma} pmap", lambda: [cp.pmap_program(
        f"{main_label} gamma={gamma}", target, main_draft, main_params, fixed, shapes, local)]))
  model_drafts = [(l, d) for l, (d, p) in drafts.items() if p and not l.startswith("hybrid")]
  for label, draft in model_drafts[:1]:
    jobs.append((f"{label} distill", lambda label=label, draft=draft: [cp.train_program(
        label, target, draft, shapes, dev)]))
  if _ONLY.value:
    jobs = [(n, j) for n, j in jobs if _ONLY.value in n]

  programs, failures = [], []
  bar = tqdm(jobs, desc="compiling", unit="path", file=sys.stderr)
  for name, job in bar:
    bar.set_postfix_str(name[:50])
    try:
      programs += job()
    except ValueError as e:  # a combination the draft refuses (e.g. a tree of a lookup)
      failures.append(dict(path=name, refused=str(e).splitlines()[0][:300]))
    except Exception as e:  # a compile failure: recorded, reported, exit 1 at the end
      failures.append(dict(path=name, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"))
  hbm = chip.hbm_bytes if chip else None
  for p in programs:
    p["fits"] = None if hbm is None else p["total_bytes"] <= hbm

  piece_draft = main_draft if main_params else next(
      (d for d, p in drafts.values() if p), None)
  t0 = time.perf_counter()
  k = _MAX_TOKENS.value
  with tqdm(total=2 * k + 2 * (piece_draft is not None) + k - 1, desc="step pieces",
            unit="program", file=sys.stderr) as pieces_bar:
    pieces = cp.step_pieces(target, piece_draft, piece_draft is not None, shapes, dev,
                            max_tokens=k, context=shapes.prompt_width + shapes.max_new_tokens,
                            progress=lambda record: pieces_bar.update())
  pieces_seconds = time.perf_counter() - t0
  overhead = _OVERHEAD.value * 1e-6
  chips = {}
  for key, c in roofline.CHIPS.items():
    model = roofline.step_model(pieces, c, overhead)
    entry = dict(model, v={str(k): v for k, v in model["v"].items()})
    if rows is not None:
      entry["predicted"] = roofline.predict(model, rows, shapes.gamma_max)
    chips[key] = entry
  layouts = {name: dict({k: rec[k] for k in ("flops", "bytes_accessed", "temp_bytes",
                                              "argument_bytes", "compile_seconds")},
                        traffic=cp.hbm_traffic(rec))
             for name, rec in pieces["layouts"].items()}
  doc = dict(
      stamp=machine_stamp(),
      meta=dict(config=config_file,
                topology=topology, devices=len(devices), device_kind=devices[0].device_kind,
                chip=chip.name if chip else None, dtype=dtype, shapes=dataclasses.asdict(shapes), mesh=mesh_shape, target=config.target,
                drafts=list(drafts), roofline_draft=next(
                    (l for l, (d, _) in drafts.items() if d is piece_draft), None),
                from_file=_FROM.value or None, call_overhead_us=_OVERHEAD.value,
                measured_on_device=None),
      programs=programs, failures=failures,
      pieces=dict(target={str(k): v for k, v in pieces["target"].items()},
                  draft=pieces["draft"], verify={str(k): v for k, v in pieces["verify"].items()},
                  compile_seconds=round(pieces_seconds, 1)),
      layouts=layouts,
      chips={k: dict(name=c.name, hbm_bytes=c.hbm_bytes, hbm_bytes_per_s=c.hbm_bytes_per_s,
                     bf16_flops_per_s=c.bf16_flops_per_s, source=c.source)
             for k, c in roofline.CHIPS.items()},
      roofline=chips)
  out = _OUT.value or os.path.join("runs", "tpu_plan", f"{stem}_{topology.replace(':', '_')}.json")
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  atomic_write_json(out, doc)

  print(f"{'program':<66} {'compile':>8} {'args':>9} {'temp':>9} {'total':>9} fits in-place")
  for p in programs:
    print(f"{p['name'][:66]:<66} {p['compile_seconds']:>7.1f}s {_bytes(p['argument_bytes']):>9} "
          f"{_bytes(p['temp_bytes']):>9} {_bytes(p['total_bytes']):>9} "
          f"{'-' if p['fits'] is None else 'yes' if p['fits'] else 'NO':>4} "
          f"{'' if 'in_place' not in p else 'yes' if p['in_place'] else 'NO'}"
          f"{'' if 'in_place' not in p else ' (copies per step: target %d, draft %d; on chip %d)' % (p['target_cache_copies'], p['draft_cache_copies'], p['target_cache_copies_on_chip'] + p['draft_cache_copies_on_chip'])}")
  for f in failures:
    print(f"{f['path']}: {f.get('refused') and 'refused: ' + f['refused'] or f['error']}")
  print(f"roofline (one step, B={shapes.batch}, context {shapes.prompt_width + shapes.max_new_tokens}):")
  for key, entry in chips.items():
    v = entry["v"]
    line = (f"  {roofline.CHIPS[key].name:<16} t(1) {entry['target_seconds'] * 1e6:8.1f} µs "
            f"({entry['bound']}-bound)  c {entry['c']:.3f}  "
            + " ".join(f"v({k}) {v[k]:.2f}" for k in ("2", "4", "8", "17") if k in v)
            + f"  s(γ) {' '.join(f'{s:.2f}' for s in entry['step_costs'][:5])}")
    if "predicted" in entry:
      g = entry["predicted"]["geomean"]
      line += f"  predicted auto {g['auto']:.2f}x" + (
          f", fixed {g['fixed']:.2f}x" if g["fixed"] else "")
    print(line)
  if rows is not None:
    print(f"  measured on CPU ({_FROM.value}): {chips['v5e']['predicted']['geomean']['cpu_speedup']:.2f}x")
  print(f"wrote {out}")
  if any("error" in f for f in failures):
    sys.exit(1)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  _bootstrap.run(main)
