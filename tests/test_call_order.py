"""Both layers take Keras' call order: `(inputs, initial_state, mask, training)`.

`keras.layers.Bidirectional.call(sequences, initial_state=None, mask=None,
training=None)` and `keras.layers.RNN.call(sequences, initial_state=None,
mask=None, training=False)`; ours add `lengths` last. Called positionally
exactly as Keras' own layers are, ours must equal Keras' layer called the
same way (oracle: Keras' layer, `use_cudnn=False`, same weights). A mask
in the wrong place would be read as an initial state (and fail) or dropped
(and give the unmasked result, which differs).
"""

import inspect

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional, MaskedRNN
from tests.helpers import assert_close, flat, oracle_pair, to_np

B, T, D, U = 4, 6, 3, 4


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, T, D)).astype("float32")
    # Right padding and holes, every row starting with a valid step: before
    # a row's first valid step Keras' JAX RNN outputs the initial h where
    # its other backends and ours output zeros (MaskedRNN's docstring).
    mask = np.ones((B, T), bool)
    mask[0, 4:] = False
    mask[1, 2:4] = False
    mask[2, [1, 3]] = False
    return x, mask


def test_signatures_are_keras_order_then_lengths():
    for ours, keras_layer in (
        (MaskedBidirectional, keras.layers.Bidirectional),
        (MaskedRNN, keras.layers.RNN),
    ):
        ours_names = list(inspect.signature(ours.call).parameters)
        keras_names = list(inspect.signature(keras_layer.call).parameters)
        assert (
            ours_names[2:5]
            == keras_names[2:5]
            == [
                "initial_state",
                "mask",
                "training",
            ]
        )
        assert ours_names[5:] == ["lengths"]


@pytest.mark.parametrize("wrapper", ["bidirectional", "rnn"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_positional_calls_match_keras(wrapper, kind):
    ours, ref = oracle_pair(
        kind, U, D, wrapper=wrapper, return_sequences=True, return_state=True
    )
    x, mask = _data()
    n = (2 if kind == "lstm" else 1) * (2 if wrapper == "bidirectional" else 1)
    rng = np.random.default_rng(1)
    state = [rng.standard_normal((B, U)).astype("float32") for _ in range(n)]
    # (inputs, initial_state, mask), tensors positional as Keras allows
    # (a Python `training` must be a keyword there).
    expected = ref(x, state, mask)
    assert_close(ours(x, state, mask), expected)
    got = ours(x, state, mask, training=False)
    assert_close(got, ref(x, state, mask, training=False))
    # (inputs, None, mask): no initial state, a mask.
    assert_close(ours(x, None, mask), ref(x, None, mask))
    # The mask matters here: the unmasked result differs.
    unmasked = flat(ref(x, state))[0]
    assert np.abs(to_np(flat(expected)[0]) - to_np(unmasked)).max() > 1e-3
    # lengths, the fifth argument, wins over the mask (right-padded rows).
    lengths = np.array([6, 3, 1, 2], "int32")
    right = np.arange(T)[None, :] < lengths[:, None]
    assert_close(ours(x, state, mask, None, lengths), ref(x, state, right))


def test_functional_models_record_positional_calls():
    """A Functional model built with positional arguments calls the layer
    the same way when it runs, and survives `convert_model` both ways."""
    import maskedrnn

    seq = keras.Input((T, D))
    mask_in = keras.Input((T,), dtype="bool")
    h0 = keras.Input((U,))
    keras_rnn = keras.layers.GRU(U, return_sequences=True, use_cudnn=False)
    model = keras.Model([seq, mask_in, h0], keras_rnn(seq, [h0], mask_in))
    converted = maskedrnn.convert_model(model)
    assert any(isinstance(layer, MaskedRNN) for layer in converted.layers)
    x, mask = _data()
    h = np.random.default_rng(2).standard_normal((B, U)).astype("float32")
    assert_close(converted([x, mask, h]), model([x, mask, h]))
