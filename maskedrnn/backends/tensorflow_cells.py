"""Keras' GRU and SimpleRNN in length tiers on TensorFlow: the `"tf-tiers"` kernel.

On a CPU, where Keras' layer steps every row to the end, the rows of
valid-first data run Keras' cell equations (`tensorflow_equations`) in a
`tf.while_loop` over blocks of steps (`tensorflow_step_loops`), with a
gradient of their own (docs/design.md, "Kernels, one per backend"). From
`SHRINKING_ROWS` rows the rows, sorted by length, leave the loop as they
end, each block projecting its rows' inputs; a smaller batch runs one tier
of `tensorflow_tiers`: every row to the longest row's end, its inputs
projected in one matmul.
`decline_reason` declines other equations, a GPU, XLA, `portable()` and
Keras' exporter.
"""

import keras
import tensorflow as tf
from keras import ops

from maskedrnn import backends
from maskedrnn.backends import Reason, preference
from maskedrnn.backends import tensorflow_equations as equations
from maskedrnn.backends import tensorflow_step_loops as step_loops
from maskedrnn.backends import tensorflow_tiers as tiers
from maskedrnn.backends.tensorflow_shapes import size

KERNEL = "tf-tiers"
DTYPES = ("float16", "float32", "float64")
# The fewest rows whose step loop sorts them by length and lets them leave
# as they end. A smaller batch (or one of unknown size) runs one loop over
# every row to the longest row's end: its steps are too small for fewer
# rows to take less time, and the sort and the moves around the loop add
# to every first call.
SHRINKING_ROWS = 64

_NOT_CELL = Reason(
    "the tiers compute keras.layers.GRU and keras.layers.SimpleRNN only "
    "(this layer is another RNN; an LSTM runs 'tf-block-lstm')"
)
_GRU_ACTIVATIONS = Reason(
    "the tiers compute a GRU's tanh / sigmoid activations only (this GRU "
    "has other ones)"
)
_RNN_ACTIVATION = Reason(
    "the tiers compute a SimpleRNN's tanh activation only (this one has another)"
)
_DECLINE_REASONS = tiers.DeclineReasons(
    recurrent_dropout=Reason(
        "recurrent_dropout > 0 (the tiers have no recurrent dropout)"
    ),
    dtype="the layer computes in {}; the tiers compute float16, float32 and float64",
    portable=Reason(
        "inside maskedrnn.backends.portable(): an export keeps Keras' own layer "
        "for converters (LiteRT built-in ops, tf2onnx)"
    ),
    keras_export=Reason(
        "traced by Keras' exporter (model.export, ExportArchive): an exported "
        "graph carries Keras' own layer, which every converter reads"
    ),
    xla=Reason(
        "traced for XLA (jit_compile=True), which needs the tiers' sizes when "
        "tracing (they depend on the batch's lengths)"
    ),
    unroll=preference("the layer has unroll=True, which asks for Keras' unrolled loop"),
    use_cudnn_false=preference(
        "the inner layer has use_cudnn=False, which asks for Keras' loop"
    ),
    fused_kernel=preference(
        "a GPU is visible, where Keras' layer runs (cuDNN for a GRU); the tiers "
        "are built for a CPU"
    ),
)


def decline_reason(inner, has_fused_rnn_kernel):
    """None when the tiers compute `inner` exactly and are preferred.

    Else a `Reason`: blocking when they cannot run, a preference when Keras' layer is
    preferred.

    Args:
        inner: The inner RNN.
        has_fused_rnn_kernel: The backend's function of that name.
    """
    kind = type(inner)
    if kind not in (keras.layers.GRU, keras.layers.SimpleRNN):
        return _NOT_CELL
    cell = inner.cell
    if cell.activation is not keras.activations.tanh:
        return _GRU_ACTIVATIONS if kind is keras.layers.GRU else _RNN_ACTIVATION
    if (
        kind is keras.layers.GRU
        and cell.recurrent_activation is not keras.activations.sigmoid
    ):
        return _GRU_ACTIVATIONS
    return tiers.decline_reason(inner, has_fused_rnn_kernel, DTYPES, _DECLINE_REASONS)


def describe(inner):
    """The `kernel_info()` sentence of the kernel."""
    name = type(inner).__name__
    return (
        f"Keras {name}'s equations in length tiers over valid-first data, "
        f"unmasked: from {SHRINKING_ROWS} rows, the rows sorted by length "
        "run one TensorFlow while_loop per direction that drops each row "
        "after the block of steps holding its last step, each block "
        "projecting its rows' inputs in one matmul; a smaller batch (or one "
        "of unknown size) runs every row to the longest row's end, its "
        "inputs projected in one matmul; each loop with a gradient of its "
        "own; the final state read at each row's last valid step (exact); "
        "in functions XLA compiles (jit_compile=True) Keras' layer runs "
        "instead"
    )


# Steps per while_loop iteration (a block), sharing the loop's own ops:
# the loops end on whole blocks (`tiers.run_tiers`' `block`), so they never
# pad. Each step is traced into the loop's body, so a longer block costs
# first calls what it saves in steady state: a GRU step is large enough
# for 2, a SimpleRNN step's small matmul gains from 4.
GRU_BLOCK = 2
RNN_BLOCK = 4
_BLOCKS = {"gru": GRU_BLOCK, "rnn": RNN_BLOCK}


def _kind(cell):
    """ "gru" or "rnn" (a SimpleRNN): the equations `cell` runs."""
    return "gru" if isinstance(cell, keras.layers.GRUCell) else "rnn"


def _weight_grads(grads, dtype, bh):
    """`grads` cast to `dtype`, `d_bh` zeros where `equations.grads` gave
    None (a recurrent bias of zeros, whose gradient is never used), dropped
    where the cell has none (`bh` None)."""
    *others, d_bh = grads
    cast = [tf.cast(g, dtype) for g in others]
    if bh is None:
        return cast
    return cast + [tf.zeros_like(bh) if d_bh is None else tf.cast(d_bh, dtype)]


def _tier_forward(xp, h0, u, bh, kind, reset_after, blocks):
    """The outputs `(steps, rows, units)` of the recurrence from `h0` over
    one tier of rows: `xp` the input projections with their bias, `blocks`
    blocks of steps (`_BLOCKS`)."""
    units = u.shape[0]
    step = equations.step(kind, u, bh, reset_after)
    inputs = equations.step_inputs(kind, xp, units)
    block = _BLOCKS[kind]
    return step_loops.scan(step, h0, inputs, [units], block, blocks)[1][0]


def _tier_backward(xp, h0, hs, dhs, u, bh, kind, reset_after, blocks):
    """The gradients of `_tier_forward` w.r.t. `xp`, `h0`, `u` (and `bh`)."""
    block = _BLOCKS[kind]

    def recur(step, seqs, widths):
        zeros = tf.zeros_like(h0)
        return step_loops.scan(step, zeros, seqs, widths, block, blocks, True)

    xs = equations.step_inputs(kind, xp, u.shape[0])
    h_prev = equations.states_before(h0, hs)
    dh0, d_xp, *weights = equations.grads(
        kind, xs, h_prev, hs, dhs, u, bh, reset_after, recur
    )
    return [d_xp, dh0, *_weight_grads(weights, xp.dtype, bh)]


def _time_major(x, blocks_time):
    """Batch-major `x` `(batch, time, width)` as time-major `(blocks_time,
    batch, width)`, zero steps after its own."""
    pad = blocks_time - size(x, 1)
    if not isinstance(pad, int) or pad > 0:
        x = tf.pad(x, [[0, 0], [0, pad], [0, 0]])
    return tf.transpose(x, (1, 0, 2))


def _batch_major(seq, inverse, time):
    """Time-major sorted `seq` `(blocks_time, batch, width)` as batch-major
    `(batch, time, width)` in the caller's row order (`inverse`)."""
    y = tf.transpose(tf.gather(seq, inverse, axis=1), (1, 0, 2))
    pad = size(seq, 0) - time
    if not isinstance(pad, int) or pad > 0:
        # A split, whose gradient is a concat (a slice's is slower).
        y = tf.split(y, tf.stack([time, pad]), num=2, axis=1)[0]
    return y


def _shrinking_forward(
    x, h0, rows, order, inverse, kernel, b, u, bh, kind, reset_after, zero_h0
):
    """The outputs of the recurrence over rows sorted by length that leave
    as they end (`step_loops.shrinking_forward`), each block's inputs
    projected by `kernel` and `b` in the loop.

    `x` `(batch, time, features)` and `h0` are in the caller's row order,
    `order` sorts it longest first and `inverse` undoes that; `rows` from
    `tiers.block_rows`. `h0` is not sorted where `zero_h0` (all zeros).
    Returns the outputs `(batch, time, units)` in the caller's order, then
    what the gradient reads: the sorted time-major inputs, initial states
    and outputs."""
    units, block = u.shape[0], _BLOCKS[kind]
    time = size(x, 1)
    xs = _time_major(tf.gather(x, order), tiers.whole(time, block))
    h0s = h0 if zero_h0 else tf.gather(h0, order)

    def project(x_block):
        return equations.step_inputs(
            kind, equations.flat_matmul(x_block, kernel, b), units
        )

    step = equations.step(kind, u, bh, reset_after)
    hs = step_loops.shrinking_forward(xs, h0s, rows, project, step, block)
    return _batch_major(hs, inverse, time), xs, h0s, hs


def _shrinking_backward(
    xs, h0s, hs, dy, rows, order, inverse, kernel, b, u, bh, kind, reset_after
):
    """The gradients of `_shrinking_forward`'s outputs w.r.t. `x`, `h0`,
    `kernel`, `b`, `u` (and `bh`), block by block: each block's gates
    recomputed and its input and weight gradients computed for its rows
    only. `xs`, `h0s`, `hs`: what the forward returned after the outputs;
    `dy` the gradient w.r.t. the outputs, in the caller's order."""
    units, block = u.shape[0], _BLOCKS[kind]
    dtype, sum_dtype = xs.dtype, equations.sum_dtype(xs.dtype)
    kernel_t = tf.transpose(kernel)
    with_bh = kind == "gru" and reset_after
    time = size(dy, 1)
    dhs = _time_major(tf.gather(dy, order), size(xs, 0))

    def grads(dh, inputs):
        x_block, h_prev, hs_block, dhs_block = inputs

        def recur(step, seqs, widths):
            return step_loops.unrolled(step, dh, seqs, len(widths), block, True)

        xp = equations.step_inputs(
            kind, equations.flat_matmul(x_block, kernel, b), units
        )
        dh, d_xp, d_u, d_bh = equations.grads(
            kind, xp, h_prev, hs_block, dhs_block, u, bh, reset_after, recur
        )
        terms = [
            equations.sum_matmul(x_block, d_xp),
            tf.reduce_sum(tf.cast(d_xp, sum_dtype), axis=(0, 1)),
            d_u,
        ]
        return (
            dh,
            equations.flat_matmul(d_xp, kernel_t),
            terms + ([d_bh] if with_bh else []),
        )

    width = kernel.shape[1]
    sums = [
        tf.zeros(kernel.shape, sum_dtype),
        tf.zeros((width,), sum_dtype),
        tf.zeros(u.shape, sum_dtype),
    ] + ([tf.zeros((width,), sum_dtype)] if with_bh else [])
    seqs = [xs, equations.states_before(h0s, hs), hs, dhs]
    d_xs, dh0s, sums = step_loops.shrinking_backward(
        seqs, rows, grads, sums, xs.shape[2], units, block
    )
    if not with_bh:
        sums.append(None)
    d_x = _batch_major(d_xs, inverse, time)
    return [d_x, tf.gather(dh0s, inverse), *_weight_grads(sums, dtype, bh)]


def _shared_graph(function):
    """`function` as one graph that every call of the same widths, dtypes
    and Python arguments runs (see `_call`)."""
    return tf.function(function, autograph=False)


# The step loops. Where a layer call runs one more than once (both
# directions of a MaskedBidirectional), each is traced once per process for
# every direction and tf.function, and each call inlines a copy of that
# trace, optimised with the graph around it; run once, its ops are traced
# in place. Eagerly they
# run as graphs, not as a Python loop of ops. They are written with
# tf.while_loop, so autograph is off.
_TIER_FORWARD = _shared_graph(_tier_forward)
_TIER_BACKWARD = _shared_graph(_tier_backward)
_SHRINKING_FORWARD = _shared_graph(_shrinking_forward)
_SHRINKING_BACKWARD = _shared_graph(_shrinking_backward)


def _call(function, sequences, others, shared, time_axes=None):
    """`function(*sequences, *others)`: the shared graph traced for any
    steps where `shared` (or eagerly), else its ops traced in place.

    In the shared trace each of `sequences` (the tensors of the rows and
    steps) has its steps unknown (axis `time_axes[i]`, none where None;
    by default axis 0 of a 3-d tensor, none else), and eagerly its rows
    too (`_rows_axis`): one trace serves batches of every size. The
    weights, tensors and Python values of `others` are part of it as they
    are."""
    if not (shared or tf.executing_eagerly()):
        return function.python_function(*sequences, *others)
    rows_known = not tf.executing_eagerly()
    if time_axes is None:
        time_axes = [0 if t.shape.rank == 3 else None for t in sequences]
    specs = []
    for t, time_axis in zip(sequences, time_axes):
        dims = t.shape.as_list()
        if time_axis is not None:
            dims[time_axis] = None
        rows_axis = _rows_axis(len(dims), time_axis)
        if not rows_known and rows_axis is not None:
            dims[rows_axis] = None
        specs.append(tf.TensorSpec(dims, t.dtype))
    function.get_concrete_function(*specs, *others)
    return function(*sequences, *others)


def _rows_axis(rank, time_axis):
    """The rows' axis of a sequence of `rank` axes for `_call`: the one of
    the first two that is not the steps' (3 axes), none for a table per
    block of steps (1 axis, steps on axis 0), else axis 0."""
    if rank == 3:
        return 1 - time_axis
    return None if rank == 1 and time_axis == 0 else 0


def _weights(cell, dtype):
    """`(kernel, b, u, bh)` of `cell` in `dtype`: `b` None without a bias,
    `bh` a GRU's recurrent bias (zeros where it has none), None for a
    SimpleRNN."""
    kernel = ops.cast(cell.kernel, dtype)
    u = ops.cast(cell.recurrent_kernel, dtype)
    if _kind(cell) == "rnn":
        b = ops.cast(cell.bias, dtype) if cell.use_bias else None
        return kernel, b, u, None
    width = 3 * cell.units
    if not cell.use_bias:
        return kernel, None, u, tf.zeros((width,), dtype)
    if cell.reset_after:
        b, bh = tf.unstack(ops.cast(cell.bias, dtype))
        return kernel, b, u, bh
    return kernel, ops.cast(cell.bias, dtype), u, tf.zeros((width,), dtype)


def _tier_segment(cell, dtype, shared):
    """The `segment` of `tiers.one_tier` running `cell` over one tier, its
    step loops the shared graphs where `shared`."""
    kernel, b, u, bh = _weights(cell, dtype)
    kind = _kind(cell)
    reset_after = kind == "gru" and cell.reset_after
    with_bh = bh is not None

    def segment(x_k, states, steps):
        xp = equations.flat_matmul(x_k, kernel, b)
        blocks = steps // _BLOCKS[kind]

        @tf.custom_gradient
        def recurrence(xp, h0, u, *bh):
            others = (u, bh[0] if with_bh else None, kind, reset_after, blocks)
            hs = _call(_TIER_FORWARD, (xp, h0), others, shared)

            def grad(dhs):
                sequences = (xp, h0, hs, dhs)
                return _call(_TIER_BACKWARD, sequences, others, shared)

            return hs, grad

        return [recurrence(xp, states[0], u, *([bh] if with_bh else []))]

    return segment


def _run_shrinking(cell, dtype, shared, x, h0, steps):
    """The outputs of `cell` over `x` `(batch, time, features)` from `h0`,
    rows sorted by length leaving the step loop as they end, its step loops
    the shared graphs where `shared`. One gradient for all of it, the
    rows' sort and its inverse included."""
    kernel, b, u, bh = _weights(cell, dtype)
    kind = _kind(cell)
    reset_after = kind == "gru" and cell.reset_after
    block = _BLOCKS[kind]
    if b is None:
        b = tf.zeros((kernel.shape[1],), dtype)
    lengths, order, inverse = tiers.sorted_lengths(steps, x.shape[0], sort=True)
    blocks_time = tiers.whole(size(x, 1), block)
    rows = steps.shared(
        ("tf-block-rows", block),
        lambda: tiers.block_rows(lengths, blocks_time, block),
    )
    known = None if tf.executing_eagerly() else tf.get_static_value(h0)
    zero_h0 = known is not None and not known.any()
    with_bh = bh is not None

    @tf.custom_gradient
    def run(x, h0, kernel, b, u, *bh):
        others = (kernel, b, u, bh[0] if with_bh else None, kind, reset_after)
        y, xs, h0s, hs = _call(
            _SHRINKING_FORWARD,
            (x, h0, rows, order, inverse),
            (*others, zero_h0),
            shared,
            (1, None, 0, None, None),
        )

        def grad(dy):
            return _call(
                _SHRINKING_BACKWARD,
                (xs, h0s, hs, dy, rows, order, inverse),
                others,
                shared,
                (0, None, 0, 1, 0, None, None),
            )

        return y, grad

    return run(x, h0, kernel, b, u, *([bh] if with_bh else []))


def run(inner, x, initial_state, steps, want_states):
    """Runs a GRU or SimpleRNN over valid-first `x` in length tiers.

    Args:
        inner: A built `keras.layers.GRU` or `SimpleRNN` that `decline_reason`
            accepts.
        x: Valid-first float tensor `(batch, time, features)`, zeros at
            padded steps, input dropout applied.
        initial_state: `[h0]`, `(batch, units)`.
        steps: The `maskedrnn.steps.Steps` of the batch.
        want_states: Whether the final state is wanted.

    Returns:
        `(outputs, states)`: `outputs` `(batch, time, units)`, exact at
        valid steps, zeros past the longest row's loop iteration (any
        value at a padded step before); `states` `[h]` after each
        row's last valid step (initial for a row with none), or None when
        not wanted.
    """
    cell = inner.cell
    # Keras' call would cast to it too; the wrapper's policy may differ.
    dtype = keras.backend.standardize_dtype(cell.compute_dtype)
    x = ops.cast(x, dtype)
    h0 = ops.cast(initial_state[0], dtype)
    batch = x.shape[0]
    shrinking = batch is not None and batch >= SHRINKING_ROWS
    # The step loops' calls in this layer call: shared graphs beyond one.
    shared = backends.directions_in_call() > 1
    if shrinking:
        y = _run_shrinking(cell, dtype, shared, x, h0, steps)
    else:
        y, _ = tiers.run_tiers(
            x,
            [h0],
            steps,
            tiers.one_tier(_tier_segment(cell, dtype, shared)),
            1,
            want_states=False,
            block=_BLOCKS[_kind(cell)],
        )
    if not want_states:
        return y, None
    h = tf.gather(y, steps.last, axis=1, batch_dims=1)
    return y, [tf.where(steps.has_steps, h, h0)]
