"""The TensorFlow backend: length tiers on a CPU, else Keras' layers.

Where no cuDNN kernel may run, an LSTM runs `tf.raw_ops.BlockLSTMV2`
(`"tf-block-lstm"`) and a GRU or SimpleRNN the length tiers
(`"tf-tiers"`). Elsewhere an LSTM whose states are wanted runs Keras'
masked loop without a fused kernel, and every other RNN Keras' layer
unmasked on valid-first data.
"""

import keras
import numpy as np
import tensorflow as tf

from maskedrnn.backends import keras_kernels
from maskedrnn.backends import tensorflow_block_lstm as block_lstm
from maskedrnn.backends import tensorflow_cells as cells
from maskedrnn.backends.tensorflow_shapes import leading_shape, size

NAME = "tensorflow"
KERNELS = (block_lstm.KERNEL, cells.KERNEL, "keras-unmasked", "keras-masked")

layout = run_direction = keras_kernels.no_caller_order_kernel
scalar = keras_kernels.scalar
gather_or_zero = keras_kernels.gather_or_zero
ONE_CALL_KERNELS = ()
run_one_call = keras_kernels.no_one_call_kernel
IN_PLACE_KERNELS = ()
run_one_call_in_place = keras_kernels.no_in_place_kernel
one_call_reason = keras_kernels.one_call_reason


def is_concrete(x):
    """True when `x` holds values: eager TensorFlow, not a variable."""
    return (
        tf.executing_eagerly()
        and not isinstance(x, tf.Variable)
        and hasattr(x, "numpy")
    )


def host_readable(x):
    """True when `x`'s values can be read on the host with no device sync."""
    device = getattr(x, "device", "") or ""
    return is_concrete(x) and "GPU:" not in device and "TPU:" not in device


def invert_permutation(perm):
    """Inverts each row of int32 `(batch, time)` permutations: an argsort,
    as one `top_k` of the negated rows (distinct values, so no ties)."""
    return tf.math.top_k(-perm, k=size(perm, 1)).indices


def gather_time(x, index):
    """`x[b, index[b, t], ...]` for int32 `index` in range: one `GatherV2`
    with `batch_dims=1` (the flat view's reshape, offsets and
    `keras.ops.take`'s handling of negative indices would each add ops to
    trace and optimise), and a gradient of one segment sum over the flat
    view (TensorFlow's own for `batch_dims` traces many more ops)."""

    @tf.custom_gradient
    def gather(x):
        def grad(dy):
            batch, time = size(x, 0), size(x, 1)
            if isinstance(batch, int) and isinstance(time, int):
                offsets = tf.constant(np.arange(batch, dtype="int32")[:, None] * time)
            else:
                offsets = tf.expand_dims(tf.range(batch) * time, 1)
            rows = tf.reshape(index + offsets, [-1])
            trailing = x.shape[2:].as_list()
            if None in trailing:
                trailing = tf.shape(x)[2:]
                dy = tf.reshape(dy, tf.concat([[-1], trailing], 0))
                shape = tf.shape(x)
            else:
                dy = tf.reshape(dy, [-1] + trailing)
                shape = leading_shape(x, 2, trailing)
            dx = tf.math.unsorted_segment_sum(dy, rows, batch * time)
            return tf.reshape(dx, shape)

        return tf.gather(x, index, batch_dims=1), grad

    return gather(x)


def has_fused_rnn_kernel():
    """True when Keras' LSTM/GRU may run cuDNN here, by Keras' own test."""
    from maskedrnn._keras_private import keras_backend_rnn

    return bool(keras_backend_rnn(NAME)._is_gpu_available())


def options(inner, where, want_states):
    """`[(kernel, reason)]`, best first: BlockLSTMV2 or tiers, then Keras' kernels."""
    return [
        (block_lstm.KERNEL, block_lstm.decline_reason(inner, has_fused_rnn_kernel)),
        (cells.KERNEL, cells.decline_reason(inner, has_fused_rnn_kernel)),
    ] + keras_kernels.options(
        inner,
        unmasked_preference=keras_kernels.states_reason(
            inner, want_states, has_fused_rnn_kernel
        ),
    )


def describe(kernel, inner, want_states, options):
    """The `kernel_info()` sentence for `kernel`."""
    if kernel == block_lstm.KERNEL:
        return block_lstm.describe(inner)
    if kernel == cells.KERNEL:
        return cells.describe(inner)
    text = keras_kernels.describe(kernel, inner, options)
    reason = dict(options).get(block_lstm.KERNEL)
    if isinstance(inner, keras.layers.LSTM) and reason is not None:
        text = f"{text} (tf.raw_ops.BlockLSTMV2 does not run: {reason})"
    reason = dict(options).get(cells.KERNEL)
    if isinstance(inner, (keras.layers.GRU, keras.layers.SimpleRNN)) and reason:
        text = f"{text} (the length tiers do not run: {reason})"
    return text


def run(kernel, inner, x, initial_state, training, steps, want_states):
    """Runs `kernel` over valid-first `x`; `(outputs, states or None)`."""
    if kernel == block_lstm.KERNEL:
        return block_lstm.run(inner, x, initial_state, steps, want_states)
    if kernel == cells.KERNEL:
        return cells.run(inner, x, initial_state, steps, want_states)
    return keras_kernels.run(kernel, inner, x, initial_state, training, steps)
