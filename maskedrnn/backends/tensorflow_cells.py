"""Keras' GRU and SimpleRNN in length tiers on TensorFlow: the `"tf-tiers"` kernel.

On a CPU, where Keras' layer steps every row to the end, rows run in the
LSTM's length tiers (`tensorflow_tiers`); each tier projects its inputs in
one matmul, then runs Keras' cell equations in a `tf.while_loop`, with a
gradient of its own (docs/design.md, "Kernels, one per backend").
`decline_reason` declines other equations, a GPU, XLA, `portable()` and Keras'
exporter.
"""

import keras
import tensorflow as tf
from keras import ops

from maskedrnn import backends
from maskedrnn.backends import Reason, preference
from maskedrnn.backends import tensorflow_tiers as tiers
from maskedrnn.backends.tensorflow_shapes import leading_shape, reshape_to, size

KERNEL = "tf-tiers"
DTYPES = ("float16", "float32", "float64")
# The fewest rows of a tier: each is one more step loop to trace and run.
TIER_ROWS = 32

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
        "unmasked: rows sorted by length leave in groups once a group has "
        "ended, each tier's inputs projected in one matmul and its "
        "recurrence in one TensorFlow while_loop with a gradient of its "
        "own; the final state read at each row's last valid step (exact); "
        "in functions XLA compiles (jit_compile=True) Keras' layer runs "
        "instead"
    )


def _flat_matmul(a, b):
    """`a @ b` over the last axis of a 3-d `a`."""
    out = tf.matmul(tf.reshape(a, [-1, a.shape[2]]), b)
    return tf.reshape(out, leading_shape(a, 2, [b.shape[1]]))


def _sum_dtype(dtype):
    """float32 for sums over half-precision steps, else `dtype`."""
    return "float32" if dtype in (tf.float16, tf.bfloat16) else dtype


def _sum_matmul(a, b):
    """Sum over steps and rows of `a^T b`, in `_sum_dtype`."""
    dtype = _sum_dtype(a.dtype)
    a = tf.cast(tf.reshape(a, [-1, a.shape[-1]]), dtype)
    b = tf.cast(tf.reshape(b, [-1, b.shape[-1]]), dtype)
    return tf.matmul(a, b, transpose_a=True)


# Steps per while_loop iteration (a block), sharing the loop's own ops:
# the tiers end on whole blocks (`tiers.run_tiers`' `block`), so the loops
# never pad. Each step is traced into the loop's body, so a longer block
# costs first calls what it saves in steady state: a GRU step is large
# enough for 2, a SimpleRNN step's small matmul gains from 4.
GRU_BLOCK = 2
RNN_BLOCK = 4


def _block(cell):
    """The steps per loop iteration of `cell`'s step loops."""
    return GRU_BLOCK if isinstance(cell, keras.layers.GRUCell) else RNN_BLOCK


def _scan(step, h0, seqs, widths, block, blocks, backward=False):
    """Runs `h, outs = step(h, inputs)` over time-major `seqs`, `block` at a time.

    Args:
        step: A function of `(h, list of (rows, width) tensors)` returning
            `(h, list of (rows, width_i) tensors)`, one per `widths`.
        h0: `(rows, units)`, the carried value before the first step.
        seqs: List of `(blocks * block, rows, width)` tensors.
        widths: Python ints, the widths of `step`'s outputs.
        block: Python int, the steps per loop iteration.
        blocks: Scalar int32 tensor, the loop's iterations.
        backward: Whether to run from the last step to the first.

    Returns:
        `(h, outs)`: the last carried value and one `(blocks * block,
        rows, width_i)` tensor per `widths`.
    """
    rows = size(h0, 0)
    dtype = seqs[0].dtype
    blocked = [
        tf.reshape(s, reshape_to([blocks, block, rows, s.shape[-1]])) for s in seqs
    ]
    known_rows = rows if isinstance(rows, int) else None
    # The steps, for a reshape: unknown, read as -1 where the rows are known.
    steps = -1 if known_rows is not None else blocks * block
    arrays = [
        tf.TensorArray(
            dtype, size=blocks, element_shape=tf.TensorShape([block, known_rows, w])
        )
        for w in widths
    ]
    order = range(block - 1, -1, -1) if backward else range(block)

    def body(i, h, *arrays):
        # Block i of each sequence: one slice (a view, no copy) sharing its
        # bounds, where `b[i]` is six ops each.
        begin = tf.reshape(i, [1])
        end, one = begin + 1, tf.constant([1])
        inputs = [
            tf.unstack(
                tf.strided_slice(b, begin, end, one, shrink_axis_mask=1), num=block
            )
            for b in blocked
        ]
        outs = [[None] * block for _ in widths]
        for j in order:
            h, out = step(h, [x[j] for x in inputs])
            for kept, value in zip(outs, out):
                kept[j] = value
        arrays = [a.write(i, tf.stack(o)) for a, o in zip(arrays, outs)]
        return (i - 1 if backward else i + 1, h, *arrays)

    out = tf.while_loop(
        (lambda i, *_: i >= 0) if backward else (lambda i, *_: i < blocks),
        body,
        (blocks - 1 if backward else 0, h0, *arrays),
    )
    results = []
    for a, w in zip(out[2:], widths):
        full = tiers.stack(a, [block, rows, w])
        results.append(tf.reshape(full, reshape_to([steps, rows, w])))
    return out[1], results


def _gru_forward(xp, h0, u, bh, reset_after, units, blocks):
    """The outputs `(steps, rows, units)` of the GRU recurrence from `h0`.

    `xp` holds the input projections with their bias, `bh` the recurrent
    bias; `units` is static, as shapes may be traced relaxed; `xp` holds
    `blocks` blocks of `GRU_BLOCK` steps.
    """
    if not reset_after:
        u_zr, u_h = tf.split(u, [2 * units, units], axis=1)

    def step(h, inputs):
        x_zr, x_h = inputs
        if reset_after:
            hp = tf.nn.bias_add(tf.matmul(h, u), bh)
            hp_zr, hp_h = tf.split(hp, [2 * units, units], axis=1)
            z, r = tf.split(tf.sigmoid(x_zr + hp_zr), 2, axis=1)
            hh = tf.tanh(x_h + r * hp_h)
        else:
            z, r = tf.split(tf.sigmoid(x_zr + tf.matmul(h, u_zr)), 2, axis=1)
            hh = tf.tanh(x_h + tf.matmul(r * h, u_h))
        # z * h + (1 - z) * hh, in one op fewer.
        h = hh + z * (h - hh)
        return h, [h]

    x_zr_h = tf.split(xp, [2 * units, units], axis=2)
    return _scan(step, h0, x_zr_h, [units], GRU_BLOCK, blocks)[1][0]


def _gru_backward(xp, h0, hs, dhs, u, bh, reset_after, units, blocks):
    """Gradients w.r.t. `(xp, h0, u, bh)`: gates recomputed, `dh` carried back."""
    dtype = xp.dtype
    u_zr, u_h = tf.split(u, [2 * units, units], axis=1)
    h_prev = tf.concat([h0[None], hs], axis=0)[:-1]
    x_zr, x_h = tf.split(xp, [2 * units, units], axis=2)
    if reset_after:
        hp_zr, hp_h = tf.split(_flat_matmul(h_prev, u) + bh, [2 * units, units], 2)
        z, r = tf.split(tf.sigmoid(x_zr + hp_zr), 2, axis=2)
        hh = tf.tanh(x_h + r * hp_h)
    else:
        z, r = tf.split(tf.sigmoid(x_zr + _flat_matmul(h_prev, u_zr)), 2, axis=2)
        rh = r * h_prev
        hh = tf.tanh(x_h + _flat_matmul(rh, u_h))
    # d(pre-activation) = g * coefficient, g the gradient of the step's h.
    c_z = (h_prev - hh) * z * (1 - z)
    c_h = (1 - z) * (1 - hh * hh)
    if reset_after:
        c_r = c_h * hp_h * r * (1 - r)
        # The gradient of h U + c (the recurrent pre-activations).
        c_rec = tf.concat([c_z, c_r, c_h * r], axis=2)
        u_t = tf.transpose(u)

        def step_after(dh, inputs):
            dh_t, z_t, c_t = inputs
            g = dh_t + dh
            d_rec = tf.concat([g, g, g], axis=1) * c_t
            return g * z_t + tf.matmul(d_rec, u_t), [g]

        dh0, (g,) = _scan(
            step_after,
            tf.zeros_like(h0),
            [dhs, z, c_rec],
            [units],
            GRU_BLOCK,
            blocks,
            backward=True,
        )
        g3 = tf.concat([g, g, g], axis=2)
        d_rec = g3 * c_rec
        d_xp = g3 * tf.concat([c_z, c_r, c_h], axis=2)
        d_u = _sum_matmul(h_prev, d_rec)
        d_bh = tf.reduce_sum(tf.cast(d_rec, _sum_dtype(dtype)), axis=(0, 1))
        return d_xp, dh0, tf.cast(d_u, dtype), tf.cast(d_bh, dtype)
    c_r = h_prev * r * (1 - r)
    u_zr_t, u_h_t = tf.transpose(u_zr), tf.transpose(u_h)

    def step(dh, inputs):
        dh_t, z_t, r_t, c_z_t, c_h_t, c_r_t = inputs
        g = dh_t + dh
        d_rh = tf.matmul(g * c_h_t, u_h_t)
        d_r = d_rh * c_r_t
        d_zr = tf.concat([g * c_z_t, d_r], axis=1)
        return g * z_t + d_rh * r_t + tf.matmul(d_zr, u_zr_t), [g, d_r]

    dh0, (g, d_r) = _scan(
        step,
        tf.zeros_like(h0),
        [dhs, z, r, c_z, c_h, c_r],
        [units, units],
        GRU_BLOCK,
        blocks,
        backward=True,
    )
    d_zr = tf.concat([g * c_z, d_r], axis=2)
    d_h = g * c_h
    d_u = tf.concat([_sum_matmul(h_prev, d_zr), _sum_matmul(rh, d_h)], axis=1)
    d_xp = tf.concat([d_zr, d_h], axis=2)
    return d_xp, dh0, tf.cast(d_u, dtype), tf.zeros_like(bh)


def _rnn_forward(xp, h0, u, units, blocks):
    """The outputs of the SimpleRNN recurrence `h' = tanh(xp_t + h U)`."""

    def step(h, inputs):
        h = tf.tanh(inputs[0] + tf.matmul(h, u))
        return h, [h]

    return _scan(step, h0, [xp], [units], RNN_BLOCK, blocks)[1][0]


def _rnn_backward(xp, h0, hs, dhs, u, units, blocks):
    """The gradients of `_rnn_forward`'s outputs w.r.t. `(xp, h0, u)`."""
    dtype = xp.dtype
    u_t = tf.transpose(u)

    def step(dh, inputs):
        d = (inputs[0] + dh) * inputs[1]
        return tf.matmul(d, u_t), [d]

    dh0, (d,) = _scan(
        step,
        tf.zeros_like(h0),
        [dhs, 1 - hs * hs],
        [units],
        RNN_BLOCK,
        blocks,
        backward=True,
    )
    h_prev = tf.concat([h0[None], hs], axis=0)[:-1]
    return d, dh0, tf.cast(_sum_matmul(h_prev, d), dtype)


def _shared_graph(function):
    """`function` as one graph that every call of the same widths, dtypes
    and Python arguments runs (see `_call`)."""
    return tf.function(function, autograph=False)


# The step loops. Where a layer call runs one more than once (tiers,
# directions), each is traced once per process for every tier, direction
# and tf.function, and each call inlines a copy of that trace, optimised
# with the graph around it; run once, its ops are traced in place. Eagerly
# they run as graphs, not as a Python loop of ops. They are written with
# tf.while_loop, so autograph is off.
_GRU_FORWARD = _shared_graph(_gru_forward)
_GRU_BACKWARD = _shared_graph(_gru_backward)
_RNN_FORWARD = _shared_graph(_rnn_forward)
_RNN_BACKWARD = _shared_graph(_rnn_backward)


def _call(function, sequences, others, shared, rows_known):
    """`function(*sequences, *others)`: the shared graph traced for any
    steps where `shared` (or eagerly), else its ops traced in place.
    In the shared trace each of `sequences` (the tensors of a tier's rows
    and steps: `(steps, rows, width)` or `(rows, width)`) has its steps
    unknown, and its rows too unless `rows_known` (one tier, so one trace
    of known sizes serves every call); the weights, tensors and Python
    values of `others` are part of it as they are."""
    if not (shared or tf.executing_eagerly()):
        return function.python_function(*sequences, *others)
    # Eagerly, one trace serves batches of every size.
    rows_known = rows_known and not tf.executing_eagerly()
    specs = []
    for t in sequences:
        dims = t.shape.as_list()
        if len(dims) == 3:
            dims[0] = None
        if not rows_known:
            dims[-2] = None
        specs.append(tf.TensorSpec(dims, t.dtype))
    function.get_concrete_function(*specs, *others)
    return function(*sequences, *others)


def _gru_recurrence(xp, h0, u, bh, reset_after, shared, rows_known, blocks):
    @tf.custom_gradient
    def recurrence(xp, h0, u, bh):
        units = u.shape[0]
        others = (u, bh, reset_after, units, blocks)
        hs = _call(_GRU_FORWARD, (xp, h0), others, shared, rows_known)

        def grad(dhs):
            sequences = (xp, h0, hs, dhs)
            return _call(_GRU_BACKWARD, sequences, others, shared, rows_known)

        return hs, grad

    return recurrence(xp, h0, u, bh)


def _rnn_recurrence(xp, h0, u, shared, rows_known, blocks):
    @tf.custom_gradient
    def recurrence(xp, h0, u):
        others = (u, u.shape[0], blocks)
        hs = _call(_RNN_FORWARD, (xp, h0), others, shared, rows_known)

        def grad(dhs):
            sequences = (xp, h0, hs, dhs)
            return _call(_RNN_BACKWARD, sequences, others, shared, rows_known)

        return hs, grad

    return recurrence(xp, h0, u)


def _segment(cell, dtype, shared, rows_known):
    """The `segment` of `tiers.chained` running `cell`, weights cast once,
    its step loops the shared graphs where `shared` (traced for the rows
    of the one tier where `rows_known`)."""
    kernel = ops.cast(cell.kernel, dtype)
    u = ops.cast(cell.recurrent_kernel, dtype)
    units = cell.units
    if isinstance(cell, keras.layers.GRUCell):
        width = 3 * units
        reset_after = cell.reset_after
        if not cell.use_bias:
            b, bh = None, tf.zeros((width,), dtype)
        elif reset_after:
            b, bh = tf.unstack(ops.cast(cell.bias, dtype))
        else:
            b, bh = ops.cast(cell.bias, dtype), tf.zeros((width,), dtype)
    else:
        b = ops.cast(cell.bias, dtype) if cell.use_bias else None

    def segment(x_k, states, steps):
        xp = _flat_matmul(x_k, kernel)
        if b is not None:
            xp = xp + b
        h0 = states[0]
        blocks = steps // _block(cell)
        if isinstance(cell, keras.layers.GRUCell):
            hs = _gru_recurrence(xp, h0, u, bh, reset_after, shared, rows_known, blocks)
        else:
            hs = _rnn_recurrence(xp, h0, u, shared, rows_known, blocks)
        return [hs]

    return segment


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
    count = tiers.tier_count(x.shape[0], TIER_ROWS)
    # The step loops' calls in this layer call: shared graphs beyond one.
    calls = count * backends.directions_in_call()
    y, _ = tiers.run_tiers(
        x,
        [h0],
        steps,
        tiers.chained(_segment(cell, dtype, calls > 1, count == 1)),
        count,
        want_states=False,
        block=_block(cell),
    )
    if not want_states:
        return y, None
    h = tf.gather(y, steps.last, axis=1, batch_dims=1)
    return y, [tf.where(steps.has_steps, h, h0)]
