"""`maskedrnn.load_weights`: Keras weight checkpoints across the two wrappers.

Keras' `.weights.h5` files key the layers of a model by class name, so a
checkpoint saved from a `keras.layers.Bidirectional` model does not load into
the same architecture built with `MaskedBidirectional` (Keras' own
`load_weights` raises, shown below), and back. The oracle is the model that
wrote the checkpoint: after `maskedrnn.load_weights` the other model holds
exactly its weights and returns its predictions (Keras' masked
`Bidirectional` on one side), in both directions and on every backend.
"""

import warnings

import keras
import numpy as np
import pytest
from keras import layers

import maskedrnn
from maskedrnn import MaskedBidirectional, MaskedRNN
from tests.test_convert_model import (
    T,
    U,
    V,
    assert_same_predictions,
    padded_ids,
    rnn_model,
    sequential_model,
)


def scramble(model, seed=1):
    """Gives every weight of `model` new random values (so a load must write
    every one of them to restore the predictions)."""
    rng = np.random.default_rng(seed)
    model.set_weights(
        [rng.standard_normal(w.shape).astype(w.dtype) for w in model.get_weights()]
    )


def assert_same_weights(model, expected):
    got, want = model.get_weights(), expected.get_weights()
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def masked_sequential_model():
    """`sequential_model()` built by hand with `MaskedBidirectional`."""
    return keras.Sequential(
        [
            keras.Input((T,), dtype="int32"),
            layers.Embedding(V, 3, mask_zero=True, name="embed"),
            MaskedBidirectional(layers.LSTM(U, return_sequences=True), name="bi_1"),
            MaskedBidirectional(layers.GRU(U), merge_mode="sum", name="bi_2"),
            layers.Dense(2, name="head"),
        ],
        name="tagger",
    )


def test_keras_load_weights_fails_across_wrappers(tmp_path):
    """The friction: the file keys layers by class name, so Keras' own
    loader finds no weights for the MaskedBidirectional cells."""
    old = sequential_model()
    path = tmp_path / "old.weights.h5"
    old.save_weights(path)
    with pytest.raises(ValueError, match="expected 3 variables, but received 0"):
        maskedrnn.convert_model(old).load_weights(path)


def test_bidirectional_checkpoint_loads_into_converted_model(tmp_path):
    old = sequential_model()
    # A compiled model with optimizer variables: the file holds them too.
    old.compile(optimizer="adam", loss="mse")
    old.optimizer.build(old.trainable_variables)
    scramble(old, seed=10)
    x = padded_ids()
    path = tmp_path / "old.weights.h5"
    old.save_weights(path)

    new = maskedrnn.convert_model(old)
    scramble(new)
    maskedrnn.load_weights(new, path)
    assert_same_weights(new, old)
    assert_same_predictions(new, old, x)


def test_masked_checkpoint_loads_into_bidirectional_model(tmp_path):
    ours = masked_sequential_model()
    scramble(ours, seed=2)
    path = tmp_path / "ours.weights.h5"
    ours.save_weights(path)

    keras_model = sequential_model()  # Keras' masked Bidirectional: the oracle
    maskedrnn.load_weights(keras_model, path)
    assert_same_weights(keras_model, ours)
    assert_same_predictions(keras_model, ours, padded_ids())


def test_dot_keras_file_loads_across_wrappers(tmp_path):
    old = sequential_model()
    scramble(old, seed=3)
    path = tmp_path / "old.keras"
    old.save(path)
    rebuilt = masked_sequential_model()
    maskedrnn.load_weights(rebuilt, path)
    assert_same_weights(rebuilt, old)
    assert_same_predictions(rebuilt, old, padded_ids())


def test_partly_converted_model_maps_each_layer_to_its_own_entry(tmp_path):
    """convert_model keeps a Bidirectional it cannot express (go_backwards=
    True), which shifts Keras' class-name counters: the file has
    `bidirectional` and `bidirectional_1`, the converted model
    `masked_bidirectional` and `bidirectional`. Weights must still land on
    the layer they came from, both ways."""
    inputs = keras.Input((T,), dtype="int32")
    x = layers.Embedding(V, 3, mask_zero=True)(inputs)
    x = layers.Bidirectional(layers.GRU(U, return_sequences=True), name="a")(x)
    x = layers.Bidirectional(
        layers.LSTM(2, go_backwards=True), backward_layer=layers.LSTM(2), name="b"
    )(x)
    old = keras.Model(inputs, layers.Dense(2)(x))
    scramble(old, seed=4)
    path = tmp_path / "old.weights.h5"
    old.save_weights(path)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="convert_model kept")
        new = maskedrnn.convert_model(old)
    assert [type(new.get_layer(n)) for n in "ab"] == [
        MaskedBidirectional,
        layers.Bidirectional,
    ]
    scramble(new, seed=5)
    maskedrnn.load_weights(new, path)
    assert_same_weights(new, old)
    assert_same_predictions(new, old, padded_ids())

    # And back: the converted model's checkpoint into the original.
    scramble(new, seed=6)
    new.save_weights(tmp_path / "new.weights.h5")
    maskedrnn.load_weights(old, tmp_path / "new.weights.h5")
    assert_same_weights(old, new)


def test_masked_model_called_with_lengths_loads_a_keras_checkpoint(tmp_path):
    """A MaskedBidirectional called with `lengths=` (right-padded rows): the
    Keras twin feeds Bidirectional the equivalent mask. Oracle: Keras'
    Bidirectional given that mask, whose checkpoint is loaded."""
    seq = keras.Input((T, 3))
    lengths = keras.Input((), dtype="int32")
    steps = keras.ops.expand_dims(keras.ops.arange(T), 0)
    mask = keras.ops.less(steps, keras.ops.expand_dims(lengths, -1))
    y = layers.Bidirectional(layers.GRU(U), name="bi")(seq, mask=mask)
    keras_model = keras.Model([seq, lengths], layers.Dense(2, name="head")(y))
    scramble(keras_model, seed=8)
    keras_model.save_weights(tmp_path / "keras.weights.h5")

    seq = keras.Input((None, 3))  # time unknown: the twin's mask is symbolic
    lengths = keras.Input((), dtype="int32")
    y = MaskedBidirectional(layers.GRU(U), name="bi")(seq, lengths=lengths)
    ours = keras.Model([seq, lengths], layers.Dense(2, name="head")(y))
    maskedrnn.load_weights(ours, tmp_path / "keras.weights.h5")
    assert_same_weights(ours, keras_model)
    x = np.random.default_rng(9).standard_normal((4, T, 3)).astype("float32")
    n = np.array([T, 3, 1, 5], "int32")
    assert_same_predictions(ours, keras_model, [x, n])


def test_plain_rnn_checkpoints_load_across_masked_rnn(tmp_path):
    """Plain LSTM/GRU/SimpleRNN <-> MaskedRNN (stored one level deeper, under
    `masked_rnn/layer/cell`), both ways, and into a model converted for
    Bidirectional layers only."""
    old = rnn_model()
    scramble(old, seed=11)
    old.save_weights(tmp_path / "old.weights.h5")
    new = maskedrnn.convert_model(old)
    assert isinstance(new.get_layer("simple"), MaskedRNN)
    scramble(new, seed=12)
    maskedrnn.load_weights(new, tmp_path / "old.weights.h5")
    assert_same_weights(new, old)
    assert_same_predictions(new, old, padded_ids(7))

    scramble(new, seed=13)
    new.save_weights(tmp_path / "new.weights.h5")
    maskedrnn.load_weights(old, tmp_path / "new.weights.h5")
    assert_same_weights(old, new)

    partly = maskedrnn.convert_model(old, only=layers.Bidirectional)
    scramble(partly, seed=14)
    maskedrnn.load_weights(partly, tmp_path / "new.weights.h5")
    assert_same_weights(partly, new)


def test_same_wrapper_checkpoint_is_keras_own_load(tmp_path):
    ours = masked_sequential_model()
    scramble(ours, seed=7)
    ours.save_weights(tmp_path / "ours.weights.h5")
    other = masked_sequential_model()
    maskedrnn.load_weights(other, tmp_path / "ours.weights.h5")
    assert_same_weights(other, ours)


def test_mismatched_checkpoint_is_refused_and_nothing_assigned(tmp_path):
    old = sequential_model()
    old.save_weights(tmp_path / "old.weights.h5")
    wider = keras.Sequential(
        [
            keras.Input((T,), dtype="int32"),
            layers.Embedding(V, 3, mask_zero=True),
            MaskedBidirectional(layers.LSTM(U + 1, return_sequences=True)),
            MaskedBidirectional(layers.GRU(U), merge_mode="sum"),
            layers.Dense(2),
        ]
    )
    before = [w.copy() for w in wider.get_weights()]
    with pytest.raises(ValueError, match="with different shapes") as error:
        maskedrnn.load_weights(wider, tmp_path / "old.weights.h5")
    assert "forward_layer/cell/vars/0" in str(error.value)
    for a, b in zip(wider.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_arguments_are_checked(tmp_path):
    old = sequential_model()
    path = tmp_path / "old.weights.h5"
    old.save_weights(path)
    with pytest.raises(TypeError, match="`model` must be a keras.Model"):
        maskedrnn.load_weights(old.layers[1], path)
    with pytest.raises(ValueError, match=r"`filepath` must be .*got '.*old\.h5'"):
        maskedrnn.load_weights(old, tmp_path / "old.h5")
    unbuilt = keras.Sequential([layers.Dense(2)])
    with pytest.raises(ValueError, match="not built"):
        maskedrnn.load_weights(unbuilt, path)
