"""`gather_time`, the per-row time gather of `maskedrnn.ops`, defined here,
below the ops: the backends' one-call kernels gather with it too.
"""

from keras import ops

from maskedrnn import backends

__all__ = ["gather_time"]


def gather_time(x, index):
    """Gathers `x[b, index[b, t], ...]`: a per-row reordering of the time axis.

    The backend's `gather_time`: one batched gather on TensorFlow, a row
    gather of the `(batch * time, ...)` view elsewhere. With
    the permutations of `valid_first_order` it moves each row's valid steps to
    the front (`order`) and back (`inverse`). Indices must lie in
    `[0, time)`; they are not checked (out-of-range indices read another
    row's data or fail, depending on the backend).

    Example:

    >>> x = [[[1.], [2.], [3.]],
    ...      [[4.], [5.], [6.]]]
    >>> gather_time(x, index=[[2, 0, 1], [1, 1, 0]])
    [[[3.0], [1.0], [2.0]],
     [[5.0], [5.0], [4.0]]]

    Args:
        x: Tensor of shape `(batch, time, ...)`.
        index: Integer tensor of shape `(batch, time_out)` with values in
            `[0, time)`; usually `time_out == time`.

    Returns:
        A tensor of shape `(batch, time_out, ...)` and the dtype of `x`.
    """
    x = ops.convert_to_tensor(x)
    shape = ops.shape(x)
    batch, time = shape[0], shape[1]
    if any(isinstance(d, int) and d == 0 for d in (batch, time)):
        # Nothing to gather (and jnp.take on an empty array drops index axes).
        # Only static sizes are compared: a symbolic size (TF graph, jax.export)
        # cannot be a Python bool, and TF's gather handles an empty run fine.
        return x
    return backends.current().gather_time(x, ops.cast(index, "int32"))


def flat_gather_time(x, index, take_rows):
    """`gather_time` as one row gather of the `(batch * time, ...)` view,
    `take_rows(flat, index)` the backend's row gather: measurably faster
    than `take_along_axis`, which broadcasts the index over the feature
    axes. `index` int32."""
    shape = ops.shape(x)
    batch, time = shape[0], shape[1]
    flat = ops.reshape(x, (-1,) + tuple(shape[2:]))
    offsets = ops.expand_dims(ops.arange(batch, dtype="int32") * time, 1)
    return take_rows(flat, index + offsets)
