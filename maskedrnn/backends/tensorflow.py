"""The TensorFlow backend: length tiers on a CPU, else Keras' layers.

Where no cuDNN kernel may run, an LSTM runs `tf.raw_ops.BlockLSTMV2`
(`"tf-block-lstm"`) and a GRU or SimpleRNN the length tiers
(`"tf-tiers"`). Elsewhere an LSTM whose states are wanted runs Keras'
masked loop without a fused kernel, and every other RNN Keras' layer
unmasked on valid-first data.
"""

import keras
import tensorflow as tf
from keras import ops

from maskedrnn.backends import keras_ways
from maskedrnn.backends import tensorflow_block_lstm as block_lstm
from maskedrnn.backends import tensorflow_cells as cells

NAME = "tensorflow"
WAYS = (block_lstm.WAY, cells.WAY, "keras-unmasked", "keras-masked")

layout = run_direction = keras_ways.no_caller_order_kernel
scalar = keras_ways.scalar
FUSED_WAYS = ()
run_fused = keras_ways.no_fused_kernel
fused_why = keras_ways.fused_why


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
    """Inverts each row of int32 `(batch, time)` permutations (an argsort)."""
    return ops.cast(ops.argsort(perm, axis=1), "int32")


def take_rows(flat, index):
    """`flat[index]`, shape `index.shape + flat.shape[1:]`."""
    return ops.take(flat, index, axis=0)


def has_fused_rnn_kernel():
    """True when Keras' LSTM/GRU may run cuDNN here, by Keras' own test."""
    from maskedrnn._keras_private import keras_backend_rnn

    return bool(keras_backend_rnn(NAME)._is_gpu_available())


def options(inner, where, want_states):
    """`[(way, why)]`, best first: BlockLSTMV2 or tiers, then Keras' ways."""
    return [
        (block_lstm.WAY, block_lstm.why_not(inner, has_fused_rnn_kernel)),
        (cells.WAY, cells.why_not(inner, has_fused_rnn_kernel)),
    ] + keras_ways.options(
        inner,
        unmasked_soft=keras_ways.states_why(inner, want_states, has_fused_rnn_kernel),
    )


def describe(way, inner, want_states, options):
    """The `kernel_info()` sentence for `way`."""
    if way == block_lstm.WAY:
        return block_lstm.describe(inner)
    if way == cells.WAY:
        return cells.describe(inner)
    text = keras_ways.describe(way, inner, options)
    why = dict(options).get(block_lstm.WAY)
    if isinstance(inner, keras.layers.LSTM) and why is not None:
        text = f"{text} (tf.raw_ops.BlockLSTMV2 does not run: {why})"
    why = dict(options).get(cells.WAY)
    if isinstance(inner, (keras.layers.GRU, keras.layers.SimpleRNN)) and why:
        text = f"{text} (the length tiers do not run: {why})"
    return text


def run(way, inner, x, initial_state, training, steps, want_states):
    """Runs `way` over valid-first `x`; `(outputs, states or None)`."""
    if way == block_lstm.WAY:
        return block_lstm.run(inner, x, initial_state, steps, want_states)
    if way == cells.WAY:
        return cells.run(inner, x, initial_state, steps, want_states)
    return keras_ways.run(way, inner, x, initial_state, training, steps)
