"""Argument checks that still bite inside compiled graphs (`keras.ops` only).

Checks that read values (`0 <= lengths <= time`) can only raise a Python
error when the tensor is concrete (eager TensorFlow, eager PyTorch, JAX
outside `jit`). Inside `tf.function`, XLA, `jax.jit` or `torch.compile` they
would be skipped, and an out-of-range length then gives silently wrong
numbers: XLA and JAX clamp out-of-range gather indices, TensorFlow's GPU
gather returns zeros, inductor reads the neighbouring row, and a negative
length reads as an empty row everywhere. The helpers here keep such inputs
loud without any backend-specific code:

- `match_leading_dims` makes a per-row argument (`lengths`, `mask`) fail when
  its leading sizes differ from the inputs', also where they are unknown
  until run time (a `None` batch in a TensorFlow graph), instead of letting a
  1-row tensor broadcast over the batch;
- `invalid_lengths` flags rows whose length is outside `[0, time]`,
  `clamp_lengths` makes them safe to index with, and `poison_rows` writes NaN
  into every output and state of those rows. A NaN loss is what Keras
  reports (and `keras.callbacks.TerminateOnNaN` stops on); the other rows
  keep their exact values, and no gradient passes into the poisoned rows, so
  the weights of the layer and of the layers before it stay finite (layers
  after it see NaN activations, so their weights do not).
"""

from keras import name_scope, ops

__all__ = [
    "match_leading_dims",
    "invalid_lengths",
    "clamp_lengths",
    "poison_rows",
]


def _static(dim):
    return dim if isinstance(dim, int) else None


def match_leading_dims(tensor, inputs, ndim, name):
    """Checks that `tensor` has the leading `ndim` sizes of `inputs`.

    Known sizes are compared now and raise a `ValueError` naming `name`.
    Sizes known only at run time (a `None` dimension in a TensorFlow graph)
    are checked by stacking `tensor` with zeros of the expected shape, which
    fails at run time (or at XLA compile time) unless the shapes are equal:
    a `(1,)` tensor is *not* broadcast to `(batch,)`. On TensorFlow the
    failing node is named `<name>_must_match_inputs/stack`.

    Args:
        tensor: Tensor of rank `ndim`, e.g. `lengths` (`ndim=1`) or a mask
            (`ndim=2`).
        inputs: Tensor whose first `ndim` sizes `tensor` must have.
        ndim: Int, how many leading axes to compare.
        name: String, the argument's name, used in error messages.

    Returns:
        `tensor`, unchanged in value and shape.

    Example:

    >>> match_leading_dims(ops.ones((2, 5)), ops.ones((3, 5, 4)), 2, "mask")
    ValueError: mask has 2 along axis 0 but inputs has 3 ...
    """
    tensor = ops.convert_to_tensor(tensor)
    if len(tensor.shape) != ndim:
        raise ValueError(
            f"{name} must have rank {ndim} (the first {ndim} axes of inputs); "
            f"got shape {tuple(tensor.shape)}."
        )
    unknown = False
    for axis in range(ndim):
        a, b = _static(tensor.shape[axis]), _static(inputs.shape[axis])
        if a is not None and b is not None:
            if a != b:
                raise ValueError(
                    f"{name} has {a} along axis {axis} but inputs has {b}; pass "
                    f"{name} with the shape of inputs' first {ndim} axes "
                    f"{tuple(inputs.shape[:ndim])}."
                )
        else:
            unknown = True
    if not unknown:
        return tensor
    with name_scope(f"{name}_must_match_inputs"):
        expected = ops.zeros(ops.shape(inputs)[:ndim], dtype=tensor.dtype)
        return ops.stack([tensor, expected])[0]


def invalid_lengths(lengths, time):
    """Boolean `(batch,)` tensor: True where `lengths` is outside `[0, time]`.

    Args:
        lengths: Integer tensor of shape `(batch,)`.
        time: Int or scalar integer tensor, the size of the time axis.

    Returns:
        A boolean tensor of shape `(batch,)`.

    Example:

    >>> invalid_lengths([3, -1, 6, 0], time=5)
    [False, True, True, False]
    """
    lengths = ops.cast(ops.convert_to_tensor(lengths), "int32")
    time = ops.cast(time, "int32")
    return ops.logical_or(lengths < 0, lengths > time)


def clamp_lengths(lengths, time):
    """`lengths` clipped to `[0, time]`, as int32, safe to build indices from.

    Args:
        lengths: Integer tensor of shape `(batch,)`.
        time: Int or scalar integer tensor, the size of the time axis.

    Returns:
        An int32 tensor of shape `(batch,)`.

    Example:

    >>> clamp_lengths([3, -1, 6], time=5)
    [3, 0, 5]
    """
    lengths = ops.cast(ops.convert_to_tensor(lengths), "int32")
    return ops.minimum(ops.maximum(lengths, 0), ops.cast(time, "int32"))


def poison_rows(tensors, bad):
    """Sets every element of the rows flagged in `bad` to NaN.

    Args:
        tensors: A floating tensor of shape `(batch, ...)`, or a list or tuple
            of them (outputs and states).
        bad: Boolean tensor of shape `(batch,)`, e.g. from `invalid_lengths`.

    Returns:
        The same structure as `tensors`, same shapes and dtypes, with NaN in
        the flagged rows and the other rows unchanged. No gradient passes
        into a flagged row, even a NaN one, so the weights of the layer that
        poisons (and of the layers before it) stay finite.

    Example:

    >>> poison_rows([[1., 2.], [3., 4.]], bad=[False, True])
    [[1., 2.], [nan, nan]]
    """
    if isinstance(tensors, (list, tuple)):
        return type(tensors)(poison_rows(t, bad) for t in tensors)
    x = ops.convert_to_tensor(tensors)
    if "float" not in str(x.dtype):
        raise TypeError(
            f"poison_rows needs floating tensors (NaN marks bad rows); got "
            f"dtype {x.dtype}."
        )
    flags = ops.convert_to_tensor(bad)
    for _ in range(len(x.shape) - 1):
        flags = ops.expand_dims(flags, -1)
    # A select against zeros, plus a per-row NaN (or 0) that does not depend
    # on x. The select passes no gradient into bad rows even when the
    # incoming gradient there is NaN (as it is in training: the loss of a
    # NaN row is NaN); multiplying x by 0 instead would give 0 * NaN = NaN
    # and turn the layer's weights into NaN. tf2onnx keeps both selects (a
    # full-size select against a NaN tensor came out all NaN in ONNX).
    nan = ops.convert_to_tensor(float("nan"), dtype=x.dtype)
    zero = ops.convert_to_tensor(0.0, dtype=x.dtype)
    return ops.where(flags, ops.zeros_like(x), x) + ops.where(flags, nan, zero)
