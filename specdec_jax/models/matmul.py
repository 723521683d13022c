"""The serving layout's matmul: x[..., I] @ w_t[O, I].T computed from w_t stored
output-major (`layouts.serving_layout`; `model`'s module docstring).

Letters: R rows of x (batch × tokens of one call), I the contraction width, O outputs.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

Array = jax.Array

# XLA:CPU computes w_t @ x^T for one row as a matrix-vector product that streams w_t once,
# but for a few rows as a general matrix product that costs more (a verify call, a two-token
# draft call, a draft's catch-up call; measured: docs/design.md#verify-cost). For
# 2..SKINNY_ROWS rows of float32, a program lowered for the CPU (`lax.platform_dependent`; a
# TPU or GPU program keeps the dot) writes the product as a broadcast multiply and a sum over
# I instead, which XLA fuses into one pass over w_t. Up to 8 rows (a chain of γ <= 7, the
# catch-up width) that fusion was the faster of the two on the models we decode (an AVX-512
# CPU); past 8 it is not reliably faster (docs/background.md#cpu).
# The rows enter each product through an optimization barrier of their own, taken with
# w_t: where one x feeds several products (q, k and v; gate and up), XLA would otherwise
# fuse x's producer into one broadcast of x to [R,O,I] that it writes out for them all,
# a pass over R·O·I floats per product instead of over w_t (docs/background.md#cpu).
SKINNY_ROWS = 8
_skinny = [True]


@contextlib.contextmanager
def dot_products_only():
  """Within: every out-major product a program traces is a `jnp.dot` on every platform
  (to time what the multiply-sum saves). A program traced before keeps its choice: give
  the programs traced within a jitted function of their own."""
  _skinny.append(False)
  try:
    yield
  finally:
    _skinny.pop()


def _dot(flat: Array, w_t: Array) -> Array:
  return jnp.dot(w_t, flat.T).T


def _multiply_sum(flat: Array, w_t: Array) -> Array:
  flat, w_t = jax.lax.optimization_barrier((flat, w_t))  # x's own copy per product
  return jnp.sum(w_t[None] * flat[:, None, :], axis=-1)


def out_major_matmul(x: Array, w_t: Array) -> Array:
  """x[..., I] @ w_t[O, I].T -> [..., O] as w_t @ x^T (the serving layout: module docstring);
  on the CPU 2..SKINNY_ROWS float32 rows of x as a fused multiply-sum (see SKINNY_ROWS)."""
  flat = x.reshape(-1, x.shape[-1])
  if (2 <= flat.shape[0] <= SKINNY_ROWS and w_t.dtype == flat.dtype == jnp.float32
      and _skinny[-1]):
    out = jax.lax.platform_dependent(flat, w_t, cpu=_multiply_sum, default=_dot)
  else:
    out = _dot(flat, w_t)
  return out.reshape(x.shape[:-1] + (w_t.shape[0],))
