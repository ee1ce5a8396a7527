"""Specification of `maskedrnn.convert.cudnn_canonical`: TF1 CudnnLSTM/CudnnGRU
canonical parameters, checked against numpy implementations of cuDNN's
documented equations (one layer, and stacked / bidirectional layers).
"""

import numpy as np
import pytest

from maskedrnn import convert
from tests.convert_helpers import (
    ATOL,
    cudnn_gru_reference,
    cudnn_lstm_reference,
    normal,
    random_canonical,
    random_keras,
    rng_for,
    run_keras,
)


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


def test_docstring_examples_run():
    import doctest

    from maskedrnn.convert import cudnn_canonical

    results = doctest.testmod(cudnn_canonical, extraglobs={"np": np})
    assert results.failed == 0 and results.attempted > 0
