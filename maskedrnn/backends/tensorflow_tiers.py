"""Length tiers: the scheduler shared by TensorFlow's tiered RNN ways.

Rows of valid-first data, sorted by length, run in tiers (`run_tiers`): a
group of rows leaves once its longest row has ended. The LSTM and the GRU
and SimpleRNN cells differ only in the `segment` that runs one tier.
"""

import tensorflow as tf

# Each tier is one more recurrence to trace; an unknown batch counts as
# Keras' default batch size.
MAX_TIERS = 8
ASSUMED_BATCH = 32


def tier_count(batch, rows_per_tier):
    """Tiers of at least `rows_per_tier` rows, at most `MAX_TIERS`."""
    if batch is None:
        batch = ASSUMED_BATCH
    return max(1, min(MAX_TIERS, batch // rows_per_tier))


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
    if tiers == 1:
        order = None
    else:
        order = tf.argsort(lengths, direction="DESCENDING", stable=True)
        inverse = tf.math.invert_permutation(order)
        x = _permute_rows(x, order, inverse)
        states = [_permute_rows(s, order, inverse) for s in states]
        lengths = tf.gather(lengths, order)
    # A trailing 0 for the last tier, which holds every row.
    rows = [batch * (tiers - k) // tiers for k in range(tiers + 1)]
    with_zero = tf.concat([lengths, [0]], axis=0)
    ends = tf.stack([tf.reduce_max(with_zero[rows[k + 1] :]) for k in range(tiers)])
    starts = tf.concat([[0], ends[:-1]], axis=0)
    sizes = tf.concat([ends - starts, [time - ends[-1]]], axis=0)
    segments = tf.split(tf.transpose(x, (1, 0, 2)), sizes, num=tiers + 1)
    hs, others = [], [[] for _ in states[1:]]
    for k in range(tiers):
        x_k = segments[k]
        if k:
            split = [rows[k], rows[k - 1] - rows[k]]
            states = [tf.split(s, split)[0] for s in states]
            x_k = tf.split(x_k, [rows[k], batch - rows[k]], axis=1)[0]
        sequences = segment(x_k, states)
        if k + 1 < tiers:
            # The state after the tier's last step (its input if no steps).
            states = [
                tf.concat([s[None], seq[-1:]], axis=0)[-1]
                for s, seq in zip(states, sequences)
            ]
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
