"""The layers the benchmark times: ours and Keras', one stack each, sharing
one set of weights (also built afresh for the first-call figures)."""

import math

import keras

from maskedrnn.bench import config
from maskedrnn.layers import MaskedBidirectional, MaskedRNN


def make_cell(cell, units, return_state=False, **kwargs):
    """The Keras RNN layer of `--cell` (`config.CELLS`), returning sequences."""
    cls = getattr(keras.layers, config.CELLS[cell]["keras"])
    return cls(units, return_sequences=True, return_state=return_state, **kwargs)


def states_into_sequence(sequence, *states, directions=2):
    """`sequence + [fwd_k, bwd_k]` for each state kind k, over all steps
    (`directions=1`: `sequence + state_k`).

    `--return-state`: applied to the outputs `[sequence, forward states...,
    backward states...]` of every implementation, Keras' and PyTorch's alike,
    so that the timed output, the loss and the checks all depend on the
    final states. A plain function inside each timed step, not a Keras layer
    around the timed one: a wrapper layer's `Layer.__call__` (a noticeable
    cost on eager torch) would be charged to the Keras implementations
    only."""
    if directions == 1:
        for state in states:
            sequence = sequence + keras.ops.expand_dims(state, 1)
        return sequence
    half = len(states) // 2
    for forward, backward in zip(states[:half], states[half:]):
        both = keras.ops.concatenate([forward, backward], axis=-1)
        sequence = sequence + keras.ops.expand_dims(both, 1)
    return sequence


class Stacked(keras.layers.Layer):
    """`--layers N`: bidirectional layers called one after the other, each
    with the same call arguments (`mask=` or `lengths=`), as a user stacks
    them; only the last may return states."""

    def __init__(self, layers, **kwargs):
        super().__init__(**kwargs)
        self.stack = list(layers)
        self.supports_masking = True

    def build(self, input_shape):
        for layer in self.stack:
            if not layer.built:
                layer.build(input_shape)

    def call(self, x, **kwargs):
        for layer in self.stack:
            x = layer(x, **kwargs)
        return x


class BenchLayers:
    """Keras' and ours' stacks of `layers` layers, built, with equal weights.

    Args:
        cell: `--cell` (`"lstm"`, `"gru"` or `"rnn"`).
        kind: `--layer` (`"bidirectional"` or `"rnn"`).
        units: Int, units per direction.
        features: Int, input features.
        layers: Int, stacked layers.
        return_state: Bool, the last layer also returns its final states.
        weights: `None` to draw the weights from `rng` (uniform in
            +-1/sqrt(units), PyTorch's RNN init, different in each
            direction), or the `weights` of another `BenchLayers` to copy.
        rng: A numpy `Generator`, when `weights` is `None`.

    Attributes:
        keras_layers, ours_layers: Lists of the layers, first to last.
        keras_timed, ours_timed: What a step calls: the single layer, or a
            `Stacked` of them.
        weights: One list of numpy arrays per layer (Keras' layout).
    """

    def __init__(
        self, cell, kind, units, features, layers, return_state, weights=None, rng=None
    ):
        directions = config.LAYERS[kind]["directions"]

        def stack(wrapper):
            built = []
            for i in range(layers):
                states = return_state and i == layers - 1
                if directions == 2:
                    layer = wrapper(make_cell(cell, units, states))
                else:
                    # Zeros at padded steps, as PyTorch's packed output.
                    layer = wrapper(
                        make_cell(cell, units, states, zero_output_for_mask=True)
                    )
                layer.build((None, None, features if i == 0 else directions * units))
                built.append(layer)
            return built

        if directions == 2:
            self.keras_layers = stack(keras.layers.Bidirectional)
            self.ours_layers = stack(MaskedBidirectional)
        else:
            self.keras_layers = stack(lambda inner: inner)
            self.ours_layers = stack(MaskedRNN)
        self.ours_timed, self.keras_timed = self.ours_layers[0], self.keras_layers[0]
        if layers > 1:
            self.ours_timed = Stacked(self.ours_layers, name="ours_stacked")
            self.keras_timed = Stacked(self.keras_layers, name="keras_stacked")
            self.ours_timed.build((None, None, features))
            self.keras_timed.build((None, None, features))
        if weights is None:
            bound = 1 / math.sqrt(units)
            weights = [
                [
                    rng.uniform(-bound, bound, tuple(v.shape)).astype("float32")
                    for v in layer.weights
                ]
                for layer in self.keras_layers
            ]
        self.weights = weights
        for keras_layer, ours, values in zip(
            self.keras_layers, self.ours_layers, weights
        ):
            keras_layer.set_weights(values)
            ours.set_weights(values)
