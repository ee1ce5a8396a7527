"""Length-aware sequence operations written with `keras.ops` only.

They run on every backend, are differentiable in their float inputs and have
static output shapes (except `sequence_mask` with `maxlen=None`). The batch
axis is 0 and the time axis 1; `lengths` has shape `(batch,)`.
"""

from keras import ops

from maskedrnn import backends
from maskedrnn.backends.gather import gather_time
from maskedrnn.masking import as_bool

__all__ = [
    "reverse_sequence",
    "reverse_index",
    "sequence_mask",
    "lengths_from_mask",
    "lengths_from_padding",
    "valid_first_order",
    "valid_ranks",
    "gather_time",
    "linear_recurrence_last",
]


def reverse_sequence(x, lengths, axis=1):
    """Reverses the first `lengths[i]` steps of each row.

    As `tf.reverse_sequence(x, lengths, seq_axis=axis, batch_axis=0)`, on
    every backend; its own inverse. Padded steps (past `lengths[i]`) stay
    where they are. Lengths are clipped to `[0, time]`, unchecked, so that it
    runs inside compiled graphs.

    Args:
        x: Tensor of shape `(batch, ..., time, ...)`, rank >= 2.
        lengths: Integer tensor of shape `(batch,)`.
        axis: Int, the time axis (not 0). Defaults to `1`.

    Returns:
        A tensor of the shape and dtype of `x`.

    Example:

    >>> x = [[1, 2, 3, 0, 0],
    ...      [1, 2, 0, 0, 0]]
    >>> reverse_sequence(x, lengths=[3, 2])
    [[3, 2, 1, 0, 0],
     [2, 1, 0, 0, 0]]
    """
    x = ops.convert_to_tensor(x)
    rank = len(x.shape)
    if rank < 2:
        raise ValueError(
            f"reverse_sequence needs x of rank >= 2 (batch, time, ...); "
            f"got rank {rank}."
        )
    if axis < 0:
        axis += rank
    if axis == 0 or not 0 < axis < rank:
        raise ValueError(
            f"axis={axis} is not a time axis of x (rank {rank}); the batch "
            "axis is 0, so pass axis between 1 and rank - 1."
        )
    if axis != 1:
        x = ops.moveaxis(x, axis, 1)
    index = reverse_index(lengths, ops.shape(x)[1])
    y = gather_time(x, index)
    if axis != 1:
        y = ops.moveaxis(y, 1, axis)
    return y


def reverse_index(lengths, time):
    """The gather index of `reverse_sequence`, to compute once and reuse.

    `reverse_sequence(x, lengths)` is `gather_time(x, reverse_index(lengths,
    time))`. Lengths are clipped to `[0, time]`.

    Args:
        lengths: Integer tensor of shape `(batch,)`.
        time: Int or scalar integer tensor, the size of the time axis.

    Returns:
        An int32 tensor of shape `(batch, time)`.

    Example:

    >>> reverse_index([3, 7, -1], time=4)
    [[2, 1, 0, 3],
     [3, 2, 1, 0],
     [0, 1, 2, 3]]
    """
    # Not cast: a symbolic jax.export dimension cast to a tensor cannot size
    # an `arange`.
    t = ops.expand_dims(ops.arange(time, dtype="int32"), 0)
    # Device scalars: a Python int copied to CUDA waits for queued kernels.
    backend = backends.current()
    zero, bound = backend.scalar(0, "int32"), backend.scalar(time, "int32")
    lengths = ops.cast(ops.convert_to_tensor(lengths), "int32")
    n = ops.expand_dims(ops.minimum(ops.maximum(lengths, zero), bound), 1)
    return ops.where(t < n, n - 1 - t, t)


def sequence_mask(lengths, maxlen=None, dtype="bool"):
    """Mask of the first `lengths[i]` steps of each row, as `tf.sequence_mask`.

    Args:
        lengths: Integer tensor of shape `(batch,)`.
        maxlen: Int or scalar tensor, the size of the time axis. Defaults to
            `None`, meaning `max(lengths)`: a data-dependent shape, so pass it
            inside `jax.jit` or XLA.
        dtype: Output dtype. Defaults to `"bool"`.

    Returns:
        A `(batch, maxlen)` tensor of `dtype`.

    Example:

    >>> sequence_mask([3, 1], maxlen=4)
    [[True, True, True, False],
     [True, False, False, False]]
    """
    lengths = ops.cast(ops.convert_to_tensor(lengths), "int32")
    if maxlen is None:
        # As tf.sequence_mask: all lengths <= 0 give a (batch, 0) mask.
        maxlen = ops.maximum(ops.max(lengths), 0)
    t = ops.expand_dims(ops.arange(maxlen, dtype="int32"), 0)
    mask = t < ops.expand_dims(lengths, 1)
    return mask if dtype == "bool" else ops.cast(mask, dtype)


def lengths_from_mask(mask):
    """Number of valid (True / non-zero) steps in each row of a mask.

    With left padding or holes, this is the row's length once its valid
    steps are moved to the front (`valid_first_order`).

    Args:
        mask: Boolean or numeric tensor of shape `(batch, time)`.

    Returns:
        An int32 tensor of shape `(batch,)`.

    Example:

    >>> lengths_from_mask([[1, 1, 1, 0], [0, 0, 1, 1]])
    [3, 2]
    """
    mask = as_bool(mask)
    return ops.sum(ops.cast(mask, "int32"), axis=1)


def lengths_from_padding(ids, pad_value=0):
    """Length of each right-padded row: the index of its first pad step.

    A step is padding when it equals `pad_value` (rank 3: in all features);
    the first pad ends the row, even inside a sequence.

    Args:
        ids: Tensor of shape `(batch, time)` (token ids) or
            `(batch, time, features)`.
        pad_value: Scalar, the padding value. Defaults to `0`.

    Returns:
        An int32 tensor of shape `(batch,)`; `time` for a row with no pad.

    Example:

    >>> lengths_from_padding([[5, 7, 2, 0, 0], [4, 0, 0, 0, 0]])
    [3, 1]
    """
    ids = ops.convert_to_tensor(ids)
    is_pad = ops.equal(ids, ops.cast(pad_value, ids.dtype))
    if len(ids.shape) == 3:
        is_pad = ops.all(is_pad, axis=-1)
    elif len(ids.shape) != 2:
        raise ValueError(
            "lengths_from_padding needs ids of shape (batch, time) or "
            f"(batch, time, features); got rank {len(ids.shape)}."
        )
    time = ops.shape(ids)[1]
    first = ops.cast(ops.argmax(ops.cast(is_pad, "int32"), axis=1), "int32")
    return ops.where(ops.any(is_pad, axis=1), first, ops.cast(time, "int32"))


def valid_first_order(mask):
    """Per-row time permutation that moves valid steps to the front, in order.

    `gather_time(x, order)` turns left padding or holes into right padding;
    `gather_time(y, inverse)` puts per-step results back.

    Args:
        mask: Boolean or numeric tensor of shape `(batch, time)`.

    Returns:
        A tuple `(order, inverse, lengths)`: two int32 `(batch, time)`
        permutations, inverse of each other, and the int32 `(batch,)` count of
        valid steps per row.

    Example:

    >>> order, inverse, lengths = valid_first_order([[0, 0, 1, 1, 1]])
    >>> order
    [[2, 3, 4, 0, 1]]
    """
    rank, inverse, lengths = valid_ranks(mask)
    order = backends.current().invert_permutation(inverse)
    return order, inverse, lengths


def valid_ranks(mask):
    """Running count of valid steps, and `valid_first_order`'s `inverse`.

    Args:
        mask: Boolean or numeric tensor of shape `(batch, time)`.

    Returns:
        A tuple `(rank, inverse, lengths)` of int32 tensors: `rank[b, t]`,
        shape `(batch, time)`, is the valid-first slot of the last valid step
        at or before `t` (-1 before the first); `inverse`, shape
        `(batch, time)`, sends valid steps to slots `0..n-1` and padded
        steps to `n..time-1`, in order; `lengths`, shape `(batch,)`, is `n`.

    Example:

    >>> rank, inverse, lengths = valid_ranks([[0, 1, 0, 1, 1]])
    >>> rank
    [[-1, 0, 0, 1, 2]]
    >>> inverse
    [[3, 0, 4, 1, 2]]
    """
    mask = as_bool(mask)
    m = ops.cast(mask, "int32")
    lengths = ops.cast(ops.sum(m, axis=1), "int32")
    rank = ops.cast(ops.cumsum(m, axis=1), "int32") - 1
    # Padded steps up to t number t - rank, so no second cumulative sum.
    t = ops.expand_dims(ops.arange(ops.shape(m)[1], dtype="int32"), 0)
    pad_slot = ops.expand_dims(lengths, 1) + t - rank - 1
    inverse = ops.cast(ops.where(mask, rank, pad_slot), "int32")
    return rank, inverse, lengths


def _combine_adjacent(a, b):
    """Composes the maps `c -> a_t * c + b_t` of steps 2k and 2k+1.

    Pairs come from a reshape and unstack, not step-2 slices, whose gradient
    is slow on TensorFlow. Needs a static time axis.
    """
    if a.shape[1] % 2:
        a = ops.concatenate([a, ops.ones_like(a[:, :1])], axis=1)
        b = ops.concatenate([b, ops.zeros_like(b[:, :1])], axis=1)
    shape = tuple(ops.shape(a))
    pairs = (shape[0], shape[1] // 2, 2) + shape[2:]
    a1, a2 = ops.unstack(ops.reshape(a, pairs), 2, axis=2)
    b1, b2 = ops.unstack(ops.reshape(b, pairs), 2, axis=2)
    return a1 * a2, a2 * b1 + b2


def linear_recurrence_last(a, b, lengths, initial):
    """Final value of `c_t = a_t * c_{t-1} + b_t` after `lengths[i]` steps.

    An elementwise recurrence over axis 1; padded steps are ignored and a row
    of length 0 returns `initial`. A tree reduction in `ceil(log2(time))`
    levels, with no division, so as stable as the loop. It gives an LSTM's
    exact cell state at each row's length (`a` = forget gate, `b` = input
    gate * candidate).

    Args:
        a: Float tensor of shape `(batch, time, ...)`.
        b: Float tensor of the same shape as `a`.
        lengths: Integer tensor of shape `(batch,)`, in `[0, time]`.
        initial: Float tensor of shape `(batch, ...)`: `c_{-1}`.

    Returns:
        A tensor of shape `(batch, ...)`.

    Example:

    >>> linear_recurrence_last(a=[[0.5, 0.5, 0.5]], b=[[1., 1., 1.]],
    ...                        lengths=[2], initial=[0.])
    [1.5]    # c1 = 0.5 * 0 + 1 = 1;  c2 = 0.5 * 1 + 1 = 1.5; step 3 ignored
    """
    a = ops.convert_to_tensor(a)
    b = ops.convert_to_tensor(b)
    initial = ops.cast(ops.convert_to_tensor(initial), a.dtype)
    valid = sequence_mask(lengths, ops.shape(a)[1])
    for _ in range(len(a.shape) - 2):
        valid = ops.expand_dims(valid, -1)
    # Steps past a row's length become the identity map c -> 1 * c + 0.
    a = ops.where(valid, a, ops.ones_like(a))
    b = ops.where(valid, b, ops.zeros_like(b))
    time = a.shape[1]
    if isinstance(time, int):
        if time == 0:
            return initial
        while a.shape[1] > 1:
            a, b = _combine_adjacent(a, b)
        return a[:, 0] * initial + b[:, 0]
    if time is None:
        # TF graph, unknown time: a Hillis-Steele scan keeps XLA's loop shapes.
        def level(steps, a, b):
            a_prev = _shift_right(a, steps, 1.0)
            b_prev = _shift_right(b, steps, 0.0)
            return steps * 2, a * a_prev, a * b_prev + b

        _, a, b = ops.while_loop(
            lambda steps, a, b: steps < ops.shape(a)[1],
            level,
            (ops.convert_to_tensor(1, "int32"), a, b),
            maximum_iterations=31,
        )
        return a[:, -1] * initial + b[:, -1]
    # Symbolic jax.export time: JAX cannot differentiate a while loop, so 31
    # fixed levels; those past the length shift in identity maps.
    for level in range(31):
        a_prev = _shift_right(a, 2**level, 1.0)
        b_prev = _shift_right(b, 2**level, 0.0)
        a, b = a * a_prev, a * b_prev + b
    return a[:, -1] * initial + b[:, -1]


def _shift_right(x, steps, fill):
    """`x` shifted right by `steps` (static) along axis 1, filled with `fill`."""
    y = ops.concatenate([ops.full_like(x, fill), x], axis=1)
    time = ops.convert_to_tensor(ops.shape(x)[1], "int32")
    start = ops.maximum(time - steps, 0)
    return ops.slice(y, [0, start] + [0] * (len(x.shape) - 2), ops.shape(x))
