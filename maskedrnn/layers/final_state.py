"""Final states at each row's true length, from an RNN run over padding too.

The unmasked RNN reads each valid-first row to the end of the time axis, so
its own final states are those after the padded tail. The states after each
row's last valid step are recovered here, exactly:

- `h` (and the state of a GRU or SimpleRNN, which is its output) is read off
  the output sequence at step `lengths - 1` (`take_at`);
- an LSTM's cell state `c`, which the fused kernels do not expose per step, is
  recomputed from the outputs (`lstm_cell_state_at_length`).
"""

import keras
from keras import ops

from maskedrnn import ops as mops

# Compute dtypes too narrow for the cell-state recomputation (its linear
# recurrence multiplies up to `time` forget gates): float32 is used for them.
_NARROW = ("float16", "bfloat16")


def recomputation_dtype(dtype):
    """The dtype `lstm_cell_state_at_length` computes in for `dtype`: the
    dtype itself (float32, float64), float32 for float16 and bfloat16."""
    dtype = keras.backend.standardize_dtype(dtype)
    return "float32" if dtype in _NARROW else dtype


def take_at(seq, index):
    """`seq[b, index[b]]` for `seq` of shape `(batch, time, units)`."""
    index = ops.reshape(ops.cast(index, "int32"), (-1, 1, 1))
    return ops.take_along_axis(seq, index, axis=1)[:, 0]


def lstm_cell_state_at_length(cell, x, h_seq, h0, c0, lengths):
    """The LSTM cell state `c` after each row's `lengths[i]` steps.

    The unmasked fused kernel gives the exact `h_t` for every valid step but
    only the `c` after the padded tail. With all `h_t` known, the gates of
    every step come from one batched matmul,
    `z_t = x_t @ kernel + h_{t-1} @ recurrent_kernel + bias`, and
    `c_t = f_t * c_{t-1} + i_t * g_t` is then a linear recurrence in `c`,
    evaluated up to each row's length by `linear_recurrence_last`. This is
    an identity in the weights, so its gradients are exact too. Computed in
    the compute dtype of `h_seq` (float64 stays float64), in float32 for
    float16 and bfloat16.

    Args:
        cell: The built `keras.layers.LSTMCell`.
        x: The inputs the LSTM read, `(batch, time, features)`.
        h_seq: Its output sequence `(batch, time, units)` (`h_t`).
        h0, c0: Its initial states, `(batch, units)` each.
        lengths: Int32 `(batch,)`, in `[0, time]`.

    Returns:
        `c` of shape `(batch, units)`, in the recomputation dtype.
    """
    dtype = recomputation_dtype(h_seq.dtype)
    x = ops.cast(x, dtype)
    h_seq = ops.cast(h_seq, dtype)
    h0 = ops.cast(h0, dtype)
    c0 = ops.cast(c0, dtype)
    h_prev = ops.concatenate([ops.expand_dims(h0, 1), h_seq[:, :-1]], axis=1)
    # Keras LSTM gate order: input, forget, candidate (c), output. The output
    # gate does not enter c, so only the first 3 * units columns are needed;
    # [x_t, h_{t-1}] @ [kernel; recurrent_kernel] is one matmul for both.
    n = 3 * cell.units
    weights = ops.concatenate(
        [cell.kernel[:, :n], cell.recurrent_kernel[:, :n]], axis=0
    )
    # einsum, not matmul: Keras' torch backend runs ops.matmul of two float64
    # tensors in float32 (its result_type("float64", "float64") is float32).
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
    """The states of `inner` after each row's last valid step.

    Args:
        inner: The LSTM, GRU or SimpleRNN that produced `y` from `x`.
        x: Its valid-first input (as it read it), `(batch, time, features)`.
        y: Its output sequence, exact at each row's valid steps.
        initial_state: The list of initial states it started from.
        steps: The `direction.Steps` of the batch.

    Returns:
        `[h, c]` for an LSTM, `[h]` otherwise, in the dtype of `y`. A row
        with no valid step returns its initial state.
    """
    h = take_at(y, steps.last)
    h = ops.where(steps.has_steps, h, ops.cast(initial_state[0], h.dtype))
    if not isinstance(inner, keras.layers.LSTM):
        return [h]
    c = lstm_cell_state_at_length(
        inner.cell, x, y, initial_state[0], initial_state[1], steps.lengths
    )
    return [h, ops.cast(c, h.dtype)]
