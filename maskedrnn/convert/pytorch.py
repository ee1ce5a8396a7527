"""PyTorch `nn.LSTM` / `nn.GRU` / `nn.RNN` weights and state dicts.

Pure numpy: pass CPU tensors or arrays; torch is never imported here.
"""

import numpy as np

from maskedrnn.convert._validate import (
    _array,
    _check_shape,
    _keras_gru,
    _keras_lstm,
    _keras_simple_rnn,
    _keras_without_bias,
    _layers_list,
    _units_and_gates,
)
from maskedrnn.convert.gate_layout import (
    GRU_GATES,
    LSTM_GATES,
    SIMPLE_RNN_GATES,
    swap_gru_zr,
)

__all__ = [
    "gru_to_torch_gru",
    "keras_to_torch_state_dict",
    "lstm_to_torch_lstm",
    "simple_rnn_to_torch_rnn",
    "torch_gru_to_gru",
    "torch_lstm_to_lstm",
    "torch_rnn_to_simple_rnn",
    "torch_state_dict_to_keras",
]


def _torch_arrays(weight_ih, weight_hh, bias_ih, bias_hh, n_gates, module):
    weight_ih = _array(weight_ih, "weight_ih")
    weight_hh = _array(weight_hh, "weight_hh")
    if weight_hh.ndim != 2 or weight_hh.shape[1] == 0:
        raise ValueError(
            f"`weight_hh` must have shape ({n_gates} * hidden_size, hidden_size) "
            f"for {module}; got shape {weight_hh.shape}."
        )
    hidden = weight_hh.shape[1]
    _check_shape(
        weight_hh, (n_gates * hidden, hidden), "weight_hh", f"{module} weight_hh"
    )
    if weight_ih.ndim != 2:
        raise ValueError(
            f"`weight_ih` must have shape ({n_gates} * hidden_size, input_size); "
            f"got shape {weight_ih.shape}."
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


def _torch_summed_to_keras(weight_ih, weight_hh, bias_ih, bias_hh, n_gates, module):
    """One `nn.LSTM` / `nn.RNN` direction to Keras, the two biases summed."""
    weight_ih, weight_hh, bias_ih, bias_hh = _torch_arrays(
        weight_ih, weight_hh, bias_ih, bias_hh, n_gates, module
    )
    # Same gate order; PyTorch computes x @ W.T, Keras x @ kernel.
    kernel = np.ascontiguousarray(weight_ih.T)
    recurrent_kernel = np.ascontiguousarray(weight_hh.T)
    if bias_ih is None:
        return [kernel, recurrent_kernel]
    return [kernel, recurrent_kernel, bias_ih + bias_hh]


def _keras_summed_to_torch(weights, n_gates, layer_name, validate):
    """Inverse of `_torch_summed_to_keras`, the whole bias in `bias_ih`."""
    if isinstance(weights, (list, tuple)) and len(weights) == 2:
        kernel, recurrent_kernel = _keras_without_bias(weights, n_gates, layer_name)
        return [
            np.ascontiguousarray(kernel.T),
            np.ascontiguousarray(recurrent_kernel.T),
        ]
    kernel, recurrent_kernel, bias, _, _ = validate(weights)
    return [
        np.ascontiguousarray(kernel.T),
        np.ascontiguousarray(recurrent_kernel.T),
        bias.copy(),
        np.zeros_like(bias),
    ]


def torch_lstm_to_lstm(weight_ih, weight_hh, bias_ih=None, bias_hh=None):
    """Converts one direction of one `torch.nn.LSTM` layer to Keras.

    Args:
        weight_ih: Array `(4H, D)`, gate row blocks i, f, g, o.
        weight_hh: Array `(4H, H)`.
        bias_ih: Array `(4H,)`, or `None` for `bias=False`.
        bias_hh: Array `(4H,)`, or `None` for `bias=False`.

    Returns:
        `[kernel (D, 4H), recurrent_kernel (H, 4H), bias (4H,)]` of
        `keras.layers.LSTM(H)`, `bias = bias_ih + bias_hh` (none without).

    Example:

    >>> w = torch_lstm_to_lstm(np.ones((8, 3)), np.ones((8, 2)),
    ...                        np.ones(8), np.ones(8))
    >>> [a.shape for a in w], float(w[2][0])
    ([(3, 8), (2, 8), (8,)], 2.0)
    """
    return _torch_summed_to_keras(
        weight_ih, weight_hh, bias_ih, bias_hh, LSTM_GATES, "nn.LSTM"
    )


def lstm_to_torch_lstm(weights):
    """Converts `keras.layers.LSTM` weights to one `torch.nn.LSTM` direction.

    Args:
        weights: `[kernel (D, 4H), recurrent_kernel (H, 4H)(, bias (4H,))]`.

    Returns:
        `[weight_ih (4H, D), weight_hh (4H, H)(, bias_ih (4H,), bias_hh)]`:
        the whole bias in `bias_ih`, zeros in `bias_hh`.
    """
    return _keras_summed_to_torch(weights, LSTM_GATES, "LSTM", _keras_lstm)


def torch_gru_to_gru(weight_ih, weight_hh, bias_ih=None, bias_hh=None):
    """Converts one direction of one `torch.nn.GRU` layer to Keras, exactly.

    Args:
        weight_ih: Array `(3H, D)`, gate row blocks r, z, n.
        weight_hh: Array `(3H, H)`.
        bias_ih: Array `(3H,)`, or `None` for `bias=False`.
        bias_hh: Array `(3H,)`, or `None` for `bias=False`.

    Returns:
        `[kernel (D, 3H), recurrent_kernel (H, 3H), bias (2, 3H)]` of
        `keras.layers.GRU(H, reset_after=True)`, gates z, r, h.

    Example:

    >>> w = torch_gru_to_gru(np.ones((6, 3)), np.ones((6, 2)),
    ...                      np.arange(6.0), np.zeros(6))
    >>> w[2][0]
    array([2., 3., 0., 1., 4., 5.])
    """
    weight_ih, weight_hh, bias_ih, bias_hh = _torch_arrays(
        weight_ih, weight_hh, bias_ih, bias_hh, GRU_GATES, "nn.GRU"
    )
    kernel = np.ascontiguousarray(swap_gru_zr(weight_ih, axis=0).T)
    recurrent_kernel = np.ascontiguousarray(swap_gru_zr(weight_hh, axis=0).T)
    if bias_ih is None:
        return [kernel, recurrent_kernel]
    bias = np.stack([swap_gru_zr(bias_ih), swap_gru_zr(bias_hh)])
    return [kernel, recurrent_kernel, bias]


def gru_to_torch_gru(weights):
    """Converts `keras.layers.GRU(reset_after=True)` weights to `nn.GRU`, exactly.

    Args:
        weights: `[kernel (D, 3H), recurrent_kernel (H, 3H)(, bias (2, 3H))]`.

    Returns:
        `[weight_ih (3H, D), weight_hh (3H, H)(, bias_ih (3H,), bias_hh)]`,
        gates r, z, n.
    """
    if isinstance(weights, (list, tuple)) and len(weights) == 2:
        kernel, recurrent_kernel = _keras_without_bias(weights, GRU_GATES, "GRU")
    else:
        kernel, recurrent_kernel, bias, _, _ = _keras_gru(weights)
    torch_weights = [
        np.ascontiguousarray(swap_gru_zr(kernel).T),
        np.ascontiguousarray(swap_gru_zr(recurrent_kernel).T),
    ]
    if len(weights) == 2:
        return torch_weights
    bias_ih, bias_hh = swap_gru_zr(bias)
    return torch_weights + [bias_ih, bias_hh]


def torch_rnn_to_simple_rnn(weight_ih, weight_hh, bias_ih=None, bias_hh=None):
    """Converts one direction of one `torch.nn.RNN` layer to Keras.

    Build `SimpleRNN(H, activation="relu")` for `nonlinearity="relu"`.

    Args:
        weight_ih: Array `(H, D)`.
        weight_hh: Array `(H, H)`.
        bias_ih: Array `(H,)`, or `None` for `bias=False`.
        bias_hh: Array `(H,)`, or `None` for `bias=False`.

    Returns:
        `[kernel (D, H), recurrent_kernel (H, H), bias (H,)]` of
        `keras.layers.SimpleRNN(H)`, `bias = bias_ih + bias_hh` (none without).
    """
    return _torch_summed_to_keras(
        weight_ih, weight_hh, bias_ih, bias_hh, SIMPLE_RNN_GATES, "nn.RNN"
    )


def simple_rnn_to_torch_rnn(weights):
    """Converts `keras.layers.SimpleRNN` weights to one `torch.nn.RNN` direction.

    Give the module the layer's activation as `nonlinearity`.

    Args:
        weights: `[kernel (D, H), recurrent_kernel (H, H)(, bias (H,))]`.

    Returns:
        `[weight_ih (H, D), weight_hh (H, H)(, bias_ih (H,), bias_hh)]`: the
        whole bias in `bias_ih`, zeros in `bias_hh`.
    """
    return _keras_summed_to_torch(
        weights, SIMPLE_RNN_GATES, "SimpleRNN", _keras_simple_rnn
    )


# Gate count -> (PyTorch -> Keras, Keras -> PyTorch) of one direction.
_CONVERTERS = {
    LSTM_GATES: (torch_lstm_to_lstm, lstm_to_torch_lstm),
    GRU_GATES: (torch_gru_to_gru, gru_to_torch_gru),
    SIMPLE_RNN_GATES: (torch_rnn_to_simple_rnn, simple_rnn_to_torch_rnn),
}


def torch_state_dict_to_keras(state_dict, prefix=""):
    """Converts an `nn.LSTM` / `nn.GRU` / `nn.RNN` `state_dict()` to Keras weights.

    Args:
        state_dict: Mapping from names to arrays or CPU tensors.
        prefix: String before every key, e.g. `"encoder.rnn."`. Defaults to
            `""`.

    Returns:
        One entry per layer: the weights of `LSTM(H)` / `GRU(H,
        reset_after=True)` / `SimpleRNN(H)`, or of a bidirectional wrapper
        around one (forward, then backward).

    Example:

    ```python
    rnn = torch.nn.LSTM(8, 16, num_layers=2, bidirectional=True)
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
            f"got {type(state_dict).__name__}."
        )
    if not isinstance(prefix, str):
        raise TypeError(f"`prefix` must be a string; got {prefix!r}.")
    keys = set(state_dict.keys())
    if f"{prefix}weight_ih_l0" not in keys:
        raise ValueError(
            f"`state_dict` has no key {prefix + 'weight_ih_l0'!r}: not an "
            "nn.LSTM/nn.GRU/nn.RNN state dict, or `prefix` is wrong. Keys "
            "found: "
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
            _, gates = _units_and_gates(
                _array(values[1], where).T, where + ".T", simple_rnn=True
            )
            layer += _CONVERTERS[gates][0](*values)
        layers.append(layer)
        k += 1
    return layers


def keras_to_torch_state_dict(layers_weights, prefix=""):
    """Converts stacked Keras LSTM/GRU/SimpleRNN weights to a PyTorch state dict.

    Args:
        layers_weights: One entry per layer: the weights of an `LSTM` /
            `GRU(reset_after=True)` / `SimpleRNN`, or of a bidirectional wrapper
            around one; all of the same type, direction count and bias use.
        prefix: String before every key. Defaults to `""`.

    Returns:
        A dict from `state_dict` keys to numpy arrays.

    Example:

    >>> d = keras_to_torch_state_dict(
    ...     [[np.ones((3, 8)), np.ones((2, 8)), np.zeros(8)]])
    >>> sorted(d)
    ['bias_hh_l0', 'bias_ih_l0', 'weight_hh_l0', 'weight_ih_l0']
    """
    layers = _layers_list(layers_weights)
    if not isinstance(prefix, str):
        raise TypeError(f"`prefix` must be a string; got {prefix!r}.")
    signatures = set()
    state = {}
    for k, layer in enumerate(layers):
        if len(layer) not in (2, 3, 4, 6):
            raise ValueError(
                f"`layers_weights[{k}]` must hold 3 arrays (LSTM/GRU/SimpleRNN), 6 "
                "(Bidirectional), or 2 / 4 without bias; got "
                f"{len(layer)}."
            )
        per_direction = 3 if len(layer) in (3, 6) else 2
        directions = len(layer) // per_direction
        for d, suffix in enumerate(("", "_reverse")[:directions]):
            part = list(layer[d * per_direction : (d + 1) * per_direction])
            where = f"layers_weights[{k}][{d * per_direction + 1}]"
            _, gates = _units_and_gates(_array(part[1], where), where, simple_rnn=True)
            signatures.add((gates, directions, per_direction))
            names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
            for name, value in zip(names, _CONVERTERS[gates][1](part)):
                state[f"{prefix}{name}_l{k}{suffix}"] = value
    if len(signatures) > 1:
        raise ValueError(
            "All entries of `layers_weights` must have the same RNN type, "
            "direction count and bias use, as in one nn.LSTM/nn.GRU/nn.RNN."
        )
    return state
