"""Argument checks of the layers, including those that bite inside compiled graphs.

The `check_*` functions check call and constructor arguments: shapes and
dtypes as soon as they are known, values when the tensors are concrete.

In compiled code a bad length cannot raise, and backends would turn it into
silently wrong numbers; `match_leading_dims`, `invalid_lengths`,
`clamp_lengths` and `poison_rows` make such inputs fail or give NaN rows
instead (docs/errors.md).
"""

import keras
from keras import name_scope, ops

from maskedrnn import backends
from maskedrnn._keras_private import ConvLSTM
from maskedrnn.masking import as_bool

__all__ = [
    "check_bidirectional_layers",
    "check_wrapped_rnn",
    "check_inputs",
    "check_lengths",
    "check_lengths_static",
    "check_mask",
    "check_initial_state",
    "match_leading_dims",
    "static_dim",
    "invalid_lengths",
    "clamp_lengths",
    "poison_rows",
]


def static_dim(dim):
    """`dim` when the shape knows it (an int), else `None`."""
    return dim if isinstance(dim, int) else None


def match_leading_dims(tensor, inputs, ndim, name):
    """Checks that `tensor` has the leading `ndim` sizes of `inputs`.

    Known sizes raise a `ValueError` naming `name` now; sizes known only at
    run time are checked by a stack with zeros of the expected shape (node
    `<name>_must_match_inputs/stack`), so a `(1,)` tensor never broadcasts.

    Args:
        tensor: Tensor of rank `ndim`, e.g. `lengths` or a mask.
        inputs: Tensor whose first `ndim` sizes `tensor` must have.
        ndim: Int, how many leading axes to compare.
        name: String, the argument's name, used in error messages.

    Returns:
        `tensor`, unchanged in value and shape.

    Example:

    >>> match_leading_dims(ops.ones((2, 5)), ops.ones((3, 5, 4)), 2, "mask")
    Traceback (most recent call last):
        ...
    ValueError: mask has 2 along axis 0 but inputs has 3; pass mask ...
    """
    tensor = ops.convert_to_tensor(tensor)
    if len(tensor.shape) != ndim:
        raise ValueError(
            f"{name} must have rank {ndim} (the first {ndim} axes of inputs); "
            f"got shape {tuple(tensor.shape)}."
        )
    unknown = False
    for axis in range(ndim):
        a, b = static_dim(tensor.shape[axis]), static_dim(inputs.shape[axis])
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
    time = backends.current().scalar(time, "int32")
    zero = backends.current().scalar(0, "int32")
    return ops.logical_or(lengths < zero, lengths > time)


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
    backend = backends.current()
    zero, time = backend.scalar(0, "int32"), backend.scalar(time, "int32")
    return ops.minimum(ops.maximum(lengths, zero), time)


def poison_rows(tensors, bad):
    """Sets every element of the rows flagged in `bad` to NaN.

    Args:
        tensors: A floating tensor of shape `(batch, ...)`, or a list or tuple
            of them (outputs and states).
        bad: Boolean tensor of shape `(batch,)`, e.g. from `invalid_lengths`.

    Returns:
        The structure, shapes and dtypes of `tensors`, with NaN in the
        flagged rows, which pass no gradient back.

    Example:

    >>> poison_rows(ops.convert_to_tensor([[1., 2.], [3., 4.]]), bad=[False, True])
    [[1.0, 2.0], [nan, nan]]
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
    # A select keeps the NaN gradient of a bad row out (x * 0 passes 0 * NaN);
    # the NaN is added apart, as tf2onnx mishandles a select against NaN.
    nan = backends.current().scalar(float("nan"), x.dtype)
    zero = backends.current().scalar(0.0, x.dtype)
    return ops.where(flags, ops.zeros_like(x), x) + ops.where(flags, nan, zero)


def check_inputs(x, layer_name, built_features=None):
    """Checks the call's `inputs`: rank 3, a step, the built feature size."""
    x = ops.convert_to_tensor(x)
    if len(x.shape) != 3:
        raise ValueError(
            f"{layer_name} expects inputs of shape (batch, time, features); "
            f"got shape {tuple(x.shape)} (rank {len(x.shape)}). Add a feature "
            "axis (e.g. an Embedding or expand_dims) for rank 2 inputs."
        )
    time = ops.shape(x)[1]
    if isinstance(time, int) and time == 0:
        raise ValueError(
            "inputs has a zero-size time axis (shape "
            f"{tuple(x.shape)}); pad every batch to at least one step."
        )
    features = x.shape[-1]
    if (
        isinstance(features, int)
        and isinstance(built_features, int)
        and features != built_features
    ):
        raise ValueError(
            f"inputs has {features} features but the layer was built for "
            f"{built_features} (last axis of inputs); got inputs of shape "
            f"{tuple(x.shape)}."
        )
    return x


def check_input_shape(shape, layer_name):
    """Checks a build-time input shape: `(batch, time, features)`."""
    shape = tuple(shape)
    if len(shape) != 3:
        raise ValueError(
            f"{layer_name} expects inputs of shape (batch, time, features); "
            f"got shape {shape} (rank {len(shape)}). Add a feature axis (e.g. "
            "an Embedding or expand_dims) for rank 2 inputs."
        )
    return shape


def one_per_row(t, description):
    """`t` as `(batch,)`, squeezing `(batch, 1)`; else a `ValueError`."""
    if len(t.shape) == 2 and t.shape[1] == 1:
        t = ops.squeeze(t, 1)
    if len(t.shape) != 1:
        raise ValueError(f"{description}; got shape {tuple(t.shape)}.")
    return t


def check_lengths_static(lengths, x):
    """Checks the shape and dtype of `lengths` (also at model build)."""
    lengths = one_per_row(
        lengths, "lengths must have shape (batch,), one length per row"
    )
    if "int" not in keras.backend.standardize_dtype(lengths.dtype):
        raise ValueError(
            f"lengths must be integers; got dtype {lengths.dtype}. Cast it "
            "with ops.cast(lengths, 'int32') (a float length is ambiguous)."
        )
    batch, n = x.shape[0], lengths.shape[0]
    if isinstance(batch, int) and isinstance(n, int) and batch != n:
        raise ValueError(
            f"lengths has {n} rows but inputs has {batch} (batch "
            f"dimension); pass one length per row; got lengths of shape "
            f"{tuple(lengths.shape)}."
        )
    return lengths


def check_lengths(lengths, x):
    """Checks `lengths` against `inputs` `x`; returns `(lengths, bad_rows)`.

    Out-of-range values raise when readable on the host; otherwise (compiled
    code, accelerator memory) `lengths` is clamped and `bad_rows` flags them
    for `poison_rows`. `bad_rows` is None when the values were checked.
    """
    lengths = check_lengths_static(ops.convert_to_tensor(lengths), x)
    lengths = ops.cast(lengths, "int32")
    # A batch size known only at run time: fail there, never broadcast.
    lengths = match_leading_dims(lengths, x, 1, "lengths")
    time = ops.shape(x)[1]
    if not backends.current().host_readable(lengths):
        # Reading them would sync with the device, or is impossible.
        return clamp_lengths(lengths, time), invalid_lengths(lengths, time)
    values = ops.convert_to_numpy(lengths)
    if values.size and values.min() < 0:
        raise ValueError(f"lengths must be >= 0; got min(lengths)={values.min()}.")
    if isinstance(time, int) and values.size and values.max() > time:
        raise ValueError(
            f"lengths has a value {values.max()} longer than the time "
            f"axis of inputs ({time}); clip lengths or pad inputs."
        )
    return lengths, None


def check_mask(mask, x):
    """Checks a `(batch, time)` mask against `inputs` `x`; returns it as bool."""
    mask = ops.convert_to_tensor(mask)
    if len(mask.shape) != 2:
        raise ValueError(
            f"mask must have shape (batch, time); got shape {tuple(mask.shape)}."
        )
    for axis, name in ((0, "batch"), (1, "time")):
        a, b = mask.shape[axis], x.shape[axis]
        if isinstance(a, int) and isinstance(b, int) and a != b:
            raise ValueError(
                f"mask has {a} along axis {axis} but inputs has {b} "
                f"({name} dimension); the mask must be (batch, time)."
            )
    dtype = keras.backend.standardize_dtype(mask.dtype)
    if dtype != "bool" and not any(k in dtype for k in ("int", "float")):
        raise ValueError(
            "mask must be boolean (or numeric: non-zero = valid step); got "
            f"dtype {mask.dtype}."
        )
    mask = as_bool(mask)
    if not isinstance(mask, keras.KerasTensor):
        mask = match_leading_dims(mask, x, 2, "mask")
    return mask


def check_initial_state(initial_state, x, parts):
    """Checks `initial_state` against the states the layer needs.

    Args:
        initial_state: A tensor or a list of tensors, or None.
        x: The inputs (for the batch size).
        parts: List of `(owner, names, sizes)` per inner layer, e.g.
            `("the forward LSTM", ["h", "c"], [64, 64])`.

    Returns:
        None, or a list with one list of state tensors per part.
    """
    if initial_state is None:
        return None
    if not isinstance(initial_state, (list, tuple)):
        initial_state = [initial_state]
    initial_state = list(initial_state)
    expected = [
        (owner, name, size)
        for owner, names, sizes in parts
        for name, size in zip(names, sizes)
    ]
    described = ", ".join(
        f"{owner}'s {name} (batch, {size})" for owner, name, size in expected
    )
    if len(initial_state) != len(expected):
        raise ValueError(
            f"initial_state has {len(initial_state)} tensors but this layer "
            f"needs {len(expected)}, in this order: {described}; got shapes "
            f"{[tuple(ops.shape(s)) for s in initial_state]}."
        )
    batch = x.shape[0]
    for i, (state, (owner, name, size)) in enumerate(zip(initial_state, expected)):
        shape = tuple(ops.convert_to_tensor(state).shape)
        if (
            len(shape) != 2
            or (isinstance(shape[1], int) and shape[1] != size)
            or (
                isinstance(shape[0], int)
                and isinstance(batch, int)
                and shape[0] != batch
            )
        ):
            raise ValueError(
                f"initial_state[{i}] is {owner}'s {name} and must have shape "
                f"(batch, {size}) with the batch of inputs ({batch}); got shape "
                f"{shape}. The layer needs, in this order: {described}."
            )
    out, start = [], 0
    for _, names, _ in parts:
        out.append(initial_state[start : start + len(names)])
        start += len(names)
    return out


MERGE_MODES = ("concat", "sum", "mul", "ave", None)


def check_bidirectional_layers(layer, backward_layer, merge_mode):
    """The constructor checks of `MaskedBidirectional`."""
    if not isinstance(layer, keras.layers.RNN):
        raise ValueError(
            "MaskedBidirectional needs `layer` to be a keras.layers.RNN "
            "instance such as keras.layers.LSTM(64) or "
            f"keras.layers.GRU(64); got layer={layer!r}."
        )
    if isinstance(layer, ConvLSTM) or isinstance(backward_layer, ConvLSTM):
        raise ValueError(
            "MaskedBidirectional wraps RNNs over (batch, time, features) "
            "inputs; ConvLSTM1D/2D/3D take images per step. Use "
            "keras.layers.Bidirectional for ConvLSTM layers."
        )
    if backward_layer is not None and not isinstance(backward_layer, keras.layers.RNN):
        raise ValueError(
            "`backward_layer` must be a keras.layers.RNN instance (or None "
            f"to copy `layer`); got backward_layer={backward_layer!r}."
        )
    if merge_mode not in MERGE_MODES:
        raise ValueError(
            f"Invalid merge_mode={merge_mode!r}: use one of "
            '"concat", "sum", "mul", "ave" or None.'
        )
    if layer.go_backwards:
        raise ValueError(
            "`layer` is the forward direction and must have "
            "go_backwards=False; the backward direction is made from it "
            "(or pass it as `backward_layer`)."
        )
    if layer.stateful:
        raise ValueError(
            "MaskedBidirectional does not support stateful=True: states "
            "carried across batches do not mix with per-row lengths. Use "
            "keras.layers.Bidirectional for stateful RNNs, or pass the "
            "previous final states as `initial_state`."
        )
    if backward_layer is not None:
        if not backward_layer.go_backwards:
            raise ValueError(
                "`backward_layer` must have go_backwards=True, like "
                "keras.layers.Bidirectional requires; got "
                "go_backwards=False."
            )
        for attr in ("stateful", "return_sequences", "return_state"):
            fwd, bwd = getattr(layer, attr), getattr(backward_layer, attr)
            if fwd != bwd:
                raise ValueError(
                    f"`layer` and `backward_layer` must have the same "
                    f"{attr}; got {fwd} for layer and {bwd} for "
                    "backward_layer."
                )


def check_wrapped_rnn(layer):
    """The constructor checks of `MaskedRNN`."""
    if not isinstance(layer, keras.layers.RNN):
        raise ValueError(
            "MaskedRNN needs `layer` to be a keras.layers.RNN instance such "
            "as keras.layers.LSTM(64) or keras.layers.GRU(64); got "
            f"layer={layer!r}."
        )
    if isinstance(layer, ConvLSTM):
        raise ValueError(
            "MaskedRNN wraps RNNs over (batch, time, features) inputs; "
            f"ConvLSTM1D/2D/3D take images per step; got layer={layer!r}. "
            "Call the ConvLSTM layer itself with its mask."
        )
    if layer.stateful:
        raise ValueError(
            "MaskedRNN does not support stateful=True: states carried "
            "across batches do not mix with per-row lengths; got a layer "
            "with stateful=True. Call the layer itself, or pass the previous "
            "final states as `initial_state`."
        )


# --------------------------------------------------------------------------
# Small argument checks of the tools (bucketing, datasets, demo): plain
# Python values, checked once, with one wording.


def check_int(name, value, low):
    """Returns `value` as an `int` if it is an integer (not a bool) `>= low`.

    Raises:
        ValueError: "`name` must be an int >= `low`; got `name`=`value`."
    """
    import numbers  # here, so this block stays apart from the layer checks

    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < low
    ):
        raise ValueError(f"{name} must be an int >= {low}; got {name}={value!r}.")
    return int(value)
