"""The JAX length tiers' step buffers: `(directions, time, batch, ...)`
arrays read and written one step of one group of rows at a time, and the
`(directions, batch, ...)` states a group starts from and ends with.

Group `j` of size `size` is the rows `j * size` to `(j + 1) * size`. The
loops' indices are always in range, so no slice traces or compiles the
wrapping of negative indices (`IN_RANGE`; JAX versions without the option
wrap them). Written with `jax.lax` (see `jax_rows`).
"""

import inspect

import jax.numpy as jnp
import numpy as np
from jax import lax

IN_RANGE = (
    {"allow_negative_indices": False}
    if "allow_negative_indices" in inspect.signature(lax.dynamic_slice).parameters
    else {}
)
_ZERO = np.int32(0)


def group_start(j, size):
    """The first row of group `j` (a loop index), int32."""
    return lax.mul(lax.convert_element_type(j, jnp.int32), np.int32(size))


def value_at(values, row):
    """`values[row]` of a `(rows,)` array."""
    return lax.squeeze(lax.dynamic_slice(values, (row,), (1,), **IN_RANGE), (0,))


def group_rows(x, first, size):
    """Rows `first` to `first + size` of `(directions, batch, ...)` `x`."""
    return lax.dynamic_slice_in_dim(x, first, size, axis=1, **IN_RANGE)


def put_group_rows(x, rows, first):
    """`x` with `rows` written from row `first` (on its second axis)."""
    return lax.dynamic_update_slice_in_dim(x, rows, first, axis=1, **IN_RANGE)


def step_buffer(shape, time, dtype):
    """Zeros for every step of a `(directions, batch, ...)` value: `(directions,
    time, batch, ...)`."""
    return jnp.zeros(shape[:1] + (time,) + shape[1:], dtype)


def step_rows(buffer, t, first, size):
    """`buffer[:, t, first:first + size]` of a `(directions, time, batch,
    ...)` buffer."""
    sizes = (buffer.shape[0], 1, size) + buffer.shape[3:]
    start = _starts(buffer, t, first)
    return lax.dynamic_slice(buffer, start, sizes, **IN_RANGE)[:, 0]


def put_step_rows(buffer, value, t, first):
    """`buffer` with `value` `(directions, size, ...)` written at step `t`,
    rows from `first`."""
    start = _starts(buffer, t, first)
    return lax.dynamic_update_slice(buffer, value[:, None], start, **IN_RANGE)


def _starts(buffer, t, first):
    """The start indices of step `t`, row `first` in a `(directions, time,
    batch, ...)` buffer, in one index dtype (under jax_enable_x64 the
    literals would be int64); the constant ones static."""
    t, first = (lax.convert_element_type(i, jnp.int32) for i in (t, first))
    return (_ZERO, t, first) + (_ZERO,) * (buffer.ndim - 3)
