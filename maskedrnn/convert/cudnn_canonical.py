"""TF1 `CudnnLSTM` / `CudnnGRU` canonical parameters (`CudnnRNNParamsToCanonical`).

One layer and direction is a list of per-gate matrices in cuDNN's gate order,
`(U, D)` for the input and `(U, U)` for the recurrent state, plus one `(U,)`
bias per matrix; a stack is their concatenation, layer by layer, forward
before backward.
"""

import numpy as np

from maskedrnn.convert._validate import (
    _array_list,
    _check_shape,
    _keras_gru,
    _keras_lstm,
    _layers_list,
    _units_and_gates,
)
from maskedrnn.convert.gate_layout import (
    GRU_GATES,
    LSTM_GATES,
    halve_bias,
    split_gates,
    swap_gru_zr,
)

__all__ = [
    "cudnn_canonical_gru_to_gru",
    "cudnn_canonical_lstm_to_lstm",
    "cudnn_canonical_to_keras",
    "gru_to_cudnn_canonical_gru",
    "keras_to_cudnn_canonical",
    "lstm_to_cudnn_canonical_lstm",
]


def _canonical_matrices(weights, biases, n_gates, name_w, name_b, layer_name):
    """Validates one pseudo-layer's canonical params; returns arrays, D, U."""
    n = 2 * n_gates
    biases = _array_list(biases, n, name_b, f"(the {n} biases of a {layer_name})")
    units = biases[0].shape[0] if biases[0].ndim == 1 else 0
    for i, b in enumerate(biases):
        _check_shape(b, (units,), f"{name_b}[{i}]", "one gate bias (units,)")
    weights = _array_list(
        weights, n, name_w, f"(the {n} weight matrices of a {layer_name})"
    )
    if units == 0:
        raise ValueError(f"`{name_b}` must hold non-empty (units,) vectors.")
    input_dim = weights[0].size // units
    for i, w in enumerate(weights):
        rows = input_dim if i < n_gates else units
        if w.ndim == 1 and w.shape == (units * rows,):
            # Flattened canonical matrix: cuDNN stores it row-major.
            w = w.reshape(units, rows)
        _check_shape(
            w,
            (units, rows),
            f"{name_w}[{i}]",
            "cuDNN canonical matrix (units, "
            + ("input_size" if i < n_gates else "units")
            + ") or its row-major flattening",
        )
        weights[i] = w
    return weights, biases, input_dim, units


def cudnn_canonical_lstm_to_lstm(weights, biases):
    """Converts one layer of cuDNN canonical LSTM params to `keras.layers.LSTM`.

    Args:
        weights: The 8 matrices `[W_i, W_f, W_c, W_o (U, D), R_i, R_f, R_c,
            R_o (U, U)]` (or their row-major flattenings).
        biases: The 8 `(U,)` vectors `[bW_i, ..., bW_o, bR_i, ..., bR_o]`.

    Returns:
        `[kernel (D, 4U), recurrent_kernel (U, 4U), bias (4U,)]`,
        `bias = bW + bR`.

    Example:

    >>> w = [np.ones((2, 3))] * 4 + [np.ones((2, 2))] * 4
    >>> [a.shape for a in cudnn_canonical_lstm_to_lstm(w, [np.zeros(2)] * 8)]
    [(3, 8), (2, 8), (8,)]
    """
    weights, biases, _, _ = _canonical_matrices(
        weights, biases, LSTM_GATES, "weights", "biases", "cuDNN LSTM layer"
    )
    kernel = np.concatenate([w.T for w in weights[:4]], axis=1)
    recurrent_kernel = np.concatenate([r.T for r in weights[4:]], axis=1)
    bias = np.concatenate(biases[:4]) + np.concatenate(biases[4:])
    return [kernel, recurrent_kernel, bias]


def lstm_to_cudnn_canonical_lstm(weights):
    """Converts `keras.layers.LSTM` weights to cuDNN canonical LSTM params.

    Args:
        weights: `[kernel (D, 4U), recurrent_kernel (U, 4U), bias (4U,)]`.

    Returns:
        A tuple `(weights, biases)` of 8 matrices and 8 `(U,)` vectors, the
        Keras bias halved into `bW` and `bR` (as TF's `CudnnLSTMSaveable`).
    """
    kernel, recurrent_kernel, bias, _, _ = _keras_lstm(weights)
    matrices = [k.T for k in split_gates(kernel, LSTM_GATES, axis=1)]
    matrices += [r.T for r in split_gates(recurrent_kernel, LSTM_GATES, axis=1)]
    half = halve_bias(bias)
    biases = split_gates(half, LSTM_GATES, axis=0) * 2
    return [np.ascontiguousarray(m) for m in matrices], biases


def cudnn_canonical_gru_to_gru(weights, biases):
    """Converts one layer of cuDNN canonical GRU params to `GRU(reset_after=True)`.

    Args:
        weights: The 6 matrices `[W_r, W_z, W_h (U, D), R_r, R_z, R_h (U, U)]`
            (or their row-major flattenings).
        biases: The 6 `(U,)` vectors `[bW_r, bW_z, bW_h, bR_r, bR_z, bR_h]`.

    Returns:
        `[kernel (D, 3U), recurrent_kernel (U, 3U), bias (2, 3U)]`, exact.
    """
    weights, biases, _, _ = _canonical_matrices(
        weights, biases, GRU_GATES, "weights", "biases", "cuDNN GRU layer"
    )
    kernel = swap_gru_zr(np.concatenate([w.T for w in weights[:3]], axis=1))
    recurrent_kernel = swap_gru_zr(np.concatenate([r.T for r in weights[3:]], axis=1))
    bias = swap_gru_zr(
        np.stack([np.concatenate(biases[:3]), np.concatenate(biases[3:])])
    )
    return [kernel, recurrent_kernel, bias]


def gru_to_cudnn_canonical_gru(weights):
    """Converts `GRU(reset_after=True)` weights to cuDNN canonical params, exactly.

    Args:
        weights: `[kernel (D, 3U), recurrent_kernel (U, 3U), bias (2, 3U)]`.

    Returns:
        A tuple `(weights, biases)` of 6 matrices (gates r, z, h) and 6 vectors.
    """
    kernel, recurrent_kernel, bias, _, _ = _keras_gru(weights)
    matrices = [
        np.ascontiguousarray(block.T)
        for matrix in (kernel, recurrent_kernel)
        for block in split_gates(swap_gru_zr(matrix), GRU_GATES, axis=1)
    ]
    bias = swap_gru_zr(bias)
    biases = split_gates(bias[0], GRU_GATES, axis=0)
    biases += split_gates(bias[1], GRU_GATES, axis=0)
    return matrices, biases


def _check_mode(rnn_mode):
    if rnn_mode not in ("lstm", "gru"):
        raise ValueError(f'`rnn_mode` must be "lstm" or "gru"; got {rnn_mode!r}.')


def cudnn_canonical_to_keras(weights, biases, rnn_mode, bidirectional=False):
    """Converts a whole (multi-layer) cuDNN canonical param set to Keras.

    Args:
        weights: Flat list of all canonical matrices.
        biases: Flat list of all canonical bias vectors.
        rnn_mode: `"lstm"` or `"gru"`.
        bidirectional: Bool. Defaults to `False`.

    Returns:
        One entry per layer: the 3 weights of `LSTM(U)` / `GRU(U,
        reset_after=True)`, or the 6 of a bidirectional wrapper around it.

    Example:

    >>> w = ([np.ones((2, 3))] * 4 + [np.ones((2, 2))] * 4
    ...      + [np.ones((2, 2))] * 8)
    >>> layers = cudnn_canonical_to_keras(w, [np.zeros(2)] * 16, "lstm")
    >>> [[a.shape for a in layer] for layer in layers]
    [[(3, 8), (2, 8), (8,)], [(2, 8), (2, 8), (8,)]]
    """
    _check_mode(rnn_mode)
    if not isinstance(bidirectional, bool):
        raise TypeError(f"`bidirectional` must be a bool; got {bidirectional!r}.")
    per_direction = 2 * (LSTM_GATES if rnn_mode == "lstm" else GRU_GATES)
    directions = 2 if bidirectional else 1
    for value, name in ((weights, "weights"), (biases, "biases")):
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"`{name}` must be a list of arrays.")
        if not value or len(value) % (per_direction * directions):
            raise ValueError(
                f"`{name}` must hold {per_direction} arrays per layer and "
                f"direction for rnn_mode={rnn_mode!r}, "
                f"bidirectional={bidirectional}; got {len(value)}."
            )
    if len(weights) != len(biases):
        raise ValueError(
            f"`weights` and `biases` must have the same length; got "
            f"{len(weights)} and {len(biases)}."
        )
    convert = (
        cudnn_canonical_lstm_to_lstm
        if rnn_mode == "lstm"
        else cudnn_canonical_gru_to_gru
    )
    layers = []
    groups = len(weights) // per_direction
    for layer_start in range(0, groups, directions):
        layer = []
        for group in range(layer_start, layer_start + directions):
            chunk = slice(group * per_direction, (group + 1) * per_direction)
            layer += convert(list(weights[chunk]), list(biases[chunk]))
        layers.append(layer)
    return layers


def keras_to_cudnn_canonical(layers_weights):
    """Converts stacked Keras LSTM/GRU (or bidirectional) weights to cuDNN.

    Args:
        layers_weights: One entry per layer, 3 or 6 arrays, all of the same
            type and direction count.

    Returns:
        A tuple `(weights, biases)` of flat lists, as
        `CudnnRNNCanonicalToParams` takes them.
    """
    layers = _layers_list(layers_weights)
    kinds, directions = set(), set()
    weights, biases = [], []
    for index, layer in enumerate(layers):
        if len(layer) not in (3, 6):
            raise ValueError(
                f"`layers_weights[{index}]` must hold 3 arrays (LSTM/GRU) or 6 "
                f"(Bidirectional); got {len(layer)}."
            )
        directions.add(len(layer) // 3)
        for start in range(0, len(layer), 3):
            part = _array_list(
                list(layer[start : start + 3]),
                3,
                f"layers_weights[{index}][{start}:{start + 3}]",
                "[kernel, recurrent_kernel, bias]",
            )
            _, gates = _units_and_gates(
                part[1], f"layers_weights[{index}][{start + 1}]"
            )
            kinds.add(gates)
            if gates == LSTM_GATES:
                w, b = lstm_to_cudnn_canonical_lstm(part)
            else:
                w, b = gru_to_cudnn_canonical_gru(part)
            weights += w
            biases += b
    if len(kinds) > 1 or len(directions) > 1:
        raise ValueError(
            "All entries of `layers_weights` must be the same RNN type (all "
            "LSTM or all GRU) and all unidirectional or all bidirectional, as "
            "in one cuDNN RNN."
        )
    return weights, biases
