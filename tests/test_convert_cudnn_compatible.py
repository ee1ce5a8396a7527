"""Specification of `maskedrnn.convert.cudnn_compatible`: TF1
CudnnCompatibleLSTMCell / CudnnCompatibleGRUCell (and LSTMBlockCell-style)
checkpoint variables, checked against numpy implementations of the cells'
documented equations.
"""

import numpy as np
import pytest

from maskedrnn import convert
from tests.convert_helpers import (
    ATOL,
    cudnn_compatible_gru_cell_reference,
    lstm_block_cell_reference,
    normal,
    random_keras,
    rng_for,
    run_keras,
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


def test_docstring_examples_run():
    import doctest

    from maskedrnn.convert import cudnn_compatible

    results = doctest.testmod(cudnn_compatible, extraglobs={"np": np})
    assert results.failed == 0 and results.attempted > 0
