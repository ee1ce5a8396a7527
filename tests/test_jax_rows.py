"""`maskedrnn.backends.jax_rows`: how the JAX length tiers move rows.

Oracles: numpy for the sort (a stable argsort of the negated spans, its
inverse, the carried values gathered by it), for the gathers and for
`per_direction` (`np.stack`), and JAX's own gradient of a plain gather (a
scatter-add) for `move_rows`.
"""

import numpy as np
import pytest

from tests.helpers import BACKEND

pytestmark = pytest.mark.skipif(
    BACKEND != "jax", reason="jax_rows is the JAX backend's"
)

if BACKEND == "jax":
    import jax
    import jax.numpy as jnp

    from maskedrnn.backends.jax_rows import (
        SortedRows,
        move_rows,
        per_direction,
        take_rows,
    )


@pytest.mark.parametrize("groups", [1, 3, 4, 11])
def test_sorted_rows_match_a_stable_numpy_sort(groups):
    spans = np.array([3, 0, 7, 3, 5, 0, 7, 1, 3, 2, 6], "int32")
    first = np.arange(11, dtype="int32") * 10
    last = first + 100
    rows = SortedRows(jnp.asarray(spans), groups, carry=(first, last))
    order = np.argsort(-spans, kind="stable")
    size = -(-11 // groups)
    pad = -(-11 // size) * size - 11
    assert rows.groups * size == 11 + pad and rows.pad == pad
    np.testing.assert_array_equal(rows.order, order)
    np.testing.assert_array_equal(np.asarray(rows.order)[rows.inverse], np.arange(11))
    padding = np.zeros(pad, "int32")
    np.testing.assert_array_equal(
        rows.sorted_spans, np.concatenate([spans[order], padding])
    )
    for carried, values in zip(rows.carried, (first, last)):
        np.testing.assert_array_equal(
            carried, np.concatenate([values[order], padding])
        )


def test_sorted_rows_slots_index_the_kernel_steps():
    rows = SortedRows(jnp.asarray([1, 4, 2], "int32"), 2)  # order 1, 2, 0; 1 pad
    positions = np.array([[[0, 1], [2, 0]]] * 3, "int32")  # (batch, 2 steps, 2 dirs)
    ys = np.random.default_rng(0).standard_normal((2, 5, 4, 3)).astype("float32")
    slots = np.asarray(rows.slots(jnp.asarray(positions), 5))
    flat = ys.reshape(-1, 3)
    inverse = np.asarray(rows.inverse)
    for b in range(3):
        for s in range(2):
            for e in range(2):
                expected = ys[e, positions[b, s, e], inverse[b]]
                np.testing.assert_array_equal(flat[slots[b, s, e]], expected)


def _a_permutation_with_unread_rows():
    """Six source rows; outputs (2, 3) read rows 4, 0, 5 / 2, 0, 1, where the
    output at (1, 1) reading row 0 again carries no gradient (row 0 lists
    only output 1) and row 3 is read by none."""
    index = np.array([[4, 0, 5], [2, 0, 1]], "int32")
    back = np.array([[1], [5], [3], [0], [0], [2]], "int32")
    valid = np.array([True, True, True, False, True, True])
    live = np.array([[1, 1, 1], [1, 0, 1]], "float32")  # outputs with gradient
    return index, back, valid, live


@pytest.mark.parametrize("groups", [1, 4])
def test_sorted_rows_sort_and_unsort_rows_and_their_gradients(groups):
    # 7 rows in groups of 2: one padding row (groups=4); the spans tie.
    spans = np.array([2, 5, 0, 5, 1, 3, 2], "int32")
    rows = SortedRows(jnp.asarray(spans), groups)
    order = np.argsort(-spans, kind="stable")
    rng = np.random.default_rng(3)
    value = rng.standard_normal((7, 3)).astype("float32")
    weights = rng.standard_normal((7, 3)).astype("float32")
    sorted_value = np.concatenate([value[order], np.zeros((rows.pad, 3), "float32")])

    def sort_loss(v):
        return jnp.sum(rows.sort(v) * weights)

    def unsort_loss(v):
        return jnp.sum(rows.unsort(v) * weights)

    np.testing.assert_array_equal(rows.sort(jnp.asarray(value)), value[order])
    np.testing.assert_array_equal(rows.unsort(jnp.asarray(sorted_value)), value)
    # The gradients: numpy's scatter of the weights through the permutation
    # (the padding row's zero), each computed by a gather, not a scatter.
    d_sort = np.zeros_like(value)
    d_sort[order] = weights
    d_unsort = np.zeros_like(sorted_value)
    d_unsort[:7] = weights[order]
    np.testing.assert_array_equal(jax.grad(sort_loss)(jnp.asarray(value)), d_sort)
    np.testing.assert_array_equal(
        jax.grad(unsort_loss)(jnp.asarray(sorted_value)), d_unsort
    )
    for loss, v in ((sort_loss, value), (unsort_loss, sorted_value)):
        text = str(jax.make_jaxpr(jax.grad(loss))(jnp.asarray(v)))
        assert "scatter" not in text and "gather" in text


def test_move_rows_reads_as_take_rows():
    index, back, valid, _ = _a_permutation_with_unread_rows()
    flat = np.random.default_rng(1).standard_normal((6, 2, 3)).astype("float32")
    out = move_rows(jnp.asarray(flat), index, back, valid)
    np.testing.assert_array_equal(out, flat[index])
    np.testing.assert_array_equal(take_rows(jnp.asarray(flat), index), flat[index])


@pytest.mark.parametrize("jit", [False, True])
def test_move_rows_gradient_is_the_scatter_add_of_jax(jit):
    index, back, valid, live = _a_permutation_with_unread_rows()
    rng = np.random.default_rng(2)
    flat = jnp.asarray(rng.standard_normal((6, 2)).astype("float32"))
    weights = rng.standard_normal((2, 3, 2)).astype("float32") * live[..., None]

    def loss(gather):
        return lambda f: jnp.sum(gather(f) * weights)

    moved = jax.grad(loss(lambda f: move_rows(f, index, back, valid)))
    plain = jax.grad(loss(lambda f: take_rows(f, index)))
    if jit:
        moved, plain = jax.jit(moved), jax.jit(plain)
    expected = np.asarray(plain(flat))
    assert np.abs(expected).sum() > 0
    np.testing.assert_allclose(moved(flat), expected, rtol=1e-6, atol=0)


def test_move_rows_sums_the_readers_of_a_row():
    # Row 0 read by outputs 0 and 2 (two directions), row 1 by output 1.
    flat = jnp.asarray([[1.0], [2.0]])
    index = np.array([0, 1, 0], "int32")
    back = np.array([[0, 2], [1, 1]], "int32")
    valid = np.array([True, False])
    scale = jnp.asarray([1.0, 10.0, 100.0])
    grad = jax.grad(lambda f: jnp.sum(move_rows(f, index, back, valid)[:, 0] * scale))
    np.testing.assert_array_equal(grad(flat), [[101.0], [0.0]])


@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("directions", [1, 2])
def test_per_direction_stacks_like_numpy(directions, axis):
    rng = np.random.default_rng(3)
    forward, backward = rng.integers(0, 9, (2, 3, 4)).astype("int32")
    expected = np.stack([forward, backward][:directions], axis=axis)
    got = per_direction(directions, axis, jnp.asarray(forward), jnp.asarray(backward))
    np.testing.assert_array_equal(got, expected)
