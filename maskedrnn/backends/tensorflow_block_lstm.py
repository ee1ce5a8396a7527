"""TensorFlow's fused LSTM kernel, `BlockLSTMV2`, for one valid-first direction.

The `"tf-block-lstm"` way of the TensorFlow backend. `tf.raw_ops.BlockLSTMV2`
(the op behind TF1's `LSTMBlockFusedCell`) runs a whole LSTM sequence in one
kernel, with a registered gradient, on a CPU where Keras has no fused LSTM
kernel. Its equations are Keras' `LSTM` with the default activations: gates in
Keras' order (input, forget, candidate, output), no forget bias added, weights
`concat([kernel, recurrent_kernel])`, Keras' bias, no peepholes and no cell
clipping. It returns every step's `h` and cell state `cs`, so the final
`[h, c]` of each row of valid-first data is one gather at step `lengths - 1`:
exact, with no masked loop and no recomputation of `c`.

It runs only where those equations are the layer's (`why_not`): a
`keras.layers.LSTM` with `tanh` / `sigmoid` activations and no recurrent
dropout, `use_cudnn` not False (which asks for Keras' loop), computing in
float32 or float16 (the op's only dtypes; mixed
precision computes in float16), outside XLA (the op has no XLA kernel, so
`jit_compile=True` runs Keras' layer), outside
`maskedrnn.backends.portable()` and outside Keras' exporter
(`model.export`: exported graphs carry Keras' LSTM, which tf2onnx and
LiteRT convert).
"""

import sys

import keras
import tensorflow as tf
from keras import ops
from tensorflow.python.ops import control_flow_util

from maskedrnn import backends
from maskedrnn.backends import Why, soft

WAY = "tf-block-lstm"
DTYPES = ("float32", "float16")

_NOT_LSTM = Why(
    lambda: "BlockLSTMV2 computes keras.layers.LSTM only (this layer is "
    "another RNN)"
)
_ACTIVATIONS = Why(
    "BlockLSTMV2 computes tanh / sigmoid activations only (this LSTM has "
    "other ones)"
)
_RECURRENT_DROPOUT = Why(
    "recurrent_dropout > 0 (BlockLSTMV2 has no recurrent dropout)"
)
_XLA = Why(
    "traced for XLA (jit_compile=True), and BlockLSTMV2 has no XLA kernel"
)
_PORTABLE_WHY = Why(
    "inside maskedrnn.backends.portable(): an export for converters that "
    "lack BlockLSTMV2 (LiteRT built-in ops, tf2onnx)"
)
_KERAS_EXPORT_WHY = Why(
    "traced by Keras' exporter (model.export, ExportArchive): an exported "
    "graph carries Keras' own LSTM, which every converter reads (tf2onnx "
    "and LiteRT's built-in ops have no BlockLSTMV2)"
)
_UNROLL = soft("the LSTM has unroll=True, which asks for Keras' unrolled loop")
_CUDNN = soft("Keras' LSTM may run cuDNN here (a GPU), which is faster")
_USE_CUDNN_FALSE = soft(
    "the inner layer has use_cudnn=False, which asks for Keras' loop"
)


def _dtype_why(dtype):
    return Why(
        lambda: f"the LSTM computes in {dtype} and BlockLSTMV2 has float32 "
        "and float16 kernels only"
    )


_KERAS_EXPORT = "keras.src.export"


def traced_for_keras_export():
    """True while Keras' exporter traces the model: `model.export(...)` (a
    SavedModel, ONNX through tf2onnx, LiteRT) and `keras.export.
    ExportArchive` trace in functions of `keras.src.export`, found on the
    Python stack. Checked only while tracing (never in eager calls)."""
    if tf.executing_eagerly():
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(_KERAS_EXPORT):
            return True
        frame = frame.f_back
    return False


def in_xla_context():
    """True while tracing a function that XLA compiles (`jit_compile=True`)."""
    if tf.executing_eagerly():
        return False
    graph = tf.compat.v1.get_default_graph()
    return bool(control_flow_util.GraphOrParentsInXlaContext(graph))


def why_not(inner, has_fused_rnn_kernel):
    """None when `BlockLSTMV2` computes `inner` exactly here and is
    preferred, else a `Why` (hard when it cannot run, soft when Keras'
    layer is preferred).

    Args:
        inner: The inner RNN.
        has_fused_rnn_kernel: The backend's function of that name.
    """
    if type(inner) is not keras.layers.LSTM:
        return _NOT_LSTM
    cell = inner.cell
    if (
        cell.activation is not keras.activations.tanh
        or cell.recurrent_activation is not keras.activations.sigmoid
    ):
        return _ACTIVATIONS
    if cell.recurrent_dropout:
        return _RECURRENT_DROPOUT
    dtype = keras.backend.standardize_dtype(cell.compute_dtype)
    if dtype not in DTYPES:
        return _dtype_why(dtype)
    if backends.portable_only():
        return _PORTABLE_WHY
    if traced_for_keras_export():
        return _KERAS_EXPORT_WHY
    if in_xla_context():
        return _XLA
    if inner.unroll:
        return _UNROLL
    if inner.use_cudnn is False:
        return _USE_CUDNN_FALSE
    if has_fused_rnn_kernel():
        return _CUDNN
    return None


def describe(inner):
    """The `kernel_info()` sentence of the way."""
    return (
        "TensorFlow's fused LSTM kernel (tf.raw_ops.BlockLSTMV2) over "
        "valid-first data, unmasked; the final [h, c] read from its per-step "
        "h and cell states at each row's last valid step (exact, no "
        "recomputation); in functions XLA compiles (jit_compile=True) Keras' "
        "layer runs instead, the op having no XLA kernel"
    )


def block_lstm(seq_len_max, x, h0, c0, weights, bias):
    """`BlockLSTMV2` over time-major `x`, with its correct gradient.

    TensorFlow registers the gradient of `BlockLSTM` (`BlockLSTMGrad`, whose
    gates are in another order) for `BlockLSTMV2` too, which gives wrong
    gradients for every input; this computes them with `BlockLSTMGradV2`,
    the gradient op of `BlockLSTMV2`.

    Args:
        seq_len_max: Int64 scalar, the number of steps to run (steps past
            it output zeros).
        x: `(time, batch, features)`.
        h0, c0: `(batch, units)`.
        weights: `(features + units, 4 * units)`, `concat([kernel,
            recurrent_kernel])`, gates in Keras' order (i, f, c, o).
        bias: `(4 * units,)`.

    Returns:
        `(cs, h)`: the cell states and outputs of every step, each
        `(time, batch, units)`.
    """

    @tf.custom_gradient
    def fused(x, h0, c0, weights, bias):
        no_peephole = tf.zeros(tf.shape(h0)[1:], x.dtype)
        args = dict(
            seq_len_max=seq_len_max,
            x=x,
            cs_prev=c0,
            h_prev=h0,
            w=weights,
            wci=no_peephole,
            wcf=no_peephole,
            wco=no_peephole,
            b=bias,
            use_peephole=False,
        )
        # cell_clip <= 0: no clipping of the cell state.
        i, cs, f, o, ci, co, h = tf.raw_ops.BlockLSTMV2(cell_clip=-1.0, **args)

        def grad(cs_grad, h_grad):
            cs_grad = tf.zeros_like(cs) if cs_grad is None else cs_grad
            h_grad = tf.zeros_like(h) if h_grad is None else h_grad
            grads = tf.raw_ops.BlockLSTMGradV2(
                i=i, cs=cs, f=f, o=o, ci=ci, co=co, h=h,
                cs_grad=cs_grad, h_grad=h_grad, **args,
            )  # fmt: skip
            x_grad, c0_grad, h0_grad, w_grad = grads[:4]
            return x_grad, h0_grad, c0_grad, w_grad, grads[7]

        return (cs, h), grad

    return fused(x, h0, c0, weights, bias)


def run(inner, x, initial_state, steps, want_states):
    """Runs `BlockLSTMV2` over valid-first `x`.

    Args:
        inner: A `keras.layers.LSTM` (`why_not` says None or soft), built.
        x: Valid-first float tensor `(batch, time, features)`, zeros at
            padded steps, input dropout already applied; computed in the
            inner layer's compute dtype (float32 or float16).
        initial_state: `[h0, c0]`, each `(batch, units)`.
        steps: The `maskedrnn.steps.Steps` of the batch.
        want_states: Whether the final states are wanted.

    Returns:
        `(outputs, states)`: `outputs` `(batch, time, units)`, exact at each
        row's valid steps (padded steps past the longest row hold zeros);
        `states` `[h, c]` after each row's last valid step (the initial
        state for a row with no valid step), or None when not wanted.
    """
    cell = inner.cell
    # The inner layer's compute dtype, to which Keras' call would cast its
    # inputs too (a policy on the wrapper alone hands it another dtype).
    dtype = keras.backend.standardize_dtype(cell.compute_dtype)
    x = ops.cast(x, dtype)
    units = cell.units
    weights = tf.concat(
        [ops.cast(cell.kernel, dtype), ops.cast(cell.recurrent_kernel, dtype)],
        axis=0,
    )
    if cell.use_bias:
        bias = ops.cast(cell.bias, dtype)
    else:
        bias = tf.zeros((4 * units,), dtype)
    h0 = ops.cast(initial_state[0], dtype)
    c0 = ops.cast(initial_state[1], dtype)
    # Steps past the longest row are skipped (the op outputs zeros there).
    # On a CPU the maximum is read on the host where it is computed: no
    # device-to-host copy.
    seq_len_max = tf.cast(tf.reduce_max(steps.lengths), tf.int64)
    cs, h = block_lstm(seq_len_max, tf.transpose(x, (1, 0, 2)), h0, c0, weights, bias)
    y = tf.transpose(h, (1, 0, 2))
    if not want_states:
        return y, None
    states = []
    for seq, start in ((h, h0), (cs, c0)):
        # Time-major: row b's state after step last[b] is seq[last[b], b].
        index = tf.stack(
            [steps.last, tf.range(tf.shape(seq)[1], dtype=steps.last.dtype)],
            axis=1,
        )
        state = tf.gather_nd(seq, index)
        states.append(tf.where(steps.has_steps, state, start))
    return y, states

