"""Argument checking shared by every converter (`maskedrnn.convert._validate`):
errors name the argument and the fix; anything `np.asarray` takes is accepted
and the dtype is kept.
"""

import numpy as np
import pytest

from maskedrnn import convert
from tests.convert_helpers import (
    random_keras,
    rng_for,
)


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
