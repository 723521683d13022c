r"""Per-token cost of plain decoding with SmolLM2-135M: ours vs a straightforward numpy one.

  python scripts/profile_target.py [--tokens=64] [--repeats=5] [--out=FILE.json]

Reports, at batch 1 in float32:
  * JAX ms/token of `autoregressive_generate` (greedy), stacked (scan) and
    unstacked (unrolled) layouts: (t(N+1 tokens) - t(1 token)) / N, medians;
  * a plain numpy decoder with a KV cache on the same weights (ms/token);
  * the weight-streaming floor: weight bytes / measured memory bandwidth;
  * prefill tokens/s for a 256-token prompt, and the first-call compile time;
  * with --product_widths (e.g. 1,2,3,4,5,9): ms of one forward's weight-matrix
    products alone at k rows (the 7 matrices of each layer and the head, x[k,in] @ W),
    jitted and in numpy, beside the whole cached forward's v(k) = t(k)/t(1) at context
    96 (`studies.verify_cost_curve`): how much of v(k) the CPU's matrix products set.
    --products_only skips the rest.
numpy's BLAS is slowed by OPENBLAS_CORETYPE on these machines (env notes); for a
fair numpy figure run with `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`.
"""

import _bootstrap  # repository root on sys.path; run(main)
import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from specdec_jax.bench import studies, timing
from specdec_jax.io.atomic import atomic_write_json
from specdec_jax.io.machine import machine_stamp
from specdec_jax.io.gguf import load_gguf, smollm2_path
from specdec_jax.models.layouts import unstack_layers
from specdec_jax.models.model import forward, init_cache
from specdec_jax.models.sampling import SamplingConfig
from specdec_jax.decoding.loop import autoregressive_generate
from specdec_jax.decoding.spec import DecodeSpec
from specdec_jax.models.model import Model

_TOKENS = flags.DEFINE_integer("tokens", 64, "decoded tokens per timed run")
_REPEATS = flags.DEFINE_integer("repeats", 5, "timed runs (median)")
_OUT = flags.DEFINE_string("out", None, "write the figures as JSON here")
_WIDTHS = flags.DEFINE_list("product_widths", [], "rows k of the matrix-product timing "
                            "(empty: skipped)")
_PRODUCTS_ONLY = flags.DEFINE_bool("products_only", False, "time the products alone")


def numpy_decoder(cfg, params):
  """A direct numpy transcription of the model (batch 1, KV cache, greedy)."""
  p = jax.tree_util.tree_map(np.asarray, params)
  lay = p["layers"]
  n, k, h, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.embed_dim
  w = [dict(q=lay["q"][i].reshape(d, -1), k=lay["k"][i].reshape(d, -1),
            v=lay["v"][i].reshape(d, -1), o=lay["o"][i].reshape(-1, d), gate=lay["gate"][i],
            up=lay["up"][i], down=lay["down"][i], n1=lay["attn_norm"]["scale"][i],
            n2=lay["mlp_norm"]["scale"][i]) for i in range(cfg.num_layers)]
  embed, final = p["embed"], p["final_norm"]["scale"]
  inv = 1.0 / cfg.rope_theta ** (np.arange(0, h, 2, dtype=np.float32) / h)

  def norm(x, s):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.norm_eps) * s

  def rope(x, pos):  # x [heads, H]
    ang = np.concatenate([pos * inv, pos * inv])
    x1, x2 = x[:, : h // 2], x[:, h // 2:]
    return x * np.cos(ang) + np.concatenate([-x2, x1], -1) * np.sin(ang)

  def decode(tokens, steps):
    kc = np.zeros((cfg.num_layers, len(tokens) + steps, k, h), np.float32)
    vc = np.zeros_like(kc)
    out, pos, tok = [], 0, None
    for t in list(tokens) + [None] * steps:
      t = tok if t is None else t
      x = embed[t]
      for i, lw in enumerate(w):
        y = norm(x, lw["n1"])
        q = rope((y @ lw["q"]).reshape(n, h), pos)
        kc[i, pos] = rope((y @ lw["k"]).reshape(k, h), pos)
        vc[i, pos] = (y @ lw["v"]).reshape(k, h)
        qg = q.reshape(k, n // k, h)
        s = np.einsum("kgh,skh->kgs", qg, kc[i, : pos + 1]) / np.sqrt(h)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        x = x + np.einsum("kgs,skh->kgh", s, vc[i, : pos + 1]).reshape(-1) @ lw["o"]
        y = norm(x, lw["n2"])
        g = y @ lw["gate"]
        x = x + ((g / (1 + np.exp(-g))) * (y @ lw["up"])) @ lw["down"]
      tok = int(np.argmax(norm(x, final) @ embed.T))
      pos += 1
      if pos >= len(tokens):
        out.append(tok)
    return out[:steps]

  return decode


def bandwidth_gbs() -> float:
  """Memory bandwidth from a 512 MB numpy copy (bytes read + written / s), best of 5."""
  a = np.ones(128 * 1024 * 1024, np.float32)
  b = np.empty_like(a)
  _, best = timing.repeated_seconds(lambda: np.copyto(b, a), 5, warmup=False, statistic="min")
  return 2 * a.nbytes / best / 1e9


def product_costs(cfg, params, widths, repeats) -> dict:
  """{k: ms of the weight-matrix products at k rows, jitted ('xla') and in numpy, and the
  cached forward's 'forward_v'} (module docstring). params: stacked, as loaded."""
  lay = params["layers"]
  mats = [np.asarray(lay[name][i]).reshape(-1, lay[name].shape[-1]) if name in ("o", "down")
          else np.asarray(lay[name][i]).reshape(cfg.embed_dim, -1)
          for i in range(cfg.num_layers) for name in ("q", "k", "v", "o", "gate", "up", "down")]
  embed = np.asarray(params["embed"])  # the tied head: logits = x @ embed.T
  jmats, jembed = [jnp.asarray(m) for m in mats], jnp.asarray(embed)

  @jax.jit
  def products(xs, ms, head_x, head):  # each product reduced, so none is dropped
    total = sum(jnp.sum(x @ m) for x, m in zip(xs, ms))
    return total + jnp.sum(jnp.einsum("kd,vd->kv", head_x, head))

  out = {}
  for k in widths:
    xs = [np.ones((k, m.shape[0]), np.float32) for m in mats]
    hx = np.ones((k, cfg.embed_dim), np.float32)
    jxs, jhx = [jnp.asarray(x) for x in xs], jnp.asarray(hx)
    _, xla = timing.repeated_seconds(lambda: products(jxs, jmats, jhx, jembed), repeats)
    _, ref = timing.repeated_seconds(  # numpy: nothing to compile
        lambda: [x @ m for x, m in zip(xs, mats)] + [hx @ embed.T], repeats, warmup=False)
    out[k] = dict(xla_ms=1e3 * xla, numpy_ms=1e3 * ref)
  forward_v = studies.verify_cost_curve(unstack_layers(params), cfg, batch=1, context=96,
                                        max_tokens=max(widths), repeats=repeats)
  for k in widths:
    for name in ("xla_ms", "numpy_ms"):
      out[k][name.replace("_ms", "_v")] = out[k][name] / out[widths[0]][name]
    out[k]["forward_v"] = forward_v[k]
  return out


def main(argv):
  del argv
  cfg, params = load_gguf(smollm2_path(), max_seq_len=1024)
  prompt = [1, 504, 3458, 282, 4649, 314]  # "<|im_start|>The capital of France is"
  n = _TOKENS.value
  weight_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
  figures = dict(weight_mb=weight_bytes / 1e6, tokens=n, jax=jax.__version__)
  widths = sorted({1, *(int(k) for k in _WIDTHS.value)}) if _WIDTHS.value else []
  if widths:
    figures["products"] = product_costs(cfg, params, widths, max(_REPEATS.value, 10))
    print("rows k | products ms: XLA, numpy | v(k): products XLA, numpy, whole forward")
    for k, row in figures["products"].items():
      print(f"{k:6d} | {row['xla_ms']:7.2f} {row['numpy_ms']:7.2f} | {row['xla_v']:.2f} "
            f"{row['numpy_v']:.2f} {row['forward_v']:.2f}")
  if _PRODUCTS_ONLY.value:
    if not widths:
      raise ValueError("--products_only needs --product_widths, e.g. 1,2,3,4,5,9")
    if _OUT.value:
      atomic_write_json(_OUT.value, dict(figures, stamp=machine_stamp()))
    return
  greedy = SamplingConfig(temperature=0.0)
  for layout, p in (("stacked", params), ("unstacked", unstack_layers(params))):
    def run(steps, p=p):
      return autoregressive_generate(Model(cfg, p), [prompt],
                                     spec=DecodeSpec(steps, sampling=greedy)).tokens
    first, t_long = timing.repeated_seconds(lambda: run(n + 1), _REPEATS.value)
    figures[f"{layout}_first_call_s"] = first
    _, t_short = timing.repeated_seconds(lambda: run(1), _REPEATS.value)
    per_token = (t_long - t_short) / n
    figures[f"{layout}_ms_per_token"] = 1e3 * per_token
    ours = run(n + 1)[0].tolist()

  decode = numpy_decoder(cfg, params)
  ref = decode(prompt, 8)
  figures["numpy_matches_jax_greedy"] = ref == ours[:8]
  # numpy, run above: nothing to compile, no warm-up call
  _, t_short = timing.repeated_seconds(lambda: decode(prompt, 1), 2, warmup=False)
  _, t_long = timing.repeated_seconds(lambda: decode(prompt, 17), 2, warmup=False)
  figures["numpy_ms_per_token"] = 1e3 * (t_long - t_short) / 16

  bw = bandwidth_gbs()
  figures["bandwidth_gbs"] = bw
  figures["floor_ms_per_token"] = 1e3 * weight_bytes / (bw * 1e9)

  length = 256
  up = unstack_layers(params)
  toks = jnp.zeros((1, length), jnp.int32)
  pos = jnp.arange(length)[None]
  prefill = jax.jit(lambda p: forward(p, toks, pos, init_cache(cfg, 1, length), config=cfg,
                                      return_logits=False)[1]["k"])
  first, seconds = timing.repeated_seconds(lambda: prefill(up), _REPEATS.value)
  figures["prefill_compile_s"] = first
  figures["prefill_tokens_per_s"] = length / seconds

  for key, value in figures.items():
    print(f"{key:28s} {value:.2f}" if isinstance(value, float) else f"{key:28s} {value}")
  if _OUT.value:
    atomic_write_json(_OUT.value, dict(figures, stamp=machine_stamp()))


if __name__ == "__main__":
  _bootstrap.run(main)
