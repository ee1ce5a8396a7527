"""Length tiers: the scheduler shared by TensorFlow's tiered RNN kernels.

Rows of valid-first data, sorted by length, run in tiers (`run_tiers`): a
group of rows leaves once its longest row has ended. The LSTM and the GRU
and SimpleRNN cells differ only in the `segment` that runs one tier.

The tier count comes from what is known at trace time (`tier_count`): tiers
of at least a cell's `rows_per_tier` rows, a batch of unknown size taken as
`ASSUMED_BATCH` rows. Both kernels decline the same cases (`decline_reason`).
"""

import collections
import sys

import keras
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from maskedrnn import backends
from maskedrnn.backends import Reason

# Each tier is one more recurrence to trace and optimise, paid again on
# every first call: at most 4 tiers. An unknown batch counts as 32 rows
# (2 LSTM tiers, 1 GRU or SimpleRNN tier).
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


def run_tiers(x, states, lengths, segment, tiers, want_states):
    """`segment` over batch-major valid-first `x` in `tiers` tiers.

    Tier k runs the sorted rows `[0, m_k)` from where tier k - 1 stopped
    until the longest row outside it ends. Steps past a row's length give
    values the caller ignores; steps past the longest row give zeros.

    Args:
        x: `(batch, time, features)`, valid-first, zeros at padded steps.
        states: List of `(batch, units_i)` initial states; `states[0]` is
            the output (`h`).
        lengths: int32 `(batch,)`.
        segment: `segment(x_k, states_k) -> sequences`: the recurrence
            over time-major `x_k` `(steps, rows, features)`, one
            `(steps, rows, units_i)` sequence per state.
        tiers: Python int, the number of tiers (`tier_count`).
        want_states: Whether the final states other than `h` are wanted.

    Returns:
        `(h, others)` in `x`'s row order: outputs `(batch, time, units)`,
        and the final `states[1:]` (any value for an empty row), or None
        without `want_states`.
    """
    batch = x.shape[0] if x.shape[0] is not None else tf.shape(x)[0]
    time = tf.shape(x)[1]
    # Tier k ends where the longest row of those after it ends: a trailing
    # 0 for the last tier, which holds every row.
    rows = [batch * (tiers - k) // tiers for k in range(tiers + 1)]
    if tiers == 1:
        order = None
        ends = tf.reduce_max(tf.concat([lengths, [0]], axis=0))[None]
    else:
        # top_k sorts stably (equal lengths keep their order), in fewer ops
        # than tf.argsort.
        lengths, order = tf.math.top_k(lengths, k=tf.shape(lengths)[0])
        inverse = tf.math.invert_permutation(order)
        x = _permute_rows(x, order, inverse)
        states = [_permute_rows(s, order, inverse) for s in states]
        # Sorted, the longest row of rows [m, batch) is row m.
        ends = tf.gather(tf.concat([lengths, [0]], axis=0), rows[1:])
    starts = tf.concat([[0], ends[:-1]], axis=0)
    sizes = tf.concat([ends - starts, [time - ends[-1]]], axis=0)
    segments = tf.split(tf.transpose(x, (1, 0, 2)), sizes, num=tiers + 1)
    hs, others = [], [[] for _ in states[1:]]
    # The slices below share these tensors: a Python slice of a tensor adds
    # three constants to the graph each time, and its gradient more ops.
    slices = [tf.constant(v) for v in ([0, 0], [1, 1], [-1, 0], [-1], [0], [1])]
    sequences = []
    for k in range(tiers):
        x_k = segments[k]
        if k:
            # Rows [0, rows[k]) of the tier's steps, and of the states after
            # the tier before.
            end = tf.stack([0, rows[k]])
            x_k = tf.strided_slice(
                x_k, slices[0], end, slices[1], begin_mask=1, end_mask=1
            )
            states = [
                _state_after(s, seq, end, slices)
                for s, seq in zip(states, sequences)
            ]
        sequences = segment(x_k, states)
        for kept, seq in zip(others, sequences[1:]):
            kept.append(seq)
        h_k = sequences[0]
        if k:
            h_k = tf.pad(h_k, [[0, 0], [0, batch - rows[k]], [0, 0]])
        hs.append(h_k)
    past = tf.zeros((sizes[tiers], batch, hs[0].shape[-1]), hs[0].dtype)
    h = tf.transpose(tf.concat(hs + [past], axis=0), (1, 0, 2))
    if want_states:
        others = [_last_states(seqs, lengths, starts, ends, rows) for seqs in others]
    else:
        others = None
    if order is not None:
        h = _permute_rows(h, inverse, order)
        if others is not None:
            others = [tf.gather(s, inverse) for s in others]
    return h, others


def _state_after(state, seq, end, slices):
    """Rows `[0, end[1])` of the state after the last step of `seq`
    (`state` where `seq` has no steps); `slices` the constant tensors of
    `run_tiers`."""
    _, step, last, last_1, first_1, step_1 = slices
    # seq[-1:]: its last step, or none.
    final = tf.strided_slice(seq, last_1, first_1, step_1, end_mask=1)
    both = tf.concat([tf.expand_dims(state, 0), final], axis=0)
    return tf.strided_slice(both, last, end, step, shrink_axis_mask=1)


def _last_states(seqs, lengths, starts, ends, rows):
    """Each sorted row's final state: one gather over the tiers' sequences."""
    units = seqs[0].shape[-1]
    flat = [tf.reshape(seq, (-1, units)) for seq in seqs]
    counts = tf.stack([tf.cast(r, "int32") for r in rows[:-1]])
    offsets = tf.cumsum((ends - starts) * counts, exclusive=True)
    total = tf.reduce_sum((ends - starts) * counts)
    flat = tf.concat(flat + [tf.zeros((1, units), seqs[0].dtype)], axis=0)
    last = lengths - 1
    # The tier holding step `last`: the tiers that end at or before it.
    tier = tf.searchsorted(ends, tf.maximum(last, 0), side="right")
    tier = tf.minimum(tier, len(seqs) - 1)
    row = tf.range(tf.shape(lengths)[0], dtype="int32")
    index = (
        tf.gather(offsets, tier)
        + (last - tf.gather(starts, tier)) * tf.gather(counts, tier)
        + row
    )
    return tf.gather(flat, tf.where(last >= 0, index, total))


def _permute_rows(x, order, inverse):
    """`x[order]`, whose gradient is one gather `grad[inverse]`, not a sum."""

    @tf.custom_gradient
    def permute(x):
        return tf.gather(x, order), lambda grad: tf.gather(grad, inverse)

    return permute(x)


def stacked(array, steps, rows, units, dtype):
    """`array.stack()`, or `(0, rows, units)` zeros for an empty array."""
    return tf.cond(steps > 0, array.stack, lambda: tf.zeros((0, rows, units), dtype))
