"""`maskedrnn.convert.model`: convert_model and bidirectional_to_masked.

Specified against the original models.

The oracle throughout is the model before conversion: Keras' own
`Bidirectional` layers fed the Keras masks of `Embedding(mask_zero=True)`.
The converted model must return the same predictions for the same inputs,
hold copies (not shares) of the same weights, and keep every layer name.
For stacks of RNNs the oracle is the original's layers called with the mask
handed to every RNN explicitly (`masked_reference`): that is what the
original computes on Keras up to 3.15; Keras 3.16 no longer passes masks on
past an RNN, and convert_model keeps the masked semantics (and says so).
"""

import warnings

import keras
import numpy as np
import pytest
from keras import layers, ops

from maskedrnn import MaskedBidirectional, MaskedRNN
from maskedrnn.convert.model import bidirectional_to_masked, convert_model
from tests.helpers import BACKEND, flat, to_np

V, T, E, U, B = 12, 8, 3, 4, 5
ATOL = 1e-5


def padded_ids(seed=0):
    """Token ids (0 = padding) with every padding pattern Keras masks allow."""
    ids = np.random.default_rng(seed).integers(1, V, (B, T)).astype("int32")
    ids[0, 5:] = 0  # right-padded
    ids[1, :3] = 0  # left-padded (keras.utils.pad_sequences' default)
    ids[2, [1, 4]] = 0  # holes
    ids[3, :] = 0  # all padding
    # row 4: full length
    return ids


def predict(model, x):
    """Runs `model` once; on JAX jit-compiled (`predict`), eager JAX RNNs are slow."""
    if BACKEND == "jax":
        return flat(model.predict(x, batch_size=len(x), verbose=0))
    return to_np(flat(model(x)))


def assert_same_predictions(new, old, x):
    expected = predict(old, x)
    actual = predict(new, x)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, atol=ATOL, rtol=1e-5)


# Keras 3.16 and later: Keras' RNN layers no longer pass masks on.
KERAS_DROPS_MASKS = not layers.LSTM(1).supports_masking


def masked_reference(old):
    """A Functional model made of `old`'s own layers (so its weights), each
    RNN handed the mask `ids != 0` explicitly: the masked semantics of the
    test models below on every Keras version. Build it after converting
    `old` (it adds call nodes to `old`'s layers)."""
    ids = keras.Input((T,), dtype="int32")
    mask = ops.not_equal(ids, 0)
    if old.name == "tagger":
        x = old.get_layer("embed")(ids)
        x = old.get_layer("bi_1")(x, mask=mask)
        out = old.get_layer("head")(old.get_layer("bi_2")(x, mask=mask))
    elif old.name == "rnns":
        x = old.get_layer("embed")(ids)
        x = old.get_layer("lstm_seq")(x, mask=mask)
        x = old.get_layer("bi")(x, mask=mask)
        x, h = old.get_layer("gru_back")(x, mask=mask)
        y = old.get_layer("simple")(x, mask=mask)
        out = old.get_layer("head")(layers.Concatenate()([y, h]))
    elif old.name == "big":
        encoder, summarizer = old.get_layer("encoder"), old.get_layer("summarizer")
        x = encoder.get_layer("bi_enc")(encoder.layers[0](ids), mask=mask)
        summary = layers.Concatenate()(
            summarizer.get_layer("bi_states")(x, mask=mask)
        )
        seq, h_f, c_f, h_b, c_b = old.get_layer("bi_top")(x, mask=mask)
        # No mask, on every Keras version: Keras hands a layer the mask of
        # its input only when it is called with one tensor.
        last = old.get_layer("bi_init")(seq, [h_f, h_b])
        out = layers.Concatenate()([summary, last, c_f, c_b])
        out = old.get_layer("head")(out)
    else:
        raise ValueError(old.name)
    return keras.Model(ids, out)


def assert_same_weights(new_layer, old_layer):
    new_w, old_w = new_layer.get_weights(), old_layer.get_weights()
    assert len(new_w) == len(old_w) > 0
    for a, b in zip(new_w, old_w):
        np.testing.assert_array_equal(a, b)


def sequential_model():
    return keras.Sequential(
        [
            keras.Input((T,), dtype="int32"),
            layers.Embedding(V, E, mask_zero=True, name="embed"),
            layers.Bidirectional(
                layers.LSTM(U, return_sequences=True, use_cudnn=False), name="bi_1"
            ),
            layers.Bidirectional(layers.GRU(U), merge_mode="sum", name="bi_2"),
            layers.Dense(2, name="head"),
        ],
        name="tagger",
    )


def functional_model():
    """A Functional model with a nested Sequential and a nested Functional
    model, four Bidirectional layers (SimpleRNN, LSTM, GRU; merge modes
    concat, ave, mul, None), final states used downstream and as another
    layer's initial state (passed positionally), an explicit `mask=`."""
    encoder = keras.Sequential(
        [
            keras.Input((T,), dtype="int32"),
            layers.Embedding(V, E, mask_zero=True),
            layers.Bidirectional(
                layers.SimpleRNN(U, return_sequences=True), name="bi_enc"
            ),
        ],
        name="encoder",
    )
    seq_in = keras.Input((T, 2 * U))
    f, b, h_f, c_f, h_b, c_b = layers.Bidirectional(
        layers.LSTM(U, return_state=True), merge_mode=None, name="bi_states"
    )(seq_in)
    summarizer = keras.Model(
        seq_in, layers.Concatenate()([f, b, h_f, c_f, h_b, c_b]), name="summarizer"
    )

    ids = keras.Input((T,), dtype="int32", name="ids")
    x = encoder(ids)
    mask = ops.not_equal(ids, 0)
    seq, h_f, c_f, h_b, c_b = layers.Bidirectional(
        layers.LSTM(U, return_sequences=True, return_state=True),
        merge_mode="ave",
        name="bi_top",
    )(x, mask=mask)
    # Initial state passed positionally, Bidirectional.call's second argument.
    last = layers.Bidirectional(layers.GRU(U), merge_mode="mul", name="bi_init")(
        seq, [h_f, h_b]
    )
    out = layers.Concatenate()([summarizer(x), last, c_f, c_b])
    return keras.Model(ids, layers.Dense(2, name="head")(out), name="big")


def rnn_model():
    """Plain RNNs outside a Bidirectional (LSTM returning sequences, a GRU
    reading backwards and returning its state, a SimpleRNN) around one
    Bidirectional, over `Embedding(mask_zero=True)`'s mask."""
    ids = keras.Input((T,), dtype="int32")
    x = layers.Embedding(V, E, mask_zero=True, name="embed")(ids)
    x = layers.LSTM(U, return_sequences=True, use_cudnn=False, name="lstm_seq")(x)
    x = layers.Bidirectional(layers.GRU(U, return_sequences=True), name="bi")(x)
    x, h = layers.GRU(
        U, return_sequences=True, return_state=True, go_backwards=True, name="gru_back"
    )(x)
    y = layers.SimpleRNN(U, name="simple")(x)
    out = layers.Dense(2, name="head")(layers.Concatenate()([y, h]))
    return keras.Model(ids, out, name="rnns")


PLAIN_RNNS = ("lstm_seq", "gru_back", "simple")


# ------------------------------------------------------------------ models


def test_sequential_model_converted_with_same_predictions():
    old = sequential_model()
    old.compile(optimizer="adam", loss="mse")
    new = convert_model(old)

    assert isinstance(new, keras.Sequential) and new.name == "tagger"
    assert [type(layer) for layer in new.layers] == [
        layers.Embedding,
        MaskedBidirectional,
        MaskedBidirectional,
        layers.Dense,
    ]
    assert [layer.name for layer in new.layers] == [layer.name for layer in old.layers]
    assert new.get_layer("bi_2").merge_mode == "sum"
    assert not new.get_layer("bi_2").return_sequences
    # LSTM's use_cudnn is not in its config; it is carried over.
    assert new.get_layer("bi_1").forward_layer.use_cudnn is False
    for layer in old.layers:
        assert_same_weights(new.get_layer(layer.name), layer)
    assert new.compiled and new.optimizer is not old.optimizer
    assert_same_predictions(new, masked_reference(old), padded_ids())


def test_stack_keeps_the_masked_semantics_and_says_where_keras_differs():
    """Keras 3.16 drops the mask after `bi_1`: `bi_2` sees none in the
    original. The converted model keeps the masked semantics (those of Keras
    3.15), and one warning names the layer. (`bi_2` returns its last output
    only, so no mask reaches `head` and the loss in either model.)"""
    old = sequential_model()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        new = convert_model(old)
    messages = [str(w.message) for w in record if "masks on" in str(w.message)]
    x = padded_ids(3)
    reference = masked_reference(old)
    assert_same_predictions(new, reference, x)
    old_differs = not np.allclose(predict(old, x)[0], predict(reference, x)[0])
    assert old_differs == KERAS_DROPS_MASKS
    if KERAS_DROPS_MASKS:
        (message,) = messages
        assert "layers 'bi_2' now see the mask" in message
        assert "'bi_1'" not in message and "'head'" not in message
        assert "Keras 3.16" in message
    else:
        assert messages == []

    # A tagger: the mask reaches the output (and so the compiled loss) only
    # through the RNN. No layer after the RNN reads a mask here.
    ids = keras.Input((T,), dtype="int32")
    x = layers.Embedding(V, E, mask_zero=True)(ids)
    x = layers.Bidirectional(layers.LSTM(U, return_sequences=True), name="rnn")(x)
    tagger = keras.Model(ids, layers.Dense(2, name="tags")(x))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        convert_model(tagger)
    messages = [str(w.message) for w in record if "masks on" in str(w.message)]
    if KERAS_DROPS_MASKS:
        (message,) = messages
        assert "the loss and metrics of outputs 'tags' now see" in message
        assert "layers" not in message.split("now see")[0]
    else:
        assert messages == []


def test_unregistered_loss_function_converts_without_compile_state():
    """A loss or metric that is a plain, unregistered function cannot be
    rebuilt from `get_compile_config()`: Keras' own `clone_model` raises.
    convert_model converts the architecture and weights anyway, leaves the
    new model uncompiled and says how to compile it."""

    def ctc_loss(y_true, y_pred):
        return ops.mean(ops.square(ops.cast(y_true, "float32") - y_pred))

    old = sequential_model()
    old.compile(optimizer="adam", loss=ctc_loss, metrics=[ctc_loss])
    with pytest.raises(TypeError, match="Could not locate function 'ctc_loss'"):
        keras.models.clone_model(old)
    with pytest.warns(UserWarning, match="could not compile") as record:
        new = convert_model(old)
    (message,) = [
        str(w.message) for w in record if "could not compile" in str(w.message)
    ]
    assert "'tagger'" in message and "Could not locate function" in message
    assert "new_model.compile(" in message and "register_keras_serializable" in message
    assert not new.compiled
    assert old.compiled and old.loss is ctc_loss  # the original is untouched
    assert isinstance(new.get_layer("bi_1"), MaskedBidirectional)
    assert_same_predictions(new, masked_reference(old), padded_ids())
    # Compiled as the warning says, it is the original's loss.
    new.compile(optimizer="adam", loss=ctc_loss)
    assert new.compiled and new.loss is ctc_loss


def test_plain_rnns_become_masked_rnn_with_same_predictions():
    old = rnn_model()
    new = convert_model(old)
    names = [layer.name for layer in old.layers[1:]]  # after the Input
    assert [layer.name for layer in new.layers[1:]] == names
    for name in PLAIN_RNNS:
        assert isinstance(new.get_layer(name), MaskedRNN), name
        assert_same_weights(new.get_layer(name), old.get_layer(name))
    assert isinstance(new.get_layer("bi"), MaskedBidirectional)
    assert new.get_layer("gru_back").go_backwards
    assert new.get_layer("gru_back").return_state
    # use_cudnn is not in the config; it is carried over.
    assert new.get_layer("lstm_seq").layer.use_cudnn is False
    assert_same_predictions(new, masked_reference(old), padded_ids(5))


def test_only_and_exclude_choose_the_layers():
    old = rnn_model()
    new = convert_model(old, only=layers.Bidirectional)
    assert isinstance(new.get_layer("bi"), MaskedBidirectional)
    assert [type(new.get_layer(n)) for n in PLAIN_RNNS] == [
        layers.LSTM,
        layers.GRU,
        layers.SimpleRNN,
    ]
    new = convert_model(old, only=["lstm_seq", layers.SimpleRNN])
    names = ("lstm_seq", "bi", "gru_back", "simple")
    assert [type(new.get_layer(n)) for n in names] == [
        MaskedRNN,
        layers.Bidirectional,
        layers.GRU,
        MaskedRNN,
    ]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        new = convert_model(old, exclude=["simple"])
    # Left out on purpose: no warning about it.
    assert not [w for w in record if "convert_model kept" in str(w.message)]
    assert type(new.get_layer("simple")) is layers.SimpleRNN
    assert isinstance(new.get_layer("gru_back"), MaskedRNN)
    assert_same_predictions(new, masked_reference(old), padded_ids(6))

    with pytest.raises(ValueError, match="`only` names layer 'lstm'.*'lstm_seq'"):
        convert_model(old, only="lstm")
    with pytest.raises(TypeError, match="layer names and layer classes.*got 3"):
        convert_model(old, exclude=[3])
    with pytest.raises(TypeError, match="MaskedRNN"):
        convert_model(layers.LSTM(U))


def test_original_model_unchanged_and_weights_not_shared():
    old = sequential_model()
    before = [w.copy() for w in old.get_weights()]
    new = convert_model(old)
    new.set_weights([np.zeros_like(w) for w in new.get_weights()])
    assert [type(layer) for layer in old.layers][1:3] == [layers.Bidirectional] * 2
    for a, b in zip(old.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_functional_model_with_nested_models_converted():
    old = functional_model()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        new = convert_model(old)
    # Everything here is convertible: convert_model keeps no layer. On Keras
    # 3.16 it says where the masked semantics differ from the original's.
    messages = [str(w.message) for w in record if "convert_model" in str(w.message)]
    if KERAS_DROPS_MASKS:
        (message,) = messages
        # summarizer reads encoder's output, whose mask bi_enc drops; bi_top
        # is handed its mask explicitly, and bi_init never gets one.
        assert "layers 'summarizer'" in message
        for name in ("bi_top", "bi_init", "bi_enc", "bi_states"):
            assert f"'{name}'" not in message
    else:
        assert messages == []

    assert new.name == "big"
    for outer, inner in [
        (None, "bi_top"),
        (None, "bi_init"),
        ("encoder", "bi_enc"),
        ("summarizer", "bi_states"),
    ]:
        owner = new if outer is None else new.get_layer(outer)
        old_owner = old if outer is None else old.get_layer(outer)
        assert isinstance(owner.get_layer(inner), MaskedBidirectional), inner
        assert isinstance(old_owner.get_layer(inner), layers.Bidirectional)
        assert_same_weights(owner.get_layer(inner), old_owner.get_layer(inner))
    assert isinstance(new.get_layer("encoder"), keras.Sequential)
    assert new.get_layer("summarizer").get_layer("bi_states").merge_mode is None
    assert new.get_layer("bi_top").return_state
    assert_same_predictions(new, masked_reference(old), padded_ids(1))


def test_frozen_layers_stay_frozen():
    old = functional_model()
    old.get_layer("encoder").trainable = False  # a nested Sequential
    old.get_layer("summarizer").trainable = False  # a nested Functional
    old.get_layer("head").trainable = False
    new = convert_model(old)
    assert not new.get_layer("encoder").trainable
    assert not new.get_layer("summarizer").trainable
    assert not new.get_layer("encoder").get_layer("bi_enc").trainable
    assert not new.get_layer("head").trainable
    assert new.get_layer("bi_top").trainable
    assert len(new.trainable_weights) == len(old.trainable_weights)


def test_shared_layer_stays_shared():
    ids = keras.Input((T,), dtype="int32")
    x = layers.Embedding(V, E, mask_zero=True)(ids)
    bi = layers.Bidirectional(layers.GRU(U, return_sequences=True), name="shared")
    y = layers.Add()([bi(x), bi(ops.flip(x, 1))])
    old = keras.Model(ids, y)
    new = convert_model(old)
    assert len(new.weights) == len(old.weights)
    assert_same_predictions(new, old, padded_ids(2))


# ----------------------------------------------------- layers left as they are


@keras.saving.register_keras_serializable(package="test_convert_model")
class CumSum(layers.Layer):
    """A sequence layer that is not an RNN but that Bidirectional accepts."""

    def __init__(self, go_backwards=False, return_sequences=True, **kwargs):
        super().__init__(**kwargs)
        self.go_backwards = go_backwards
        self.return_sequences = return_sequences
        self.return_state = False
        self.stateful = False

    def compute_output_shape(self, input_shape):
        return input_shape

    def call(self, x, initial_state=None):
        if self.go_backwards:
            x = ops.flip(x, 1)
        return ops.cumsum(x, axis=1)

    def get_config(self):
        config = super().get_config()
        config.update(go_backwards=self.go_backwards)
        config.update(return_sequences=self.return_sequences)
        return config


@keras.saving.register_keras_serializable(package="test_convert_model")
class MyBidirectional(layers.Bidirectional):
    pass


@keras.saving.register_keras_serializable(package="test_convert_model")
class MyLSTM(layers.LSTM):
    pass


@keras.saving.register_keras_serializable(package="test_convert_model")
class Block(layers.Layer):
    """A custom layer holding a Bidirectional."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.bidi = layers.Bidirectional(layers.LSTM(units), name="bi_in_block")

    def call(self, x):
        return self.bidi(x)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


UNCONVERTIBLE = {
    "bi_stateful": "stateful=True",
    "bi_cumsum": "not a keras.layers.RNN",
    "bi_go_backwards": "go_backwards=True",
    "bi_subclass": "subclass of Bidirectional",
    "bi_in_block": "inside Block 'block'",
    "lstm_stateful": "stateful=True",
    "lstm_subclass": "subclass (MyLSTM)",
}


def mixed_model():
    """One convertible Bidirectional and one of each kind that is not."""
    x = keras.Input(batch_shape=(B, T, 2))
    outputs = [
        layers.Bidirectional(layers.GRU(U), name="bi_ok")(x),
        layers.Bidirectional(layers.LSTM(U, stateful=True), name="bi_stateful")(x),
        layers.Bidirectional(CumSum(), name="bi_cumsum")(x),
        layers.Bidirectional(
            layers.LSTM(U, go_backwards=True),
            backward_layer=layers.LSTM(U),
            name="bi_go_backwards",
        )(x),
        MyBidirectional(layers.GRU(U), name="bi_subclass")(x),
        Block(U, name="block")(x),
        layers.GRU(U, name="gru_ok")(x),
        layers.LSTM(U, stateful=True, name="lstm_stateful")(x),
        MyLSTM(U, name="lstm_subclass")(x),
    ]
    return keras.Model(x, outputs)


def test_unconvertible_layers_kept_with_a_warning():
    old = mixed_model()
    with pytest.warns(UserWarning) as record:
        new = convert_model(old)
    messages = [str(w.message) for w in record if "convert_model" in str(w.message)]
    assert len(messages) == len(UNCONVERTIBLE)
    for name, reason in UNCONVERTIBLE.items():
        assert any(f"'{name}'" in m and reason in m for m in messages), name

    assert isinstance(new.get_layer("bi_ok"), MaskedBidirectional)
    assert isinstance(new.get_layer("gru_ok"), MaskedRNN)
    assert type(new.get_layer("lstm_stateful")) is layers.LSTM
    assert type(new.get_layer("lstm_subclass")) is MyLSTM
    for name in ("bi_stateful", "bi_cumsum", "bi_go_backwards"):
        assert type(new.get_layer(name)) is layers.Bidirectional
    assert type(new.get_layer("bi_subclass")) is MyBidirectional
    assert type(new.get_layer("block").bidi) is layers.Bidirectional
    for layer in old.layers[1:]:
        if layer.weights:
            assert_same_weights(new.get_layer(layer.name), layer)
    x = np.random.default_rng(3).standard_normal((B, T, 2)).astype("float32")
    assert_same_predictions(new, old, x)


def test_strict_raises_naming_every_unconvertible_layer():
    with pytest.raises(ValueError, match="strict=True") as info:
        convert_model(mixed_model(), strict=True)
    for name in UNCONVERTIBLE:
        assert f"'{name}'" in str(info.value)


# ------------------------------------------------------- subclassed models


class Tagger(keras.Model):
    def __init__(self, wrapper=layers.Bidirectional, **kwargs):
        super().__init__(**kwargs)
        self.embed = layers.Embedding(V, E, mask_zero=True)
        self.rnn = wrapper(layers.LSTM(U, return_sequences=True))
        self.head = layers.Dense(3)

    def call(self, ids):
        return self.head(self.rnn(self.embed(ids)))


def test_subclassed_model_refused_and_manual_swap_works():
    ids = padded_ids(4)
    old = Tagger()
    expected = predict(old, ids)
    with pytest.raises(ValueError, match="subclassed model") as info:
        convert_model(old)
    assert "set_weights(old_model.get_weights())" in str(info.value)
    assert "self.rnn = maskedrnn.MaskedBidirectional" in str(info.value)

    # The recipe from the error message.
    new = Tagger(wrapper=MaskedBidirectional)
    new(keras.Input((T,), dtype="int32"))  # builds it (as a call on a batch)
    new.set_weights(old.get_weights())
    np.testing.assert_allclose(predict(new, ids)[0], expected[0], atol=ATOL, rtol=1e-5)


def test_argument_errors():
    bidi = layers.Bidirectional(layers.LSTM(U))
    with pytest.raises(TypeError, match="bidirectional_to_masked"):
        convert_model(bidi)
    with pytest.raises(TypeError, match="keras.Model"):
        convert_model(layers.Dense(2))


# ------------------------------------------------------------ single layer


def test_bidirectional_to_masked_built_layer():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((B, T, 2)).astype("float32")
    mask = padded_ids(5) != 0
    bidi = layers.Bidirectional(
        layers.GRU(U, return_sequences=True, return_state=True, use_cudnn=False),
        merge_mode="sum",
        name="bi",
    )
    expected = to_np(flat(bidi(x, mask=mask)))

    masked = bidirectional_to_masked(bidi)
    assert isinstance(masked, MaskedBidirectional) and masked.built
    assert masked.name == "bi" and masked.merge_mode == "sum"
    assert masked.forward_layer.use_cudnn is False
    assert_same_weights(masked, bidi)
    actual = to_np(flat(masked(x, mask=mask)))
    assert len(actual) == len(expected) == 3
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, atol=ATOL, rtol=1e-5)
    masked.set_weights([np.zeros_like(w) for w in masked.get_weights()])
    assert all(np.any(w != 0) for w in bidi.get_weights()[:2])


def test_bidirectional_to_masked_unbuilt_layer():
    bidi = layers.Bidirectional(
        layers.GRU(U, return_sequences=True),
        backward_layer=layers.GRU(U + 1, return_sequences=True, go_backwards=True),
        merge_mode=None,
    )
    masked = bidirectional_to_masked(bidi)
    assert not masked.built
    config, old_config = masked.get_config(), bidi.get_config()
    for key in ("name", "merge_mode", "layer", "trainable"):
        assert config[key] == old_config[key], key
    # A backward_layer given by the user keeps its name in Bidirectional and
    # gets the prefix "backward_" in MaskedBidirectional; all else is equal.
    backward, old_backward = config["backward_layer"], old_config["backward_layer"]
    name, old_name = backward["config"].pop("name"), old_backward["config"].pop("name")
    assert name == "backward_" + old_name
    assert backward == old_backward
    outputs = masked(keras.Input((T, 3)))
    assert [tuple(o.shape) for o in outputs] == [(None, T, U), (None, T, U + 1)]


def test_bidirectional_to_masked_errors():
    with pytest.raises(TypeError, match="keras.layers.Bidirectional"):
        bidirectional_to_masked(layers.LSTM(U))
    stateful = layers.Bidirectional(layers.LSTM(U, stateful=True), name="bi_s")
    with pytest.raises(ValueError, match="'bi_s'.*stateful=True"):
        bidirectional_to_masked(stateful)


def test_unbuilt_model_with_built_layers_asks_to_build_first():
    embed = layers.Embedding(V, E)
    embed.build((None, T))  # weights exist, but the model has no input shape
    old = keras.Sequential([embed, layers.Bidirectional(layers.GRU(U))])
    assert not old.built
    with pytest.raises(ValueError, match="Build the model first"):
        convert_model(old)
    old.build((None, T))
    assert isinstance(convert_model(old).layers[1], MaskedBidirectional)
