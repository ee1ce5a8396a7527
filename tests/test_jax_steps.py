"""`maskedrnn.backends.jax_steps`: the JAX length tiers' step buffers.

Oracle: numpy slicing and assignment of the same arrays, under `jax.jit`
(the loops index with traced values) and with the indices as the loops
give them.
"""

import numpy as np
import pytest

from tests.helpers import BACKEND

pytestmark = pytest.mark.skipif(
    BACKEND != "jax", reason="jax_steps is the JAX backend's"
)

if BACKEND == "jax":
    import jax
    import jax.numpy as jnp

    from maskedrnn.backends import jax_steps

# (directions, time, batch, units), groups of SIZE rows.
SHAPE = (2, 5, 6, 3)
SIZE = 2


def _buffer():
    return np.arange(np.prod(SHAPE), dtype="float32").reshape(SHAPE)


@pytest.mark.parametrize("t, group", [(0, 0), (4, 2), (2, 1)])
def test_step_rows_reads_and_writes_one_step_of_one_group(t, group):
    buffer = _buffer()
    value = -np.ones((SHAPE[0], SIZE, SHAPE[3]), "float32")

    @jax.jit
    def read_write(buffer, value, t, j):
        first = jax_steps.group_start(j, SIZE)
        read = jax_steps.step_rows(buffer, t, first, SIZE)
        return read, jax_steps.put_step_rows(buffer, value, t, first)

    read, written = read_write(buffer, value, jnp.int32(t), jnp.int32(group))
    rows = slice(group * SIZE, (group + 1) * SIZE)
    np.testing.assert_array_equal(read, buffer[:, t, rows])
    expected = buffer.copy()
    expected[:, t, rows] = value
    np.testing.assert_array_equal(written, expected)


@pytest.mark.parametrize("group", [0, 1, 2])
def test_group_rows_reads_and_writes_a_groups_states(group):
    states = _buffer()[:, 0]  # (directions, batch, units)
    rows = -np.ones((SHAPE[0], SIZE, SHAPE[3]), "float32")

    @jax.jit
    def read_write(states, rows, j):
        first = jax_steps.group_start(j, SIZE)
        read = jax_steps.group_rows(states, first, SIZE)
        return read, jax_steps.put_group_rows(states, rows, first)

    read, written = read_write(states, rows, jnp.int32(group))
    span = slice(group * SIZE, (group + 1) * SIZE)
    np.testing.assert_array_equal(read, states[:, span])
    expected = states.copy()
    expected[:, span] = rows
    np.testing.assert_array_equal(written, expected)


def test_value_at_and_step_buffer():
    values = np.array([7, 3, 9, 1], "int32")
    at = jax.jit(jax_steps.value_at)
    assert [int(at(values, jnp.int32(i))) for i in range(4)] == [7, 3, 9, 1]
    buffer = jax_steps.step_buffer((2, 6, 3), 5, jnp.float16)
    assert buffer.shape == (2, 5, 6, 3) and buffer.dtype == jnp.float16
    assert not np.any(np.asarray(buffer))


def test_step_indices_stay_int32_under_x64():
    """Under jax_enable_x64 the loops' indices are int64: the slices still
    read the right rows (one index dtype for every start)."""
    buffer = _buffer()
    with jax.enable_x64(True):
        read = jax.jit(jax_steps.step_rows, static_argnums=3)(
            buffer, jnp.int64(3), jax_steps.group_start(jnp.int64(1), SIZE), SIZE
        )
    np.testing.assert_array_equal(read, buffer[:, 3, SIZE : 2 * SIZE])
