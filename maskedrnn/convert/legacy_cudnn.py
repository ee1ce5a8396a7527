"""Legacy `CuDNNLSTM` / `CuDNNGRU` layers (tf-keras, Keras 2) and their `.h5` files.

`tf.compat.v1.keras.layers.CuDNNLSTM(U).get_weights()` is `[kernel (D, 4U),
recurrent_kernel (U, 4U), bias (8U,)]` (gates i, f, c, o), `CuDNNGRU(U)`'s is
`[kernel (D, 3U), recurrent_kernel (U, 3U), bias (6U,)]` (gates z, r, h):
Keras-looking shapes, but each gate block holds a cuDNN matrix in disguise and
the bias is `[input biases | recurrent biases]`. `load_legacy_cudnn_h5` reads a
tf-keras `.h5` file (with `h5py`, imported only there) and assigns the
converted weights to a Keras 3 model.
"""

import os

import keras
import numpy as np

from maskedrnn.convert._validate import (
    _array_list,
    _check_shape,
    _keras_gru,
    _keras_lstm,
    _units_and_gates,
)
from maskedrnn.convert.gate_layout import (
    GRU_GATES,
    LSTM_GATES,
    halve_bias,
    map_gate_blocks,
)

__all__ = [
    "bidirectional_to_cudnn_bidirectional",
    "cudnn_bidirectional_to_bidirectional",
    "cudnn_gru_to_gru",
    "cudnn_lstm_to_lstm",
    "gru_to_cudnn_gru",
    "load_legacy_cudnn_h5",
    "lstm_to_cudnn_lstm",
]


def _cudnn_block_to_keras(block):
    """Converts one gate block of a legacy CuDNN layer's kernel to Keras.

    A legacy CuDNN layer keeps each gate's weights in a `(rows, U)` slice of
    its Keras-shaped variable, but hands that slice's memory (C order) to
    cuDNN, which reads it as a row-major `(U, rows)` matrix `W` (units by
    inputs). The Keras block for the same gate is `W.T`, so: reinterpret the
    memory as `(U, rows)`, then transpose. This is what tf-keras'
    `transpose_input(from_cudnn=True)` computes as
    `block.T.reshape(block.shape, order="F")`. For the square recurrent
    blocks it is a plain transpose.
    """
    rows, units = block.shape
    return block.reshape(units, rows).T


def _keras_block_to_cudnn(block):
    """Inverse of `_cudnn_block_to_keras`: `W = block.T`, stored C-order."""
    rows, units = block.shape
    return np.ascontiguousarray(block.T).reshape(rows, units)


def _legacy_cudnn(weights, n_gates, name, layer_name):
    kernel, recurrent_kernel, bias = _array_list(
        weights, 3, name, f"[kernel, recurrent_kernel, bias] of a {layer_name}"
    )
    units = recurrent_kernel.shape[0] if recurrent_kernel.ndim == 2 else 0
    _check_shape(
        recurrent_kernel,
        (units, n_gates * units),
        f"{name}[1]",
        f"recurrent_kernel (units, {n_gates} * units) of a {layer_name}",
    )
    if kernel.ndim != 2:
        raise ValueError(
            f"`{name}[0]` must be the 2-D kernel (input_dim, {n_gates} * units) "
            f"of a {layer_name}; got shape {kernel.shape}."
        )
    _check_shape(
        kernel,
        (kernel.shape[0], n_gates * units),
        f"{name}[0]",
        f"kernel of a {layer_name}",
    )
    _check_shape(
        bias,
        (2 * n_gates * units,),
        f"{name}[2]",
        f"bias [input biases, recurrent biases] of a {layer_name}",
    )
    return kernel, recurrent_kernel, bias, units


def cudnn_lstm_to_lstm(weights):
    """Converts legacy `CuDNNLSTM` weights to `keras.layers.LSTM` weights.

    Source: `tf.compat.v1.keras.layers.CuDNNLSTM` (tf-keras / Keras 2), whose
    `get_weights()` is `[kernel (D, 4U), recurrent_kernel (U, 4U),
    bias (8U,)]`, gates in order i, f, c, o (the same order as Keras). Each
    gate's `(D, U)` kernel block holds cuDNN's `(U, D)` input matrix in
    row-major memory order, and each `(U, U)` recurrent block holds the
    transposed recurrent matrix; `bias` is the 4 input biases followed by
    the 4 recurrent biases. This is the conversion tf-keras applies when it
    loads CuDNNLSTM weights into an LSTM (`hdf5_format._convert_rnn_weights`).

    Args:
        weights: list `[kernel, recurrent_kernel, bias]` of a CuDNNLSTM
            layer, shapes `(D, 4U)`, `(U, 4U)`, `(8U,)`.

    Returns:
        List `[kernel (D, 4U), recurrent_kernel (U, 4U), bias (4U,)]` for
        `keras.layers.LSTM(U)`. The two cuDNN biases are summed (only their
        sum enters the LSTM equations).

    Example:

    >>> legacy = [np.ones((3, 8)), np.ones((2, 8)), np.zeros(16)]
    >>> [w.shape for w in cudnn_lstm_to_lstm(legacy)]
    [(3, 8), (2, 8), (8,)]
    """
    kernel, recurrent_kernel, bias, units = _legacy_cudnn(
        weights, LSTM_GATES, "weights", "CuDNNLSTM"
    )
    # Per gate (order i, f, c, o kept): reinterpret the cuDNN matrix, transpose.
    kernel = map_gate_blocks(kernel, LSTM_GATES, _cudnn_block_to_keras)
    recurrent_kernel = map_gate_blocks(
        recurrent_kernel, LSTM_GATES, _cudnn_block_to_keras
    )
    # bias (8U,) = [input biases i,f,c,o | recurrent biases i,f,c,o] -> sum.
    bias = bias[: 4 * units] + bias[4 * units :]
    return [kernel, recurrent_kernel, bias]


def lstm_to_cudnn_lstm(weights):
    """Converts `keras.layers.LSTM` weights to legacy `CuDNNLSTM` weights.

    Inverse of `cudnn_lstm_to_lstm` (see there for the layouts), for code
    that still runs `tf.compat.v1.keras.layers.CuDNNLSTM`.

    Args:
        weights: list `[kernel (D, 4U), recurrent_kernel (U, 4U),
            bias (4U,)]` of a `keras.layers.LSTM(U)` (with `use_bias=True`).

    Returns:
        List `[kernel (D, 4U), recurrent_kernel (U, 4U), bias (8U,)]` for a
        CuDNNLSTM. The Keras bias is split in two equal halves (input and
        recurrent biases), as tf-keras does; any split with the same sum
        computes the same function.

    Example:

    >>> keras_weights = [np.ones((3, 8)), np.ones((2, 8)), np.ones(8)]
    >>> lstm_to_cudnn_lstm(keras_weights)[2][:3]
    array([0.5, 0.5, 0.5])
    """
    kernel, recurrent_kernel, bias, _, _ = _keras_lstm(weights)
    # Per gate (order i, f, c, o kept): transpose, store in cuDNN memory order.
    kernel = map_gate_blocks(kernel, LSTM_GATES, _keras_block_to_cudnn)
    recurrent_kernel = map_gate_blocks(
        recurrent_kernel, LSTM_GATES, _keras_block_to_cudnn
    )
    # bias (4U,) -> [input half | recurrent half] (8U,).
    half = halve_bias(bias)
    return [kernel, recurrent_kernel, np.concatenate([half, half])]


def cudnn_gru_to_gru(weights):
    """Converts legacy `CuDNNGRU` weights to `keras.layers.GRU` weights.

    Source: `tf.compat.v1.keras.layers.CuDNNGRU`, whose `get_weights()` is
    `[kernel (D, 3U), recurrent_kernel (U, 3U), bias (6U,)]`, gate blocks in
    the Keras order z, r, h (the layer itself reorders them to cuDNN's
    r, z, h when it calls cuDNN). Each gate's `(D, U)` kernel block holds
    cuDNN's `(U, D)` input matrix in row-major memory order, each `(U, U)`
    recurrent block holds the transposed recurrent matrix; `bias` is the 3
    input biases followed by the 3 recurrent biases. This is the conversion
    tf-keras applies when it loads CuDNNGRU weights into
    `GRU(reset_after=True)`.

    Args:
        weights: list `[kernel, recurrent_kernel, bias]` of a CuDNNGRU layer,
            shapes `(D, 3U)`, `(U, 3U)`, `(6U,)`.

    Returns:
        List `[kernel (D, 3U), recurrent_kernel (U, 3U), bias (2, 3U)]` for
        `keras.layers.GRU(U, reset_after=True)`.

    Example:

    >>> legacy = [np.ones((3, 6)), np.ones((2, 6)), np.arange(12.0)]
    >>> cudnn_gru_to_gru(legacy)[2]
    array([[ 0.,  1.,  2.,  3.,  4.,  5.],
           [ 6.,  7.,  8.,  9., 10., 11.]])
    """
    kernel, recurrent_kernel, bias, units = _legacy_cudnn(
        weights, GRU_GATES, "weights", "CuDNNGRU"
    )
    # Per gate (order z, r, h kept): reinterpret the cuDNN matrix, transpose.
    kernel = map_gate_blocks(kernel, GRU_GATES, _cudnn_block_to_keras)
    recurrent_kernel = map_gate_blocks(
        recurrent_kernel, GRU_GATES, _cudnn_block_to_keras
    )
    # bias (6U,) = [input biases z,r,h | recurrent biases z,r,h] -> (2, 3U).
    return [kernel, recurrent_kernel, bias.reshape(2, 3 * units)]


def gru_to_cudnn_gru(weights):
    """Converts `keras.layers.GRU(reset_after=True)` weights to `CuDNNGRU`.

    Inverse of `cudnn_gru_to_gru` (see there for the layouts). Exact: no
    information is lost either way.

    Args:
        weights: list `[kernel (D, 3U), recurrent_kernel (U, 3U),
            bias (2, 3U)]` of a `keras.layers.GRU(U, reset_after=True)`.

    Returns:
        List `[kernel (D, 3U), recurrent_kernel (U, 3U), bias (6U,)]` for a
        `tf.compat.v1.keras.layers.CuDNNGRU`.

    Example:

    >>> keras_weights = [np.ones((3, 6)), np.ones((2, 6)), np.zeros((2, 6))]
    >>> [w.shape for w in gru_to_cudnn_gru(keras_weights)]
    [(3, 6), (2, 6), (12,)]
    """
    kernel, recurrent_kernel, bias, _, _ = _keras_gru(weights)
    # Per gate (order z, r, h kept): transpose, store in cuDNN memory order.
    kernel = map_gate_blocks(kernel, GRU_GATES, _keras_block_to_cudnn)
    recurrent_kernel = map_gate_blocks(
        recurrent_kernel, GRU_GATES, _keras_block_to_cudnn
    )
    # bias (2, 3U) = [input; recurrent] -> [input | recurrent] (6U,).
    return [kernel, recurrent_kernel, bias.reshape(-1)]


def cudnn_bidirectional_to_bidirectional(weights):
    """Converts legacy `Bidirectional(CuDNNLSTM/CuDNNGRU)` weights to Keras 3.

    The source is the `get_weights()` of a tf-keras
    `Bidirectional(tf.compat.v1.keras.layers.CuDNNLSTM(U))` (or `CuDNNGRU`):
    the forward layer's 3 weights, then the backward layer's 3 weights. Each
    half is converted with `cudnn_lstm_to_lstm` / `cudnn_gru_to_gru` (the
    type is read from the recurrent kernel's shape, `(U, 4U)` or
    `(U, 3U)`).

    Args:
        weights: list of 6 arrays `[fw_kernel, fw_recurrent_kernel, fw_bias,
            bw_kernel, bw_recurrent_kernel, bw_bias]` in legacy CuDNN layout.

    Returns:
        List of 6 arrays for `keras.layers.Bidirectional(keras.layers.LSTM(U))`
        (or `GRU(U, reset_after=True)`) or
        `maskedrnn.MaskedBidirectional` around the same layer.

    Example:

    >>> half = [np.ones((3, 8)), np.ones((2, 8)), np.zeros(16)]
    >>> [w.shape for w in cudnn_bidirectional_to_bidirectional(half + half)]
    [(3, 8), (2, 8), (8,), (3, 8), (2, 8), (8,)]
    """
    return _each_direction(weights, cudnn_lstm_to_lstm, cudnn_gru_to_gru)


def bidirectional_to_cudnn_bidirectional(weights):
    """Converts Keras 3 `Bidirectional(LSTM/GRU)` weights to legacy CuDNN.

    Inverse of `cudnn_bidirectional_to_bidirectional`: each half goes
    through `lstm_to_cudnn_lstm` or `gru_to_cudnn_gru` (type read from the
    recurrent kernel's shape).

    Args:
        weights: list of 6 arrays of a `keras.layers.Bidirectional` (or
            `maskedrnn.MaskedBidirectional`) around `LSTM(U)` or
            `GRU(U, reset_after=True)`: forward weights then backward weights.

    Returns:
        List of 6 arrays for a tf-keras
        `Bidirectional(tf.compat.v1.keras.layers.CuDNNLSTM(U))` (or
        `CuDNNGRU`).

    Example:

    >>> half = [np.ones((3, 8)), np.ones((2, 8)), np.zeros(8)]
    >>> [w.shape for w in bidirectional_to_cudnn_bidirectional(half + half)]
    [(3, 8), (2, 8), (16,), (3, 8), (2, 8), (16,)]
    """
    return _each_direction(weights, lstm_to_cudnn_lstm, gru_to_cudnn_gru)


def _each_direction(weights, lstm_fn, gru_fn):
    """Converts the forward then the backward 3 arrays of a bidirectional
    layer, with `lstm_fn` or `gru_fn` as the recurrent kernel's shape says
    (`(U, 4U)`: LSTM, `(U, 3U)`: GRU)."""
    weights = _array_list(weights, 6, "weights", "(forward then backward layer)")
    converted = []
    for start, direction in ((0, "forward"), (3, "backward")):
        half = weights[start : start + 3]
        _, gates = _units_and_gates(
            half[1], f"weights[{start + 1}] ({direction} recurrent_kernel)"
        )
        converted += (lstm_fn if gates == LSTM_GATES else gru_fn)(half)
    return converted


# ---------------------------------------------------------------------------
# Loading legacy .h5 files.
# ---------------------------------------------------------------------------


def _h5_attribute_list(group, name):
    """Reads a (possibly chunked) list-of-strings attribute like Keras does."""
    if name in group.attrs:
        values = list(group.attrs[name])
    else:
        # Keras splits large attributes into `name0`, `name1`, ...
        values, chunk = [], 0
        while f"{name}{chunk}" in group.attrs:
            values.extend(group.attrs[f"{name}{chunk}"])
            chunk += 1
        if not chunk:
            return None
    return [v.decode("utf8") if hasattr(v, "decode") else str(v) for v in values]


def _rnn_parts(layer):
    """Returns the RNN parts of `layer` as [(kind, reset_after), ...] or None.

    `kind` is "lstm" or "gru". A layer whose `cell` is a `keras.layers.
    LSTMCell`/`GRUCell` (i.e. `LSTM`, `GRU`, `RNN(LSTMCell(...))`) has one
    part; a wrapper exposing `forward_layer` and `backward_layer`
    (`keras.layers.Bidirectional`, `maskedrnn.MaskedBidirectional`) has the
    parts of both, forward first (the order of its weights).
    """
    cell = getattr(layer, "cell", None)
    if isinstance(cell, keras.layers.LSTMCell):
        return [("lstm", None)]
    if isinstance(cell, keras.layers.GRUCell):
        return [("gru", cell.reset_after)]
    forward = getattr(layer, "forward_layer", None)
    backward = getattr(layer, "backward_layer", None)
    if forward is not None and backward is not None:
        forward_parts, backward_parts = _rnn_parts(forward), _rnn_parts(backward)
        if forward_parts and backward_parts:
            return forward_parts + backward_parts
    return None


def _legacy_part_to_keras(kind, reset_after, arrays, where):
    """Converts one RNN's saved arrays if they are in legacy CuDNN layout."""
    if len(arrays) != 3:
        # CuDNN layers always have a bias: these are already Keras weights.
        return arrays
    units = arrays[1].shape[0] if arrays[1].ndim == 2 else 0
    if kind == "lstm" and arrays[2].shape == (8 * units,):
        return cudnn_lstm_to_lstm(arrays)
    if kind == "gru" and arrays[2].shape == (6 * units,):
        if not reset_after:
            raise ValueError(
                f"{where} holds CuDNNGRU weights but the target GRU has "
                "reset_after=False, which computes a different function. Build "
                "it with keras.layers.GRU(..., reset_after=True)."
            )
        return cudnn_gru_to_gru(arrays)
    return arrays


def load_legacy_cudnn_h5(filepath, model):
    """Loads a tf-keras `.h5` file with CuDNN RNN weights into a Keras 3 model.

    Keras 3 reads legacy `.h5` weights but no longer converts the weights of
    `tf.compat.v1.keras.layers.CuDNNLSTM` / `CuDNNGRU` layers. This function
    reads the file with `h5py`, matches saved layers with weights to the
    model's layers with weights by order (like
    `model.load_weights(filepath)`), converts every legacy CuDNN RNN's
    weights (`cudnn_lstm_to_lstm` / `cudnn_gru_to_gru`; inside
    `Bidirectional` each direction separately) and assigns them. Other
    layers' weights, and RNN weights already in Keras layout, are assigned
    unchanged. The saved architecture is not used: build the equivalent
    Keras 3 model yourself, with `keras.layers.LSTM` for `CuDNNLSTM`,
    `keras.layers.GRU(reset_after=True, recurrent_activation="sigmoid")`
    (the defaults) for `CuDNNGRU`, and `keras.layers.Bidirectional` or
    `maskedrnn.MaskedBidirectional` for `Bidirectional`.

    Args:
        filepath: path of an `.h5` file written by tf-keras / Keras 2
            `model.save(...)` (a `model_weights` group is used) or
            `model.save_weights(...)`.
        model: a built Keras 3 model whose layers with weights correspond, in
            order, to the saved layers with weights. RNN layers are recognized
            by their `cell` (`keras.layers.LSTMCell` / `GRUCell`), wrappers by
            their `forward_layer` / `backward_layer` attributes.

    Returns:
        None. The model's variables are assigned in place.

    Example:

    ```python
    # Saved by tf-keras: Bidirectional(CuDNNLSTM(64, return_sequences=True))
    # -> CuDNNGRU(32) -> Dense(1), on inputs of shape (None, 20, 8).
    inputs = keras.Input((20, 8))
    x = keras.layers.Bidirectional(
        keras.layers.LSTM(64, return_sequences=True))(inputs)
    x = keras.layers.GRU(32)(x)
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    maskedrnn.convert.load_legacy_cudnn_h5("legacy_model.h5", model)
    ```
    """
    if not isinstance(model, keras.layers.Layer):
        raise TypeError(f"`model` must be a Keras 3 model; got {type(model).__name__}.")
    import h5py  # Only here: `import maskedrnn` must not load h5py.

    filepath = os.fspath(filepath)
    with h5py.File(filepath, "r") as file:
        group = file["model_weights"] if "model_weights" in file else file
        layer_names = _h5_attribute_list(group, "layer_names")
        if layer_names is None:
            raise ValueError(
                f"`filepath` {filepath!r} is not a Keras HDF5 model or weights "
                "file (no `layer_names` attribute). Pass a file written by "
                "tf-keras `model.save('x.h5')` or `model.save_weights('x.h5')`."
            )
        saved = []
        for name in layer_names:
            weight_names = _h5_attribute_list(group[name], "weight_names") or []
            if weight_names:
                arrays = [np.asarray(group[name][w]) for w in weight_names]
                saved.append((name, arrays))
    targets = [layer for layer in model.layers if layer.weights]
    if len(saved) != len(targets):
        raise ValueError(
            f"The file {filepath!r} has {len(saved)} layers with weights "
            f"({[name for name, _ in saved]}) but `model` has {len(targets)} "
            f"({[layer.name for layer in targets]}). Build `model` with the "
            "same layers, in the same order, as the saved model (and build it, "
            "e.g. by calling it on a `keras.Input`, so its weights exist)."
        )
    assignments = []
    for (saved_name, arrays), layer in zip(saved, targets):
        variables = layer.trainable_weights + layer.non_trainable_weights
        where = f"Saved layer {saved_name!r} (model layer {layer.name!r})"
        if len(arrays) != len(variables):
            raise ValueError(
                f"{where} has {len(arrays)} saved weights but the model layer "
                f"has {len(variables)}. Check that the layers correspond "
                "(e.g. use_bias, Bidirectional vs. single direction)."
            )
        parts = _rnn_parts(layer)
        if parts is not None and len(arrays) % len(parts) == 0:
            per_part = len(arrays) // len(parts)
            converted = []
            for index, (kind, reset_after) in enumerate(parts):
                chunk = arrays[index * per_part : (index + 1) * per_part]
                converted += _legacy_part_to_keras(kind, reset_after, chunk, where)
            arrays = converted
        for variable, value in zip(variables, arrays):
            if tuple(variable.shape) != value.shape:
                raise ValueError(
                    f"{where}: weight {variable.path!r} has shape "
                    f"{tuple(variable.shape)} but the file holds shape "
                    f"{value.shape} after conversion. Check units, input size "
                    "and layer types (CuDNNLSTM -> LSTM, CuDNNGRU -> "
                    "GRU(reset_after=True))."
                )
            assignments.append((variable, value))
    # Assign only once everything has been checked, so a failure leaves the
    # model untouched.
    for variable, value in assignments:
        variable.assign(value)
