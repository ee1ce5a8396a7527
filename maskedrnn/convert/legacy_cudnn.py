"""Legacy `CuDNNLSTM` / `CuDNNGRU` layers (tf-keras, Keras 2) and their `.h5` files.

Their weights have Keras' shapes, but each gate block holds a cuDNN matrix
in memory order and the bias is `[input biases | recurrent biases]` (see
`docs/convert.md`).
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
    """Converts one gate block: cuDNN reads the `(rows, U)` slice as `(U, rows)`.

    Same as tf-keras' `block.T.reshape(block.shape, order="F")`.
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

    Args:
        weights: `[kernel (D, 4U), recurrent_kernel (U, 4U), bias (8U,)]`.

    Returns:
        `[kernel (D, 4U), recurrent_kernel (U, 4U), bias (4U,)]`, the two cuDNN
        biases summed.

    Example:

    >>> legacy = [np.ones((3, 8)), np.ones((2, 8)), np.zeros(16)]
    >>> [w.shape for w in cudnn_lstm_to_lstm(legacy)]
    [(3, 8), (2, 8), (8,)]
    """
    kernel, recurrent_kernel, bias, units = _legacy_cudnn(
        weights, LSTM_GATES, "weights", "CuDNNLSTM"
    )
    kernel = map_gate_blocks(kernel, LSTM_GATES, _cudnn_block_to_keras)
    recurrent_kernel = map_gate_blocks(
        recurrent_kernel, LSTM_GATES, _cudnn_block_to_keras
    )
    bias = bias[: 4 * units] + bias[4 * units :]
    return [kernel, recurrent_kernel, bias]


def lstm_to_cudnn_lstm(weights):
    """Converts `keras.layers.LSTM` weights to legacy `CuDNNLSTM` weights.

    Args:
        weights: `[kernel (D, 4U), recurrent_kernel (U, 4U), bias (4U,)]`.

    Returns:
        `[kernel (D, 4U), recurrent_kernel (U, 4U), bias (8U,)]`, half of the
        Keras bias in each cuDNN bias, as tf-keras writes.
    """
    kernel, recurrent_kernel, bias, _, _ = _keras_lstm(weights)
    kernel = map_gate_blocks(kernel, LSTM_GATES, _keras_block_to_cudnn)
    recurrent_kernel = map_gate_blocks(
        recurrent_kernel, LSTM_GATES, _keras_block_to_cudnn
    )
    half = halve_bias(bias)
    return [kernel, recurrent_kernel, np.concatenate([half, half])]


def cudnn_gru_to_gru(weights):
    """Converts legacy `CuDNNGRU` weights to `keras.layers.GRU` weights, exactly.

    Args:
        weights: `[kernel (D, 3U), recurrent_kernel (U, 3U), bias (6U,)]`.

    Returns:
        `[kernel (D, 3U), recurrent_kernel (U, 3U), bias (2, 3U)]` of
        `GRU(U, reset_after=True)`.

    Example:

    >>> legacy = [np.ones((3, 6)), np.ones((2, 6)), np.arange(12.0)]
    >>> cudnn_gru_to_gru(legacy)[2]
    array([[ 0.,  1.,  2.,  3.,  4.,  5.],
           [ 6.,  7.,  8.,  9., 10., 11.]])
    """
    kernel, recurrent_kernel, bias, units = _legacy_cudnn(
        weights, GRU_GATES, "weights", "CuDNNGRU"
    )
    kernel = map_gate_blocks(kernel, GRU_GATES, _cudnn_block_to_keras)
    recurrent_kernel = map_gate_blocks(
        recurrent_kernel, GRU_GATES, _cudnn_block_to_keras
    )
    return [kernel, recurrent_kernel, bias.reshape(2, 3 * units)]


def gru_to_cudnn_gru(weights):
    """Converts `GRU(reset_after=True)` weights to legacy `CuDNNGRU`, exactly.

    Args:
        weights: `[kernel (D, 3U), recurrent_kernel (U, 3U), bias (2, 3U)]`.

    Returns:
        `[kernel (D, 3U), recurrent_kernel (U, 3U), bias (6U,)]`.
    """
    kernel, recurrent_kernel, bias, _, _ = _keras_gru(weights)
    kernel = map_gate_blocks(kernel, GRU_GATES, _keras_block_to_cudnn)
    recurrent_kernel = map_gate_blocks(
        recurrent_kernel, GRU_GATES, _keras_block_to_cudnn
    )
    return [kernel, recurrent_kernel, bias.reshape(-1)]


def cudnn_bidirectional_to_bidirectional(weights):
    """Converts legacy `Bidirectional(CuDNNLSTM/CuDNNGRU)` weights to Keras 3.

    Args:
        weights: The 6 arrays of the legacy layer, forward then backward.

    Returns:
        The 6 arrays of a `Bidirectional` or `MaskedBidirectional` around
        `LSTM(U)` or `GRU(U, reset_after=True)`.

    Example:

    >>> half = [np.ones((3, 8)), np.ones((2, 8)), np.zeros(16)]
    >>> [w.shape for w in cudnn_bidirectional_to_bidirectional(half + half)]
    [(3, 8), (2, 8), (8,), (3, 8), (2, 8), (8,)]
    """
    return _each_direction(weights, cudnn_lstm_to_lstm, cudnn_gru_to_gru)


def bidirectional_to_cudnn_bidirectional(weights):
    """Converts Keras 3 `Bidirectional(LSTM/GRU)` weights to legacy CuDNN.

    Args:
        weights: The 6 arrays of a `Bidirectional` or `MaskedBidirectional`.

    Returns:
        The 6 arrays of a tf-keras `Bidirectional(CuDNNLSTM/CuDNNGRU)`.
    """
    return _each_direction(weights, lstm_to_cudnn_lstm, gru_to_cudnn_gru)


def _each_direction(weights, lstm_fn, gru_fn):
    """Converts each half with `lstm_fn` or `gru_fn`, by its recurrent kernel."""
    weights = _array_list(weights, 6, "weights", "(forward then backward layer)")
    converted = []
    for start, direction in ((0, "forward"), (3, "backward")):
        half = weights[start : start + 3]
        _, gates = _units_and_gates(
            half[1], f"weights[{start + 1}] ({direction} recurrent_kernel)"
        )
        converted += (lstm_fn if gates == LSTM_GATES else gru_fn)(half)
    return converted


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
    """`[(kind, reset_after), ...]` of an RNN or bidirectional wrapper, else None."""
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

    Keras 3 no longer converts CuDNN RNN weights. Saved layers with weights
    are matched to `model`'s by order; CuDNN-layout RNN weights are converted,
    others copied; nothing is assigned unless all fit. Build the model with
    `LSTM` for `CuDNNLSTM` and `GRU(reset_after=True)` for `CuDNNGRU`.

    Args:
        filepath: Path of an `.h5` file from tf-keras `model.save()` or
            `model.save_weights()`.
        model: A built Keras 3 model whose layers with weights correspond, in
            order, to the saved ones.

    Returns:
        None; the model's variables are assigned in place.

    Example:

    ```python
    inputs = keras.Input((20, 8))  # saved: Bidirectional(CuDNNLSTM), CuDNNGRU
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
    # Assign only after every check, so a failure leaves the model untouched.
    for variable, value in assignments:
        variable.assign(value)
