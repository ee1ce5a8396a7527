"""`MaskedBidirectional`: a bidirectional RNN wrapper whose inner RNNs run unmasked.

API, config, shapes and `call` orchestration only: each direction runs on the
shared core `maskedrnn.layers.direction`.
"""

import copy

import keras
from keras import ops

from maskedrnn import _checks, backends
from maskedrnn import ops as mops
from maskedrnn.layers import direction
from maskedrnn.layers.direction import output_size as _output_size
from maskedrnn.layers.direction import state_sizes as _state_sizes
from maskedrnn.steps import Steps


def _strip_prefix(name, prefix):
    return name[len(prefix) :] if name.startswith(prefix) else name


@keras.saving.register_keras_serializable(package="maskedrnn")
class MaskedBidirectional(direction.MaskedWrapper):
    """Bidirectional wrapper for RNNs that honours masks and keeps cuDNN.

    Behaves like `keras.layers.Bidirectional` fed a mask: masked steps are
    skipped (the state is carried over them), in both directions. Unlike it,
    wherever a fused kernel could run the two inner RNNs never receive a
    mask, so Keras can run its fused cuDNN kernels on GPU. How: each row's
    valid steps are moved to the front (one gather; not needed when
    `lengths` is given), the forward RNN reads
    them in order, the backward RNN reads them reversed by each row's own
    length (`maskedrnn.ops.reverse_sequence`, so it reads `3 2 1`, not
    `0 0 3 2 1`), and the outputs are put back where they came from.

    For `LSTM`, `GRU` and `SimpleRNN` (without `recurrent_dropout`) the inner
    RNNs run unmasked: `LSTM` and `GRU` on their backend's fused kernel where
    one exists (cuDNN on GPU). No backend has a fused `SimpleRNN` kernel, so
    an unmasked `SimpleRNN` runs Keras' step loop, without a mask (on the
    torch backend on CPU, PyTorch's `rnn_tanh`/`rnn_relu`). Final states are
    read at each row's last valid step; the LSTM cell state, which the
    unmasked kernel does not expose at that step, is recomputed exactly from
    the outputs (one batched matmul plus a linear-recurrence reduction, see
    `maskedrnn.ops.linear_recurrence_last`). Where that is not the cheapest
    exact way, the states come from the kernel itself: with
    `return_state=True` an `LSTM` on TensorFlow without a GPU where
    TensorFlow's fused LSTM op does not run runs Keras' masked loop, on a
    JAX CPU (and for a `GRU` or `SimpleRNN` on a JAX GPU) the rows run in
    length tiers that carry each row's exact states and skip most padded
    steps (`maskedrnn.backends.jax_tiers`), and on the torch
    backend on CPU PyTorch's fused kernel runs with the padded steps made
    no-ops for the cell state (forget gate 1, input gate 0), so its own
    final `c` is exact. Any other RNN layer (`keras.layers.RNN(cell)`,
    custom cells, `recurrent_dropout > 0`) has no fused kernel to lose: it
    runs Keras' masked loop as well, so its results are exact too. That
    loop reads any mask: given `mask=`, both directions run on the data as
    it is, the backward one flipped as in Keras' `Bidirectional` (no
    reordering; masked inputs zeroed); given `lengths=`, the same with
    their right-padded mask. `uses_fast_path` tells
    which path a layer takes. On the torch backend on CPU, where Keras would
    step through time in Python, the unmasked inner RNNs run on PyTorch's
    native kernels instead (same equations; faster, see
    docs/benchmarks.md); `kernel_info()` says which code computes each
    direction and why. Each direction runs on the core shared with
    `MaskedRNN` (`maskedrnn.layers.direction`).

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

    # ------------------------------------------------------------------ build

    def build(self, inputs_shape, initial_state_shape=None, lengths_shape=None):
        inputs_shape = _checks.check_input_shape(inputs_shape, "MaskedBidirectional")
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
            Keras' masked step loop (no fused kernel to keep for that
            layer here), each with the reason it was chosen.
        """
        return self._kernel_info(self._inners(), inputs)

    @property
    def uses_fast_path(self):
        """Whether neither inner RNN is handed a mask here (read from the
        plan for the layer's weights, as `kernel_info()`)."""
        return self._uses_fast_path(self._inners())

    # ------------------------------------------------------------------- call

    def call(self, inputs, initial_state=None, mask=None, training=None, lengths=None):
        x = _checks.check_inputs(inputs, "MaskedBidirectional", self._input_features)
        if x.shape[0] == 0:
            return self._empty_batch_outputs(x)
        steps = Steps.from_call(x, mask, lengths)
        plan = self._plan(self._inners(), x, steps.masked, training)
        fwd_state, bwd_state = self._split_initial_state(initial_state, x)
        if plan.route == "torch":
            outputs = self._call_in_torch(plan, x, steps, fwd_state, bwd_state)
        elif plan.route == "fused":
            outputs = self._call_fused(plan, x, steps, fwd_state, bwd_state, training)
        elif plan.route == "masked_loop":
            outputs = self._call_masked_loops(x, steps, fwd_state, bwd_state, training)
        else:
            outputs = self._call_valid_first(
                plan, x, steps, fwd_state, bwd_state, training
            )
        return self._returned(outputs, steps.bad_rows)

    def _inners(self):
        return {"forward": self.forward_layer, "backward": self.backward_layer}

    def _call_valid_first(self, plan, x, steps, fwd_state, bwd_state, training):
        """Both directions on valid-first data (`direction.run`), the
        outputs put back in the caller's order."""
        x = steps.valid_first(x)
        fwd_y, fwd_states = direction.run(
            plan.way(0), self.forward_layer, x, steps, fwd_state, training,
            self.return_state,
        )
        x_rev = mops.gather_time(x, steps.reverse)
        bwd_y_rev, bwd_states = direction.run(
            plan.way(1), self.backward_layer, x_rev, steps, bwd_state, training,
            self.return_state,
        )
        if self.return_sequences:
            fwd_y = direction.in_place(fwd_y, steps)
            bwd_y = direction.in_place(
                mops.gather_time(bwd_y_rev, steps.reverse), steps
            )
        else:
            fwd_y = direction.last_output(fwd_y, steps)
            bwd_y = direction.last_output(bwd_y_rev, steps)
        return self._merge(fwd_y, bwd_y, fwd_states, bwd_states)

    def _call_fused(self, plan, x, steps, fwd_state, bwd_state, training):
        """Both directions in one call of the backend's one-call way
        (`run_fused`) on valid-first data; the outputs of both put back in
        the caller's order with one gather."""
        y, (fwd_states, bwd_states) = backends.current().run_fused(
            plan.way(0),
            [self.forward_layer, self.backward_layer],
            direction.valid_first_zeroed(x, steps),
            steps,
            [fwd_state, bwd_state],
            training,
            self.return_state,
        )
        units = _output_size(self.forward_layer)
        if self.return_sequences:
            if steps.masked:
                y = direction.in_place(y, steps)
            if self.merge_mode == "concat":
                return self._merge(y, None, fwd_states, bwd_states)
            fwd_y, bwd_y = y[..., :units], y[..., units:]
        else:
            fwd_y = direction.last_output(y[..., :units], steps)
            # The backward direction's last output is the one at step 0.
            bwd_y = y[:, 0, units:]
            bwd_y = ops.where(steps.has_steps, bwd_y, ops.zeros_like(bwd_y))
        return self._merge(fwd_y, bwd_y, fwd_states, bwd_states)

    def _call_in_torch(self, plan, x, steps, fwd_state, bwd_state):
        """Both directions on PyTorch's kernels, from and back to the
        caller's order (the backend's `run_direction`, one layout shared)."""
        backend = backends.current()
        place = "zeros" if self.return_sequences else "last"
        layout = backend.layout(steps)
        fwd_y, fwd_states = backend.run_direction(
            plan.way(0), self.forward_layer, x, layout, fwd_state, False, place,
            self.return_state,
        )
        bwd_y, bwd_states = backend.run_direction(
            plan.way(1), self.backward_layer, x, layout, bwd_state, True, place,
            self.return_state,
        )
        return self._merge(fwd_y, bwd_y, fwd_states, bwd_states)

    def _call_masked_loops(self, x, steps, fwd_state, bwd_state, training):
        """Both directions in Keras' masked loop, in the caller's order
        (`direction.run_masked_loop`): the backward one over the flipped
        time axis and mask, as Keras' `Bidirectional` runs it."""
        mask = steps.mask
        fwd_y, fwd_states = direction.run_masked_loop(
            self.forward_layer, x, mask, fwd_state, training
        )
        bwd_y, bwd_states = direction.run_masked_loop(
            self.backward_layer, ops.flip(x, 1), ops.flip(mask, 1), bwd_state, training
        )
        if self.return_sequences:
            fwd_y = direction.zero_where_masked(fwd_y, mask)
            bwd_y = direction.zero_where_masked(ops.flip(bwd_y, 1), mask)
        else:
            fwd_y, bwd_y = fwd_y[:, -1], bwd_y[:, -1]
        if not self.return_state:
            fwd_states = bwd_states = []
        return self._merge(fwd_y, bwd_y, fwd_states, bwd_states)

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
        return (None, None) if split is None else tuple(split)

    # ---------------------------------------------------------------- config

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
