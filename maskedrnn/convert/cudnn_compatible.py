"""TF1 `CudnnCompatibleLSTMCell` / `CudnnCompatibleGRUCell` checkpoint variables.

Also the layout of `LSTMBlockCell`, `BasicLSTMCell` and `LSTMCell` without
peepholes or projection: one `[x, h]`-stacked kernel, LSTM gates in TF1's
order i, c, f, o.
"""

import numpy as np

from maskedrnn.convert._validate import _array, _check_shape, _keras_gru, _keras_lstm
from maskedrnn.convert.gate_layout import TF1_LSTM_SWAP_CF, reorder_gates, split_gates

__all__ = [
    "CUDNN_COMPATIBLE_GRU_CELL_VARIABLES",
    "CUDNN_COMPATIBLE_LSTM_CELL_VARIABLES",
    "cudnn_compatible_gru_cell_to_gru",
    "cudnn_compatible_lstm_cell_to_lstm",
    "gru_to_cudnn_compatible_gru_cell",
    "lstm_to_cudnn_compatible_lstm_cell",
]

#: `CudnnCompatibleLSTMCell` variable names under the cell's scope, in the
#: argument order of `cudnn_compatible_lstm_cell_to_lstm`.
CUDNN_COMPATIBLE_LSTM_CELL_VARIABLES = ("kernel", "bias")

#: `CudnnCompatibleGRUCell` variable names under the cell's scope, in the
#: argument order of `cudnn_compatible_gru_cell_to_gru`.
CUDNN_COMPATIBLE_GRU_CELL_VARIABLES = (
    "gates/kernel",
    "gates/bias",
    "candidate/input_projection/kernel",
    "candidate/input_projection/bias",
    "candidate/hidden_projection/kernel",
    "candidate/hidden_projection/bias",
)


def cudnn_compatible_lstm_cell_to_lstm(kernel, bias, forget_bias=0.0):
    """Converts `CudnnCompatibleLSTMCell` variables to `keras.layers.LSTM`.

    Also for TF1 `LSTMBlockCell`, `BasicLSTMCell` and `LSTMCell` without
    peepholes or projection: pass their `forget_bias` (1.0 by default there).

    Args:
        kernel: Array `(D + U, 4U)`: rows input then hidden-state features,
            gate column blocks i, c, f, o.
        bias: Array `(4U,)`, gates i, c, f, o.
        forget_bias: Float, the cell's constant forget-gate offset, added to
            the Keras forget-gate bias. Defaults to `0.0`.

    Returns:
        `[kernel (D, 4U), recurrent_kernel (U, 4U), bias (4U,)]` of
        `keras.layers.LSTM(U)`.

    Example:

    >>> w = cudnn_compatible_lstm_cell_to_lstm(np.ones((5, 8)), np.zeros(8))
    >>> [a.shape for a in w]
    [(3, 8), (2, 8), (8,)]
    """
    kernel = _array(kernel, "kernel")
    bias = _array(bias, "bias")
    if kernel.ndim != 2 or kernel.shape[1] % 4 or kernel.shape[1] == 0:
        raise ValueError(
            "`kernel` must have shape (input_dim + units, 4 * units); got "
            f"shape {kernel.shape}."
        )
    units = kernel.shape[1] // 4
    input_dim = kernel.shape[0] - units
    if input_dim < 1:
        raise ValueError(
            f"`kernel` has {kernel.shape[0]} rows but must have input_dim + "
            f"units rows with units = {units} (= columns / 4); got shape "
            f"{kernel.shape}."
        )
    _check_shape(bias, (4 * units,), "bias", "4 * units, gate order i, c, f, o")
    kernel = reorder_gates(kernel, TF1_LSTM_SWAP_CF, axis=1)
    bias = reorder_gates(bias, TF1_LSTM_SWAP_CF, axis=0)
    if forget_bias:
        bias = bias.copy()
        bias[units : 2 * units] += forget_bias  # Keras forget gate block.
    return [kernel[:input_dim], kernel[input_dim:], bias]


def lstm_to_cudnn_compatible_lstm_cell(weights):
    """Converts `keras.layers.LSTM` weights to `CudnnCompatibleLSTMCell` variables.

    Args:
        weights: `[kernel (D, 4U), recurrent_kernel (U, 4U), bias (4U,)]`.

    Returns:
        `[kernel (D + U, 4U), bias (4U,)]`, gates i, c, f, o.
    """
    kernel, recurrent_kernel, bias, _, _ = _keras_lstm(weights)
    stacked = np.concatenate([kernel, recurrent_kernel], axis=0)
    stacked = reorder_gates(stacked, TF1_LSTM_SWAP_CF, axis=1)
    bias = reorder_gates(bias, TF1_LSTM_SWAP_CF, axis=0)
    return [stacked, bias]


def cudnn_compatible_gru_cell_to_gru(
    gates_kernel,
    gates_bias,
    input_projection_kernel,
    input_projection_bias,
    hidden_projection_kernel,
    hidden_projection_bias,
):
    """Converts `CudnnCompatibleGRUCell` variables to `keras.layers.GRU`.

    The cell is Keras' `GRU(reset_after=True)` with its update gate `u` as `z`.

    Args:
        gates_kernel: `gates/kernel`, `(D + U, 2U)`: rows input then
            hidden-state features, column blocks r then u.
        gates_bias: `gates/bias`, `(2U,)`, r then u.
        input_projection_kernel: `candidate/input_projection/kernel`, `(D, U)`.
        input_projection_bias: `candidate/input_projection/bias`, `(U,)`.
        hidden_projection_kernel: `candidate/hidden_projection/kernel`,
            `(U, U)`.
        hidden_projection_bias: `candidate/hidden_projection/bias`, `(U,)`.

    Returns:
        `[kernel (D, 3U), recurrent_kernel (U, 3U), bias (2, 3U)]` of
        `keras.layers.GRU(U, reset_after=True)`; the r/u biases go into the
        input bias row.

    Example:

    >>> w = cudnn_compatible_gru_cell_to_gru(
    ...     np.ones((5, 4)), np.ones(4), np.ones((3, 2)), np.zeros(2),
    ...     np.ones((2, 2)), np.zeros(2))
    >>> [a.shape for a in w]
    [(3, 6), (2, 6), (2, 6)]
    """
    gates_kernel = _array(gates_kernel, "gates_kernel")
    gates_bias = _array(gates_bias, "gates_bias")
    input_kernel = _array(input_projection_kernel, "input_projection_kernel")
    input_bias = _array(input_projection_bias, "input_projection_bias")
    hidden_kernel = _array(hidden_projection_kernel, "hidden_projection_kernel")
    hidden_bias = _array(hidden_projection_bias, "hidden_projection_bias")
    if hidden_kernel.ndim != 2 or hidden_kernel.shape[0] == 0:
        raise ValueError(
            "`hidden_projection_kernel` must have shape (units, units); "
            f"got shape {hidden_kernel.shape}."
        )
    units = hidden_kernel.shape[0]
    _check_shape(hidden_kernel, (units, units), "hidden_projection_kernel", "U, U")
    if input_kernel.ndim != 2:
        raise ValueError(
            "`input_projection_kernel` must have shape (input_dim, units); "
            f"got shape {input_kernel.shape}."
        )
    input_dim = input_kernel.shape[0]
    _check_shape(input_kernel, (input_dim, units), "input_projection_kernel", "D, U")
    _check_shape(
        gates_kernel, (input_dim + units, 2 * units), "gates_kernel", "D + U, 2U"
    )
    _check_shape(gates_bias, (2 * units,), "gates_bias", "2U: r then u")
    _check_shape(input_bias, (units,), "input_projection_bias", "U")
    _check_shape(hidden_bias, (units,), "hidden_projection_bias", "U")
    r_block, z_block = split_gates(gates_kernel, 2, axis=1)
    r_bias, z_bias = split_gates(gates_bias, 2, axis=0)
    kernel = np.concatenate(
        [z_block[:input_dim], r_block[:input_dim], input_kernel], axis=1
    )
    recurrent_kernel = np.concatenate(
        [z_block[input_dim:], r_block[input_dim:], hidden_kernel], axis=1
    )
    zeros = np.zeros_like(hidden_bias)
    bias = np.stack(
        [
            np.concatenate([z_bias, r_bias, input_bias]),  # input biases
            np.concatenate([zeros, zeros, hidden_bias]),  # recurrent biases
        ]
    )
    return [kernel, recurrent_kernel, bias]


def gru_to_cudnn_compatible_gru_cell(weights):
    """Converts `GRU(reset_after=True)` weights to `CudnnCompatibleGRUCell` ones.

    Args:
        weights: `[kernel (D, 3U), recurrent_kernel (U, 3U), bias (2, 3U)]`.

    Returns:
        The 6 variables in the order of `CUDNN_COMPATIBLE_GRU_CELL_VARIABLES`,
        z and r biases summed into `gates/bias`.
    """
    kernel, recurrent_kernel, bias, _, _ = _keras_gru(weights)
    k_z, k_r, k_h = split_gates(kernel, 3, axis=1)
    r_z, r_r, r_h = split_gates(recurrent_kernel, 3, axis=1)
    bi_z, bi_r, bi_h = split_gates(bias[0], 3, axis=0)
    br_z, br_r, br_h = split_gates(bias[1], 3, axis=0)
    gates_kernel = np.concatenate(
        [np.concatenate([k_r, r_r], axis=0), np.concatenate([k_z, r_z], axis=0)],
        axis=1,
    )  # column blocks r, u(=z)
    gates_bias = np.concatenate([bi_r + br_r, bi_z + br_z])
    return [gates_kernel, gates_bias, k_h, bi_h, r_h, br_h]
