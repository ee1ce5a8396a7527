"""`MaskedBidirectional`: a bidirectional RNN wrapper whose inner RNNs run unmasked."""

import copy

import keras
from keras import ops
from keras.src.backend import get_keras_mask
from keras.src.layers.rnn.conv_lstm import ConvLSTM
from keras.src.saving import serialization_lib

from maskedrnn import _backend, _checks
from maskedrnn import ops as mops

_MERGE_MODES = ("concat", "sum", "mul", "ave", None)

# Layers whose per-step output *is* their hidden state h: for them the final
# state can be read off the unmasked output sequence at each row's last valid
# step (LSTM's cell state c is recomputed, see `_lstm_cell_state_at_length`).
_UNMASKED_TYPES = (keras.layers.LSTM, keras.layers.GRU, keras.layers.SimpleRNN)


def _strip_prefix(name, prefix):
    return name[len(prefix) :] if name.startswith(prefix) else name


def _inner_copy(layer, name):
    """A fresh copy of `layer` that returns its whole sequence and its states,
    reading forward (`go_backwards=False`), with no weights shared."""
    config = serialization_lib.serialize_keras_object(layer)
    inner_config = config["config"]
    inner_config["name"] = name
    inner_config["return_sequences"] = True
    inner_config["return_state"] = True
    inner_config["go_backwards"] = False
    inner = serialization_lib.deserialize_keras_object(config)
    # `use_cudnn` is not part of the config (as in keras.layers.Bidirectional).
    if hasattr(layer, "use_cudnn"):
        inner.use_cudnn = layer.use_cudnn
    return inner


def _without_keras_mask(x):
    """`x`, or a copy of it with no Keras mask attached.

    Keras fills a layer's `mask` argument from a mask attached to its input
    tensor; the inner RNNs must not get one, or they leave the fused kernel.
    """
    if get_keras_mask(x) is not None:
        return ops.copy(x)
    return x


def _torch_kernels():
    """The torch-only module, imported on the torch backend only."""
    from maskedrnn import _torch_kernels

    return _torch_kernels


def _native_reason(inner, where):
    """None when `inner` runs on PyTorch's native kernel for data on the
    device of `where` (a tensor or variable), else a sentence saying why not."""
    if keras.backend.backend() != "torch":
        return f"the {keras.backend.backend()} backend (PyTorch kernels: torch only)"
    return _torch_kernels().unavailable_reason(inner, where)


def _take_at(seq, index):
    """`seq[b, index[b]]` for `seq` of shape `(batch, time, units)`."""
    index = ops.reshape(ops.cast(index, "int32"), (-1, 1, 1))
    return ops.take_along_axis(seq, index, axis=1)[:, 0]


def _lstm_cell_state_at_length(cell, x, h_seq, h0, c0, lengths):
    """The LSTM cell state `c` after each row's `lengths[i]` steps.

    The unmasked fused kernel gives the exact `h_t` for every valid step but
    only the `c` after the padded tail. With all `h_t` known, the gates of
    every step come from one batched matmul,
    `z_t = x_t @ kernel + h_{t-1} @ recurrent_kernel + bias`, and
    `c_t = f_t * c_{t-1} + i_t * g_t` is then a linear recurrence in `c`,
    evaluated up to each row's length by `linear_recurrence_last`. This is
    an identity in the weights, so its gradients are exact too. Computed in
    float32 whatever the compute dtype.
    """
    x = ops.cast(x, "float32")
    h_seq = ops.cast(h_seq, "float32")
    h0 = ops.cast(h0, "float32")
    c0 = ops.cast(c0, "float32")
    h_prev = ops.concatenate([ops.expand_dims(h0, 1), h_seq[:, :-1]], axis=1)
    # Keras LSTM gate order: input, forget, candidate (c), output. The output
    # gate does not enter c, so only the first 3 * units columns are needed;
    # [x_t, h_{t-1}] @ [kernel; recurrent_kernel] is one matmul for both.
    n = 3 * cell.units
    weights = ops.concatenate(
        [cell.kernel[:, :n], cell.recurrent_kernel[:, :n]], axis=0
    )
    z = ops.matmul(
        ops.concatenate([x, h_prev], axis=-1), ops.cast(weights, "float32")
    )
    if cell.use_bias:
        z = z + ops.cast(cell.bias[:n], "float32")
    z_i, z_f, z_c = ops.split(z, 3, axis=-1)
    i = cell.recurrent_activation(z_i)
    f = cell.recurrent_activation(z_f)
    g = cell.activation(z_c)
    return mops.linear_recurrence_last(f, i * g, lengths, c0)


@keras.saving.register_keras_serializable(package="maskedrnn")
class MaskedBidirectional(keras.layers.Layer):
    """Bidirectional wrapper for RNNs that honours masks and keeps cuDNN.

    Behaves like `keras.layers.Bidirectional` fed a mask: masked steps are
    skipped (the state is carried over them), in both directions. Unlike it,
    the two inner RNNs never receive a mask, so Keras can run its fused
    cuDNN kernels on GPU. How: each row's valid steps are moved to the front
    (one gather; not needed when `lengths` is given), the forward RNN reads
    them in order, the backward RNN reads them reversed by each row's own
    length (`maskedrnn.ops.reverse_sequence`, so it reads `3 2 1`, not
    `0 0 3 2 1`), and the outputs are put back where they came from.

    For `LSTM`, `GRU` and `SimpleRNN` (without `recurrent_dropout`) the inner
    RNNs run unmasked (the fast path). Final states are read at each row's
    last valid step; the LSTM cell state, which the unmasked kernel does not
    expose at that step, is recomputed exactly from the outputs (one batched
    matmul plus a linear-recurrence reduction, see
    `maskedrnn.ops.linear_recurrence_last`). Any other RNN layer
    (`keras.layers.RNN(cell)`, custom cells, `recurrent_dropout > 0`) has no
    fused kernel to lose: it gets the same reordering and reversal, plus a
    right-padded mask, so its results are exact too. `uses_fast_path` tells
    which path a layer takes. On the torch backend on CPU, where Keras would
    step through time in Python, the unmasked inner RNNs run on PyTorch's
    native kernels instead (same equations, about 3x faster);
    `kernel_info()` says which code computes each direction and why.

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
        mask: Optional boolean tensor of shape `(batch, time)`, usually
            attached by an upstream layer (`Embedding(mask_zero=True)`,
            `Masking`). Any pattern works: right-padded, left-padded (the
            default of `keras.utils.pad_sequences`), holes, all-padding rows.
        lengths: Optional integer tensor of shape `(batch,)`: the data is
            right-padded and row `i` has `lengths[i]` valid steps. When given,
            it wins over `mask` and saves one gather.
        initial_state: Optional list of initial state tensors: the first half
            for the forward layer (e.g. `[h, c]` for an LSTM), the second half
            for the backward layer.
        training: Python boolean, passed to the inner layers (dropout).

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
        if not isinstance(layer, keras.layers.RNN):
            raise ValueError(
                "MaskedBidirectional needs `layer` to be a keras.layers.RNN "
                "instance such as keras.layers.LSTM(64) or "
                f"keras.layers.GRU(64). Received: layer={layer!r}"
            )
        if isinstance(layer, ConvLSTM) or isinstance(backward_layer, ConvLSTM):
            raise ValueError(
                "MaskedBidirectional wraps RNNs over (batch, time, features) "
                "inputs; ConvLSTM1D/2D/3D take images per step. Use "
                "keras.layers.Bidirectional for ConvLSTM layers."
            )
        if backward_layer is not None and not isinstance(
            backward_layer, keras.layers.RNN
        ):
            raise ValueError(
                "`backward_layer` must be a keras.layers.RNN instance (or None "
                f"to copy `layer`). Received: backward_layer={backward_layer!r}"
            )
        if merge_mode not in _MERGE_MODES:
            raise ValueError(
                f"Invalid merge_mode={merge_mode!r}: use one of "
                '"concat", "sum", "mul", "ave" or None.'
            )
        if layer.go_backwards:
            raise ValueError(
                "`layer` is the forward direction and must have "
                "go_backwards=False; the backward direction is made from it "
                "(or pass it as `backward_layer`)."
            )
        if layer.stateful:
            raise ValueError(
                "MaskedBidirectional does not support stateful=True: states "
                "carried across batches do not mix with per-row lengths. Use "
                "keras.layers.Bidirectional for stateful RNNs, or pass the "
                "previous final states as `initial_state`."
            )
        if backward_layer is not None:
            if not backward_layer.go_backwards:
                raise ValueError(
                    "`backward_layer` must have go_backwards=True, like "
                    "keras.layers.Bidirectional requires. Received "
                    "go_backwards=False."
                )
            for attr in ("stateful", "return_sequences", "return_state"):
                fwd, bwd = getattr(layer, attr), getattr(backward_layer, attr)
                if fwd != bwd:
                    raise ValueError(
                        f"`layer` and `backward_layer` must have the same "
                        f"{attr}; got {fwd} for layer and {bwd} for "
                        "backward_layer."
                    )
        super().__init__(**kwargs)

        base = _strip_prefix(layer.name, "forward_")
        self.forward_layer = _inner_copy(layer, f"forward_{base}")
        source = layer if backward_layer is None else backward_layer
        base = _strip_prefix(source.name, "backward_")
        self.backward_layer = _inner_copy(source, f"backward_{base}")

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
        self._generic_gru_loop = {}
        for key, inner in (
            ("forward", self.forward_layer),
            ("backward", self.backward_layer),
        ):
            # JAX on CPU: Keras' generic loop beats its GRU kernel (see
            # _backend.prefers_generic_gru_loop); the GRU still gets no mask.
            self._generic_gru_loop[key] = _backend.prefers_generic_gru_loop(inner)
            if self._generic_gru_loop[key]:
                inner.use_cudnn = False
        self.uses_fast_path = all(
            type(inner) in _UNMASKED_TYPES and not inner.cell.recurrent_dropout
            for inner in (self.forward_layer, self.backward_layer)
        )
        if weights:
            nw = len(weights)
            self.forward_layer.initial_weights = weights[: nw // 2]
            self.backward_layer.initial_weights = weights[nw // 2 :]

    # ------------------------------------------------------------------ build

    def build(self, inputs_shape, lengths_shape=None, initial_state_shape=None):
        inputs_shape = tuple(inputs_shape)
        if len(inputs_shape) != 3:
            raise ValueError(
                "MaskedBidirectional expects inputs of shape (batch, time, "
                f"features); got shape {inputs_shape} (rank "
                f"{len(inputs_shape)}). Add a feature axis (e.g. an Embedding "
                "or expand_dims) for rank 2 inputs."
            )
        self._input_features = inputs_shape[-1]
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
        self, inputs_shape, lengths_shape=None, initial_state_shape=None
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

    def compute_output_spec(
        self, inputs, mask=None, lengths=None, initial_state=None, training=None
    ):
        # Functional models are built from shapes alone: run the checks that
        # need no values now, so a bad `lengths`/`mask` fails at model build.
        if lengths is not None:
            self._check_lengths_static(lengths, inputs)
        elif mask is not None:
            self._check_mask(mask, inputs)
        return super().compute_output_spec(
            inputs,
            mask=mask,
            lengths=lengths,
            initial_state=initial_state,
            training=training,
        )

    def compute_mask(self, inputs, mask=None):
        if isinstance(mask, (list, tuple)):
            mask = mask[0]
        if self.return_sequences:
            output_mask = [mask, mask] if self.merge_mode is None else [mask]
        else:
            output_mask = [None, None] if self.merge_mode is None else [None]
        if self.return_state:
            output_mask = output_mask + [None] * (2 * self._n_states())
            return tuple(output_mask)
        return output_mask[0] if len(output_mask) == 1 else tuple(output_mask)

    def kernel_info(self, inputs=None):
        """Says which code computes each direction, and why.

        Args:
            inputs: Optional tensor the layer would be called on; on the
                torch backend its device decides (CPU: PyTorch's native
                kernels; CUDA: Keras' cuDNN path). Defaults to `None`: the
                device of the layer's weights. The layer must be built.

        Returns:
            A dict with keys `"forward"` and `"backward"`, each a sentence:
            PyTorch's native kernel (`torch.lstm`/`gru`/`rnn_tanh`/
            `rnn_relu`, torch backend on CPU), Keras' unmasked inner layer
            (its backend picks a fused kernel such as cuDNN when it can), or
            Keras' step loop with a right-padded mask (no fused kernel
            exists for that layer), each with the reason it was chosen.
        """
        if not self.built:
            raise ValueError(
                "kernel_info() needs a built layer: call it on data first or "
                "call layer.build(input_shape)."
            )
        info = {}
        for key, inner in (
            ("forward", self.forward_layer),
            ("backward", self.backward_layer),
        ):
            name = type(inner).__name__
            if not self.uses_fast_path:
                info[key] = (
                    f"Keras {name} with a right-padded mask: no fused kernel "
                    "for this layer (a custom cell or recurrent_dropout > 0)"
                )
                continue
            reason = _native_reason(
                inner, inner.cell.kernel if inputs is None else inputs
            )
            if reason is None:
                info[key] = (
                    f"PyTorch's native {name} kernel, unmasked (torch backend "
                    "on CPU, where Keras would step through time in Python)"
                )
            elif self._generic_gru_loop[key]:
                info[key] = (
                    f"Keras {name}, unmasked, in Keras' generic step loop: on "
                    "a JAX CPU it is faster than Keras' GRU kernel"
                )
            elif getattr(inner, "use_cudnn", "auto") is False:
                info[key] = (
                    f"Keras {name}, unmasked, in Keras' generic step loop "
                    "(the wrapped layer has use_cudnn=False)"
                )
            else:
                info[key] = (
                    f"Keras {name}, unmasked: its backend's fused kernel "
                    "(cuDNN on GPU) when available"
                )
                if keras.backend.backend() == "torch":
                    info[key] += f". Not PyTorch's native kernel: {reason}"
        return info

    def _n_states(self):
        return len(_state_sizes(self.forward_layer))

    # ------------------------------------------------------------------- call

    def call(self, inputs, mask=None, lengths=None, initial_state=None, training=None):
        x = ops.convert_to_tensor(inputs)
        if len(x.shape) != 3:
            raise ValueError(
                "MaskedBidirectional expects inputs of shape (batch, time, "
                f"features); got rank {len(x.shape)}."
            )
        time = ops.shape(x)[1]
        if isinstance(time, int) and time == 0:
            raise ValueError(
                "inputs has a zero-size time axis (shape "
                f"{tuple(x.shape)}); pad every batch to at least one step."
            )
        features = x.shape[-1]
        if (
            isinstance(features, int)
            and isinstance(self._input_features, int)
            and features != self._input_features
        ):
            raise ValueError(
                f"inputs has {features} features but the layer was built for "
                f"{self._input_features} (last axis of inputs)."
            )
        if x.shape[0] == 0:
            return self._empty_batch_outputs(x)
        order = inverse = bad_rows = None
        if lengths is not None:
            lengths = self._check_lengths(lengths, x)
            if not _backend.is_concrete(lengths):
                # Compiled code cannot raise on values: rows with a length
                # outside [0, time] get NaN in every output and state
                # (docs/errors.md), never plausible numbers.
                bad_rows = _checks.invalid_lengths(lengths, time)
                lengths = _checks.clamp_lengths(lengths, time)
        elif mask is not None:
            mask = self._check_mask(mask, x)
            order, inverse, lengths = mops.valid_first_order(mask)
            x = mops._gather_time(x, order)
        else:
            lengths = ops.full((ops.shape(x)[0],), time, dtype="int32")

        fwd_state, bwd_state = self._split_initial_state(initial_state, x)
        fwd_y, fwd_states = self._run(
            self.forward_layer, x, lengths, fwd_state, training
        )
        x_rev = mops.reverse_sequence(x, lengths)
        bwd_y_rev, bwd_states = self._run(
            self.backward_layer, x_rev, lengths, bwd_state, training
        )

        has_steps = ops.expand_dims(lengths > 0, -1)
        if self.return_sequences:
            valid = ops.expand_dims(mops.sequence_mask(lengths, time), -1)
            fwd_y = ops.where(valid, fwd_y, ops.zeros_like(fwd_y))
            bwd_y = mops.reverse_sequence(bwd_y_rev, lengths)
            bwd_y = ops.where(valid, bwd_y, ops.zeros_like(bwd_y))
            if inverse is not None:
                # Back from valid-first order to the caller's positions; the
                # padded positions receive the zeros from the tail.
                fwd_y = mops._gather_time(fwd_y, inverse)
                bwd_y = mops._gather_time(bwd_y, inverse)
        else:
            last = ops.maximum(lengths - 1, 0)
            fwd_y = _take_at(fwd_y, last)
            fwd_y = ops.where(has_steps, fwd_y, ops.zeros_like(fwd_y))
            bwd_y = _take_at(bwd_y_rev, last)
            bwd_y = ops.where(has_steps, bwd_y, ops.zeros_like(bwd_y))

        fwd_y = ops.cast(fwd_y, self.compute_dtype)
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
        if bad_rows is not None:
            outputs = _checks.poison_rows(outputs, bad_rows)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _empty_batch_outputs(self, x):
        """Outputs of the right shapes for a batch of 0 rows (no RNN call)."""
        shapes = self.compute_output_shape(tuple(x.shape))
        if isinstance(shapes[0], int) or shapes[0] is None:
            shapes = [shapes]
        outputs = [
            ops.zeros(tuple(0 if d is None else d for d in shape), self.compute_dtype)
            for shape in shapes
        ]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _run(self, inner, x, lengths, initial_state, training):
        """Runs one direction on valid-first data; returns (sequence, states).

        The sequence holds the exact outputs at valid steps (garbage after
        them); the states are those after each row's last valid step (an
        empty list when the layer does not return states).
        """
        if not self.uses_fast_path:
            # No fused kernel to keep: give the inner RNN a right-padded mask.
            mask = mops.sequence_mask(lengths, ops.shape(x)[1])
            y, *states = inner(
                x, mask=mask, initial_state=initial_state, training=training
            )
            return y, list(states)

        x = _without_keras_mask(x)
        is_lstm = isinstance(inner, keras.layers.LSTM)
        if training and inner.cell.dropout:
            # Apply input dropout here, one mask for all steps (as the fused
            # LSTM/GRU paths and SimpleRNN's cell do), so that the LSTM state
            # recomputation and PyTorch's kernels see the same dropped x.
            dp_mask = inner.cell.get_dropout_mask(x[:, 0, :])
            inner.cell.reset_dropout_mask()
            x = x * ops.expand_dims(dp_mask, 1)
            training = False
        if initial_state is None:
            batch = ops.shape(x)[0]
            initial_state = [
                ops.zeros((batch, size), dtype=inner.compute_dtype)
                for size in _state_sizes(inner)
            ]
        if _native_reason(inner, x) is None:
            # Torch backend on CPU: PyTorch's own kernel (_torch_kernels).
            y = _torch_kernels().run(inner, x, initial_state)
        else:
            y, *_ = inner(x, initial_state=initial_state, training=training)
        if not self.return_state:
            # The outputs are all the caller needs; skip the state work.
            return y, []
        has_steps = ops.expand_dims(lengths > 0, -1)
        h = _take_at(y, ops.maximum(lengths - 1, 0))
        h = ops.where(has_steps, h, ops.cast(initial_state[0], h.dtype))
        if not is_lstm:
            return y, [h]
        c = _lstm_cell_state_at_length(
            inner.cell, x, y, initial_state[0], initial_state[1], lengths
        )
        return y, [h, ops.cast(c, h.dtype)]

    def _split_initial_state(self, initial_state, x):
        if initial_state is None:
            return None, None
        if not isinstance(initial_state, (list, tuple)):
            initial_state = [initial_state]
        initial_state = list(initial_state)
        expected = 2 * self._n_states()
        if len(initial_state) != expected:
            raise ValueError(
                f"initial_state has {len(initial_state)} tensors but this "
                f"layer needs {expected}: the forward layer's "
                f"{expected // 2} then the backward layer's."
            )
        half = expected // 2
        sizes = _state_sizes(self.forward_layer) + _state_sizes(self.backward_layer)
        for i, (state, size) in enumerate(zip(initial_state, sizes)):
            shape = tuple(ops.convert_to_tensor(state).shape)
            batch = x.shape[0]
            if (
                len(shape) != 2
                or (isinstance(shape[1], int) and shape[1] != size)
                or (
                    isinstance(shape[0], int)
                    and isinstance(batch, int)
                    and shape[0] != batch
                )
            ):
                raise ValueError(
                    f"initial_state[{i}] has shape {shape} but must be "
                    f"(batch, {size}) with the batch of inputs "
                    f"({x.shape[0]}): the forward layer's states then the "
                    "backward layer's."
                )
        return initial_state[:half], initial_state[half:]

    def _check_lengths_static(self, lengths, x):
        """Checks that need shapes and dtypes only (also at model build)."""
        if len(lengths.shape) == 2 and lengths.shape[1] == 1:
            lengths = ops.squeeze(lengths, 1)
        if len(lengths.shape) != 1:
            raise ValueError(
                "lengths must have shape (batch,), one length per row; got "
                f"shape {tuple(lengths.shape)}."
            )
        if "int" not in keras.backend.standardize_dtype(lengths.dtype):
            raise ValueError(
                f"lengths must be integers; got dtype {lengths.dtype}. Cast it "
                "with ops.cast(lengths, 'int32') (a float length is ambiguous)."
            )
        batch, n = x.shape[0], lengths.shape[0]
        if isinstance(batch, int) and isinstance(n, int) and batch != n:
            raise ValueError(
                f"lengths has {n} rows but inputs has {batch} (batch "
                "dimension); pass one length per row."
            )
        return lengths

    def _check_lengths(self, lengths, x):
        lengths = self._check_lengths_static(ops.convert_to_tensor(lengths), x)
        lengths = ops.cast(lengths, "int32")
        # A batch size known only at run time: fail there, never broadcast.
        lengths = _checks.match_leading_dims(lengths, x, 1, "lengths")
        if _backend.is_concrete(lengths):
            values = ops.convert_to_numpy(lengths)
            time = x.shape[1]
            if values.size and values.min() < 0:
                raise ValueError(
                    f"lengths must be >= 0; got min(lengths)={values.min()}."
                )
            if isinstance(time, int) and values.size and values.max() > time:
                raise ValueError(
                    f"lengths has a value {values.max()} longer than the time "
                    f"axis of inputs ({time}); clip lengths or pad inputs."
                )
        return lengths

    def _check_mask(self, mask, x):
        mask = ops.convert_to_tensor(mask)
        if len(mask.shape) != 2:
            raise ValueError(
                f"mask must have shape (batch, time); got shape {tuple(mask.shape)}."
            )
        for axis, name in ((0, "batch"), (1, "time")):
            a, b = mask.shape[axis], x.shape[axis]
            if isinstance(a, int) and isinstance(b, int) and a != b:
                raise ValueError(
                    f"mask has {a} along axis {axis} but inputs has {b} "
                    f"({name} dimension); the mask must be (batch, time)."
                )
        dtype = keras.backend.standardize_dtype(mask.dtype)
        if dtype != "bool" and not any(k in dtype for k in ("int", "float")):
            raise ValueError(
                "mask must be boolean (or numeric: non-zero = valid step); got "
                f"dtype {mask.dtype}."
            )
        if dtype != "bool":
            mask = ops.not_equal(mask, 0)
        if not isinstance(mask, keras.KerasTensor):
            mask = _checks.match_leading_dims(mask, x, 2, "mask")
        return mask

    # ---------------------------------------------------------------- config

    def _public_config(self, inner, go_backwards):
        config = serialization_lib.serialize_keras_object(inner)
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
        config["layer"] = serialization_lib.deserialize_keras_object(
            config["layer"], custom_objects=custom_objects
        )
        backward = config.pop("backward_layer", None)
        if backward is not None:
            config["backward_layer"] = serialization_lib.deserialize_keras_object(
                backward, custom_objects=custom_objects
            )
        return cls(**config)


def _output_size(inner):
    cell = inner.cell
    size = getattr(cell, "output_size", None)
    return size if size is not None else _state_sizes(inner)[0]


def _state_sizes(inner):
    state_size = inner.cell.state_size
    if isinstance(state_size, (list, tuple)):
        return list(state_size)
    return [state_size]
