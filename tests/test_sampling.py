"""The warp (`models.sampling.warp`): temperature, top-k and top-p against hand values.

Every law the exactness tests compare with is the warped target's, computed by this same
function, so a wrong warp would pass them all; these cases pin it to numbers worked out by
hand. p = (.5, .3, .15, .05) throughout, given as log-probabilities.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.models.sampling import warp

P = np.asarray([0.5, 0.3, 0.15, 0.05])
LOGITS = jnp.log(jnp.asarray(P, jnp.float32))


def warped(**settings) -> np.ndarray:
  return np.asarray(warp(LOGITS, **settings), np.float64)


def test_temperature_scales_the_logits():
  np.testing.assert_allclose(warped(), P, rtol=1e-6)
  np.testing.assert_allclose(warped(temperature=0.5), P ** 2 / (P ** 2).sum(), rtol=1e-5)
  np.testing.assert_allclose(warped(temperature=2.0), P ** 0.5 / (P ** 0.5).sum(), rtol=1e-5)


def test_temperature_zero_is_the_argmax_lowest_index_on_ties():
  np.testing.assert_array_equal(warped(temperature=0.0), [1, 0, 0, 0])
  tie = np.asarray(warp(jnp.asarray([1.0, 3.0, 3.0, 0.0]), temperature=0.0))
  np.testing.assert_array_equal(tie, [0, 1, 0, 0])


def test_top_k_keeps_the_k_largest_and_their_ties():
  np.testing.assert_allclose(warped(top_k=2), [0.625, 0.375, 0, 0], rtol=1e-6)
  np.testing.assert_allclose(warped(top_k=1), [1, 0, 0, 0], rtol=1e-6)
  tied = np.asarray(warp(jnp.log(jnp.asarray([0.4, 0.2, 0.2, 0.2])), top_k=2))
  np.testing.assert_allclose(tied, [0.4, 0.2, 0.2, 0.2], rtol=1e-5)  # ties at the k-th stay
  assert (warped(top_k=2)[2:] == 0).all()  # exact zeros: never drawn


@pytest.mark.parametrize("top_p,expected", [
    (0.4, [1, 0, 0, 0]),              # the first token alone reaches 0.4
    (0.75, [0.625, 0.375, 0, 0]),     # .5 < .75: the second is needed, and reaches it
    (0.85, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0]),  # .8 < .85: the third too
])
def test_top_p_keeps_the_smallest_set_that_reaches_p(top_p, expected):
  got = warped(top_p=top_p)
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  assert (got[np.asarray(expected) == 0] == 0).all()


def test_the_order_is_temperature_then_top_k_then_top_p():
  # top-p at 0.6 after T = 0.5 (p² renormalised: .685, .247, ..): the first alone reaches it
  np.testing.assert_allclose(warped(temperature=0.5, top_p=0.6), [1, 0, 0, 0], atol=1e-6)
  # top-k = 3 first (.526, .316, .158): the mass before the third is .842 >= .83, so
  # top-p keeps two; top-p alone on p would keep three (.8 < .83)
  np.testing.assert_allclose(warped(top_k=3, top_p=0.83), [0.625, 0.375, 0, 0], rtol=1e-5)
  assert (warped(top_p=0.83) > 0).sum() == 3
