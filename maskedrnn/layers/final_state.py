"""Exact final states at each row's true length, from an RNN that also ran
over the padded tail: `h` read off the outputs, an LSTM's `c` recomputed."""

import keras
from keras import ops

from maskedrnn import ops as mops

# Too narrow for a product of up to `time` forget gates: float32 instead.
_NARROW = ("float16", "bfloat16")


def recomputation_dtype(dtype):
    """The dtype `lstm_cell_state_at_length` computes in for `dtype`."""
    dtype = keras.backend.standardize_dtype(dtype)
    return "float32" if dtype in _NARROW else dtype


def take_at(seq, index):
    """`seq[b, index[b]]` for `seq` of shape `(batch, time, units)`."""
    index = ops.reshape(ops.cast(index, "int32"), (-1, 1, 1))
    return ops.take_along_axis(seq, index, axis=1)[:, 0]


def lstm_cell_state_at_length(cell, x, h_seq, h0, c0, lengths):
    """The LSTM cell state `c` after each row's `lengths[i]` steps.

    With every `h_t` known, the gates of all steps come from one matmul and
    `c_t = f_t * c_{t-1} + i_t * g_t` is a linear recurrence, evaluated to
    each row's length (`linear_recurrence_last`): exact, gradients included.
    Returns `(batch, units)` in `recomputation_dtype(h_seq.dtype)`.
    """
    dtype = recomputation_dtype(h_seq.dtype)
    x = ops.cast(x, dtype)
    h_seq = ops.cast(h_seq, dtype)
    h0 = ops.cast(h0, dtype)
    c0 = ops.cast(c0, dtype)
    h_prev = ops.concatenate([ops.expand_dims(h0, 1), h_seq[:, :-1]], axis=1)
    # Gates i, f, c (the output gate does not enter c), in one matmul.
    n = 3 * cell.units
    weights = ops.concatenate(
        [cell.kernel[:, :n], cell.recurrent_kernel[:, :n]], axis=0
    )
    # einsum: Keras' torch backend runs a float64 ops.matmul in float32.
    z = ops.einsum(
        "btk,kn->btn", ops.concatenate([x, h_prev], axis=-1), ops.cast(weights, dtype)
    )
    if cell.use_bias:
        z = z + ops.cast(cell.bias[:n], dtype)
    z_i, z_f, z_c = ops.split(z, 3, axis=-1)
    i = cell.recurrent_activation(z_i)
    f = cell.recurrent_activation(z_f)
    g = cell.activation(z_c)
    return mops.linear_recurrence_last(f, i * g, lengths, c0)


def states_at_length(inner, x, y, initial_state, steps):
    """`[h, c]` (an LSTM) or `[h]` of `inner` after each row's last valid
    step of its valid-first input `x`, in the dtype of its outputs `y`; a
    row with no valid step keeps `initial_state`."""
    h = take_at(y, steps.last)
    h = ops.where(steps.has_steps, h, ops.cast(initial_state[0], h.dtype))
    if not isinstance(inner, keras.layers.LSTM):
        return [h]
    c = lstm_cell_state_at_length(
        inner.cell, x, y, initial_state[0], initial_state[1], steps.lengths
    )
    return [h, ops.cast(c, h.dtype)]
