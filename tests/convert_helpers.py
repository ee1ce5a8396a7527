"""Shared pieces of the `maskedrnn.convert` tests (tests/test_convert_*.py).

Numpy references implement each source layout's documented equations, so the
converters are checked against code that does not use them; the Keras side is
always a real `keras.layers.LSTM`/`GRU`/`Bidirectional` (or
`maskedrnn.MaskedBidirectional`) on the active backend.
"""

import importlib.util
import pathlib
import zlib

import keras
import numpy as np
import pytest

import maskedrnn

DATA = pathlib.Path(__file__).parent / "data"
ATOL = 1e-5

HAS_TF_KERAS = (
    importlib.util.find_spec("tensorflow") is not None
    and importlib.util.find_spec("tf_keras") is not None
)
requires_tf_keras = pytest.mark.skipif(
    not HAS_TF_KERAS,
    reason="needs tensorflow and tf-keras (pip install --no-deps tf-keras==2.21.0) "
    "for the legacy CuDNNLSTM/CuDNNGRU layers",
)
HAS_TORCH = importlib.util.find_spec("torch") is not None
requires_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch")


def rng_for(*key):
    # Stable across processes (unlike hash() of strings).
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def normal(rng, *shape, scale=0.5):
    return (scale * rng.standard_normal(shape)).astype("float32")


def to_np(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


# ---------------------------------------------------------------------------
# Numpy references: each source layout's documented equations.
# ---------------------------------------------------------------------------


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def cudnn_lstm_reference(x, weights, biases, h0=None, c0=None):
    """cuDNN LSTM (cuDNN docs, CUDNN_LSTM), canonical params.

    weights = [W_i, W_f, W_c, W_o (U, D), R_i, R_f, R_c, R_o (U, U)],
    biases = [bW_i, bW_f, bW_c, bW_o, bR_i, bR_f, bR_c, bR_o].
    i = s(W_i x + R_i h + bW_i + bR_i), f, o alike, c~ = tanh(...),
    c = f c + i c~, h = o tanh(c). x: (B, T, D). Returns (y, h, c).
    """
    x = np.asarray(x, np.float64)
    W = [np.asarray(w, np.float64) for w in weights]
    b = [np.asarray(v, np.float64) for v in biases]
    batch, steps, _ = x.shape
    units = b[0].shape[0]
    h = np.zeros((batch, units)) if h0 is None else np.asarray(h0, np.float64)
    c = np.zeros((batch, units)) if c0 is None else np.asarray(c0, np.float64)
    ys = []
    for t in range(steps):
        pre = [x[:, t] @ W[g].T + h @ W[4 + g].T + b[g] + b[4 + g] for g in range(4)]
        i, f, cand, o = sigmoid(pre[0]), sigmoid(pre[1]), np.tanh(pre[2]), pre[3]
        c = f * c + i * cand
        h = sigmoid(o) * np.tanh(c)
        ys.append(h)
    return np.stack(ys, 1), h, c


def cudnn_gru_reference(x, weights, biases, h0=None):
    """cuDNN GRU (cuDNN docs, CUDNN_GRU), canonical params, gates r, z, h.

    weights = [W_r, W_z, W_h (U, D), R_r, R_z, R_h (U, U)], biases alike.
    r = s(W_r x + R_r h + bW_r + bR_r), z alike,
    h~ = tanh(W_h x + bW_h + r (R_h h + bR_h)), h = (1 - z) h~ + z h.
    """
    x = np.asarray(x, np.float64)
    W = [np.asarray(w, np.float64) for w in weights]
    b = [np.asarray(v, np.float64) for v in biases]
    batch, steps, _ = x.shape
    units = b[0].shape[0]
    h = np.zeros((batch, units)) if h0 is None else np.asarray(h0, np.float64)
    ys = []
    for t in range(steps):
        xt = x[:, t]
        r = sigmoid(xt @ W[0].T + h @ W[3].T + b[0] + b[3])
        z = sigmoid(xt @ W[1].T + h @ W[4].T + b[1] + b[4])
        cand = np.tanh(xt @ W[2].T + b[2] + r * (h @ W[5].T + b[5]))
        h = (1 - z) * cand + z * h
        ys.append(h)
    return np.stack(ys, 1), h


def lstm_block_cell_reference(x, kernel, bias, forget_bias=0.0):
    """TF1 LSTMBlockCell / CudnnCompatibleLSTMCell (forget_bias=0).

    [i, ci, f, o] = [x, h] @ kernel + bias; f += forget_bias;
    c = s(f) c + s(i) tanh(ci); h = s(o) tanh(c).
    """
    x = np.asarray(x, np.float64)
    kernel = np.asarray(kernel, np.float64)
    bias = np.asarray(bias, np.float64)
    batch, steps, _ = x.shape
    units = bias.shape[0] // 4
    h, c = np.zeros((batch, units)), np.zeros((batch, units))
    ys = []
    for t in range(steps):
        gates = np.concatenate([x[:, t], h], 1) @ kernel + bias
        i, ci, f, o = np.split(gates, 4, axis=1)
        c = sigmoid(f + forget_bias) * c + sigmoid(i) * np.tanh(ci)
        h = sigmoid(o) * np.tanh(c)
        ys.append(h)
    return np.stack(ys, 1), h, c


def cudnn_compatible_gru_cell_reference(x, gk, gb, ik, ib, hk, hb):
    """TF1 CudnnCompatibleGRUCell.call (tensorflow/contrib/cudnn_rnn).

    [r, u] = s([x, h] @ gates/kernel + gates/bias);
    c = tanh(x @ input_projection + r * (h @ hidden_projection));
    h = u h + (1 - u) c.
    """
    x = np.asarray(x, np.float64)
    gk, gb, ik, ib, hk, hb = (
        np.asarray(a, np.float64) for a in (gk, gb, ik, ib, hk, hb)
    )
    batch, steps, _ = x.shape
    units = hb.shape[0]
    h = np.zeros((batch, units))
    ys = []
    for t in range(steps):
        r, u = np.split(sigmoid(np.concatenate([x[:, t], h], 1) @ gk + gb), 2, axis=1)
        c = np.tanh(x[:, t] @ ik + ib + r * (h @ hk + hb))
        h = u * h + (1 - u) * c
        ys.append(h)
    return np.stack(ys, 1), h


def random_canonical(rng, kind, input_dim, units):
    gates = 4 if kind == "lstm" else 3
    weights = [normal(rng, units, input_dim) for _ in range(gates)]
    weights += [normal(rng, units, units) for _ in range(gates)]
    biases = [normal(rng, units) for _ in range(2 * gates)]
    return weights, biases


def random_keras(rng, kind, input_dim, units):
    """Random Keras weights of `kind` "lstm", "gru" or "rnn_<activation>"
    (a SimpleRNN)."""
    gates = {"lstm": 4, "gru": 3}.get(kind, 1)
    bias = {
        "lstm": lambda: normal(rng, 4 * units),
        "gru": lambda: normal(rng, 2, 3 * units),
    }.get(kind, lambda: normal(rng, units))()
    return [
        normal(rng, input_dim, gates * units),
        normal(rng, units, gates * units),
        bias,
    ]


# ---------------------------------------------------------------------------
# Keras side.
# ---------------------------------------------------------------------------


def keras_rnn(kind, units, mask=None, **kwargs):
    """A Keras `LSTM` ("lstm"), `GRU(reset_after=True)` ("gru") or
    `SimpleRNN(activation=...)` ("rnn_tanh", "rnn_relu": PyTorch's
    `nonlinearity` names), returning sequences and states by default."""
    if kind.startswith("rnn_"):
        kwargs.pop("use_cudnn", None)  # SimpleRNN has no cuDNN option.
    else:
        kwargs.setdefault("use_cudnn", False)
    # Short sequences: unrolling keeps eager JAX from compiling a scan per
    # call. Not with a mask: with unroll=True the JAX backend (Keras 3.15.1)
    # ignores zero_output_for_mask, so padded steps would not output zeros.
    kwargs.setdefault("unroll", mask is None)
    kwargs.setdefault("return_sequences", True)
    kwargs.setdefault("return_state", True)
    if kind == "lstm":
        return keras.layers.LSTM(units, **kwargs)
    if kind.startswith("rnn_"):
        return keras.layers.SimpleRNN(units, activation=kind[4:], **kwargs)
    return keras.layers.GRU(units, reset_after=True, **kwargs)


def run_keras(kind, weights, x, *, bidirectional=False, mask=None, **kwargs):
    """Runs one Keras LSTM/GRU (or Bidirectional) with `weights` on `x`.

    Returns numpy [sequence_output, *final_states].
    """
    units = np.asarray(weights[1]).shape[0]
    layer = keras_rnn(kind, units, mask=mask, **kwargs)
    if bidirectional:
        layer = keras.layers.Bidirectional(layer)
    layer.build(x.shape)
    layer.set_weights(weights)
    return [to_np(o) for o in layer(x, mask=mask)]


def bidirectional_classes():
    yield pytest.param(keras.layers.Bidirectional, id="keras.Bidirectional")
    masked = getattr(maskedrnn, "MaskedBidirectional", None)
    yield pytest.param(
        masked,
        id="MaskedBidirectional",
        marks=pytest.mark.skipif(
            masked is None, reason="maskedrnn.MaskedBidirectional not importable yet"
        ),
    )
