"""Specification of `maskedrnn.convert.legacy_cudnn`: legacy CuDNNLSTM/CuDNNGRU.

Oracles that do not use the converter under test: tf-keras' own converter
(`hdf5_format.preprocess_weights_for_loading`, and `load_weights` of an `.h5`
into a non-CuDNN tf-keras model), a published before/after pair
(`tests/data/cudnngru_to_gru_example.json`), and the real legacy layer run
with a numpy stand-in for the GPU-only `CudnnRNNV3` op that follows cuDNN's
documented equations and parameter layout. The tf-keras tests need
`pip install --no-deps tf-keras==2.21.0` and are skipped without it.
"""

import json
import sys
import textwrap

import keras
import numpy as np
import pytest

from maskedrnn import convert
from tests.convert_helpers import (
    ATOL,
    DATA,
    HAS_TF_KERAS,
    bidirectional_classes,
    cudnn_gru_reference,
    cudnn_lstm_reference,
    normal,
    random_keras,
    requires_tf_keras,
    rng_for,
    run_keras,
    to_np,
)
from tests.helpers import run_python


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
@pytest.mark.parametrize("bidirectional_cls", list(bidirectional_classes()))
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


def test_docstring_examples_run():
    import doctest

    from maskedrnn.convert import legacy_cudnn

    results = doctest.testmod(legacy_cudnn, extraglobs={"np": np})
    assert results.failed == 0 and results.attempted > 0


@pytest.mark.on_backends("torch")  # a fresh process: the same on any backend
def test_h5py_is_needed_only_to_read_h5_files():
    """`h5py` is imported inside the functions that read `.h5` files, never
    when maskedrnn is imported. (Keras 3.15 itself imports h5py on `import
    keras` when it is installed, so `sys.modules` cannot show this; instead
    h5py is made unimportable in a fresh process.)"""
    code = textwrap.dedent(
        """
        import sys, types
        sys.modules["h5py"] = None  # `import h5py` now raises ImportError
        import numpy as np
        import maskedrnn
        from maskedrnn import convert

        w = convert.cudnn_lstm_to_lstm([np.ones((3, 8)), np.ones((2, 8)), np.zeros(16)])
        assert [a.shape for a in w] == [(3, 8), (2, 8), (8,)]
        holders = [
            name for name, module in list(sys.modules.items())
            if name.startswith("maskedrnn") and isinstance(module, types.ModuleType)
            and "h5py" in vars(module)
        ]
        assert not holders, holders
        import keras

        inputs = keras.Input((2, 3))
        model = keras.Model(inputs, keras.layers.LSTM(2)(inputs))
        try:
            convert.load_legacy_cudnn_h5("missing.h5", model)
        except ImportError:
            pass
        else:
            raise AssertionError("load_legacy_cudnn_h5 ran without h5py")
        print("ok")
        """
    )
    assert run_python(["-c", code], keras.backend.backend()).strip() == "ok"
