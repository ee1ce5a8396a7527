"""`maskedrnn.backends.jax_groups`: the JAX length tiers' grouped
recurrence and its hand-written gradient.

Oracle: a plain LSTM step loop in `jax.numpy`, row by row and step by step
(a masked step keeps the state), its gradient by JAX's own autodiff. The
recurrence gets sorted rows in groups, masked steps inside the rows' spans,
a padding row, two directions and nonzero initial states.
"""

import numpy as np
import pytest

from tests.helpers import BACKEND

pytestmark = pytest.mark.skipif(
    BACKEND != "jax", reason="jax_groups is the JAX backend's"
)

if BACKEND == "jax":
    import jax
    import jax.numpy as jnp

    from maskedrnn.backends import jax_groups

E, T, D, U = 2, 6, 3, 4
# Sorted longest first, in 3 groups of 2 rows; the last row pads (span 0).
SPANS = np.array([6, 5, 5, 3, 2, 0], "int32")
GROUPS = 3


def _case():
    rng = np.random.default_rng(0)
    batch = len(SPANS)
    x = rng.standard_normal((E, T, batch, D)).astype("float32")
    inside = np.arange(T)[:, None] < SPANS[None]
    holes = rng.random((E, T, batch)) < 0.25
    keep = inside[None] & ~holes
    states = tuple(
        rng.standard_normal((E, batch, U)).astype("float32") for _ in range(2)
    )
    params = (
        rng.uniform(-0.5, 0.5, (E, D, 4 * U)).astype("float32"),
        rng.uniform(-0.5, 0.5, (E, U, 4 * U)).astype("float32"),
        rng.uniform(-0.5, 0.5, (E, 1, 4 * U)).astype("float32"),
    )
    return x, keep, states, params


def _reference(x, keep, states, params):
    """Keras' LSTM equations (gates i, f, c, o), one row and step at a time."""
    kernel, recurrent, bias = params
    ys = jnp.zeros(x.shape[:3] + (U,), x.dtype)
    finals = [[], []]
    for e in range(E):
        for b in range(len(SPANS)):
            h, c = states[0][e, b], states[1][e, b]
            for t in range(int(SPANS[b])):
                if keep[e, t, b]:
                    z = x[e, t, b] @ kernel[e] + h @ recurrent[e] + bias[e, 0]
                    i, f, g, o = jnp.split(z, 4)
                    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                    h = jax.nn.sigmoid(o) * jnp.tanh(c)
                ys = ys.at[e, t, b].set(h)
            finals[0].append(h)
            finals[1].append(c)
    finals = tuple(jnp.stack(f).reshape(E, len(SPANS), U) for f in finals)
    return ys, finals


def _loss(run, keep):
    """A fixed weighting of the outputs inside each row's span and of both
    final states."""
    rng = np.random.default_rng(1)
    inside = (np.arange(T)[:, None] < SPANS[None])[None, :, :, None]
    w_y = rng.standard_normal((E, T, len(SPANS), U)).astype("float32") * inside
    w_h, w_c = rng.standard_normal((2, E, len(SPANS), U)).astype("float32")

    def loss(x, states, params):
        ys, (h, c) = run(x, keep, states, params)
        return jnp.sum(ys * w_y) + jnp.sum(h * w_h) + jnp.sum(c * w_c)

    return loss


def _grouped(x, keep, states, params):
    return jax_groups.recurrence(
        ("lstm",), GROUPS, x, jnp.asarray(SPANS), keep, states, params
    )


def test_recurrence_matches_a_step_loop_and_its_autodiff():
    x, keep, states, params = _case()
    ys, finals = jax.jit(_grouped)(x, keep, states, params)
    ref_ys, ref_finals = _reference(x, keep, states, params)
    inside = np.broadcast_to(np.arange(T)[:, None] < SPANS[None], (E, T, len(SPANS)))
    np.testing.assert_allclose(
        np.asarray(ys)[inside], np.asarray(ref_ys)[inside], atol=1e-5
    )
    for got, expected in zip(finals, ref_finals):
        np.testing.assert_allclose(got, expected, atol=1e-5)
    # The padding row (span 0) ends with its initial states.
    np.testing.assert_array_equal(np.asarray(finals[0])[:, -1], states[0][:, -1])
    grads = jax.jit(jax.grad(_loss(_grouped, keep), argnums=(0, 1, 2)))
    ref_grads = jax.grad(_loss(_reference, keep), argnums=(0, 1, 2))
    got, expected = grads(x, states, params), ref_grads(x, states, params)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        assert np.abs(r).max() > 0
        np.testing.assert_allclose(g, r, atol=2e-5, rtol=1e-4)
