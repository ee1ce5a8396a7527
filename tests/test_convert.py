"""Specification of `maskedrnn.convert`: weight converters to and from Keras 3.

Every conversion is checked against an oracle that does not use the
converter under test:

- legacy `CuDNNLSTM`/`CuDNNGRU`: tf-keras' own converter
  (`hdf5_format.preprocess_weights_for_loading`, and `load_weights` of an
  `.h5` into a non-CuDNN tf-keras model), a published before/after pair
  (`tests/data/cudnngru_to_gru_example.json`), and the real legacy layer run
  with a numpy stand-in for the GPU-only `CudnnRNNV3` op that follows cuDNN's
  documented equations and parameter layout;
- TF1 canonical params and `CudnnCompatible*Cell` variables: numpy
  implementations of each layout's documented equations;
- PyTorch: `torch.nn.LSTM`/`GRU` run on the same inputs, padded batches as a
  `PackedSequence`.

The Keras side is always a real `keras.layers.LSTM`/`GRU`/`Bidirectional`
(or `maskedrnn.MaskedBidirectional`) on the active backend.
"""

import importlib.util
import json
import pathlib
import sys
import zlib

import keras
import numpy as np
import pytest

import maskedrnn
from maskedrnn import convert

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
    gates = 4 if kind == "lstm" else 3
    bias = normal(rng, 4 * units) if kind == "lstm" else normal(rng, 2, 3 * units)
    return [
        normal(rng, input_dim, gates * units),
        normal(rng, units, gates * units),
        bias,
    ]


# ---------------------------------------------------------------------------
# Keras side.
# ---------------------------------------------------------------------------


def keras_rnn(kind, units, mask=None, **kwargs):
    kwargs.setdefault("use_cudnn", False)
    # Short sequences: unrolling keeps eager JAX from compiling a scan per
    # call. Not with a mask: with unroll=True the JAX backend (Keras 3.15.1)
    # ignores zero_output_for_mask, so padded steps would not output zeros.
    kwargs.setdefault("unroll", mask is None)
    kwargs.setdefault("return_sequences", True)
    kwargs.setdefault("return_state", True)
    if kind == "lstm":
        return keras.layers.LSTM(units, **kwargs)
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


# ---------------------------------------------------------------------------
# 1. Legacy tf.compat.v1.keras.layers.CuDNNLSTM / CuDNNGRU.
# ---------------------------------------------------------------------------


def legacy_keras_v1():
    """tf-keras' v1 API: what `tf.compat.v1.keras` is with legacy Keras."""
    import tf_keras.api._v1.keras as keras_v1

    return keras_v1


def random_legacy(rng, kind, input_dim, units):
    gates = 4 if kind == "lstm" else 3
    return [
        normal(rng, input_dim, gates * units),
        normal(rng, units, gates * units),
        normal(rng, 2 * gates * units),
    ]


def test_cudnn_gru_to_gru_reproduces_published_example():
    # Published CuDNNGRU(2) weights on 2 features and the same weights as
    # loaded into tf.keras GRU(reset_after=True); see the JSON's "source".
    example = json.loads((DATA / "cudnngru_to_gru_example.json").read_text())
    names = ("kernel", "recurrent_kernel", "bias")
    legacy = [np.asarray(example["cudnn_gru_weights"][n], "float32") for n in names]
    expected = [np.asarray(example["keras_gru_weights"][n], "float32") for n in names]

    converted = convert.cudnn_gru_to_gru(legacy)
    for got, want in zip(converted, expected):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(convert.gru_to_cudnn_gru(expected), legacy):
        np.testing.assert_array_equal(got, want)


@requires_tf_keras
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("input_dim,units", [(3, 4), (5, 2)])
def test_legacy_conversion_equals_tf_keras_converter(kind, input_dim, units):
    import tf_keras
    from tf_keras.src.saving.legacy import hdf5_format

    keras_v1 = legacy_keras_v1()
    rng = rng_for("tfk", kind, input_dim, units)
    legacy = random_legacy(rng, kind, input_dim, units)
    if kind == "lstm":
        target, legacy_layer = (
            tf_keras.layers.LSTM(units),
            keras_v1.layers.CuDNNLSTM(units),
        )
        to_keras, to_legacy = convert.cudnn_lstm_to_lstm, convert.lstm_to_cudnn_lstm
    else:
        target = tf_keras.layers.GRU(units, reset_after=True)
        legacy_layer = keras_v1.layers.CuDNNGRU(units)
        to_keras, to_legacy = convert.cudnn_gru_to_gru, convert.gru_to_cudnn_gru

    # CuDNN -> Keras: tf-keras converts when loading into its non-CuDNN layer.
    expected = hdf5_format.preprocess_weights_for_loading(target, list(legacy))
    got = to_keras(legacy)
    assert len(got) == 3
    for g, e in zip(got, expected):
        assert g.dtype == np.float32
        np.testing.assert_array_equal(g, e)

    # Keras -> CuDNN: tf-keras converts when loading into its CuDNN layer.
    keras_weights = random_keras(rng, kind, input_dim, units)
    expected = hdf5_format.preprocess_weights_for_loading(
        legacy_layer, list(keras_weights)
    )
    for g, e in zip(to_legacy(keras_weights), expected):
        np.testing.assert_array_equal(g, e)


def _fake_cudnn_rnn_v3(
    input, input_h, input_c, params, rnn_mode="lstm", sequence_lengths=None, **_
):
    """Numpy stand-in for the GPU-only `CudnnRNNV3` op (unidirectional, one
    layer, time-major): reads `params` as cuDNN lays it out (the canonical
    matrices, each (units, in) row-major, in cuDNN gate order, then the
    biases) and applies cuDNN's documented equations."""
    import tensorflow as tf

    x = np.transpose(np.asarray(input), (1, 0, 2))  # (B, T, D)
    h0 = np.asarray(input_h)[0]
    units, input_dim = h0.shape[1], x.shape[2]
    gates = 4 if rnn_mode == "lstm" else 3
    flat = np.asarray(params)
    weights, offset = [], 0
    for g in range(2 * gates):
        cols = input_dim if g < gates else units
        weights.append(flat[offset : offset + units * cols].reshape(units, cols))
        offset += units * cols
    biases = [
        flat[offset + g * units : offset + (g + 1) * units] for g in range(2 * gates)
    ]
    assert offset + 2 * gates * units == flat.size
    if rnn_mode == "lstm":
        y, h, c = cudnn_lstm_reference(x, weights, biases, h0, np.asarray(input_c)[0])
    else:
        y, h = cudnn_gru_reference(x, weights, biases, h0)
        c = np.zeros_like(h)
    as_tf = lambda a: tf.constant(np.asarray(a, np.float32))  # noqa: E731
    return (
        as_tf(np.transpose(y, (1, 0, 2))),
        as_tf(h[None]),
        as_tf(c[None]),
        tf.zeros([0]),
        tf.zeros([0], tf.int8),
    )


@requires_tf_keras
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_legacy_layer_semantics_match_keras(kind, monkeypatch):
    """The real legacy layer (its own weight slicing and gate reordering), run
    through cuDNN's documented equations, equals Keras 3 with converted
    weights; and Keras weights converted back drive the legacy layer to the
    Keras outputs."""
    import tensorflow as tf

    keras_v1 = legacy_keras_v1()
    layer_cls = (
        keras_v1.layers.CuDNNLSTM if kind == "lstm" else keras_v1.layers.CuDNNGRU
    )
    module = sys.modules[layer_cls.__module__]
    monkeypatch.setattr(module.tf.raw_ops, "CudnnRNNV3", _fake_cudnn_rnn_v3)
    rng = rng_for("fake", kind)
    batch, steps, input_dim, units = 3, 5, 3, 4
    x = normal(rng, batch, steps, input_dim, scale=1.0)

    def run_legacy(weights):
        layer = layer_cls(units, return_sequences=True, return_state=True)
        layer.build((None, steps, input_dim))
        layer.set_weights(weights)
        return [np.asarray(o) for o in layer(tf.constant(x))]

    legacy = random_legacy(rng, kind, input_dim, units)
    to_keras = (
        convert.cudnn_lstm_to_lstm if kind == "lstm" else convert.cudnn_gru_to_gru
    )
    for got, want in zip(run_keras(kind, to_keras(legacy), x), run_legacy(legacy)):
        np.testing.assert_allclose(got, want, atol=ATOL)

    keras_weights = random_keras(rng, kind, input_dim, units)
    to_legacy = (
        convert.lstm_to_cudnn_lstm if kind == "lstm" else convert.gru_to_cudnn_gru
    )
    legacy_out = run_legacy(to_legacy(keras_weights))
    for got, want in zip(legacy_out, run_keras(kind, keras_weights, x)):
        np.testing.assert_allclose(got, want, atol=ATOL)


@requires_tf_keras
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_legacy_bidirectional_pair_equals_tf_keras_converter(kind):
    import tf_keras
    from tf_keras.src.saving.legacy import hdf5_format

    keras_v1 = legacy_keras_v1()
    input_dim, units = 3, 2
    if kind == "lstm":
        inner, legacy_inner = (
            tf_keras.layers.LSTM(units),
            keras_v1.layers.CuDNNLSTM(units),
        )
    else:
        inner = tf_keras.layers.GRU(units, reset_after=True)
        legacy_inner = keras_v1.layers.CuDNNGRU(units)
    target = tf_keras.layers.Bidirectional(inner)
    target.build((None, 4, input_dim))
    legacy_target = keras_v1.layers.Bidirectional(legacy_inner)
    legacy_target.build((None, 4, input_dim))
    rng = rng_for("bi", kind)
    legacy = random_legacy(rng, kind, input_dim, units) + random_legacy(
        rng, kind, input_dim, units
    )
    expected = hdf5_format.preprocess_weights_for_loading(target, list(legacy))
    got = convert.cudnn_bidirectional_to_bidirectional(legacy)
    assert len(got) == 6
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)

    keras_weights = random_keras(rng, kind, input_dim, units) + random_keras(
        rng, kind, input_dim, units
    )
    expected = hdf5_format.preprocess_weights_for_loading(
        legacy_target, list(keras_weights)
    )
    for g, e in zip(
        convert.bidirectional_to_cudnn_bidirectional(keras_weights), expected
    ):
        np.testing.assert_array_equal(g, e)


STEPS, FEATURES = 6, 3


def _legacy_model(keras_v1):
    """A tf-keras model with every legacy CuDNN layer kind (CPU-buildable)."""
    L = keras_v1.layers
    inputs = L.Input((STEPS, FEATURES))
    x = L.Bidirectional(L.CuDNNLSTM(4, return_sequences=True))(inputs)
    x = L.CuDNNGRU(3, return_sequences=True)(x)
    x = L.Dense(5)(x)
    x = L.Bidirectional(L.CuDNNGRU(2, return_sequences=True))(x)
    x = L.CuDNNLSTM(3)(x)
    return keras_v1.Model(inputs, L.Dense(2)(x))


def _reference_model(tf_keras):
    """The same architecture with tf-keras' non-CuDNN layers."""
    L = tf_keras.layers
    inputs = L.Input((STEPS, FEATURES))
    x = L.Bidirectional(L.LSTM(4, return_sequences=True))(inputs)
    x = L.GRU(3, return_sequences=True, reset_after=True)(x)
    x = L.Dense(5)(x)
    x = L.Bidirectional(L.GRU(2, return_sequences=True, reset_after=True))(x)
    x = L.LSTM(3)(x)
    return tf_keras.Model(inputs, L.Dense(2)(x))


def _keras3_model(bidirectional_cls):
    L = keras.layers
    inputs = keras.Input((STEPS, FEATURES))
    x = bidirectional_cls(L.LSTM(4, return_sequences=True, unroll=True))(inputs)
    x = L.GRU(3, return_sequences=True, unroll=True)(x)
    x = L.Dense(5)(x)
    x = bidirectional_cls(L.GRU(2, return_sequences=True, unroll=True))(x)
    x = L.LSTM(3, unroll=True)(x)
    return keras.Model(inputs, L.Dense(2)(x))


def _bidirectional_classes():
    yield pytest.param(keras.layers.Bidirectional, id="keras.Bidirectional")
    masked = getattr(maskedrnn, "MaskedBidirectional", None)
    yield pytest.param(
        masked,
        id="MaskedBidirectional",
        marks=pytest.mark.skipif(
            masked is None, reason="maskedrnn.MaskedBidirectional not importable yet"
        ),
    )


@pytest.fixture(scope="module")
def legacy_h5_files(tmp_path_factory):
    """A legacy model with random weights (random biases too) saved by tf-keras
    as a full-model .h5 and a weights-only .h5, plus the predictions of the
    non-CuDNN tf-keras model that loaded the file (tf-keras' own conversion)."""
    if not HAS_TF_KERAS:
        pytest.skip("needs tensorflow and tf-keras")
    import tf_keras

    keras_v1 = legacy_keras_v1()
    rng = rng_for("h5")
    legacy = _legacy_model(keras_v1)
    legacy.set_weights([normal(rng, *w.shape) for w in legacy.get_weights()])
    directory = tmp_path_factory.mktemp("legacy_h5")
    files = {"model": directory / "legacy_model.h5", "weights": directory / "w.h5"}
    legacy.save(files["model"])
    legacy.save_weights(files["weights"])
    x = normal(rng, 4, STEPS, FEATURES, scale=1.0)
    reference = _reference_model(tf_keras)
    reference.load_weights(files["weights"])
    expected = reference(x).numpy()
    return files, x, expected


@requires_tf_keras
@pytest.mark.parametrize("file_kind", ["model", "weights"])
@pytest.mark.parametrize("bidirectional_cls", list(_bidirectional_classes()))
def test_load_legacy_cudnn_h5_predicts_like_tf_keras(
    legacy_h5_files, file_kind, bidirectional_cls
):
    files, x, expected = legacy_h5_files
    model = _keras3_model(bidirectional_cls)
    convert.load_legacy_cudnn_h5(str(files[file_kind]), model)
    np.testing.assert_allclose(to_np(model(x)), expected, atol=ATOL)


@requires_tf_keras
def test_load_legacy_cudnn_h5_rejects_mismatched_models(legacy_h5_files):
    files, _, _ = legacy_h5_files
    L = keras.layers
    inputs = keras.Input((STEPS, FEATURES))
    too_short = keras.Model(inputs, L.LSTM(3)(inputs))
    with pytest.raises(ValueError, match="has 6 layers with weights"):
        convert.load_legacy_cudnn_h5(files["model"], too_short)

    # CuDNNGRU weights cannot go into GRU(reset_after=False).
    x = keras.layers.Bidirectional(L.LSTM(4, return_sequences=True))(inputs)
    x = L.GRU(3, return_sequences=True, reset_after=False)(x)
    x = L.Dense(5)(x)
    x = keras.layers.Bidirectional(L.GRU(2, return_sequences=True))(x)
    x = L.LSTM(3)(x)
    model = keras.Model(inputs, L.Dense(2)(x))
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match="reset_after=True"):
        convert.load_legacy_cudnn_h5(files["model"], model)
    # Nothing was assigned.
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_load_legacy_cudnn_h5_rejects_non_keras_files(tmp_path):
    import h5py

    path = tmp_path / "not_keras.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros(3)
    inputs = keras.Input((2, 3))
    model = keras.Model(inputs, keras.layers.LSTM(2)(inputs))
    with pytest.raises(ValueError, match="not a Keras HDF5"):
        convert.load_legacy_cudnn_h5(path, model)
    with pytest.raises(TypeError, match="`model`"):
        convert.load_legacy_cudnn_h5(path, "model")


# ---------------------------------------------------------------------------
# 2. TF1 cuDNN canonical params and CudnnCompatible*Cell variables.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("flattened", [False, True], ids=["matrices", "flat"])
def test_cudnn_canonical_to_keras_follows_cudnn_equations(kind, flattened):
    rng = rng_for("canonical", kind, flattened)
    input_dim, units = 3, 4
    x = normal(rng, 2, 5, input_dim, scale=1.0)
    weights, biases = random_canonical(rng, kind, input_dim, units)
    given = [w.reshape(-1) for w in weights] if flattened else weights
    if kind == "lstm":
        keras_weights = convert.cudnn_canonical_lstm_to_lstm(given, biases)
        expected = cudnn_lstm_reference(x, weights, biases)
    else:
        keras_weights = convert.cudnn_canonical_gru_to_gru(given, biases)
        expected = cudnn_gru_reference(x, weights, biases)
    for got, want in zip(run_keras(kind, keras_weights, x), expected):
        np.testing.assert_allclose(got, want, atol=ATOL)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_keras_to_cudnn_canonical_follows_cudnn_equations(kind):
    rng = rng_for("to_canonical", kind)
    input_dim, units = 5, 2
    x = normal(rng, 2, 4, input_dim, scale=1.0)
    keras_weights = random_keras(rng, kind, input_dim, units)
    if kind == "lstm":
        weights, biases = convert.lstm_to_cudnn_canonical_lstm(keras_weights)
        expected = cudnn_lstm_reference(x, weights, biases)
    else:
        weights, biases = convert.gru_to_cudnn_canonical_gru(keras_weights)
        expected = cudnn_gru_reference(x, weights, biases)
    assert [w.shape for w in weights[: len(weights) // 2]] == [(units, input_dim)] * (
        len(weights) // 2
    )
    for got, want in zip(run_keras(kind, keras_weights, x), expected):
        np.testing.assert_allclose(got, want, atol=ATOL)


def _stacked_cudnn_reference(kind, x, weights, biases, num_layers, bidirectional):
    """cuDNN multi-layer semantics: layer k reads layer k-1's output (both
    directions concatenated); the backward direction runs on the reversed
    sequence. Params flat, pseudo-layer by pseudo-layer."""
    per = 8 if kind == "lstm" else 6
    ref = cudnn_lstm_reference if kind == "lstm" else cudnn_gru_reference
    group = 0
    for _ in range(num_layers):
        outputs = []
        for direction in range(2 if bidirectional else 1):
            chunk = slice(group * per, (group + 1) * per)
            seq = x if direction == 0 else x[:, ::-1]
            y = ref(seq, weights[chunk], biases[chunk])[0]
            outputs.append(y if direction == 0 else y[:, ::-1])
            group += 1
        x = np.concatenate(outputs, axis=-1)
    return x


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_multilayer_cudnn_canonical_to_keras_stack(kind, bidirectional):
    rng = rng_for("stack", kind, bidirectional)
    input_dim, units, num_layers = 3, 2, 2
    x = normal(rng, 2, 4, input_dim, scale=1.0)
    weights, biases = [], []
    layer_input = input_dim
    for _ in range(num_layers):
        for _ in range(2 if bidirectional else 1):
            w, b = random_canonical(rng, kind, layer_input, units)
            weights += w
            biases += b
        layer_input = units * (2 if bidirectional else 1)
    expected = _stacked_cudnn_reference(
        kind, x, weights, biases, num_layers, bidirectional
    )

    layers = convert.cudnn_canonical_to_keras(weights, biases, kind, bidirectional)
    assert len(layers) == num_layers
    y = x
    for layer_weights in layers:
        y = run_keras(kind, layer_weights, y, bidirectional=bidirectional)[0]
    np.testing.assert_allclose(y, expected, atol=ATOL)

    # Back: Keras stack -> flat canonical lists that drive the same reference.
    back_w, back_b = convert.keras_to_cudnn_canonical(layers)
    assert len(back_w) == len(weights) and len(back_b) == len(biases)
    np.testing.assert_allclose(
        _stacked_cudnn_reference(kind, x, back_w, back_b, num_layers, bidirectional),
        expected,
        atol=ATOL,
    )


@pytest.mark.parametrize("forget_bias", [0.0, 1.0])
def test_cudnn_compatible_lstm_cell_to_lstm(forget_bias):
    rng = rng_for("lstmcell", forget_bias)
    input_dim, units = 3, 4
    x = normal(rng, 2, 5, input_dim, scale=1.0)
    kernel = normal(rng, input_dim + units, 4 * units)
    bias = normal(rng, 4 * units)
    expected = lstm_block_cell_reference(x, kernel, bias, forget_bias)
    keras_weights = convert.cudnn_compatible_lstm_cell_to_lstm(
        kernel, bias, forget_bias=forget_bias
    )
    for got, want in zip(run_keras("lstm", keras_weights, x), expected):
        np.testing.assert_allclose(got, want, atol=ATOL)


def test_lstm_to_cudnn_compatible_lstm_cell():
    rng = rng_for("tolstmcell")
    x = normal(rng, 2, 5, 3, scale=1.0)
    keras_weights = random_keras(rng, "lstm", 3, 4)
    kernel, bias = convert.lstm_to_cudnn_compatible_lstm_cell(keras_weights)
    assert kernel.shape == (7, 16) and bias.shape == (16,)
    expected = lstm_block_cell_reference(x, kernel, bias)
    for got, want in zip(run_keras("lstm", keras_weights, x), expected):
        np.testing.assert_allclose(got, want, atol=ATOL)


def test_cudnn_compatible_gru_cell_to_gru_and_back():
    rng = rng_for("grucell")
    input_dim, units = 3, 4
    x = normal(rng, 2, 5, input_dim, scale=1.0)
    cell = [
        normal(rng, input_dim + units, 2 * units),  # gates/kernel
        normal(rng, 2 * units),  # gates/bias
        normal(rng, input_dim, units),  # candidate/input_projection/kernel
        normal(rng, units),
        normal(rng, units, units),  # candidate/hidden_projection/kernel
        normal(rng, units),
    ]
    assert len(convert.CUDNN_COMPATIBLE_GRU_CELL_VARIABLES) == len(cell)
    expected = cudnn_compatible_gru_cell_reference(x, *cell)
    keras_weights = convert.cudnn_compatible_gru_cell_to_gru(*cell)
    for got, want in zip(run_keras("gru", keras_weights, x), expected):
        np.testing.assert_allclose(got, want, atol=ATOL)

    keras_weights = random_keras(rng, "gru", input_dim, units)
    back = convert.gru_to_cudnn_compatible_gru_cell(keras_weights)
    expected = cudnn_compatible_gru_cell_reference(x, *back)
    for got, want in zip(run_keras("gru", keras_weights, x), expected):
        np.testing.assert_allclose(got, want, atol=ATOL)


# ---------------------------------------------------------------------------
# 3. PyTorch nn.LSTM / nn.GRU.
# ---------------------------------------------------------------------------


def torch_module(kind, input_dim, units, **kwargs):
    import torch

    cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
    return cls(input_dim, units, batch_first=True, **kwargs)


def run_torch(module, x, lengths=None):
    """Returns (padded outputs, [h_n, (c_n)]) as numpy; packed if lengths."""
    import torch

    xt = torch.from_numpy(x)
    with torch.no_grad():
        if lengths is None:
            y, state = module(xt)
        else:
            packed = torch.nn.utils.rnn.pack_padded_sequence(
                xt, torch.as_tensor(lengths), batch_first=True, enforce_sorted=False
            )
            y, state = module(packed)
            y, _ = torch.nn.utils.rnn.pad_packed_sequence(
                y, batch_first=True, total_length=x.shape[1]
            )
    states = list(state) if isinstance(state, tuple) else [state]
    return y.numpy(), [s.numpy() for s in states]


def run_keras_stack(kind, layers_weights, x, mask=None, bidirectional_cls=None, **kw):
    """Stacked Keras layers; returns (last outputs, [per-layer state lists])."""
    y, states = x, []
    for weights in layers_weights:
        units = np.asarray(weights[1]).shape[0]
        layer = keras_rnn(kind, units, mask, use_bias=len(weights) % 3 == 0, **kw)
        if bidirectional_cls is not None:
            layer = bidirectional_cls(layer)
        layer.build(y.shape)
        layer.set_weights(weights)
        out = layer(y, mask=mask)
        y = to_np(out[0])
        states.append([to_np(s) for s in out[1:]])
    return y, states


def assert_states_match_torch(kind, keras_states, torch_states, bidirectional):
    """Keras per-layer [h_fw, (c_fw), h_bw, (c_bw)] vs torch h_n (and c_n) of
    shape (num_layers * directions, batch, H)."""
    per_direction = 2 if kind == "lstm" else 1
    directions = 2 if bidirectional else 1
    for k, layer_states in enumerate(keras_states):
        for d in range(directions):
            for s in range(per_direction):
                np.testing.assert_allclose(
                    layer_states[d * per_direction + s],
                    torch_states[s][k * directions + d],
                    atol=ATOL,
                )


@requires_torch
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize(
    "num_layers,bidirectional", [(1, False), (2, False), (2, True)]
)
def test_torch_state_dict_to_keras_unmasked(kind, num_layers, bidirectional):
    import torch

    torch.manual_seed(0)
    input_dim, units = 3, 4
    module = torch_module(
        kind, input_dim, units, num_layers=num_layers, bidirectional=bidirectional
    )
    x = normal(
        rng_for("torch", kind, num_layers, bidirectional), 3, 5, input_dim, scale=1
    )
    expected, torch_states = run_torch(module, x)

    layers = convert.torch_state_dict_to_keras(module.state_dict())
    assert len(layers) == num_layers
    assert all(len(w) == (6 if bidirectional else 3) for w in layers)
    bi_cls = keras.layers.Bidirectional if bidirectional else None
    y, keras_states = run_keras_stack(kind, layers, x, bidirectional_cls=bi_cls)
    np.testing.assert_allclose(y, expected, atol=ATOL)
    assert_states_match_torch(kind, keras_states, torch_states, bidirectional)


@requires_torch
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_keras_to_torch_state_dict_loads_into_torch(kind, bidirectional):
    import torch

    rng = rng_for("k2t", kind, bidirectional)
    input_dim, units, num_layers = 3, 4, 2
    directions = 2 if bidirectional else 1
    layers = []
    layer_input = input_dim
    for _ in range(num_layers):
        layer = []
        for _ in range(directions):
            layer += random_keras(rng, kind, layer_input, units)
        layers.append(layer)
        layer_input = units * directions
    x = normal(rng, 3, 5, input_dim, scale=1.0)
    bi_cls = keras.layers.Bidirectional if bidirectional else None
    expected, keras_states = run_keras_stack(kind, layers, x, bidirectional_cls=bi_cls)

    state = convert.keras_to_torch_state_dict(layers)
    if kind == "lstm":
        # Documented split: the whole Keras bias in bias_ih, zeros in bias_hh.
        np.testing.assert_array_equal(state["bias_ih_l0"], layers[0][2])
        np.testing.assert_array_equal(state["bias_hh_l0"], np.zeros(4 * units))
    module = torch_module(
        kind, input_dim, units, num_layers=num_layers, bidirectional=bidirectional
    )
    module.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    y, torch_states = run_torch(module, x)
    np.testing.assert_allclose(y, expected, atol=ATOL)
    assert_states_match_torch(kind, keras_states, torch_states, bidirectional)


@requires_torch
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_torch_without_bias_round_trips_through_keras_use_bias_false(kind):
    import torch

    torch.manual_seed(1)
    module = torch_module(kind, 3, 2, bias=False, bidirectional=True)
    x = normal(rng_for("nobias", kind), 2, 4, 3, scale=1.0)
    expected, torch_states = run_torch(module, x)
    layers = convert.torch_state_dict_to_keras(module.state_dict())
    assert [len(w) for w in layers] == [4]
    y, keras_states = run_keras_stack(
        kind, layers, x, bidirectional_cls=keras.layers.Bidirectional
    )
    np.testing.assert_allclose(y, expected, atol=ATOL)
    assert_states_match_torch(kind, keras_states, torch_states, True)
    state = convert.keras_to_torch_state_dict(layers)
    assert sorted(state) == sorted(module.state_dict())
    for key, value in module.state_dict().items():
        np.testing.assert_array_equal(state[key], value.numpy())


LENGTHS = [6, 2, 4, 1]


@requires_torch
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("bidirectional_cls", list(_bidirectional_classes()))
def test_torch_packed_sequence_equals_masked_keras_bidirectional(
    kind, bidirectional_cls
):
    """Padded batch: PyTorch on a PackedSequence vs the converted weights in
    Keras given the mask (2 stacked bidirectional layers). Outputs (zeros at
    padded steps) and final states of every layer and direction match."""
    import torch

    torch.manual_seed(2)
    input_dim, units, steps = 3, 4, max(LENGTHS)
    module = torch_module(kind, input_dim, units, num_layers=2, bidirectional=True)
    # Padded steps hold garbage: they must be ignored.
    x = normal(rng_for("packed", kind), len(LENGTHS), steps, input_dim, scale=1.0)
    mask = np.arange(steps)[None, :] < np.asarray(LENGTHS)[:, None]
    expected, torch_states = run_torch(module, x, LENGTHS)
    assert np.all(expected[~mask] == 0)

    layers = convert.torch_state_dict_to_keras(module.state_dict())
    y, keras_states = run_keras_stack(
        kind, layers, x, mask=mask, bidirectional_cls=bidirectional_cls
    )
    np.testing.assert_allclose(y, expected, atol=ATOL)
    assert_states_match_torch(kind, keras_states, torch_states, True)


@requires_torch
def test_torch_state_dict_prefix_selects_a_submodule():
    import torch

    torch.manual_seed(3)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.GRU(3, 2, batch_first=True)
            self.head = torch.nn.Linear(2, 1)

    model = Model()
    layers = convert.torch_state_dict_to_keras(model.state_dict(), prefix="rnn.")
    x = normal(rng_for("prefix"), 2, 4, 3, scale=1.0)
    expected, _ = run_torch(model.rnn, x)
    np.testing.assert_allclose(run_keras("gru", layers[0], x)[0], expected, atol=ATOL)
    state = convert.keras_to_torch_state_dict(layers, prefix="rnn.")
    assert sorted(state) == sorted(
        k for k in model.state_dict() if k.startswith("rnn.")
    )
    with pytest.raises(ValueError, match="prefix"):
        convert.torch_state_dict_to_keras(model.state_dict())


@requires_torch
def test_torch_errors_name_the_problem():
    import torch

    projected = torch.nn.LSTM(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="proj_size"):
        convert.torch_state_dict_to_keras(projected.state_dict())
    with pytest.raises(TypeError, match="mapping"):
        convert.torch_state_dict_to_keras([np.zeros(3)])
    weight = torch.zeros(8, 3, requires_grad=True)
    with pytest.raises(TypeError, match="detach"):
        convert.torch_lstm_to_lstm(weight, np.zeros((8, 2)))
    with pytest.raises(ValueError, match="both `bias_ih` and `bias_hh`"):
        convert.torch_gru_to_gru(np.zeros((6, 3)), np.zeros((6, 2)), np.zeros(6))
    with pytest.raises(TypeError, match=r"\[layer.get_weights\(\)\]"):
        convert.keras_to_torch_state_dict([np.zeros((3, 8)), np.zeros((2, 8))])


# ---------------------------------------------------------------------------
# Argument checking (all converters): errors name the argument and the fix.
# ---------------------------------------------------------------------------


def test_reset_after_false_gru_weights_are_rejected():
    gru_v1 = [np.zeros((3, 6)), np.zeros((2, 6)), np.zeros(6)]
    for fn in (
        convert.gru_to_cudnn_gru,
        convert.gru_to_torch_gru,
        convert.gru_to_cudnn_canonical_gru,
        convert.gru_to_cudnn_compatible_gru_cell,
    ):
        with pytest.raises(ValueError, match="reset_after=True"):
            fn(gru_v1)


def test_shape_and_length_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"list of 3 arrays .*CuDNNLSTM"):
        convert.cudnn_lstm_to_lstm([np.zeros((3, 8)), np.zeros((2, 8))])
    with pytest.raises(ValueError, match=r"`weights\[2\]` must have shape \(16,\)"):
        convert.cudnn_lstm_to_lstm([np.zeros((3, 8)), np.zeros((2, 8)), np.zeros(8)])
    with pytest.raises(ValueError, match=r"`weights\[1\]` must have shape \(2, 6\)"):
        convert.cudnn_gru_to_gru([np.zeros((3, 6)), np.zeros((2, 8)), np.zeros(12)])
    with pytest.raises(TypeError, match="list of 3 arrays"):
        convert.lstm_to_cudnn_lstm(np.zeros((3, 8)))
    with pytest.raises(
        ValueError,
        match=r"`weights\[1\] \(forward recurrent_kernel\)` must have shape \(units, 4",
    ):
        convert.cudnn_bidirectional_to_bidirectional(
            [np.zeros((3, 8)), np.zeros((2, 5)), np.zeros(16)] * 2
        )
    with pytest.raises(ValueError, match=r"`biases` must be a list of 8"):
        convert.cudnn_canonical_lstm_to_lstm([np.zeros((2, 3))] * 8, [np.zeros(2)] * 6)
    with pytest.raises(ValueError, match=r"`weights\[4\]` must have shape \(2, 2\)"):
        convert.cudnn_canonical_lstm_to_lstm(
            [np.zeros((2, 3))] * 5 + [np.zeros((2, 2))] * 3, [np.zeros(2)] * 8
        )
    with pytest.raises(ValueError, match='`rnn_mode` must be "lstm" or "gru"'):
        convert.cudnn_canonical_to_keras([], [], "rnn")
    with pytest.raises(ValueError, match="8 arrays per layer and direction"):
        convert.cudnn_canonical_to_keras(
            [np.zeros((2, 2))] * 8, [np.zeros(2)] * 8, "lstm", bidirectional=True
        )
    with pytest.raises(ValueError, match="`kernel` has 2 rows"):
        convert.cudnn_compatible_lstm_cell_to_lstm(np.zeros((2, 8)), np.zeros(8))
    with pytest.raises(ValueError, match="`gates_kernel` must have shape"):
        convert.cudnn_compatible_gru_cell_to_gru(
            np.zeros((4, 4)),
            np.zeros(4),
            np.zeros((3, 2)),
            np.zeros(2),
            np.zeros((2, 2)),
            np.zeros(2),
        )
    with pytest.raises(TypeError, match="`weights\\[0\\]` must hold real numbers"):
        convert.lstm_to_torch_lstm([np.array(["a"]), np.zeros((2, 8)), np.zeros(8)])
    with pytest.raises(ValueError, match="same RNN type"):
        convert.keras_to_cudnn_canonical(
            [
                random_keras(rng_for("mix"), "lstm", 3, 2),
                random_keras(rng_for("mix"), "gru", 2, 2),
            ]
        )


def test_converters_accept_anything_asarray_takes_and_keep_dtype():
    # Nested Python lists in, numpy arrays out; float64 stays float64.
    legacy = [np.ones((3, 8)).tolist(), np.ones((2, 8)).tolist(), [0.25] * 16]
    out = convert.cudnn_lstm_to_lstm(legacy)
    assert all(isinstance(a, np.ndarray) and a.dtype == np.float64 for a in out)
    np.testing.assert_array_equal(out[2], np.full(8, 0.5))
    out32 = convert.lstm_to_cudnn_lstm([a.astype("float32") for a in out])
    assert all(a.dtype == np.float32 for a in out32)


def test_docstring_examples_run():
    import doctest

    results = doctest.testmod(convert, extraglobs={"np": np})
    assert results.failed == 0 and results.attempted > 20
