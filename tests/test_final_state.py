"""`maskedrnn.layers.final_state`: states at each row's true length from an
RNN that ran over the padding too.

Which runner a call takes decides whether this module computes the states:
on a GPU (cuDNN) an LSTM runs unmasked and its cell state is recomputed here;
on a CPU the kernels return exact states themselves (Keras' masked loop on
TensorFlow and JAX, PyTorch's packed kernel on torch; see
`tests/test_kernels.py`). So these tests force the unmasked path on the CPU
(Keras' unmasked inner layers forced, `maskedrnn.backends.force`)
and check the states against the oracles: Keras' own masked layer
(`use_cudnn=False`) with the same weights and mask, and a numpy loop.
"""

import keras
import numpy as np
import pytest

from maskedrnn import backends
from maskedrnn.layers import final_state
from tests.helpers import (
    GPU_GRAD_ATOL,
    assert_close,
    edge_mask,
    loss_and_grads,
    oracle_pair,
    record_calls,
    to_np,
)

B, T, D, U = 6, 7, 3, 4


@pytest.fixture
def recomputed(monkeypatch):
    """Every LSTM runs unmasked and its states come from `final_state`, as on
    a GPU; records each `states_at_length` call."""
    calls = record_calls(monkeypatch, final_state, "states_at_length")
    with backends.force("keras-unmasked"):
        yield calls


@pytest.mark.parametrize("wrapper", ["rnn", "bidirectional"])
@pytest.mark.parametrize("go_backwards", [False, True])
def test_recomputed_lstm_states_match_keras(recomputed, wrapper, go_backwards):
    kw = dict(return_sequences=True, return_state=True)
    if wrapper == "rnn":
        kw["go_backwards"] = go_backwards
    elif go_backwards:
        pytest.skip("Bidirectional has no go_backwards of its own")
    ours, ref = oracle_pair("lstm", U, D, wrapper=wrapper, **kw)
    x = np.random.default_rng(0).standard_normal((B, T, D)).astype("float32")
    mask = edge_mask()
    assert_close(ours(x, mask=mask), ref(x, mask=mask))
    assert recomputed, "final_state.states_at_length was not used"
    assert "unmasked" in str(ours.kernel_info())
    loss_o, grads_o = loss_and_grads(ours, x, mask=mask)
    loss_r, grads_r = loss_and_grads(ref, x, mask=mask)
    assert np.isclose(loss_o, loss_r, atol=1e-4)
    for g_o, g_r in zip(grads_o, grads_r):
        np.testing.assert_allclose(g_o, g_r, atol=max(1e-5, GPU_GRAD_ATOL), rtol=1e-4)


def test_recomputed_states_keep_initial_state_of_empty_rows(recomputed):
    ours, ref = oracle_pair(
        "lstm", U, D, wrapper="rnn", return_sequences=False, return_state=True
    )
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, T, D)).astype("float32")
    h0, c0 = (rng.standard_normal((B, U)).astype("float32") for _ in range(2))
    mask = edge_mask()
    out = ours(x, mask=mask, initial_state=[h0, c0])
    expected = ref(x, mask=mask, initial_state=[h0, c0])
    # The states; the last output only where the row has a valid step
    # (Keras' JAX backend returns the initial h as an empty row's output,
    # its other backends and ours zeros: see MaskedRNN's docstring).
    assert_close(out[1:], expected[1:])
    has_steps = mask.any(1)
    np.testing.assert_allclose(
        to_np(out[0])[has_steps], to_np(expected[0])[has_steps], atol=1e-5
    )
    np.testing.assert_array_equal(to_np(out[0])[~has_steps], 0.0)
    np.testing.assert_allclose(to_np(out[1])[3], h0[3], atol=1e-6)
    np.testing.assert_allclose(to_np(out[2])[3], c0[3], atol=1e-6)


def test_lstm_cell_state_at_length_equals_a_numpy_loop():
    """The cell state after `lengths[i]` steps, from the outputs alone, equals
    the c of a step-by-step numpy LSTM (Keras gate order i, f, c, o)."""
    rng = np.random.default_rng(2)
    layer = keras.layers.LSTM(U, return_sequences=True)
    layer.build((None, None, D))
    k, rk, b = (to_np(w) for w in layer.weights)
    x = rng.standard_normal((B, T, D)).astype("float32")
    h0, c0 = (rng.standard_normal((B, U)).astype("float32") for _ in range(2))
    lengths = np.array([7, 3, 0, 1, 5, 6], "int32")

    def sigmoid(z):
        return 1 / (1 + np.exp(-z))

    h, c = h0.astype("float64"), c0.astype("float64")
    hs, cs = [], []
    for t in range(T):
        z = x[:, t] @ k + h @ rk + b
        i, f, g, o = np.split(z, 4, axis=-1)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        hs.append(h)
        cs.append(c)
    h_seq = np.stack(hs, 1).astype("float32")
    expected = np.stack([c0] + cs, 1)[np.arange(B), lengths]
    got = final_state.lstm_cell_state_at_length(
        layer.cell, x, h_seq, h0, c0, lengths
    )
    np.testing.assert_allclose(to_np(got), expected, atol=1e-5)
