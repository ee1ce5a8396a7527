"""Length-aware sequence operations written with `keras.ops` only.

Every function here runs on the TensorFlow, JAX and PyTorch backends, has no
data-dependent output shape (except `sequence_mask` with `maxlen=None`), and is
differentiable in its floating-point inputs.

Conventions: the batch axis is 0 and the time axis is 1 unless an argument says
otherwise. `lengths` is a rank-1 integer tensor with one entry per batch row.
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
    """Reverses the first `lengths[i]` steps of each row; the rest stay put.

    Same semantics as `tf.reverse_sequence(x, lengths, seq_axis=axis,
    batch_axis=0)`, written with `keras.ops` so it runs on every backend. It is
    its own inverse, and is differentiable in `x`. Lengths above the size of
    the time axis are clipped to it and negative lengths count as 0 (no
    check here, so that it can run inside compiled graphs; layers check their
    `lengths` argument before calling it).

    Example:

    >>> x = [[1, 2, 3, 0, 0],
    ...      [1, 2, 0, 0, 0]]
    >>> reverse_sequence(x, lengths=[3, 2])
    [[3, 2, 1, 0, 0],
     [2, 1, 0, 0, 0]]

    Args:
        x: Tensor of shape `(batch, ..., time, ...)`, rank >= 2; batch is
            axis 0.
        lengths: Integer tensor of shape `(batch,)`: how many leading steps of
            each row to reverse.
        axis: Int, the time axis (not 0). Defaults to `1`.

    Returns:
        A tensor of the shape and dtype of `x`.
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
    """The `(batch, time)` gather index of `reverse_sequence`.

    `reverse_sequence(x, lengths)` is `gather_time(x, reverse_index(lengths,
    time))`; layers compute the index once and reuse it. Lengths are clipped
    to `[0, time]`, so every index lies in `[0, time)`.

    Example:

    >>> reverse_index([3, 7, -1], time=4)
    [[2, 1, 0, 3],
     [3, 2, 1, 0],
     [0, 1, 2, 3]]

    Args:
        lengths: Integer tensor of shape `(batch,)`.
        time: Int or scalar integer tensor, the size of the time axis.

    Returns:
        An int32 tensor of shape `(batch, time)`.
    """
    # `arange` takes `time` as it comes: an int, a scalar tensor (a TF graph)
    # or a symbolic dimension (jax.export), which a cast would turn into a
    # traced value that `arange` cannot size an array with.
    t = ops.expand_dims(ops.arange(time, dtype="int32"), 0)
    # The clip's bounds as device scalars made without a host copy (a
    # Python int handed to `ops.maximum` is copied to a CUDA device, which
    # waits for every queued kernel first).
    backend = backends.current()
    zero, bound = backend.scalar(0, "int32"), backend.scalar(time, "int32")
    lengths = ops.cast(ops.convert_to_tensor(lengths), "int32")
    n = ops.expand_dims(ops.minimum(ops.maximum(lengths, zero), bound), 1)
    return ops.where(t < n, n - 1 - t, t)


def sequence_mask(lengths, maxlen=None, dtype="bool"):
    """Boolean mask of the first `lengths[i]` steps of each row.

    Same semantics as `tf.sequence_mask`.

    Example:

    >>> sequence_mask([3, 1], maxlen=4)
    [[True, True, True, False],
     [True, False, False, False]]

    Args:
        lengths: Integer tensor of shape `(batch,)`.
        maxlen: Int or scalar tensor, the size of the time axis. Defaults to
            `None`, meaning `max(lengths)`: a data-dependent shape, so pass it
            explicitly inside `jax.jit` or XLA.
        dtype: Output dtype. Defaults to `"bool"`.

    Returns:
        A `(batch, maxlen)` tensor of `dtype`.
    """
    lengths = ops.cast(ops.convert_to_tensor(lengths), "int32")
    if maxlen is None:
        # As tf.sequence_mask: all lengths <= 0 give a (batch, 0) mask.
        maxlen = ops.maximum(ops.max(lengths), 0)
    t = ops.expand_dims(ops.arange(maxlen, dtype="int32"), 0)
    mask = t < ops.expand_dims(lengths, 1)
    return mask if dtype == "bool" else ops.cast(mask, dtype)


def lengths_from_mask(mask):
    """Number of valid (True / non-zero) steps in each row of a `(batch, time)` mask.

    For a right-padded mask this is the usual length. For a left-padded mask
    or one with holes it is the count of valid steps, which is the length
    of the row once its valid steps are moved to the front (see
    `valid_first_order`).

    Example:

    >>> lengths_from_mask([[1, 1, 1, 0], [0, 0, 1, 1]])
    [3, 2]

    Args:
        mask: Boolean or numeric tensor of shape `(batch, time)`.

    Returns:
        An int32 tensor of shape `(batch,)`.
    """
    mask = as_bool(mask)
    return ops.sum(ops.cast(mask, "int32"), axis=1)


def lengths_from_padding(ids, pad_value=0):
    """Length of each right-padded row: the index of its first pad step.

    A step is padding when it equals `pad_value` (for rank-3 inputs: when all
    its features do). A row with no padding has length `time`. Steps after
    the first pad are ignored, so a pad value inside a sequence ends it.

    Example:

    >>> lengths_from_padding([[5, 7, 2, 0, 0], [4, 0, 0, 0, 0]])
    [3, 1]

    Args:
        ids: Tensor of shape `(batch, time)` (token ids) or
            `(batch, time, features)`.
        pad_value: Scalar, the padding value. Defaults to `0`.

    Returns:
        An int32 tensor of shape `(batch,)`.
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

    `gather(x, order)` (along time) turns a left-padded row or a row with holes
    into a right-padded one, keeping the valid steps in their original order;
    `gather(y, inverse)` puts per-step results back where they came from.

    Example:

    >>> order, inverse, lengths = valid_first_order([[0, 0, 1, 1, 1]])
    >>> order
    [[2, 3, 4, 0, 1]]

    Args:
        mask: Boolean or numeric tensor of shape `(batch, time)`.

    Returns:
        A tuple `(order, inverse, lengths)`: two int32 `(batch, time)`
        permutations, inverse of each other, and the int32 `(batch,)` count of
        valid steps per row.
    """
    rank, inverse, lengths = valid_ranks(mask)
    # order is the inverse permutation of `inverse`: order[inverse[t]] = t.
    order = backends.current().invert_permutation(inverse)
    return order, inverse, lengths


def valid_ranks(mask):
    """The running count of valid steps, and where `valid_first_order` sends
    each step (its `inverse`), from one cumulative sum.

    Example:

    >>> rank, inverse, lengths = valid_ranks([[0, 1, 0, 1, 1]])
    >>> rank
    [[-1, 0, 0, 1, 2]]
    >>> inverse
    [[3, 0, 4, 1, 2]]

    Args:
        mask: Boolean or numeric tensor of shape `(batch, time)`.

    Returns:
        A tuple `(rank, inverse, lengths)`: `rank[b, t]` (int32) is the
        number of valid steps of row `b` up to and including `t`, minus one
        (the valid-first slot of the last valid step at or before `t`; -1
        before the first one); `inverse` the int32 `(batch, time)`
        permutation sending valid steps to slots `0..n-1` and padded steps
        to `n..time-1`, each in order; `lengths` the int32 `(batch,)` count
        `n` of valid steps.
    """
    mask = as_bool(mask)
    m = ops.cast(mask, "int32")
    lengths = ops.cast(ops.sum(m, axis=1), "int32")
    rank = ops.cast(ops.cumsum(m, axis=1), "int32") - 1
    # Padded steps up to and including t number (t + 1) - (rank + 1), so a
    # padded step's slot is lengths + t - rank - 1: no second cumulative sum.
    t = ops.expand_dims(ops.arange(ops.shape(m)[1], dtype="int32"), 0)
    pad_slot = ops.expand_dims(lengths, 1) + t - rank - 1
    inverse = ops.cast(ops.where(mask, rank, pad_slot), "int32")
    return rank, inverse, lengths


def _combine_adjacent(a, b):
    """One level of a tree reduction of `c -> a_t * c + b_t` maps along axis 1.

    Pads an odd-length time axis with the identity map (a=1, b=0), then
    composes steps 2k and 2k+1: `c -> a2 * (a1 * c + b1) + b2`. The pairs
    come from a reshape to `(batch, time / 2, 2, ...)` and an unstack, not
    from step-2 slices: TensorFlow's strided-slice gradient made those 5-7x
    slower there (fwd and fwd+bwd, (32, 100, 64), CPU), and the unstack is
    as fast or faster on JAX and PyTorch. Needs a static time axis.
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

    Elementwise linear recurrence over axis 1, run for the first `lengths[i]`
    steps of each row (a row of length 0 returns `initial`). Computed as a
    tree reduction: about `2 * time` elementwise products, `ceil(log2(time))`
    levels, memory linear in `time`, and no division or logarithm, so it is
    as stable as the sequential loop. This is how `MaskedBidirectional` gets
    an LSTM's exact cell state at each row's true length from unmasked outputs
    (`a` = forget gate, `b` = input gate * candidate).

    Example:

    >>> linear_recurrence_last(a=[[0.5, 0.5, 0.5]], b=[[1., 1., 1.]],
    ...                        lengths=[2], initial=[0.])
    [1.5]    # c1 = 0.5 * 0 + 1 = 1;  c2 = 0.5 * 1 + 1 = 1.5; step 3 ignored

    Args:
        a: Float tensor of shape `(batch, time, ...)`.
        b: Float tensor of the same shape as `a`.
        lengths: Integer tensor of shape `(batch,)`, in `[0, time]`.
        initial: Float tensor of shape `(batch, ...)`: `c_{-1}`.

    Returns:
        A tensor of shape `(batch, ...)`.
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
        # Static time axis (the usual case on every backend): unrolled levels.
        if time == 0:
            return initial
        while a.shape[1] > 1:
            a, b = _combine_adjacent(a, b)
        return a[:, 0] * initial + b[:, 0]
    if time is None:
        # Unknown time axis in a TensorFlow graph: a differentiable while loop
        # over a constant-shape Hillis-Steele prefix scan (XLA needs loop
        # bodies that keep shapes, and a bound on the iterations).
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
    # A symbolic dimension (jax.export with a dynamic time axis): no Python
    # branch on its value and no while loop (JAX cannot differentiate one),
    # so a fixed-shape Hillis-Steele prefix scan with enough levels for any
    # length below 2**31; levels past the length shift in identity maps only.
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
