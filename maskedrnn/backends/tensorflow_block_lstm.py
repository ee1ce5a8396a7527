"""TensorFlow's fused LSTM kernel, `BlockLSTMV2`, for one valid-first direction.

The `"tf-block-lstm"` kernel: `tf.raw_ops.BlockLSTMV2` computes Keras' `LSTM`
in one kernel on a CPU and returns every step's `h` and `c`, so exact final
states are one gather; rows run in length tiers, with a gradient of its
own (docs/design.md, "Kernels, one per backend"). `decline_reason` declines what
it cannot run: other activations, float64, XLA, `portable()` and Keras'
exporter.
"""

import threading

import keras
import tensorflow as tf
from keras import ops
from tensorflow.python.eager import context as tf_context

from maskedrnn import backends
from maskedrnn.backends import Reason, preference
from maskedrnn.backends import tensorflow_tiers as tiers
from maskedrnn.backends.tensorflow_shapes import size

KERNEL = "tf-block-lstm"
DTYPES = ("float32", "float16")
# The fewest rows of a tier: each is one more op per direction to trace,
# and to differentiate, in exchange for the steps it skips.
TIER_ROWS = 16

_NOT_LSTM = Reason(
    lambda: "BlockLSTMV2 computes keras.layers.LSTM only (this layer is "
    "another RNN)"
)
_ACTIVATIONS = Reason(
    "BlockLSTMV2 computes tanh / sigmoid activations only (this LSTM has "
    "other ones)"
)
_DECLINE_REASONS = tiers.DeclineReasons(
    recurrent_dropout=Reason(
        "recurrent_dropout > 0 (BlockLSTMV2 has no recurrent dropout)"
    ),
    dtype="the LSTM computes in {} and BlockLSTMV2 has float32 and float16 "
    "kernels only",
    portable=Reason(
        "inside maskedrnn.backends.portable(): an export for converters that "
        "lack BlockLSTMV2 (LiteRT built-in ops, tf2onnx)"
    ),
    keras_export=Reason(
        "traced by Keras' exporter (model.export, ExportArchive): an exported "
        "graph carries Keras' own LSTM, which every converter reads (tf2onnx "
        "and LiteRT's built-in ops have no BlockLSTMV2)"
    ),
    xla=Reason(
        "traced for XLA (jit_compile=True), and BlockLSTMV2 has no XLA kernel"
    ),
    unroll=preference("the LSTM has unroll=True, which asks for Keras' unrolled loop"),
    use_cudnn_false=preference(
        "the inner layer has use_cudnn=False, which asks for Keras' loop"
    ),
    fused_kernel=preference("Keras' LSTM may run cuDNN here (a GPU), which is faster"),
)


def decline_reason(inner, has_fused_rnn_kernel):
    """None when `BlockLSTMV2` computes `inner` exactly and is preferred.

    Else a `Reason`: blocking when it cannot run, a preference when Keras' layer is
    preferred.

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
    return tiers.decline_reason(inner, has_fused_rnn_kernel, DTYPES, _DECLINE_REASONS)


def describe(inner):
    """The `kernel_info()` sentence of the kernel."""
    return (
        "TensorFlow's fused LSTM kernel (tf.raw_ops.BlockLSTMV2) over "
        "valid-first data, unmasked, its rows sorted by length and leaving "
        "in groups once a group has ended; the final [h, c] read from its "
        "per-step h and cell states at each row's last valid step (exact, no "
        "recomputation); in functions XLA compiles (jit_compile=True) Keras' "
        "layer runs instead, the op having no XLA kernel"
    )


def constants(weights):
    """`(w_h, w_h_icfo, no_peephole)`, built once for a direction's
    gradient."""
    units = weights.shape[1] // 4
    w_h = weights[weights.shape[0] - units :]
    w_i, w_f, w_c, w_o = tf.split(w_h, 4, axis=1)
    w_h_icfo = tf.transpose(tf.concat([w_i, w_c, w_f, w_o], axis=1))
    return w_h, w_h_icfo, tf.zeros((units,), weights.dtype)


def block_lstm(x, h0, c0, weights, bias, no_peephole, steps):
    """`BlockLSTMV2` over every step of time-major `x`, with no gradient of
    its own (`tiered` holds the gradient of every tier).

    Args:
        x: `(time, batch, features)`; every step is run.
        h0, c0: `(batch, units)`.
        weights: `(features + units, 4 * units)`, `concat([kernel,
            recurrent_kernel])`, gates in Keras' order (i, f, c, o).
        bias: `(4 * units,)`.
        no_peephole: `(units,)` zeros.
        steps: int64 scalar, the size of `x`'s time axis.

    Returns:
        The op's seven outputs `(i, cs, f, o, ci, co, h)`, each `(time,
        batch, units)`: `cs` the cell states and `h` the outputs.
    """
    return tf.raw_ops.BlockLSTMV2(
        seq_len_max=steps,
        x=x,
        cs_prev=c0,
        h_prev=h0,
        w=weights,
        wci=no_peephole,
        wcf=no_peephole,
        wco=no_peephole,
        b=bias,
        use_peephole=False,
        cell_clip=-1.0,  # <= 0: no clipping of the cell state
    )


def tiered(weights, bias):
    """The `run_tiers` recurrence of one LSTM direction: a `BlockLSTMV2` per
    tier, all of them under one gradient.

    TensorFlow registers `BlockLSTM`'s gradient for `BlockLSTMV2` too, whose
    gate order differs, so it is wrong; and `BlockLSTMGradV2` computes the
    inputs' and weights' gradients step by step. `_backward` replaces
    both, tier by tier from the last, the gradient of each tier's initial
    states carried into the tier before. One gradient for the whole
    direction, not one per tier: the sorting, splitting and padding
    between the tiers then have no gradient graph of their own to trace.

    Args:
        weights: `(features + units, 4 * units)`, `concat([kernel,
            recurrent_kernel])`, gates in Keras' order (i, f, c, o).
        bias: `(4 * units,)`.

    Returns:
        `recurrence(x, steps, [h0, c0], rows) -> [h, cs]`, as
        `tiers.run_tiers` calls it: every tier's outputs and cell states.
    """
    # Static: the gradient's graph may be traced with relaxed shapes.
    units = weights.shape[1] // 4
    sizes = (weights.shape[0] - units, units)
    no_peephole = tf.zeros((units,), weights.dtype)

    def recurrence(x, steps, states, rows):
        count = len(rows)
        # The gradient loop's calls in this layer call (read now: the
        # gradient is traced outside the layer call).
        calls = count * backends.directions_in_call()
        pads = tiers.paddings(size(x, 1), rows)
        past = steps[count]
        # Each tier's steps for its op, in one op.
        op_steps = tf.unstack(tf.cast(steps, tf.int64), num=count + 1)

        @tf.custom_gradient
        def run(x, h0, c0, weights, bias):
            segments = tf.split(x, steps, num=count + 1)
            xs, ins, gates = [], [(h0, c0)], []
            for k, rows_k in enumerate(rows):
                x_k = segments[k]
                if k:
                    x_k = tiers.first_rows(x_k, rows_k)
                    last = gates[-1]
                    ins.append(tiers.states_after(ins[-1], [last[6], last[1]], rows_k))
                xs.append(x_k)
                gates.append(
                    block_lstm(x_k, *ins[-1], weights, bias, no_peephole, op_steps[k])
                )
            h, cs = (tiers.full([g[j] for g in gates], pads, past) for j in (6, 1))

            def grad(h_grad, cs_grad):
                # Built once for every tier's gradient, and only for one.
                shared = constants(weights)
                if h_grad is None:
                    h_grad = tf.zeros_like(h)
                if cs_grad is None:
                    cs_grad = tf.zeros_like(cs)
                # Each tier's steps and rows of the outputs' gradients.
                split = [tf.split(g, steps, num=count + 1) for g in (h_grad, cs_grad)]
                x_grads, weights_grad, bias_grad = [None] * count, 0, 0
                carried = [tf.zeros_like(ins[-1][0])] * 2
                for k in reversed(range(count)):
                    if k < count - 1:
                        # Rows that leave after tier k carry no gradient.
                        below = tf.stack([[0, rows[k] - rows[k + 1]], [0, 0]])
                        carried = [tf.pad(c, below) for c in carried]
                    h_k, cs_k = (
                        tiers.first_rows(g[k], rows[k]) if k else g[k] for g in split
                    )
                    x_grad, *carried, w_grad, b_grad = _backward_graph(
                        xs[k],
                        *ins[k],
                        weights,
                        gates[k],
                        cs_k,
                        h_k,
                        carried,
                        shared,
                        sizes,
                        calls,
                    )
                    x_grads[k] = x_grad
                    weights_grad += w_grad
                    bias_grad += b_grad
                x_grad = tiers.full(x_grads, pads, past)
                return x_grad, *carried, weights_grad, bias_grad

            return (h, cs), grad

        return list(run(x, *states, weights, bias))

    return recurrence


def _backward(x, h0, c0, weights, gates, cs_grad, h_grad, carried, shared, sizes):
    """The gradients of one tier's `block_lstm` w.r.t. `(x, h0, c0,
    weights, bias)`.

    `gates` are `BlockLSTMV2`'s outputs `(i, cs, f, o, ci, co, h)`;
    `cs_grad`, `h_grad` the gradients of its `cs` and `h`; `carried` the
    gradients `(dh, dc)` of the states after its last step reaching it from
    the tiers after; `shared` the direction's `constants`; `sizes` the ints
    `(features, units)`. `LSTMBlockCellGrad` (gates i, c, f, o) steps back
    one step at a time.
    """
    i, cs, f, o, ci, co, h = gates
    dtype = x.dtype
    features, units = sizes
    steps = tf.shape(x)[0]
    rows = tf.shape(h0)[0]
    w_x = weights[:features]
    w_h, w_h_icfo, no_peephole = shared
    cs_prev = tf.concat([c0[None], cs], axis=0)[:-1]
    h_prev = tf.concat([h0[None], h], axis=0)[:-1]
    # The op only checks the shapes of x, w and b: no inputs, w = w_h.
    no_x = tf.zeros((rows, 0), dtype)
    zero_bias = tf.zeros((4 * units,), dtype)
    gate_grads = tf.TensorArray(
        dtype, size=steps, element_shape=tf.TensorShape([None, 4 * units])
    )
    one = tf.constant([1])

    def step(t, dh, dc, gate_grads):
        # Step t of each tensor, its slice's bounds shared: `x[t]` would add
        # three ops and three constants per tensor to every copy of the loop.
        begin = tf.expand_dims(t, 0)
        end = begin + 1
        at = []
        for v in (cs_prev, h_prev, i, cs, f, o, ci, co, cs_grad, h_grad):
            at.append(tf.strided_slice(v, begin, end, one, shrink_axis_mask=1))
            # Its shape, which TensorFlow cannot infer from tensor bounds.
            at[-1].set_shape(v.shape[1:])
        dc, dicfo, _, _, _ = tf.raw_ops.LSTMBlockCellGrad(
            x=no_x,
            cs_prev=at[0],
            h_prev=at[1],
            w=w_h,
            wci=no_peephole,
            wcf=no_peephole,
            wco=no_peephole,
            b=zero_bias,
            i=at[2],
            cs=at[3],
            f=at[4],
            o=at[5],
            ci=at[6],
            co=at[7],
            cs_grad=at[8] + dc,
            h_grad=at[9] + dh,
            use_peephole=False,
        )
        dh = tf.matmul(dicfo, w_h_icfo)
        return t - 1, dh, dc, gate_grads.write(t, dicfo)

    _, h0_grad, c0_grad, gate_grads = tf.while_loop(
        lambda t, *_: t >= 0,
        step,
        (steps - 1, *carried, gate_grads),
    )
    gate_grads = tiers.stack(gate_grads, [rows, 4 * units])
    d_i, d_c, d_f, d_o = tf.split(gate_grads, 4, axis=2)
    # All steps at once; sums in float32, as float16 would lose small terms.
    d = tf.reshape(tf.concat([d_i, d_f, d_c, d_o], 2), (-1, 4 * units))
    d = tf.cast(d, "float32")
    x_flat = tf.cast(tf.reshape(x, (-1, features)), "float32")
    h_flat = tf.cast(tf.reshape(h_prev, (-1, units)), "float32")
    x_grad = tf.matmul(d, tf.cast(w_x, "float32"), transpose_b=True)
    weights_grad = tf.concat(
        [
            tf.matmul(x_flat, d, transpose_a=True),
            tf.matmul(h_flat, d, transpose_a=True),
        ],
        axis=0,
    )
    return (
        tf.cast(tf.reshape(x_grad, tf.shape(x)), dtype),
        h0_grad,
        c0_grad,
        tf.cast(weights_grad, dtype),
        tf.cast(tf.reduce_sum(d, axis=0), dtype),
    )


# One graph, traced once per sizes for every tier and direction of every
# layer. Where a layer call runs it at most `INLINED_CALLS` times (tiers
# times directions), each call inlines a copy, optimised with the graph
# around it; more calls call the one graph (`_noinline`, `unspecialized`),
# optimised and instantiated once, where copies would each be optimised
# again.
INLINED_CALLS = 2
_BACKWARD = tf.function(_backward, autograph=False)
_BACKWARD_CALLED = tf.function(
    _backward, autograph=False, experimental_attributes={"_noinline": True}
)


def _backward_graph(
    x, h0, c0, weights, gates, cs_grad, h_grad, carried, shared, sizes, calls
):
    """`_backward` as one traced graph for every tier and direction of the
    same sizes, inlined or called as `calls` (its calls in the layer call)
    asks. The tiers differ in steps and rows, so the graph is traced once
    with those dimensions unknown, and every tier calls that trace."""
    rows = tf.TensorSpec((None, sizes[1]), h0.dtype)
    steps = tf.TensorSpec((None, None, sizes[1]), x.dtype)
    specs = (
        tf.TensorSpec((None, None, sizes[0]), x.dtype),
        rows,
        rows,
        tf.TensorSpec(weights.shape, weights.dtype),
        (steps,) * len(gates),
        steps,
        steps,
        (rows, rows),
        tuple(tf.TensorSpec(t.shape, t.dtype) for t in shared),
    )
    graph = _BACKWARD if calls <= INLINED_CALLS else _BACKWARD_CALLED
    concrete = graph.get_concrete_function(*specs, sizes)
    if graph is _BACKWARD_CALLED:
        unspecialized(concrete)
    args = (x, h0, c0, weights, tuple(gates), cs_grad, h_grad, tuple(carried))
    return graph(*args, shared, sizes)


# TensorFlow's function attribute (not one `tf.function` accepts) that stops
# its graph optimiser from copying a called function per call.
_NO_SPECIALIZE = "_nospecialize"
# Replicas of a tf.distribute strategy trace in threads of their own.
_REGISTERING = threading.Lock()


def unspecialized(concrete):
    """Marks the traced graph `concrete` so that every call runs the one
    graph.

    Before a function's first run, TensorFlow's graph optimiser (Grappler's
    function optimizer) gives each call of another function a copy of it,
    specialised to that call: its constant inputs (zero states) folded in,
    its unused outputs (the initial states' gradients) dropped. Each copy
    is then optimised and instantiated anew, which costs every tier and
    direction of an LSTM's gradient as much as its first. Marked (with the
    FunctionDef attribute `_nospecialize`, which `tf.function` does not
    take), the calls share one instantiation of the function.

    Re-registers the function's definition with the attribute in the eager
    context, where every graph that calls it reads it from; once per traced
    graph, before any call, one thread at a time.
    """
    context = tf_context.context()
    with _REGISTERING:
        definition = context.get_function_def(concrete.name)
        if definition.attr[_NO_SPECIALIZE].b:
            return
        definition.attr[_NO_SPECIALIZE].b = True
        context.remove_function(concrete.name)
        context.add_function_def(definition)


def run(inner, x, initial_state, steps, want_states):
    """Runs `BlockLSTMV2` over valid-first `x`, rows in length tiers.

    Args:
        inner: A built `keras.layers.LSTM` that `decline_reason` accepts.
        x: Valid-first float tensor `(batch, time, features)`, zeros at
            padded steps, input dropout applied.
        initial_state: `[h0, c0]`, each `(batch, units)`.
        steps: The `maskedrnn.steps.Steps` of the batch.
        want_states: Whether the final states are wanted.

    Returns:
        `(outputs, states)`: `outputs` `(batch, time, units)`, exact at
        valid steps, zeros past the longest row; `states` `[h, c]`
        after each row's last valid step (initial for a row with none), or
        None when not wanted.
    """
    cell = inner.cell
    # Keras' call would cast to it too; the wrapper's policy may differ.
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
    y, others = tiers.run_tiers(
        x,
        [h0, c0],
        steps,
        tiered(weights, bias),
        tiers.tier_count(x.shape[0], TIER_ROWS),
        want_states,
    )
    if not want_states:
        return y, None
    # Row b's output after step last[b] is y[b, last[b]].
    h = tf.gather(y, steps.last, axis=1, batch_dims=1)
    c = others[0]
    return y, [tf.where(steps.has_steps, h, h0), tf.where(steps.has_steps, c, c0)]
