"""`MaskedBidirectional`: a bidirectional RNN wrapper whose inner RNNs run unmasked."""

import copy

import keras
from keras import ops

from maskedrnn import _checks
from maskedrnn.layers import direction
from maskedrnn.layers.direction import output_size as _output_size
from maskedrnn.layers.direction import state_sizes as _state_sizes
from maskedrnn.layers.masked_wrapper import MaskedWrapper
from maskedrnn.steps import Steps


def _strip_prefix(name, prefix):
    return name[len(prefix) :] if name.startswith(prefix) else name


@keras.saving.register_keras_serializable(package="maskedrnn")
class MaskedBidirectional(MaskedWrapper):
    """Bidirectional wrapper for RNNs that honours masks and keeps cuDNN.

    Behaves like `keras.layers.Bidirectional` fed the same mask: masked steps
    are skipped in both directions, the state carried over them. Unlike it,
    the inner RNNs are handed no mask wherever a fused kernel could run, so
    the backend keeps its fused kernel (cuDNN on a GPU). Each row's valid
    steps are moved to the front, the forward RNN reads them in order and
    the backward RNN reads them reversed by the row's own length (`3 2 1`,
    not `0 0 3 2 1`); the outputs are put back where they came from and the
    final states are exact. RNNs with no fused kernel to keep (`RNN(cell)`,
    custom cells, `recurrent_dropout > 0`) run Keras' masked loop, exact as
    well. `kernel_info()` says which kernel computes each direction and why;
    docs/design.md explains each kernel.

    Args:
        layer: A `keras.layers.RNN` instance such as `keras.layers.LSTM(64)`
            or `keras.layers.GRU(64)`, with `go_backwards=False`. Its config
            is copied (as `Bidirectional` does): the wrapper has fresh
            weights. `return_sequences` and `return_state` are read from it.
        merge_mode: How forward and backward outputs are combined: one of
            `"concat"`, `"sum"`, `"mul"`, `"ave"`, or `None` (a list of both).
            Defaults to `"concat"`.
        backward_layer: Optional `keras.layers.RNN` instance for the backward
            direction, with `go_backwards=True` and the same
            `return_sequences`, `return_state` and `stateful` as `layer` (the
            same contract as `keras.layers.Bidirectional`). Defaults to
            `None`: a copy of `layer`.
        weights: Optional list of initial weights: forward layer's then
            backward layer's, as returned by `Bidirectional.get_weights()`.
            Defaults to `None`.
        **kwargs: Base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: Float tensor of shape `(batch, time, features)`.
        initial_state: Optional list of initial state tensors: the first half
            for the forward layer (e.g. `[h, c]` for an LSTM), the second half
            for the backward layer.
        mask: Optional boolean tensor of shape `(batch, time)`, usually
            attached by an upstream layer (`Embedding(mask_zero=True)`,
            `Masking`). Any pattern works: right-padded, left-padded (the
            default of `keras.utils.pad_sequences`), holes, all-padding rows.
        training: Python boolean, passed to the inner layers (dropout).
        lengths: Optional integer tensor of shape `(batch,)`: the data is
            right-padded and row `i` has `lengths[i]` valid steps. When given,
            it wins over `mask` and saves one gather.

    Input shape:
        3D tensor `(batch, time, features)`; `batch` and `time` may be `None`.

    Output shape:
        With `return_sequences=True`: `(batch, time, units_out)`, where
        `units_out` is `2 * units` for `"concat"` and `units` otherwise.
        Padded (masked) steps output zeros. Otherwise `(batch, units_out)`:
        the forward output at the last valid step merged with the backward
        output at the first valid step (zeros for an all-padding row).
        With `merge_mode=None`, a list of the two direction outputs.
        With `return_state=True`, the forward layer's final states then the
        backward layer's follow: the forward state after its last valid
        step, the backward state after the first valid step (which it reads
        last). An all-padding row returns its initial state (zeros by
        default). LSTM states are `[h, c]`, GRU and SimpleRNN states `[h]`.
        The output mask is the input mask when `return_sequences=True`.

    Example:

    ```python
    inputs = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(10_000, 64, mask_zero=True)(inputs)
    x = maskedrnn.MaskedBidirectional(
        keras.layers.LSTM(128, return_sequences=True))(x)
    outputs = keras.layers.Dense(5, activation="softmax")(x)
    model = keras.Model(inputs, outputs)

    # Or with explicit lengths and no Keras mask at all:
    seq = keras.Input((None, 12))
    lengths = keras.Input((), dtype="int32")
    y = maskedrnn.MaskedBidirectional(keras.layers.GRU(32))(seq, lengths=lengths)
    ```
    """

    def __init__(
        self,
        layer,
        merge_mode="concat",
        backward_layer=None,
        weights=None,
        **kwargs,
    ):
        _checks.check_bidirectional_layers(layer, backward_layer, merge_mode)
        super().__init__(**kwargs)

        base = _strip_prefix(layer.name, "forward_")
        self.forward_layer = direction.inner_copy(layer, f"forward_{base}")
        source = layer if backward_layer is None else backward_layer
        base = _strip_prefix(source.name, "backward_")
        self.backward_layer = direction.inner_copy(source, f"backward_{base}")

        if merge_mode in ("sum", "mul", "ave"):
            fwd_size = _output_size(self.forward_layer)
            bwd_size = _output_size(self.backward_layer)
            if fwd_size != bwd_size:
                raise ValueError(
                    f'merge_mode="{merge_mode}" adds or multiplies the two '
                    f"directions, which needs equal output sizes; got {fwd_size} "
                    f"for layer and {bwd_size} for backward_layer. Use "
                    'merge_mode="concat" or None, or equal units.'
                )
        self.merge_mode = merge_mode
        self._input_features = None
        self.return_sequences = layer.return_sequences
        self.return_state = layer.return_state
        self.stateful = False
        self.supports_masking = True
        if weights:
            nw = len(weights)
            self.forward_layer.initial_weights = weights[: nw // 2]
            self.backward_layer.initial_weights = weights[nw // 2 :]

    def build(self, inputs_shape, initial_state_shape=None, lengths_shape=None):
        inputs_shape = _checks.check_input_shape(inputs_shape, "MaskedBidirectional")
        self._input_features = inputs_shape[-1]
        self._load_backend()
        if not self.forward_layer.built:
            self.forward_layer.build(inputs_shape)
        if not self.backward_layer.built:
            self.backward_layer.build(inputs_shape)
        for inner in (self.forward_layer, self.backward_layer):
            initial = getattr(inner, "initial_weights", None)
            if initial:
                inner.set_weights(initial)
                del inner.initial_weights

    def compute_output_shape(
        self, inputs_shape, initial_state_shape=None, lengths_shape=None
    ):
        fwd = self.forward_layer.compute_output_shape(inputs_shape)
        bwd = self.backward_layer.compute_output_shape(inputs_shape)
        fwd_seq, fwd_states = tuple(fwd[0]), [tuple(s) for s in fwd[1:]]
        bwd_seq, bwd_states = tuple(bwd[0]), [tuple(s) for s in bwd[1:]]
        if not self.return_sequences:
            fwd_seq = (fwd_seq[0], fwd_seq[-1])
            bwd_seq = (bwd_seq[0], bwd_seq[-1])
        if self.merge_mode == "concat":
            out = fwd_seq[:-1] + (fwd_seq[-1] + bwd_seq[-1],)
            outputs = [out]
        elif self.merge_mode is None:
            outputs = [fwd_seq, bwd_seq]
        else:
            outputs = [fwd_seq]
        if self.return_state:
            return tuple(outputs + fwd_states + bwd_states)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def compute_mask(self, inputs, mask=None):
        if isinstance(mask, (list, tuple)):
            mask = mask[0]
        if self.return_sequences:
            output_mask = [mask, mask] if self.merge_mode is None else [mask]
        else:
            output_mask = [None, None] if self.merge_mode is None else [None]
        if self.return_state:
            n_states = len(_state_sizes(self.forward_layer)) + len(
                _state_sizes(self.backward_layer)
            )
            output_mask = output_mask + [None] * n_states
            return tuple(output_mask)
        return output_mask[0] if len(output_mask) == 1 else tuple(output_mask)

    def kernel_info(self, inputs=None):
        """Says which kernel computes each direction, and why.

        Args:
            inputs: Optional tensor the layer would be called on (on torch
                its device decides). Defaults to `None`: the device of the
                layer's weights. The layer must be built.

        Returns:
            A dict with keys `"forward"` and `"backward"`, each a sentence
            naming the kernel and the reason it was chosen.
        """
        return self._kernel_info(inputs)

    def call(self, inputs, initial_state=None, mask=None, training=None, lengths=None):
        x = _checks.check_inputs(inputs, "MaskedBidirectional", self._input_features)
        if x.shape[0] == 0:
            return self._empty_batch_outputs(x)
        steps = Steps.from_call(x, mask, lengths)
        plan = self._plan(x, steps.masked, training)
        joined = self.return_sequences and self.merge_mode == "concat"
        y, (fwd_states, bwd_states) = direction.run_plan(
            plan,
            x,
            steps,
            self._split_initial_state(initial_state, x),
            training,
            self.return_state,
            place="zeros" if self.return_sequences else "last",
            joined=joined,
        )
        if joined:
            outputs = self._merge(y, None, fwd_states, bwd_states)
        else:
            outputs = self._merge(*y, fwd_states, bwd_states)
        return self._returned(outputs, steps.bad_rows)

    def _inners(self):
        return {"forward": self.forward_layer, "backward": self.backward_layer}

    def _merge(self, fwd_y, bwd_y, fwd_states, bwd_states):
        """The list of outputs: the two directions merged by `merge_mode`,
        then the states when `return_state`. `bwd_y=None`: `fwd_y` holds
        both directions concatenated already (`"concat"`)."""
        fwd_y = ops.cast(fwd_y, self.compute_dtype)
        if bwd_y is None:
            outputs = [fwd_y]
        else:
            bwd_y = ops.cast(bwd_y, self.compute_dtype)
            if self.merge_mode == "concat":
                outputs = [ops.concatenate([fwd_y, bwd_y], axis=-1)]
            elif self.merge_mode == "sum":
                outputs = [fwd_y + bwd_y]
            elif self.merge_mode == "ave":
                outputs = [(fwd_y + bwd_y) / 2]
            elif self.merge_mode == "mul":
                outputs = [fwd_y * bwd_y]
            else:
                outputs = [fwd_y, bwd_y]
        if self.return_state:
            outputs = outputs + fwd_states + bwd_states
        return outputs

    def _split_initial_state(self, initial_state, x):
        parts = []
        for owner, inner in (
            ("the forward", self.forward_layer),
            ("the backward", self.backward_layer),
        ):
            sizes = _state_sizes(inner)
            names = direction.state_names(inner)
            parts.append((f"{owner} {type(inner).__name__}", names, sizes))
        split = _checks.check_initial_state(initial_state, x, parts)
        return [None, None] if split is None else list(split)

    def _public_config(self, inner, go_backwards):
        config = keras.saving.serialize_keras_object(inner)
        config["config"]["return_sequences"] = self.return_sequences
        config["config"]["return_state"] = self.return_state
        config["config"]["go_backwards"] = go_backwards
        return config

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "merge_mode": self.merge_mode,
                "layer": self._public_config(self.forward_layer, False),
                "backward_layer": self._public_config(self.backward_layer, True),
            }
        )
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = copy.deepcopy(config)
        config["layer"] = keras.saving.deserialize_keras_object(
            config["layer"], custom_objects=custom_objects
        )
        backward = config.pop("backward_layer", None)
        if backward is not None:
            config["backward_layer"] = keras.saving.deserialize_keras_object(
                backward, custom_objects=custom_objects
            )
        return cls(**config)
