"""Param layouts for decoding (letters as in `model`).

Params are stored and trained stacked (`layers` [L, ...], run under `nn.scan`) and
input-major (q [D,N,H], gate [D,F], head [D,V]). Decoding on a CPU runs them per layer
(`unstack_layers`: an unrolled loop, faster per token) and output-major (`serving_layout`:
every block matmul and an untied head as `<name>_t` [out, in], computed by
`matmul.out_major_matmul`; why: `model`'s module docstring). `stack_layers` undoes both.
`forward` takes any of the three.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models.model import ModelConfig, is_unstacked, param_shapes

def unstack_layers(params) -> dict:
  """Stacked params (`layers` [L,...]) -> per-layer `layers_i` (for the unrolled loop)."""
  if is_unstacked(params):
    return params
  out = {k: v for k, v in params.items() if k != "layers"}
  num_layers = jax.tree_util.tree_leaves(params["layers"])[0].shape[0]
  for i in range(num_layers):
    out[f"layers_{i}"] = jax.tree_util.tree_map(lambda x: x[i], params["layers"])
  return out


# matmul params of a block and how many leading dims of each are its input (o [N,H,D])
SERVING_MATMULS = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1}


def serving_layout(params) -> dict:
  """Per-layer params (`unstack_layers`) with every block matmul and an untied head stored
  output-major as `<name>_t` [out, in] (module docstring), as host arrays (one copy of
  each matrix). `stack_layers` undoes it."""
  out = dict(unstack_layers(params))
  for key in [k for k in out if k.startswith("layers_")]:
    layer = dict(out[key])
    for name, inputs in SERVING_MATMULS.items():
      if name in layer:
        w = layer.pop(name)
        size = functools.reduce(int.__mul__, w.shape[:inputs])
        layer[name + "_t"] = np.ascontiguousarray(np.asarray(w).reshape(size, -1).T)
    out[key] = layer
  if "head" in out:
    out["head_t"] = np.ascontiguousarray(np.asarray(out.pop("head")).T)
  return out


def _input_major(params) -> dict:
  """The inverse of `serving_layout`'s transposes (layers stay per-layer)."""
  if not any(k == "head_t" or (k.startswith("layers_") and any(
      n + "_t" in params[k] for n in SERVING_MATMULS)) for k in params):
    return params
  out = dict(params)
  if "head_t" in out:
    out["head"] = out.pop("head_t").T
  for key in [k for k in out if k.startswith("layers_")]:
    layer = dict(out[key])
    for name in SERVING_MATMULS:
      if name + "_t" in layer:
        layer[name] = layer.pop(name + "_t").T  # reshaped to its own rank by the caller
    out[key] = layer
  return out


def stack_layers(params, config: "ModelConfig | None" = None) -> dict:
  """The inverse of `unstack_layers` (and of `serving_layout`, given the config for the
  matmuls' shapes): the layout params are stored and trained in."""
  if not is_unstacked(params):
    return params
  transposed = _input_major(params)
  if transposed is not params:
    if config is None:
      raise ValueError("stack_layers of serving-layout params needs their config")
    stored = param_shapes(config)["layers"]  # [L, ...] each
    params = {k: (jax.tree_util.tree_map(lambda x, ref: x.reshape(ref.shape[1:]), v,
                                         {n: stored[n] for n in v})
                  if k.startswith("layers_") else v) for k, v in transposed.items()}
  names = sorted((k for k in params if k.startswith("layers_")), key=lambda k: int(k[7:]))
  out = {k: v for k, v in params.items() if not k.startswith("layers_")}
  out["layers"] = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[params[k] for k in names])
  return out


