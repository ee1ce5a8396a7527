"""A stack of maskedrnn layers keeps the mask, on every Keras version.

Keras 3.16 stops passing masks past its RNN layers (`RNN`, `Bidirectional`
set `supports_masking = False`): in a stack of Keras RNNs the second RNN and
the loss see no mask there. maskedrnn's layers keep returning the mask, so a
stack of them has the masked semantics of Keras 3.15 on every version.

Oracle: the same weights in Keras' own layers (`use_cudnn=False`), each
handed the mask explicitly (`layer(h, mask=m)`), which states the masked
semantics without relying on Keras passing masks along; and the loss
computed in numpy (float64) as the mean over valid steps.
"""

import warnings

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional, MaskedRNN
from maskedrnn._keras_private import get_keras_mask
from tests.helpers import make_rnn, to_np

B, T, V, D, U, C = 5, 7, 11, 4, 3, 6
DESTROY = "will therefore destroy the mask information"


def tokens(padding):
    """Token ids with 0 as padding, one all-padding row."""
    rng = np.random.default_rng(0)
    lengths = np.array([T, 4, 1, 0, 5])
    ids = rng.integers(1, V, (B, T))
    valid = np.arange(T)[None] < lengths[:, None]
    if padding == "pre":
        valid = valid[:, ::-1]
    labels = rng.integers(0, C, (B, T))
    return np.where(valid, ids, 0).astype("int32"), valid, labels.astype("int32")


def stack():
    """Embedding(mask_zero) -> MaskedBidirectional(LSTM) -> MaskedRNN(GRU) ->
    Dense, compiled with a per-step loss, and the layers in order."""
    keras.utils.set_random_seed(1)
    # Large weights: logits far from uniform, so masking matters to the loss.
    big = keras.initializers.RandomNormal(stddev=3.0)
    layers = [
        keras.layers.Embedding(V, D, mask_zero=True, embeddings_initializer=big),
        MaskedBidirectional(keras.layers.LSTM(U, return_sequences=True)),
        MaskedRNN(keras.layers.GRU(U, return_sequences=True)),
        keras.layers.Dense(C, kernel_initializer=big, bias_initializer=big),
    ]
    inputs = keras.Input((None,), dtype="int32")
    h = inputs
    for layer in layers:
        h = layer(h)
    model = keras.Model(inputs, h)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(loss=loss)
    return model, layers


def oracle(layers, ids, valid):
    """The same weights in Keras layers, the mask handed to each RNN."""
    embedding, bidirectional, rnn, dense = layers
    ref_bi = keras.layers.Bidirectional(
        keras.layers.LSTM(U, return_sequences=True, use_cudnn=False)
    )
    ref_rnn = keras.layers.GRU(U, return_sequences=True, use_cudnn=False)
    ref_bi.build((None, None, D))
    ref_rnn.build((None, None, 2 * U))
    ref_bi.set_weights(bidirectional.get_weights())
    ref_rnn.set_weights(rnn.get_weights())
    mask = keras.ops.convert_to_tensor(valid)
    with warnings.catch_warnings():
        # Keras 3.16's own RNNs warn when handed a mask: expected here.
        warnings.filterwarnings("ignore", message=".*" + DESTROY)
        h = ref_bi(embedding(ids), mask=mask)
        h = ref_rnn(h, mask=mask)
    return to_np(dense(h))


@pytest.mark.parametrize("padding", ["post", "pre"])
def test_stack_keeps_the_mask_into_the_next_layer_and_the_loss(padding):
    ids, valid, labels = tokens(padding)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, layers = stack()
        out = to_np(model(ids))
        loss = model.evaluate(ids, labels, verbose=0)
    assert not [w for w in caught if DESTROY in str(w.message)]

    # Every step, padded ones included (MaskedRNN follows the wrapped
    # layer's conventions there, as Keras' GRU handed the mask does).
    np.testing.assert_allclose(out, oracle(layers, ids, valid), atol=1e-5, rtol=1e-5)

    # The mask reaches the compiled loss: the mean over valid steps only.
    logits = out.astype("float64")
    logits -= logits.max(-1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    per_step = -np.take_along_axis(log_p, labels[..., None], -1)[..., 0]
    np.testing.assert_allclose(loss, per_step[valid].mean(), rtol=1e-5)
    # (The mean over every step differs: a lost mask would be seen.)
    assert abs(per_step.mean() - per_step[valid].mean()) > 1e-2


def test_every_layer_of_the_stack_outputs_a_mask():
    model, _ = stack()
    for tensor in [layer.output for layer in model.layers[1:]]:
        assert get_keras_mask(tensor) is not None, tensor.name


@pytest.mark.parametrize("wrapper", [MaskedBidirectional, MaskedRNN])
@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_cell"])
def test_masked_calls_never_warn_that_the_mask_is_destroyed(wrapper, kind):
    """Keras 3.16 warns when an RNN layer is called with a mask ("... will
    therefore destroy the mask information"). The wrapped layers are
    maskedrnn's own: a masked call of either layer, on whichever path runs
    (`RNN(cell)` always runs Keras' masked loop, which is handed the mask),
    warns about nothing."""
    x = np.random.default_rng(0).standard_normal((B, T, D)).astype("float32")
    _, valid, _ = tokens("pre")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layer = wrapper(make_rnn(kind, U, return_sequences=True, return_state=True))
        layer(x, mask=valid)
        layer(x, lengths=valid.sum(1))
    assert not [w for w in caught if DESTROY in str(w.message)]


@pytest.mark.parametrize(
    "wrapper, go_backwards",
    [(MaskedBidirectional, False), (MaskedRNN, False), (MaskedRNN, True)],
)
@pytest.mark.parametrize("return_state", [False, True])
def test_output_mask_is_the_input_mask_on_every_kernel(
    kernel, wrapper, go_backwards, return_state
):
    """The sequence outputs carry the input mask as it is, as Keras'
    `RNN.compute_mask` says, whichever kernel the layer runs: not the reversed
    mask a `go_backwards` direction reads, which the inner layer of Keras'
    masked loop attaches to its own output. States carry no mask."""
    x = np.random.default_rng(0).standard_normal((B, T, D)).astype("float32")
    _, valid, _ = tokens("pre")
    inner = keras.layers.GRU(
        U, return_sequences=True, return_state=return_state, go_backwards=go_backwards
    )
    if wrapper is MaskedBidirectional:
        layer, n_sequences = wrapper(inner, merge_mode=None), 2
    else:
        layer, n_sequences = wrapper(inner), 1
    outputs = layer(x, mask=valid)
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    for y in outputs[:n_sequences]:
        np.testing.assert_array_equal(to_np(get_keras_mask(y)), valid)
    for state in outputs[n_sequences:]:
        assert get_keras_mask(state) is None
