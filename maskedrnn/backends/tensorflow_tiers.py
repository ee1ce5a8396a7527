"""Length tiers: the scheduler shared by TensorFlow's tiered RNN kernels.

Rows of valid-first data, sorted by length, run in tiers (`run_tiers`): a
group of rows leaves once its longest row has ended. The kernels differ in
the `recurrence` that runs the tiers: the LSTM runs every tier of a
direction under one gradient; the GRU and SimpleRNN run one tier
(`one_tier`) where their rows do not leave their step loop one block of
steps at a time (`block_rows`).

The LSTM's tier count comes from what is known at trace time
(`tier_count`): tiers of at least `rows_per_tier` rows, a batch of unknown
size taken as `ASSUMED_BATCH` rows. Both kernels decline the same cases
(`decline_reason`).
"""

import collections
import sys

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from maskedrnn import backends
from maskedrnn.backends import Reason
from maskedrnn.backends.tensorflow_shapes import size

# Each tier is one more recurrence to trace and optimise, paid again on
# every first call: at most 4 tiers. An unknown batch counts as 32 rows
# (2 LSTM tiers).
MAX_TIERS = 4
ASSUMED_BATCH = 32


def tier_count(batch, rows_per_tier):
    """Tiers of at least `rows_per_tier` rows, at most `MAX_TIERS`."""
    if batch is None:
        batch = ASSUMED_BATCH
    return max(1, min(MAX_TIERS, batch // rows_per_tier))


DeclineReasons = collections.namedtuple(
    "DeclineReasons",
    [
        "recurrent_dropout",
        "dtype",
        "portable",
        "keras_export",
        "xla",
        "unroll",
        "use_cudnn_false",
        "fused_kernel",
    ],
)
DeclineReasons.__doc__ = """A tiered kernel's reasons to decline, for
`decline_reason`: `Reason`s, but `dtype`, a sentence with a `{}` for the
dtype."""


def decline_reason(inner, has_fused_rnn_kernel, dtypes, reasons):
    """The checks of every tiered kernel once the layer's cell and activations
    are its own: None when the kernel runs `inner` here and is preferred, else
    the `Reason` in `reasons` of the first check that fails.

    Args:
        inner: The inner RNN.
        has_fused_rnn_kernel: The backend's function of that name (a GPU
            kernel, which Keras' layer runs instead).
        dtypes: The compute dtypes the kernel computes.
        reasons: The kernel's `DeclineReasons`.
    """
    if inner.cell.recurrent_dropout:
        return reasons.recurrent_dropout
    dtype = keras.backend.standardize_dtype(inner.cell.compute_dtype)
    if dtype not in dtypes:
        return Reason(lambda: reasons.dtype.format(dtype))
    if backends.portable_only():
        return reasons.portable
    if traced_for_keras_export():
        return reasons.keras_export
    if in_xla_context():
        return reasons.xla
    if inner.unroll:
        return reasons.unroll
    if getattr(inner, "use_cudnn", "auto") is False:
        return reasons.use_cudnn_false
    if has_fused_rnn_kernel():
        return reasons.fused_kernel
    return None


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


def run_tiers(x, states, steps, recurrence, tiers, want_states, block=1):
    """`recurrence` over batch-major valid-first `x` in `tiers` tiers.

    Tier k runs the sorted rows `[0, m_k)` from where tier k - 1 stopped
    until the longest row outside it ends, in whole blocks of `block`
    steps. Steps past a row's length give values the caller ignores, and
    so do those of the last block past the longest row's end; steps after
    it give zeros.

    Args:
        x: `(batch, time, features)`, valid-first, zeros at padded steps.
        states: List of `(batch, units_i)` initial states; `states[0]` is
            the output (`h`).
        steps: The batch's `maskedrnn.steps.Steps`.
        recurrence: `recurrence(x, steps, states, rows) -> sequences`: runs
            every tier over the time-major, sorted `x` `(time, batch,
            features)`, tier k over the next `steps[k]` steps and the rows
            `[0, rows[k])`, from the states after the tier before
            (`states` before tier 0); `steps` (int32, a list of scalars
            for one tier, else a tensor; multiples of `block`) ends with
            the steps past every tier, `rows` (Python ints or scalars) has
            one entry per tier. `x`'s time axis is a multiple of `block`.
            Returns one `(time, batch, units_i)` sequence per state, tier
            after tier, zeros past every tier (`full`).
        tiers: Python int, the number of tiers (`tier_count`).
        want_states: Whether the final states other than `h` are wanted.
        block: Python int, the steps a recurrence runs at a time: each
            tier runs a multiple of it, `x` padded with zero steps to one.

    Returns:
        `(h, others)` in `x`'s row order: outputs `(batch, time, units)`,
        and the final `states[1:]` (any value for an empty row), or None
        without `want_states`.
    """
    batch, time = size(x, 0), size(x, 1)
    batch_and_time = x.shape[:2]
    # Tier k ends where the longest row of those after it ends: a trailing
    # 0 for the last tier, which holds every row.
    rows = [batch * (tiers - k) // tiers for k in range(tiers + 1)]
    lengths, order, inverse = sorted_lengths(steps, batch, sort=tiers > 1)
    if order is not None:
        x = _permute_rows(x, order, inverse)
        states = [_permute_rows(s, order, inverse) for s in states]
    blocks_time = whole(time, block)
    pad = blocks_time - time
    padded = block > 1 and (not isinstance(pad, int) or pad > 0)
    if padded:
        x = tf.pad(x, [[0, 0], [0, pad], [0, 0]])
    tier_steps = steps.shared(
        ("tf-tier-steps", tiers, block),
        lambda: _tier_steps(lengths, rows, blocks_time, block),
    )
    sequences = recurrence(tf.transpose(x, (1, 0, 2)), tier_steps, states, rows[:tiers])
    h = tf.transpose(sequences[0], (1, 0, 2))
    if padded:
        # A split, whose gradient is a concat (a slice's is slower).
        h = tf.split(h, tf.stack([time, pad]), num=2, axis=1)[0]
    # The padded tiers' time axis is traced unknown; it is `x`'s.
    h.set_shape(batch_and_time.concatenate(h.shape[2:]))
    if want_states:
        others = [_last_states(seq, lengths, batch) for seq in sequences[1:]]
    else:
        others = None
    if order is not None:
        h = _permute_rows(h, inverse, order)
        if others is not None:
            others = [tf.gather(s, inverse) for s in others]
    return h, others


def one_tier(segment):
    """The `recurrence` of `run_tiers` for one tier: `segment(x, states,
    steps) -> sequences` over the steps to the longest row's end (`steps`,
    a scalar), zeros after."""

    def recurrence(x, steps, states, rows):
        ran, past = steps
        sequences = segment(tf.split(x, [ran, past], num=2)[0], states, ran)
        return [full([s], [], past) for s in sequences]

    return recurrence


def block_rows(lengths, blocks_time, block):
    """The rows with a step in each block of `block` steps, for `lengths`
    sorted longest first, then a 0 (a block past the time axis):
    `(blocks_time // block + 1,)` int32, non-increasing."""
    if isinstance(blocks_time, int):
        starts = np.arange(0, blocks_time + 1, block, dtype="int32")[:, None]
    else:
        starts = tf.range(0, blocks_time + 1, block)[:, None]
    return tf.reduce_sum(tf.cast(lengths > starts, "int32"), 1)


def first_rows(x, rows):
    """Rows `[0, rows)` of time-major `x`: one op, where `x[:, :rows]` is
    three more and its gradient more again."""
    return tf.strided_slice(
        x, [0, 0], tf.stack([0, rows]), [1, 1], begin_mask=1, end_mask=1
    )


def states_after(states, sequences, rows):
    """Rows `[0, rows)` of the states after the last step of a tier's
    `sequences` (`states` where the tier has no steps)."""
    last, end, step = tf.constant([-1, 0]), tf.stack([0, rows]), tf.constant([1, 1])
    last_1, first_1, step_1 = tf.constant([-1]), tf.constant([0]), tf.constant([1])
    after = []
    for state, seq in zip(states, sequences):
        # seq[-1:]: its last step, or none.
        final = tf.strided_slice(seq, last_1, first_1, step_1, end_mask=1)
        both = tf.concat([tf.expand_dims(state, 0), final], axis=0)
        after.append(tf.strided_slice(both, last, end, step, shrink_axis_mask=1))
    return after


def paddings(batch, rows):
    """The `tf.pad` paddings taking each tier's `rows` to `batch` rows (on
    the second axis of a 3-d tensor), for `full`."""
    return [
        tf.reshape(tf.stack([0, 0, 0, batch - r, 0, 0]), (3, 2)) for r in rows[1:]
    ]


def full(per_tier, pads, past):
    """Tier k's `(steps_k, rows[k], width)` tensors as one `(steps, batch,
    width)` tensor, tier after tier on the time axis, zeros at the rows of
    no tier, then `past` steps of zeros; `pads` from `paddings`."""
    padded = [per_tier[0]] + [tf.pad(t, p) for t, p in zip(per_tier[1:], pads)]
    joined = padded[0] if len(padded) == 1 else tf.concat(padded, axis=0)
    # A pad, whose gradient is one slice (a concat's is several ops).
    return tf.pad(joined, [[0, past], [0, 0], [0, 0]])


def _tier_steps(lengths, rows, time, block):
    """The steps of each tier of sorted `lengths`, each tier's end rounded
    up to a multiple of `block` (and `time` one), then those past every
    tier: `(tiers + 1,)` int32, a list of two scalars for one tier."""
    if len(rows) == 2:
        # One tier, unsorted, to the longest row.
        end = whole(tf.reduce_max(tf.concat([lengths, [0]], axis=0)), block)
        return [end, time - end]
    # Sorted, the longest row of rows [m, batch) is row m.
    ends = whole(tf.gather(tf.concat([lengths, [0]], axis=0), rows[1:]), block)
    bounds = tf.concat([[0], ends, [time]], axis=0)
    return bounds[1:] - bounds[:-1]


def whole(steps, block):
    """`steps` rounded up to a multiple of `block`."""
    return steps if block == 1 else (steps + (block - 1)) // block * block


def sorted_lengths(steps, batch, sort):
    """`(lengths, order, inverse)`: int32 `lengths` sorted longest first,
    the sort's permutation and its inverse; without `sort` the lengths as
    they are and None twice. Sorted once per call, for every direction."""
    lengths = steps.shared("tf-lengths", lambda: tf.cast(steps.lengths, "int32"))
    if not sort:
        return lengths, None, None

    def sort():
        # top_k sorts stably (equal lengths keep their order), in fewer ops
        # than tf.argsort.
        ordered, order = tf.math.top_k(lengths, k=batch)
        return ordered, order, tf.math.invert_permutation(order)

    return steps.shared("tf-sorted-lengths", sort)


def _last_states(seq, lengths, batch):
    """Each sorted row's state after its last step: one gather from `seq`
    `(steps, batch, units)` (any value for a row of length 0)."""
    units = seq.shape[-1]
    flat = tf.concat([tf.reshape(seq, (-1, units)), tf.zeros((1, units), seq.dtype)], 0)
    index = (lengths - 1) * batch + tf.range(batch)
    return tf.gather(flat, tf.where(lengths > 0, index, tf.shape(flat)[0] - 1))


def _permute_rows(x, order, inverse):
    """`x[order]`, whose gradient is one gather `grad[inverse]`, not a sum.
    Rows the trace knows are all zeros (initial states made by `tf.zeros`
    of a known shape) are the same in any order: no gather runs."""
    known = None if tf.executing_eagerly() else tf.get_static_value(x)
    unmoved = known is not None and not known.any()

    @tf.custom_gradient
    def permute(x):
        y = tf.identity(x) if unmoved else tf.gather(x, order)
        return y, lambda grad: tf.gather(grad, inverse)

    return permute(x)


def stack(array, element_shape):
    """`array.stack()` of a graph's `tf.TensorArray` whose elements have
    `element_shape` (Python ints and scalar tensors): one op, where an
    empty array of elements not fully known to the trace would not stack
    (and a `tf.cond` around it is more ops to trace and optimise)."""
    return tf.raw_ops.TensorListStack(
        input_handle=array.flow,
        element_shape=tf.stack(element_shape),
        element_dtype=array.dtype,
    )
