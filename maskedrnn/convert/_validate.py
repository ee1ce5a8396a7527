"""Argument checks shared by the converters: arrays, Keras LSTM/GRU weight lists.

Every converter accepts anything `np.asarray` accepts; these helpers turn
arguments into arrays and reject wrong shapes with an error that names the
argument, the expected layout and what it got.
"""

import numpy as np

from maskedrnn.convert.gate_layout import GRU_GATES, LSTM_GATES, SIMPLE_RNN_GATES


def _array(value, name):
    """Returns `np.asarray(value)`, or raises an error naming `name`."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"`{name}` must be array-like (anything `np.asarray` accepts; for a "
            "torch tensor call `.detach().cpu()` first); got "
            f"{type(value).__name__}: {error}"
        ) from error
    if array.dtype.kind not in "fiu":
        raise TypeError(f"`{name}` must hold real numbers; got dtype {array.dtype}.")
    return array


def _array_list(values, length, name, what):
    """Checks `values` is a list/tuple of `length` arrays; returns arrays."""
    if isinstance(values, np.ndarray) or not isinstance(values, (list, tuple)):
        raise TypeError(
            f"`{name}` must be a list of {length} arrays {what}; got "
            f"{type(values).__name__}."
        )
    if len(values) != length:
        raise ValueError(
            f"`{name}` must be a list of {length} arrays {what}; got "
            f"{len(values)} arrays."
        )
    return [_array(v, f"{name}[{i}]") for i, v in enumerate(values)]


def _check_shape(array, shape, name, hint):
    if array.shape != tuple(shape):
        raise ValueError(
            f"`{name}` must have shape {tuple(shape)} ({hint}); got shape "
            f"{array.shape}."
        )


def _units_and_gates(recurrent_kernel, name, simple_rnn=False):
    """Returns (U, number of gates) from a (U, gates * U) recurrent matrix:
    4 (LSTM) or 3 (GRU), and 1 (SimpleRNN) where `simple_rnn` is True (the
    formats that have one: PyTorch's `nn.RNN`)."""
    if recurrent_kernel.ndim != 2 or recurrent_kernel.shape[0] == 0:
        raise ValueError(
            f"`{name}` must be a 2-D recurrent kernel of shape (units, "
            f"gates * units); got shape {recurrent_kernel.shape}."
        )
    units, columns = recurrent_kernel.shape
    allowed = (GRU_GATES, LSTM_GATES) + ((SIMPLE_RNN_GATES,) if simple_rnn else ())
    if columns % units or columns // units not in allowed:
        also = " or (units, units) for a SimpleRNN" if simple_rnn else ""
        raise ValueError(
            f"`{name}` must have shape (units, 4 * units) for an LSTM or "
            f"(units, 3 * units) for a GRU{also}; got shape "
            f"{recurrent_kernel.shape}."
        )
    return units, columns // units


def _blocks(n_gates):
    """"4 * units", or "units" for one block."""
    return "units" if n_gates == 1 else f"{n_gates} * units"


def _keras_summed_bias(weights, n_gates, layer_name, name):
    """Validates `[kernel (D, G*U), recurrent_kernel (U, G*U), bias (G*U,)]`
    of a Keras layer with one bias (LSTM, SimpleRNN); returns
    (kernel, rk, bias, D, U)."""
    what = f"of a keras {layer_name}"
    kernel, recurrent_kernel, bias = _array_list(
        weights, 3, name, f"[kernel, recurrent_kernel, bias] {what}"
    )
    units = recurrent_kernel.shape[0] if recurrent_kernel.ndim == 2 else 0
    _check_shape(
        recurrent_kernel,
        (units, n_gates * units),
        f"{name}[1]",
        f"recurrent_kernel (units, {_blocks(n_gates)}) {what}",
    )
    if kernel.ndim != 2:
        raise ValueError(
            f"`{name}[0]` must be the 2-D kernel (input_dim, {_blocks(n_gates)}); "
            f"got shape {kernel.shape}."
        )
    _check_shape(
        kernel, (kernel.shape[0], n_gates * units), f"{name}[0]", f"kernel {what}"
    )
    _check_shape(bias, (n_gates * units,), f"{name}[2]", f"bias {what}")
    return kernel, recurrent_kernel, bias, kernel.shape[0], units


def _keras_lstm(weights, name="weights"):
    """Validates Keras LSTM weights; returns (kernel, rk, bias, D, U)."""
    return _keras_summed_bias(weights, LSTM_GATES, "LSTM", name)


def _keras_gru(weights, name="weights"):
    """Validates Keras GRU(reset_after=True) weights."""
    kernel, recurrent_kernel, bias = _array_list(
        weights,
        3,
        name,
        "[kernel, recurrent_kernel, bias] of a keras GRU(reset_after=True)",
    )
    units = recurrent_kernel.shape[0] if recurrent_kernel.ndim == 2 else 0
    _check_shape(
        recurrent_kernel,
        (units, 3 * units),
        f"{name}[1]",
        "recurrent_kernel (units, 3 * units) of a keras GRU",
    )
    if kernel.ndim != 2:
        raise ValueError(
            f"`{name}[0]` must be the 2-D kernel (input_dim, 3 * units); "
            f"got shape {kernel.shape}."
        )
    _check_shape(
        kernel, (kernel.shape[0], 3 * units), f"{name}[0]", "kernel of a keras GRU"
    )
    if bias.shape == (3 * units,):
        raise ValueError(
            f"`{name}[2]` has shape {bias.shape}: these are the weights of a "
            "keras GRU(reset_after=False), which computes a different function "
            "from cuDNN and PyTorch GRUs (the reset gate is applied before the "
            "recurrent matmul) and cannot be converted. Use "
            "keras.layers.GRU(..., reset_after=True) (the default)."
        )
    _check_shape(
        bias,
        (2, 3 * units),
        f"{name}[2]",
        "bias [input_bias; recurrent_bias] of a keras GRU(reset_after=True)",
    )
    return kernel, recurrent_kernel, bias, kernel.shape[0], units


def _keras_without_bias(weights, n_gates, layer_name):
    """Validates `[kernel, recurrent_kernel]` of a Keras RNN(use_bias=False)."""
    kernel, recurrent_kernel = _array_list(
        weights, 2, "weights", f"[kernel, recurrent_kernel] of a keras {layer_name}"
    )
    units = recurrent_kernel.shape[0] if recurrent_kernel.ndim == 2 else 0
    _check_shape(
        recurrent_kernel,
        (units, n_gates * units),
        "weights[1]",
        f"recurrent_kernel (units, {n_gates} * units) of a keras {layer_name}",
    )
    if kernel.ndim != 2:
        raise ValueError(
            f"`weights[0]` must be the 2-D kernel (input_dim, {n_gates} * units); "
            f"got shape {kernel.shape}."
        )
    _check_shape(
        kernel,
        (kernel.shape[0], n_gates * units),
        "weights[0]",
        f"kernel of a keras {layer_name}",
    )
    return kernel, recurrent_kernel


def _keras_simple_rnn(weights, name="weights"):
    """Validates Keras SimpleRNN weights; returns (kernel, rk, bias, D, U)."""
    return _keras_summed_bias(weights, SIMPLE_RNN_GATES, "SimpleRNN", name)


def _layers_list(layers_weights):
    if isinstance(layers_weights, np.ndarray) or not isinstance(
        layers_weights, (list, tuple)
    ):
        raise TypeError(
            "`layers_weights` must be a list with one list of arrays per layer, "
            f"e.g. [layer.get_weights()]; got {type(layers_weights).__name__}."
        )
    if not layers_weights:
        raise ValueError("`layers_weights` must hold at least one layer.")
    for index, layer in enumerate(layers_weights):
        if not isinstance(layer, (list, tuple)):
            raise TypeError(
                f"`layers_weights[{index}]` must be a list of arrays (one layer's "
                f"weights); got {type(layer).__name__}. For a single layer "
                "pass [layer.get_weights()]."
            )
    return layers_weights
