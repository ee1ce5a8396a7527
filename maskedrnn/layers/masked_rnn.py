"""`MaskedRNN`: a masked RNN layer whose wrapped RNN runs unmasked."""

import copy

import keras
from keras import ops

from maskedrnn import _checks
from maskedrnn.layers import direction
from maskedrnn.layers.masked_wrapper import MaskedWrapper
from maskedrnn.steps import Steps


@keras.saving.register_keras_serializable(package="maskedrnn")
class MaskedRNN(MaskedWrapper):
    """Wrapper for one RNN layer that honours masks and keeps its fused kernel.

    Behaves like the wrapped `keras.layers.LSTM`, `GRU`, `SimpleRNN` or
    `RNN(cell)` called with the same mask, with Keras' conventions for every
    option of the wrapped layer. Unlike it, the wrapped RNN is handed no mask
    wherever a fused kernel could run: each row's valid steps are moved to
    the front, padding is zeroed, the RNN runs unmasked, and the outputs are
    placed back where Keras puts them. RNNs with no fused kernel to keep run
    Keras' masked loop, exact as well. The one-direction sibling of
    `MaskedBidirectional`; `kernel_info()` says which kernel runs and why.

    Under a mask, with `return_sequences=True` a masked step repeats the last
    valid output and steps before a row's first valid step are zeros (every
    masked step is zeros with `zero_output_for_mask=True`). The last output is
    the one at the last valid step (zeros for an all-padding row, and with
    `zero_output_for_mask=True` when the last step is masked).
    `return_state=True` adds the states after each row's last valid step (the
    initial state for an all-padding row). `go_backwards=True` reads the time
    axis reversed and returns outputs in that order, as Keras does. (Keras'
    JAX backend repeats the initial `h` before a row's first valid step;
    `MaskedRNN` gives zeros on every backend.)

    Args:
        layer: A `keras.layers.RNN` instance (`keras.layers.LSTM(64)`,
            `GRU`, `SimpleRNN`, `RNN(cell)`), not stateful. Its config is
            copied: the wrapper has fresh weights, the same variables in the
            same order as the wrapped layer (copy trained weights with
            `set_weights(layer.get_weights())`). `return_sequences`,
            `return_state`, `go_backwards` and `zero_output_for_mask` are
            read from it.
        **kwargs: Base layer arguments (`name`, `dtype`, ...). `dtype`
            defaults to the wrapped layer's dtype policy.

    Call arguments:
        inputs: Float tensor of shape `(batch, time, features)`.
        initial_state: Optional list of initial state tensors (`[h, c]` for
            an LSTM, `[h]` for a GRU or SimpleRNN), each `(batch, units)`.
        mask: Optional boolean tensor of shape `(batch, time)`, usually
            attached by an upstream layer (`Embedding(mask_zero=True)`,
            `Masking`). Any pattern: right-padded, left-padded, holes,
            all-padding rows.
        training: Python boolean, passed on for dropout.
        lengths: Optional integer tensor of shape `(batch,)`: the data is
            right-padded and row `i` has `lengths[i]` valid steps. When
            given, it wins over `mask` and saves one gather.

    Input shape:
        3D tensor `(batch, time, features)`; `batch` and `time` may be `None`.

    Output shape:
        With `return_sequences=True`: `(batch, time, units)`, else
        `(batch, units)`. With `return_state=True` the final states follow
        (each `(batch, units)`). The output mask is the input mask when
        `return_sequences=True`.

    Example:

    ```python
    inputs = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(10_000, 64, mask_zero=True)(inputs)
    x = maskedrnn.MaskedRNN(keras.layers.LSTM(128))(x)
    outputs = keras.layers.Dense(5, activation="softmax")(x)
    model = keras.Model(inputs, outputs)

    # An encoder whose final [h, c] seeds a decoder, with explicit lengths:
    seq = keras.Input((None, 12))
    lengths = keras.Input((), dtype="int32")
    y, h, c = maskedrnn.MaskedRNN(keras.layers.LSTM(32, return_state=True))(
        seq, lengths=lengths)
    ```
    """

    def __init__(self, layer, **kwargs):
        _checks.check_wrapped_rnn(layer)
        kwargs.setdefault("dtype", layer.dtype_policy)
        super().__init__(**kwargs)
        self.layer = direction.inner_copy(layer, layer.name)
        self.return_sequences = layer.return_sequences
        self.return_state = layer.return_state
        self.go_backwards = layer.go_backwards
        self.zero_output_for_mask = layer.zero_output_for_mask
        self.stateful = False
        self.supports_masking = True
        self._input_features = None

    def build(self, inputs_shape, initial_state_shape=None, lengths_shape=None):
        inputs_shape = _checks.check_input_shape(inputs_shape, "MaskedRNN")
        self._input_features = inputs_shape[-1]
        self._load_backend()
        if not self.layer.built:
            self.layer.build(inputs_shape)

    def compute_output_shape(
        self, inputs_shape, initial_state_shape=None, lengths_shape=None
    ):
        seq, *states = self.layer.compute_output_shape(inputs_shape)
        seq, states = tuple(seq), [tuple(s) for s in states]
        out = seq if self.return_sequences else (seq[0], seq[-1])
        if self.return_state:
            return tuple([out] + states)
        return out

    def compute_mask(self, inputs, mask=None):
        if isinstance(mask, (list, tuple)):
            mask = mask[0]
        output_mask = mask if self.return_sequences else None
        if self.return_state:
            n_states = len(direction.state_sizes(self.layer))
            return tuple([output_mask] + [None] * n_states)
        return output_mask

    def kernel_info(self, inputs=None):
        """Says which kernel computes the wrapped RNN, and why.

        Args:
            inputs: Optional tensor the layer would be called on (on torch
                its device decides). Defaults to `None`: the device of the
                layer's weights. The layer must be built.

        Returns:
            A dict with the key `"layer"` and a sentence naming the kernel
            and the reason it was chosen.
        """
        return self._kernel_info(inputs)

    def call(self, inputs, initial_state=None, mask=None, training=None, lengths=None):
        x = _checks.check_inputs(inputs, "MaskedRNN", self._input_features)
        if x.shape[0] == 0:
            return self._empty_batch_outputs(x)
        steps = Steps.from_call(x, mask, lengths)
        plan = self._plan(x, steps.masked, training)
        state = _checks.check_initial_state(
            initial_state,
            x,
            [
                (
                    f"the {type(self.layer).__name__}",
                    direction.state_names(self.layer),
                    direction.state_sizes(self.layer),
                )
            ],
        )
        if self.go_backwards:
            x, steps = direction.read_backwards(x, steps)
        if not self.return_sequences:
            place = "last"
        elif self.zero_output_for_mask:
            place = "zeros"
        else:
            place = "held"
        (y,), (states,) = direction.run_plan(
            plan,
            x,
            steps,
            [None if state is None else state[0]],
            training,
            self.return_state,
            place,
        )
        if not self.return_sequences and steps.masked:
            y = self._zero_if_last_step_masked(y, steps.mask)
        outputs = [ops.cast(t, self.compute_dtype) for t in [y] + list(states)]
        return self._returned(outputs, steps.bad_rows)

    def _inners(self):
        return {"layer": self.layer}

    def _zero_if_last_step_masked(self, y, read_mask):
        """The last output `(batch, units)` as Keras' `RNN` returns it with
        `zero_output_for_mask=True`: zeros for a row whose last step (in
        reading order) is masked; `y` unchanged otherwise."""
        if not self.zero_output_for_mask:
            return y
        keep = ops.expand_dims(read_mask[:, -1], -1)
        return ops.where(keep, y, ops.zeros_like(y))

    def get_config(self):
        config = super().get_config()
        layer = keras.saving.serialize_keras_object(self.layer)
        layer["config"]["return_sequences"] = self.return_sequences
        layer["config"]["return_state"] = self.return_state
        layer["config"]["go_backwards"] = self.go_backwards
        config["layer"] = layer
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = copy.deepcopy(config)
        config["layer"] = keras.saving.deserialize_keras_object(
            config["layer"], custom_objects=custom_objects
        )
        return cls(**config)
