"""Convert recurrent-layer weights between other layouts and Keras 3.

The converters are pure numpy: they take arrays (anything `np.asarray`
accepts, e.g. `layer.get_weights()`, `h5py` datasets, CPU `torch` tensors from
a `state_dict()`) or lists of them, and return `np.ndarray`s or lists of
them, keeping the input dtype. Function names say the direction:
`<source>_to_<target>`.

Keras 3 layouts (the target/source of every function here), with `D` the
input feature size and `U` the number of units:

- `keras.layers.LSTM`: `[kernel (D, 4U), recurrent_kernel (U, 4U),
  bias (4U,)]`, gate column blocks in order i (input), f (forget),
  c (cell candidate), o (output).
- `keras.layers.GRU(reset_after=True)`: `[kernel (D, 3U),
  recurrent_kernel (U, 3U), bias (2, 3U)]`, gate column blocks in order
  z (update), r (reset), h (candidate); `bias[0]` is the input bias and
  `bias[1]` the recurrent bias (the one multiplied by the reset gate for h).
  `GRU(reset_after=False)` computes a different function and cannot hold
  cuDNN/PyTorch GRU weights.
- `keras.layers.Bidirectional` (and `maskedrnn.MaskedBidirectional`): the
  forward layer's weights followed by the backward layer's weights.

Sources: legacy `tf.compat.v1.keras.layers.CuDNNLSTM`/`CuDNNGRU` (and their
`.h5` files, see `load_legacy_cudnn_h5`), TF1 `CudnnLSTM`/`CudnnGRU`
canonical parameters, TF1 `CudnnCompatibleLSTMCell`/`CudnnCompatibleGRUCell`
checkpoint variables, and PyTorch `nn.LSTM`/`nn.GRU` state dicts. See
`docs/convert.md` for the full layout tables.
"""

import os

import h5py
import keras
import numpy as np

_LSTM_GATES = 4
_GRU_GATES = 3

#: Names of the `CudnnCompatibleLSTMCell` checkpoint variables (relative to
#: the cell's variable scope, e.g. `rnn/multi_rnn_cell/cell_0/
#: cudnn_compatible_lstm_cell/`), in the argument order of
#: `cudnn_compatible_lstm_cell_to_lstm`.
CUDNN_COMPATIBLE_LSTM_CELL_VARIABLES = ("kernel", "bias")

#: Names of the `CudnnCompatibleGRUCell` checkpoint variables (relative to
#: the cell's variable scope, e.g. `rnn/multi_rnn_cell/cell_0/
#: cudnn_compatible_gru_cell/`), in the argument order of
#: `cudnn_compatible_gru_cell_to_gru`.
CUDNN_COMPATIBLE_GRU_CELL_VARIABLES = (
    "gates/kernel",
    "gates/bias",
    "candidate/input_projection/kernel",
    "candidate/input_projection/bias",
    "candidate/hidden_projection/kernel",
    "candidate/hidden_projection/bias",
)


# ---------------------------------------------------------------------------
# Argument checking helpers.
# ---------------------------------------------------------------------------


def _array(value, name):
    """Returns `np.asarray(value)`, or raises an error naming `name`."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"`{name}` must be array-like (anything `np.asarray` accepts; for a "
            "torch tensor call `.detach().cpu()` first). Received "
            f"{type(value).__name__}: {error}"
        ) from error
    if array.dtype.kind not in "fiu":
        raise TypeError(
            f"`{name}` must hold real numbers; received dtype {array.dtype}."
        )
    return array


def _array_list(values, length, name, what):
    """Checks `values` is a list/tuple of `length` arrays; returns arrays."""
    if isinstance(values, np.ndarray) or not isinstance(values, (list, tuple)):
        raise TypeError(
            f"`{name}` must be a list of {length} arrays {what}; received "
            f"{type(values).__name__}."
        )
    if len(values) != length:
        raise ValueError(
            f"`{name}` must be a list of {length} arrays {what}; received "
            f"{len(values)} arrays."
        )
    return [_array(v, f"{name}[{i}]") for i, v in enumerate(values)]


def _check_shape(array, shape, name, hint):
    if array.shape != tuple(shape):
        raise ValueError(
            f"`{name}` must have shape {tuple(shape)} ({hint}); received shape "
            f"{array.shape}."
        )


def _units_and_gates(recurrent_kernel, name):
    """Returns (U, number of gates) from a (U, gates * U) recurrent matrix."""
    if recurrent_kernel.ndim != 2 or recurrent_kernel.shape[0] == 0:
        raise ValueError(
            f"`{name}` must be a 2-D recurrent kernel of shape (units, "
            f"gates * units); received shape {recurrent_kernel.shape}."
        )
    units, columns = recurrent_kernel.shape
    if columns % units or columns // units not in (_GRU_GATES, _LSTM_GATES):
        raise ValueError(
            f"`{name}` must have shape (units, 4 * units) for an LSTM or "
            f"(units, 3 * units) for a GRU; received shape "
            f"{recurrent_kernel.shape}."
        )
    return units, columns // units


def _keras_lstm(weights, name="weights"):
    """Validates Keras LSTM weights; returns (kernel, rk, bias, D, U)."""
    kernel, recurrent_kernel, bias = _array_list(
        weights, 3, name, "[kernel, recurrent_kernel, bias] of a keras LSTM"
    )
    units = recurrent_kernel.shape[0] if recurrent_kernel.ndim == 2 else 0
    _check_shape(
        recurrent_kernel,
        (units, 4 * units),
        f"{name}[1]",
        "recurrent_kernel (units, 4 * units) of a keras LSTM",
    )
    if kernel.ndim != 2:
        raise ValueError(
            f"`{name}[0]` must be the 2-D kernel (input_dim, 4 * units); "
            f"received shape {kernel.shape}."
        )
    _check_shape(
        kernel, (kernel.shape[0], 4 * units), f"{name}[0]", "kernel of a keras LSTM"
    )
    _check_shape(bias, (4 * units,), f"{name}[2]", "bias of a keras LSTM")
    return kernel, recurrent_kernel, bias, kernel.shape[0], units


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
            f"received shape {kernel.shape}."
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
            f"received shape {kernel.shape}."
        )
    _check_shape(
        kernel,
        (kernel.shape[0], n_gates * units),
        "weights[0]",
        f"kernel of a keras {layer_name}",
    )
    return kernel, recurrent_kernel


def _split_gates(matrix, n_gates, axis):
    return np.split(matrix, n_gates, axis=axis)


# Keras gate order z, r, h  <->  cuDNN / PyTorch gate order r, z, h(n): the
# permutation swaps the first two gate blocks and is its own inverse.
_GRU_SWAP_ZR = (1, 0, 2)


def _reorder(blocks, order):
    return [blocks[i] for i in order]


# ---------------------------------------------------------------------------
# Legacy tf.compat.v1.keras.layers.CuDNNLSTM / CuDNNGRU.
# ---------------------------------------------------------------------------


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


def _map_gate_blocks(matrix, n_gates, fn):
    # Apply `fn` to each gate's column block, keeping the gate order.
    return np.concatenate(
        [fn(block) for block in _split_gates(matrix, n_gates, axis=1)], axis=1
    )


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
            f"of a {layer_name}; received shape {kernel.shape}."
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
        weights, _LSTM_GATES, "weights", "CuDNNLSTM"
    )
    # Per gate (order i, f, c, o kept): reinterpret the cuDNN matrix, transpose.
    kernel = _map_gate_blocks(kernel, _LSTM_GATES, _cudnn_block_to_keras)
    recurrent_kernel = _map_gate_blocks(
        recurrent_kernel, _LSTM_GATES, _cudnn_block_to_keras
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
    kernel = _map_gate_blocks(kernel, _LSTM_GATES, _keras_block_to_cudnn)
    recurrent_kernel = _map_gate_blocks(
        recurrent_kernel, _LSTM_GATES, _keras_block_to_cudnn
    )
    # bias (4U,) -> [input half | recurrent half] (8U,).
    half = bias * np.asarray(0.5, dtype=bias.dtype)
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
        weights, _GRU_GATES, "weights", "CuDNNGRU"
    )
    # Per gate (order z, r, h kept): reinterpret the cuDNN matrix, transpose.
    kernel = _map_gate_blocks(kernel, _GRU_GATES, _cudnn_block_to_keras)
    recurrent_kernel = _map_gate_blocks(
        recurrent_kernel, _GRU_GATES, _cudnn_block_to_keras
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
    kernel = _map_gate_blocks(kernel, _GRU_GATES, _keras_block_to_cudnn)
    recurrent_kernel = _map_gate_blocks(
        recurrent_kernel, _GRU_GATES, _keras_block_to_cudnn
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
        converted += (lstm_fn if gates == _LSTM_GATES else gru_fn)(half)
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
        raise TypeError(
            f"`model` must be a Keras 3 model; received {type(model).__name__}."
        )
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


# ---------------------------------------------------------------------------
# TF1 CudnnLSTM / CudnnGRU canonical parameters.
# ---------------------------------------------------------------------------


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

    Source: the canonical parameters of a TF1 `CudnnLSTM` (what
    `tf.raw_ops.CudnnRNNParamsToCanonical` returns and
    `CudnnRNNCanonicalToParams` takes, for one layer and one direction).
    cuDNN computes, per gate g, `W_g @ x + R_g @ h + bW_g + bR_g`, with

    - `weights`: 8 matrices `[W_i, W_f, W_c, W_o, R_i, R_f, R_c, R_o]`,
      `W_g` of shape `(U, D)` and `R_g` of shape `(U, U)` (row-major;
      flattened 1-D versions are accepted), gate order i, f, c, o;
    - `biases`: 8 vectors `[bW_i, bW_f, bW_c, bW_o, bR_i, bR_f, bR_c, bR_o]`,
      each `(U,)`.

    Args:
        weights: list of the 8 canonical weight matrices, as above.
        biases: list of the 8 canonical bias vectors, as above.

    Returns:
        List `[kernel (D, 4U), recurrent_kernel (U, 4U), bias (4U,)]` for
        `keras.layers.LSTM(U)`: `kernel = [W_i.T | W_f.T | W_c.T | W_o.T]`,
        `recurrent_kernel = [R_i.T | ... | R_o.T]`, `bias = bW + bR`.

    Example:

    >>> w = [np.ones((2, 3))] * 4 + [np.ones((2, 2))] * 4
    >>> [a.shape for a in cudnn_canonical_lstm_to_lstm(w, [np.zeros(2)] * 8)]
    [(3, 8), (2, 8), (8,)]
    """
    weights, biases, _, _ = _canonical_matrices(
        weights, biases, _LSTM_GATES, "weights", "biases", "cuDNN LSTM layer"
    )
    # Gate order i, f, c, o is the same in cuDNN and Keras; transpose each
    # (U, in) matrix to a (in, U) column block.
    kernel = np.concatenate([w.T for w in weights[:4]], axis=1)
    recurrent_kernel = np.concatenate([r.T for r in weights[4:]], axis=1)
    bias = np.concatenate(biases[:4]) + np.concatenate(biases[4:])
    return [kernel, recurrent_kernel, bias]


def lstm_to_cudnn_canonical_lstm(weights):
    """Converts `keras.layers.LSTM` weights to cuDNN canonical LSTM params.

    Inverse of `cudnn_canonical_lstm_to_lstm` (see there for the layout).

    Args:
        weights: list `[kernel (D, 4U), recurrent_kernel (U, 4U),
            bias (4U,)]` of a `keras.layers.LSTM(U)`.

    Returns:
        Tuple `(weights, biases)`: 8 matrices `[W_i, W_f, W_c, W_o (U, D),
        R_i, R_f, R_c, R_o (U, U)]` and 8 vectors `(U,)`. Each Keras bias is
        split in two equal halves `bW_g = bR_g = bias_g / 2`, as TF's
        `CudnnLSTMSaveable` does when restoring.

    Example:

    >>> w, b = lstm_to_cudnn_canonical_lstm(
    ...     [np.ones((3, 8)), np.ones((2, 8)), np.ones(8)])
    >>> [a.shape for a in w][:5], b[0]
    ([(2, 3), (2, 3), (2, 3), (2, 3), (2, 2)], array([0.5, 0.5]))
    """
    kernel, recurrent_kernel, bias, _, _ = _keras_lstm(weights)
    # Column blocks i, f, c, o -> (U, in) matrices in the same gate order.
    matrices = [k.T for k in _split_gates(kernel, _LSTM_GATES, axis=1)]
    matrices += [r.T for r in _split_gates(recurrent_kernel, _LSTM_GATES, axis=1)]
    half = bias * np.asarray(0.5, dtype=bias.dtype)
    biases = _split_gates(half, _LSTM_GATES, axis=0) * 2
    return [np.ascontiguousarray(m) for m in matrices], biases


def cudnn_canonical_gru_to_gru(weights, biases):
    """Converts one layer of cuDNN canonical GRU params to `keras.layers.GRU`.

    Source: the canonical parameters of a TF1 `CudnnGRU` (what
    `tf.raw_ops.CudnnRNNParamsToCanonical` returns, for one layer and one
    direction), gate order r (reset), z (update), h (new memory). cuDNN
    computes `r = sigmoid(W_r x + R_r h + bW_r + bR_r)`, `z` likewise,
    `h~ = tanh(W_h x + bW_h + r * (R_h h + bR_h))`,
    `h' = (1 - z) * h~ + z * h`, which is Keras' `GRU(reset_after=True)`.

    Args:
        weights: list of 6 matrices `[W_r, W_z, W_h (U, D), R_r, R_z, R_h
            (U, U)]` (row-major; flattened 1-D versions are accepted).
        biases: list of 6 vectors `[bW_r, bW_z, bW_h, bR_r, bR_z, bR_h]`,
            each `(U,)`.

    Returns:
        List `[kernel (D, 3U), recurrent_kernel (U, 3U), bias (2, 3U)]` for
        `keras.layers.GRU(U, reset_after=True)`, gates reordered to z, r, h:
        `kernel = [W_z.T | W_r.T | W_h.T]`, `bias[0] = [bW_z, bW_r, bW_h]`,
        `bias[1] = [bR_z, bR_r, bR_h]`. Exact.

    Example:

    >>> w = [np.ones((2, 3))] * 3 + [np.ones((2, 2))] * 3
    >>> [a.shape for a in cudnn_canonical_gru_to_gru(w, [np.zeros(2)] * 6)]
    [(3, 6), (2, 6), (2, 6)]
    """
    weights, biases, _, _ = _canonical_matrices(
        weights, biases, _GRU_GATES, "weights", "biases", "cuDNN GRU layer"
    )
    # cuDNN r, z, h -> Keras z, r, h (swap the first two gates); transpose
    # each (U, in) matrix to an (in, U) column block.
    kernel = np.concatenate([w.T for w in _reorder(weights[:3], _GRU_SWAP_ZR)], 1)
    recurrent_kernel = np.concatenate(
        [r.T for r in _reorder(weights[3:], _GRU_SWAP_ZR)], axis=1
    )
    bias = np.stack(
        [
            np.concatenate(_reorder(biases[:3], _GRU_SWAP_ZR)),  # input biases
            np.concatenate(_reorder(biases[3:], _GRU_SWAP_ZR)),  # recurrent
        ]
    )
    return [kernel, recurrent_kernel, bias]


def gru_to_cudnn_canonical_gru(weights):
    """Converts `keras.layers.GRU(reset_after=True)` weights to cuDNN canonical.

    Inverse of `cudnn_canonical_gru_to_gru` (see there for the layout).
    Exact.

    Args:
        weights: list `[kernel (D, 3U), recurrent_kernel (U, 3U),
            bias (2, 3U)]` of a `keras.layers.GRU(U, reset_after=True)`.

    Returns:
        Tuple `(weights, biases)`: 6 matrices `[W_r, W_z, W_h (U, D),
        R_r, R_z, R_h (U, U)]` and 6 vectors `[bW_r, bW_z, bW_h, bR_r, bR_z,
        bR_h]` of shape `(U,)`.

    Example:

    >>> w, b = gru_to_cudnn_canonical_gru(
    ...     [np.ones((3, 6)), np.ones((2, 6)), np.zeros((2, 6))])
    >>> [a.shape for a in w], len(b)
    ([(2, 3), (2, 3), (2, 3), (2, 2), (2, 2), (2, 2)], 6)
    """
    kernel, recurrent_kernel, bias, _, _ = _keras_gru(weights)
    # Keras z, r, h -> cuDNN r, z, h (swap the first two gates); transpose.
    matrices = [
        np.ascontiguousarray(k.T)
        for k in _reorder(_split_gates(kernel, _GRU_GATES, 1), _GRU_SWAP_ZR)
    ]
    matrices += [
        np.ascontiguousarray(r.T)
        for r in _reorder(_split_gates(recurrent_kernel, _GRU_GATES, 1), _GRU_SWAP_ZR)
    ]
    biases = _reorder(_split_gates(bias[0], _GRU_GATES, 0), _GRU_SWAP_ZR)
    biases += _reorder(_split_gates(bias[1], _GRU_GATES, 0), _GRU_SWAP_ZR)
    return matrices, biases


def _check_mode(rnn_mode):
    if rnn_mode not in ("lstm", "gru"):
        raise ValueError(f'`rnn_mode` must be "lstm" or "gru"; received {rnn_mode!r}.')


def cudnn_canonical_to_keras(weights, biases, rnn_mode, bidirectional=False):
    """Converts a whole (multi-layer) cuDNN canonical param set to Keras.

    The flat lists returned by `tf.raw_ops.CudnnRNNParamsToCanonical` for a
    TF1 `CudnnLSTM`/`CudnnGRU` with `num_layers` layers hold, for each
    layer and (if bidirectional) each direction (forward first), the 8
    (LSTM) or 6 (GRU) weight matrices; then, in the same order, the bias
    vectors. Each group is converted with `cudnn_canonical_lstm_to_lstm` /
    `cudnn_canonical_gru_to_gru`.

    Args:
        weights: flat list of all canonical weight matrices.
        biases: flat list of all canonical bias vectors.
        rnn_mode: `"lstm"` or `"gru"`.
        bidirectional: bool (default `False`), `True` for
            `direction="bidirectional"`.

    Returns:
        List with one entry per layer: the 3 Keras weights of `LSTM(U)` /
        `GRU(U, reset_after=True)`, or, if `bidirectional`, the 6 weights of
        `keras.layers.Bidirectional` (merge_mode `"concat"`) /
        `maskedrnn.MaskedBidirectional` around it. Layer `k > 0` takes the
        previous layer's output (`2U` features if bidirectional).

    Example:

    >>> w = ([np.ones((2, 3))] * 4 + [np.ones((2, 2))] * 4
    ...      + [np.ones((2, 2))] * 8)
    >>> layers = cudnn_canonical_to_keras(w, [np.zeros(2)] * 16, "lstm")
    >>> [[a.shape for a in layer] for layer in layers]
    [[(3, 8), (2, 8), (8,)], [(2, 8), (2, 8), (8,)]]
    """
    _check_mode(rnn_mode)
    if not isinstance(bidirectional, bool):
        raise TypeError(f"`bidirectional` must be a bool; received {bidirectional!r}.")
    per_direction = 2 * (_LSTM_GATES if rnn_mode == "lstm" else _GRU_GATES)
    directions = 2 if bidirectional else 1
    for value, name in ((weights, "weights"), (biases, "biases")):
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"`{name}` must be a list of arrays.")
        if not value or len(value) % (per_direction * directions):
            raise ValueError(
                f"`{name}` must hold {per_direction} arrays per layer and "
                f"direction for rnn_mode={rnn_mode!r}, "
                f"bidirectional={bidirectional}; received {len(value)}."
            )
    if len(weights) != len(biases):
        raise ValueError(
            f"`weights` and `biases` must have the same length; received "
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

    Inverse of `cudnn_canonical_to_keras`: returns the flat `(weights,
    biases)` lists `tf.raw_ops.CudnnRNNCanonicalToParams` takes.

    Args:
        layers_weights: list with one entry per layer, each the weights of a
            `keras.layers.LSTM` / `GRU(reset_after=True)` (3 arrays) or of a
            `Bidirectional`/`MaskedBidirectional` around one (6 arrays). All
            layers must be of the same type and direction count.

    Returns:
        Tuple `(weights, biases)` of flat lists in cuDNN canonical order
        (layer by layer, forward before backward; see
        `lstm_to_cudnn_canonical_lstm` / `gru_to_cudnn_canonical_gru`).

    Example:

    >>> lstm = [np.ones((3, 8)), np.ones((2, 8)), np.zeros(8)]
    >>> w, b = keras_to_cudnn_canonical([lstm])
    >>> len(w), len(b)
    (8, 8)
    """
    layers = _layers_list(layers_weights)
    kinds, directions = set(), set()
    weights, biases = [], []
    for index, layer in enumerate(layers):
        if len(layer) not in (3, 6):
            raise ValueError(
                f"`layers_weights[{index}]` must hold 3 arrays (LSTM/GRU) or 6 "
                f"(Bidirectional); received {len(layer)}."
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
            if gates == _LSTM_GATES:
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


def _layers_list(layers_weights):
    if isinstance(layers_weights, np.ndarray) or not isinstance(
        layers_weights, (list, tuple)
    ):
        raise TypeError(
            "`layers_weights` must be a list with one list of arrays per layer, "
            f"e.g. [layer.get_weights()]; received {type(layers_weights).__name__}."
        )
    if not layers_weights:
        raise ValueError("`layers_weights` must hold at least one layer.")
    for index, layer in enumerate(layers_weights):
        if not isinstance(layer, (list, tuple)):
            raise TypeError(
                f"`layers_weights[{index}]` must be a list of arrays (one layer's "
                f"weights); received {type(layer).__name__}. For a single layer "
                "pass [layer.get_weights()]."
            )
    return layers_weights


# ---------------------------------------------------------------------------
# TF1 CudnnCompatibleLSTMCell / CudnnCompatibleGRUCell checkpoint variables.
# ---------------------------------------------------------------------------

# TF1 LSTM cells order the gate columns i, c(j), f, o; Keras orders them
# i, f, c, o: swap the middle two blocks (a permutation that is its own
# inverse).
_TF1_LSTM_SWAP_CF = (0, 2, 1, 3)


def cudnn_compatible_lstm_cell_to_lstm(kernel, bias, forget_bias=0.0):
    """Converts `CudnnCompatibleLSTMCell` variables to `keras.layers.LSTM`.

    Source: the checkpoint variables `.../cudnn_compatible_lstm_cell/kernel`
    and `.../bias` of a TF1 `tf.contrib.cudnn_rnn.CudnnCompatibleLSTMCell`
    (also what a TF1 `CudnnLSTM` layer saves to checkpoints). The cell is an
    `LSTMBlockCell` with `forget_bias=0`: `[i, c, f, o] = [x, h] @ kernel +
    bias`, `c' = sigmoid(f + forget_bias) * c + sigmoid(i) * tanh(c)`,
    `h' = sigmoid(o) * tanh(c')`.

    - `kernel`: `(D + U, 4U)`; rows are the input features then the
      hidden-state features, gate column blocks in order i, c, f, o.
    - `bias`: `(4U,)`, gate order i, c, f, o (input and recurrent biases
      already summed).

    The same layout (with `forget_bias=1.0` by default there) is used by
    TF1 `LSTMBlockCell`, `BasicLSTMCell` and `LSTMCell` without peepholes or
    projection: pass their `forget_bias`.

    Args:
        kernel: array `(D + U, 4U)`, as above.
        bias: array `(4U,)`, as above.
        forget_bias: float (default `0.0`), the cell's constant forget-gate
            offset; it is added to the Keras forget-gate bias.

    Returns:
        List `[kernel (D, 4U), recurrent_kernel (U, 4U), bias (4U,)]` for
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
            "`kernel` must have shape (input_dim + units, 4 * units); received "
            f"shape {kernel.shape}."
        )
    units = kernel.shape[1] // 4
    input_dim = kernel.shape[0] - units
    if input_dim < 1:
        raise ValueError(
            f"`kernel` has {kernel.shape[0]} rows but must have input_dim + "
            f"units rows with units = {units} (= columns / 4); received shape "
            f"{kernel.shape}."
        )
    _check_shape(bias, (4 * units,), "bias", "4 * units, gate order i, c, f, o")
    # Gate column blocks i, c, f, o -> i, f, c, o.
    kernel = np.concatenate(_reorder(_split_gates(kernel, 4, 1), _TF1_LSTM_SWAP_CF), 1)
    bias = np.concatenate(_reorder(_split_gates(bias, 4, 0), _TF1_LSTM_SWAP_CF))
    if forget_bias:
        bias = bias.copy()
        bias[units : 2 * units] += forget_bias  # Keras forget gate block.
    # Rows: input features first, then hidden-state features.
    return [kernel[:input_dim], kernel[input_dim:], bias]


def lstm_to_cudnn_compatible_lstm_cell(weights):
    """Converts `keras.layers.LSTM` weights to `CudnnCompatibleLSTMCell`.

    Inverse of `cudnn_compatible_lstm_cell_to_lstm` with `forget_bias=0`
    (see there for the layout).

    Args:
        weights: list `[kernel (D, 4U), recurrent_kernel (U, 4U),
            bias (4U,)]` of a `keras.layers.LSTM(U)`.

    Returns:
        List `[kernel (D + U, 4U), bias (4U,)]`, gate order i, c, f, o, in
        the order of `CUDNN_COMPATIBLE_LSTM_CELL_VARIABLES`.

    Example:

    >>> cell = lstm_to_cudnn_compatible_lstm_cell(
    ...     [np.ones((3, 8)), np.ones((2, 8)), np.zeros(8)])
    >>> [a.shape for a in cell]
    [(5, 8), (8,)]
    """
    kernel, recurrent_kernel, bias, _, _ = _keras_lstm(weights)
    # Rows: input features, then hidden-state features.
    stacked = np.concatenate([kernel, recurrent_kernel], axis=0)
    # Gate column blocks i, f, c, o -> i, c, f, o.
    stacked = np.concatenate(
        _reorder(_split_gates(stacked, 4, 1), _TF1_LSTM_SWAP_CF), axis=1
    )
    bias = np.concatenate(_reorder(_split_gates(bias, 4, 0), _TF1_LSTM_SWAP_CF))
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

    Source: the checkpoint variables of a TF1
    `tf.contrib.cudnn_rnn.CudnnCompatibleGRUCell` (also what a TF1 `CudnnGRU`
    layer saves to checkpoints), named as in
    `CUDNN_COMPATIBLE_GRU_CELL_VARIABLES`. The cell computes
    `[r, u] = sigmoid([x, h] @ gates/kernel + gates/bias)`,
    `c = tanh(x @ input_projection/kernel + input_projection/bias
    + r * (h @ hidden_projection/kernel + hidden_projection/bias))`,
    `h' = u * h + (1 - u) * c`: Keras' `GRU(reset_after=True)` with z = u.

    Args:
        gates_kernel: `gates/kernel`, `(D + U, 2U)`: rows input features then
            hidden-state features, column blocks r then u.
        gates_bias: `gates/bias`, `(2U,)`, r then u (input and recurrent
            biases summed).
        input_projection_kernel: `candidate/input_projection/kernel`,
            `(D, U)`.
        input_projection_bias: `candidate/input_projection/bias`, `(U,)`.
        hidden_projection_kernel: `candidate/hidden_projection/kernel`,
            `(U, U)`.
        hidden_projection_bias: `candidate/hidden_projection/bias`, `(U,)`.

    Returns:
        List `[kernel (D, 3U), recurrent_kernel (U, 3U), bias (2, 3U)]` for
        `keras.layers.GRU(U, reset_after=True)`. The summed r/u biases go
        into the input bias row; the recurrent bias row holds zeros for z
        and r and `hidden_projection/bias` for h.

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
            f"received shape {hidden_kernel.shape}."
        )
    units = hidden_kernel.shape[0]
    _check_shape(hidden_kernel, (units, units), "hidden_projection_kernel", "U, U")
    if input_kernel.ndim != 2:
        raise ValueError(
            "`input_projection_kernel` must have shape (input_dim, units); "
            f"received shape {input_kernel.shape}."
        )
    input_dim = input_kernel.shape[0]
    _check_shape(input_kernel, (input_dim, units), "input_projection_kernel", "D, U")
    _check_shape(
        gates_kernel, (input_dim + units, 2 * units), "gates_kernel", "D + U, 2U"
    )
    _check_shape(gates_bias, (2 * units,), "gates_bias", "2U: r then u")
    _check_shape(input_bias, (units,), "input_projection_bias", "U")
    _check_shape(hidden_bias, (units,), "hidden_projection_bias", "U")
    # gates/kernel column blocks r, u(=z); rows split into input / hidden.
    r_block, z_block = _split_gates(gates_kernel, 2, axis=1)
    r_bias, z_bias = _split_gates(gates_bias, 2, axis=0)
    # Keras gate order z, r, h.
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
    """Converts `keras.layers.GRU(reset_after=True)` weights to the cell's.

    Inverse of `cudnn_compatible_gru_cell_to_gru` (see there for the
    layout); the Keras input and recurrent biases of z and r are summed into
    `gates/bias`.

    Args:
        weights: list `[kernel (D, 3U), recurrent_kernel (U, 3U),
            bias (2, 3U)]` of a `keras.layers.GRU(U, reset_after=True)`.

    Returns:
        List of the 6 `CudnnCompatibleGRUCell` variables in the order of
        `CUDNN_COMPATIBLE_GRU_CELL_VARIABLES`: `gates/kernel (D + U, 2U)`,
        `gates/bias (2U,)`, `candidate/input_projection/kernel (D, U)`,
        `.../bias (U,)`, `candidate/hidden_projection/kernel (U, U)`,
        `.../bias (U,)`.

    Example:

    >>> cell = gru_to_cudnn_compatible_gru_cell(
    ...     [np.ones((3, 6)), np.ones((2, 6)), np.zeros((2, 6))])
    >>> [a.shape for a in cell]
    [(5, 4), (4,), (3, 2), (2,), (2, 2), (2,)]
    """
    kernel, recurrent_kernel, bias, _, _ = _keras_gru(weights)
    # Keras column blocks z, r, h; rows input then hidden for the gates kernel.
    k_z, k_r, k_h = _split_gates(kernel, 3, axis=1)
    r_z, r_r, r_h = _split_gates(recurrent_kernel, 3, axis=1)
    bi_z, bi_r, bi_h = _split_gates(bias[0], 3, axis=0)
    br_z, br_r, br_h = _split_gates(bias[1], 3, axis=0)
    gates_kernel = np.concatenate(
        [np.concatenate([k_r, r_r], axis=0), np.concatenate([k_z, r_z], axis=0)],
        axis=1,
    )  # column blocks r, u(=z)
    gates_bias = np.concatenate([bi_r + br_r, bi_z + br_z])
    return [gates_kernel, gates_bias, k_h, bi_h, r_h, br_h]


# ---------------------------------------------------------------------------
# PyTorch nn.LSTM / nn.GRU.
# ---------------------------------------------------------------------------


def _torch_arrays(weight_ih, weight_hh, bias_ih, bias_hh, n_gates, module):
    weight_ih = _array(weight_ih, "weight_ih")
    weight_hh = _array(weight_hh, "weight_hh")
    if weight_hh.ndim != 2 or weight_hh.shape[1] == 0:
        raise ValueError(
            f"`weight_hh` must have shape ({n_gates} * hidden_size, hidden_size) "
            f"for {module}; received shape {weight_hh.shape}."
        )
    hidden = weight_hh.shape[1]
    _check_shape(
        weight_hh, (n_gates * hidden, hidden), "weight_hh", f"{module} weight_hh"
    )
    if weight_ih.ndim != 2:
        raise ValueError(
            f"`weight_ih` must have shape ({n_gates} * hidden_size, input_size); "
            f"received shape {weight_ih.shape}."
        )
    _check_shape(
        weight_ih,
        (n_gates * hidden, weight_ih.shape[1]),
        "weight_ih",
        f"{module} weight_ih",
    )
    if (bias_ih is None) != (bias_hh is None):
        raise ValueError(
            "Pass both `bias_ih` and `bias_hh` (a module with bias=True) or "
            "neither (bias=False)."
        )
    if bias_ih is None:
        return weight_ih, weight_hh, None, None
    bias_ih = _array(bias_ih, "bias_ih")
    bias_hh = _array(bias_hh, "bias_hh")
    _check_shape(bias_ih, (n_gates * hidden,), "bias_ih", f"{module} bias_ih")
    _check_shape(bias_hh, (n_gates * hidden,), "bias_hh", f"{module} bias_hh")
    return weight_ih, weight_hh, bias_ih, bias_hh


def torch_lstm_to_lstm(weight_ih, weight_hh, bias_ih=None, bias_hh=None):
    """Converts one direction of one `torch.nn.LSTM` layer to Keras.

    PyTorch stores `weight_ih_l{k}` `(4H, D)` and `weight_hh_l{k}`
    `(4H, H)` with gate row blocks in order i, f, g(=c), o (the Keras
    order), and two biases `bias_ih_l{k}`, `bias_hh_l{k}` `(4H,)`.

    Args:
        weight_ih: array `(4H, D)`.
        weight_hh: array `(4H, H)`.
        bias_ih: array `(4H,)` or `None` (default) for `bias=False`.
        bias_hh: array `(4H,)` or `None` (default) for `bias=False`.

    Returns:
        `[kernel (D, 4H), recurrent_kernel (H, 4H), bias (4H,)]` for
        `keras.layers.LSTM(H)` (`bias = bias_ih + bias_hh`), or
        `[kernel, recurrent_kernel]` for `LSTM(H, use_bias=False)` when the
        biases are `None`.

    Example:

    >>> w = torch_lstm_to_lstm(np.ones((8, 3)), np.ones((8, 2)),
    ...                        np.ones(8), np.ones(8))
    >>> [a.shape for a in w], float(w[2][0])
    ([(3, 8), (2, 8), (8,)], 2.0)
    """
    weight_ih, weight_hh, bias_ih, bias_hh = _torch_arrays(
        weight_ih, weight_hh, bias_ih, bias_hh, _LSTM_GATES, "nn.LSTM"
    )
    # Same gate order; PyTorch computes x @ W.T, Keras x @ kernel.
    kernel = np.ascontiguousarray(weight_ih.T)
    recurrent_kernel = np.ascontiguousarray(weight_hh.T)
    if bias_ih is None:
        return [kernel, recurrent_kernel]
    return [kernel, recurrent_kernel, bias_ih + bias_hh]


def lstm_to_torch_lstm(weights):
    """Converts `keras.layers.LSTM` weights to one `torch.nn.LSTM` direction.

    Inverse of `torch_lstm_to_lstm` up to the bias split: the whole Keras
    bias goes into `bias_ih` and `bias_hh` is zeros (only the sum matters).

    Args:
        weights: `[kernel (D, 4H), recurrent_kernel (H, 4H), bias (4H,)]`
            of `keras.layers.LSTM(H)`, or `[kernel, recurrent_kernel]` of
            `LSTM(H, use_bias=False)`.

    Returns:
        `[weight_ih (4H, D), weight_hh (4H, H), bias_ih (4H,),
        bias_hh (4H,)]`, or the two weights only without bias.

    Example:

    >>> t = lstm_to_torch_lstm([np.ones((3, 8)), np.ones((2, 8)), np.ones(8)])
    >>> [a.shape for a in t], float(t[3][0])
    ([(8, 3), (8, 2), (8,), (8,)], 0.0)
    """
    if isinstance(weights, (list, tuple)) and len(weights) == 2:
        kernel, recurrent_kernel = _keras_without_bias(weights, _LSTM_GATES, "LSTM")
        return [
            np.ascontiguousarray(kernel.T),
            np.ascontiguousarray(recurrent_kernel.T),
        ]
    kernel, recurrent_kernel, bias, _, _ = _keras_lstm(weights)
    # Same gate order i, f, c(g), o; transpose to (4H, in).
    return [
        np.ascontiguousarray(kernel.T),
        np.ascontiguousarray(recurrent_kernel.T),
        bias.copy(),
        np.zeros_like(bias),
    ]


def _gru_rows_swap(matrix):
    # Swap the first two gate blocks along axis 0 (r, z <-> z, r).
    return np.concatenate(_reorder(_split_gates(matrix, 3, 0), _GRU_SWAP_ZR), 0)


def torch_gru_to_gru(weight_ih, weight_hh, bias_ih=None, bias_hh=None):
    """Converts one direction of one `torch.nn.GRU` layer to Keras.

    PyTorch stores `weight_ih_l{k}` `(3H, D)`, `weight_hh_l{k}` `(3H, H)`
    and biases `(3H,)` with gate blocks in order r, z, n, and computes
    `n = tanh(W_in x + b_in + r * (W_hn h + b_hn))`,
    `h' = (1 - z) * n + z * h`: Keras' `GRU(reset_after=True)`.

    Args:
        weight_ih: array `(3H, D)`.
        weight_hh: array `(3H, H)`.
        bias_ih: array `(3H,)` or `None` (default) for `bias=False`.
        bias_hh: array `(3H,)` or `None` (default) for `bias=False`.

    Returns:
        `[kernel (D, 3H), recurrent_kernel (H, 3H), bias (2, 3H)]` for
        `keras.layers.GRU(H, reset_after=True)`, gates reordered to
        z, r, h (`bias[0]` from `bias_ih`, `bias[1]` from `bias_hh`), or
        `[kernel, recurrent_kernel]` for `use_bias=False`. Exact.

    Example:

    >>> w = torch_gru_to_gru(np.ones((6, 3)), np.ones((6, 2)),
    ...                      np.arange(6.0), np.zeros(6))
    >>> w[2][0]
    array([2., 3., 0., 1., 4., 5.])
    """
    weight_ih, weight_hh, bias_ih, bias_hh = _torch_arrays(
        weight_ih, weight_hh, bias_ih, bias_hh, _GRU_GATES, "nn.GRU"
    )
    # Gate row blocks r, z, n -> z, r, h, then transpose to (in, 3H).
    kernel = np.ascontiguousarray(_gru_rows_swap(weight_ih).T)
    recurrent_kernel = np.ascontiguousarray(_gru_rows_swap(weight_hh).T)
    if bias_ih is None:
        return [kernel, recurrent_kernel]
    bias = np.stack([_gru_rows_swap(bias_ih), _gru_rows_swap(bias_hh)])
    return [kernel, recurrent_kernel, bias]


def gru_to_torch_gru(weights):
    """Converts `keras.layers.GRU(reset_after=True)` weights to `nn.GRU`.

    Inverse of `torch_gru_to_gru`. Exact.

    Args:
        weights: `[kernel (D, 3H), recurrent_kernel (H, 3H), bias (2, 3H)]`
            of `keras.layers.GRU(H, reset_after=True)`, or
            `[kernel, recurrent_kernel]` of `GRU(H, use_bias=False)`.

    Returns:
        `[weight_ih (3H, D), weight_hh (3H, H), bias_ih (3H,),
        bias_hh (3H,)]` (gate order r, z, n), or the two weights only.

    Example:

    >>> t = gru_to_torch_gru([np.ones((3, 6)), np.ones((2, 6)),
    ...                       np.arange(12.0).reshape(2, 6)])
    >>> t[2]
    array([2., 3., 0., 1., 4., 5.])
    """
    if isinstance(weights, (list, tuple)) and len(weights) == 2:
        kernel, recurrent_kernel = _keras_without_bias(weights, _GRU_GATES, "GRU")
    else:
        kernel, recurrent_kernel, bias, _, _ = _keras_gru(weights)
    # Column blocks z, r, h -> row blocks r, z, n after transposing.
    torch_weights = [
        np.ascontiguousarray(_gru_rows_swap(kernel.T)),
        np.ascontiguousarray(_gru_rows_swap(recurrent_kernel.T)),
    ]
    if len(weights) == 2:
        return torch_weights
    return torch_weights + [_gru_rows_swap(bias[0]), _gru_rows_swap(bias[1])]


def torch_state_dict_to_keras(state_dict, prefix=""):
    """Converts a `torch.nn.LSTM` / `nn.GRU` `state_dict()` to Keras weights.

    Reads `{prefix}weight_ih_l{k}`, `weight_hh_l{k}`, `bias_ih_l{k}`,
    `bias_hh_l{k}` and, for `bidirectional=True`, the same keys with the
    suffix `_reverse`, for every layer `k`. The module type is read from the
    shapes (`weight_hh` is `(4H, H)` for LSTM, `(3H, H)` for GRU); each
    direction goes through `torch_lstm_to_lstm` / `torch_gru_to_gru`.

    Args:
        state_dict: mapping from names to arrays or CPU tensors, e.g.
            `module.state_dict()`.
        prefix: string (default `""`) prepended to every key, e.g.
            `"encoder.rnn."` for a submodule of a larger model's state dict.

    Returns:
        List with one entry per layer: the Keras weights of `LSTM(H)` /
        `GRU(H, reset_after=True)`, or, for a bidirectional module, of
        `keras.layers.Bidirectional(..., merge_mode="concat")` /
        `maskedrnn.MaskedBidirectional` (forward then backward). Stacking
        these layers (`return_sequences=True` below the top) reproduces the
        module.

    Example:

    ```python
    rnn = torch.nn.LSTM(8, 16, num_layers=2, bidirectional=True,
                        batch_first=True)
    weights = maskedrnn.convert.torch_state_dict_to_keras(rnn.state_dict())
    layer0 = keras.layers.Bidirectional(
        keras.layers.LSTM(16, return_sequences=True))
    layer0.build((None, None, 8))
    layer0.set_weights(weights[0])
    ```
    """
    if not hasattr(state_dict, "keys") or not hasattr(state_dict, "__getitem__"):
        raise TypeError(
            "`state_dict` must be a mapping such as `module.state_dict()`; "
            f"received {type(state_dict).__name__}."
        )
    if not isinstance(prefix, str):
        raise TypeError(f"`prefix` must be a string; received {prefix!r}.")
    keys = set(state_dict.keys())
    if f"{prefix}weight_ih_l0" not in keys:
        raise ValueError(
            f"`state_dict` has no key {prefix + 'weight_ih_l0'!r}: not an "
            "nn.LSTM/nn.GRU state dict, or `prefix` is wrong. Keys found: "
            f"{sorted(keys)[:8]}."
        )
    if any(k.startswith(f"{prefix}weight_hr_l") for k in keys):
        raise ValueError(
            "`state_dict` is from an nn.LSTM with proj_size > 0 (weight_hr_l* "
            "keys); Keras LSTM has no projection, so it cannot be converted."
        )
    bidirectional = f"{prefix}weight_ih_l0_reverse" in keys
    suffixes = ("", "_reverse") if bidirectional else ("",)
    layers = []
    k = 0
    while f"{prefix}weight_ih_l{k}" in keys:
        layer = []
        for suffix in suffixes:
            names = [
                f"{prefix}{n}_l{k}{suffix}"
                for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
            ]
            for name in names[:2]:
                if name not in keys:
                    raise ValueError(f"`state_dict` is missing the key {name!r}.")
            values = [state_dict[n] if n in keys else None for n in names]
            where = f"state_dict[{names[1]!r}]"
            _, gates = _units_and_gates(_array(values[1], where).T, where + ".T")
            convert = torch_lstm_to_lstm if gates == _LSTM_GATES else torch_gru_to_gru
            layer += convert(*values)
        layers.append(layer)
        k += 1
    return layers


def keras_to_torch_state_dict(layers_weights, prefix=""):
    """Converts stacked Keras LSTM/GRU weights to a `nn.LSTM`/`nn.GRU` state.

    Inverse of `torch_state_dict_to_keras` (LSTM biases: the Keras bias goes
    into `bias_ih`, zeros into `bias_hh`; see `lstm_to_torch_lstm`).

    Args:
        layers_weights: list with one entry per layer: the weights of a
            `keras.layers.LSTM` / `GRU(reset_after=True)` (3 arrays, or 2 with
            `use_bias=False`), or of a `Bidirectional(..., merge_mode=
            "concat")` / `MaskedBidirectional` around one (6, or 4). All
            layers must have the same type, direction count and bias use.
            For a single layer pass `[layer.get_weights()]`.
        prefix: string (default `""`) prepended to every key.

    Returns:
        Dict from `state_dict` keys (`weight_ih_l0`, ..., `bias_hh_l{k}_reverse`)
        to numpy arrays. Load it with
        `module.load_state_dict({k: torch.from_numpy(v) for k, v in d.items()})`
        into `nn.LSTM`/`nn.GRU(input_size, H, num_layers=len(layers_weights),
        bidirectional=..., bias=..., batch_first=...)`.

    Example:

    >>> d = keras_to_torch_state_dict(
    ...     [[np.ones((3, 8)), np.ones((2, 8)), np.zeros(8)]])
    >>> sorted(d)
    ['bias_hh_l0', 'bias_ih_l0', 'weight_hh_l0', 'weight_ih_l0']
    """
    layers = _layers_list(layers_weights)
    if not isinstance(prefix, str):
        raise TypeError(f"`prefix` must be a string; received {prefix!r}.")
    signatures = set()
    state = {}
    for k, layer in enumerate(layers):
        if len(layer) not in (2, 3, 4, 6):
            raise ValueError(
                f"`layers_weights[{k}]` must hold 3 arrays (LSTM/GRU), 6 "
                "(Bidirectional), or 2 / 4 without bias; received "
                f"{len(layer)}."
            )
        # 3 / 6 arrays: with bias; 2 / 4 arrays: use_bias=False.
        per_direction = 3 if len(layer) in (3, 6) else 2
        directions = len(layer) // per_direction
        for d, suffix in enumerate(("", "_reverse")[:directions]):
            part = list(layer[d * per_direction : (d + 1) * per_direction])
            where = f"layers_weights[{k}][{d * per_direction + 1}]"
            _, gates = _units_and_gates(_array(part[1], where), where)
            signatures.add((gates, directions, per_direction))
            convert = lstm_to_torch_lstm if gates == _LSTM_GATES else gru_to_torch_gru
            names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
            for name, value in zip(names, convert(part)):
                state[f"{prefix}{name}_l{k}{suffix}"] = value
    if len(signatures) > 1:
        raise ValueError(
            "All entries of `layers_weights` must have the same RNN type, "
            "direction count and bias use, as in one nn.LSTM/nn.GRU."
        )
    return state
