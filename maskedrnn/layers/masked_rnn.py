"""`MaskedRNN`: a masked RNN layer whose wrapped RNN runs unmasked.

API, config, shapes and `call` orchestration only: the direction runs on the
shared core `maskedrnn.layers.direction`.
"""

import copy

import keras
from keras import ops

from maskedrnn import _checks, backends
from maskedrnn import ops as mops
from maskedrnn.layers import direction
from maskedrnn.steps import Steps


@keras.saving.register_keras_serializable(package="maskedrnn")
class MaskedRNN(direction.MaskedWrapper):
    """Wrapper for one RNN layer that honours masks and keeps its fused kernel.

    Behaves like the wrapped `keras.layers.LSTM`, `GRU`, `SimpleRNN` or
    `RNN(cell)` called with the same mask: masked steps are skipped (the
    state is carried over them), with Keras' own conventions for every option
    of the wrapped layer. Unlike it, the wrapped RNN receives no mask
    wherever a fused kernel could run, so its backend can keep it (cuDNN on
    GPU; on the torch backend on CPU, PyTorch's native kernels): each row's
    valid steps are moved to
    the front (one gather; none when `lengths` is given), padding is zeroed,
    the RNN runs unmasked, and the outputs are placed back where Keras puts
    them. This is the one-direction sibling of `MaskedBidirectional`; both
    run on the same core (`maskedrnn.layers.direction`).

    Which code runs: `LSTM` and `GRU` run unmasked on their backend's fused
    kernel where one exists (cuDNN on GPU), PyTorch's native kernel on the
    torch backend on CPU, else Keras' step loop without a mask. No backend
    has a fused `SimpleRNN` kernel: it runs Keras' step loop without a mask
    (PyTorch's `rnn_tanh`/`rnn_relu` on torch CPU). Final states are read at
    each row's last valid step; an LSTM's cell state is recomputed exactly
    from the outputs, except where the kernel gives it exactly for less:
    with `return_state=True` an `LSTM` on TensorFlow without a GPU where
    TensorFlow's fused LSTM op does not run runs Keras' masked loop, on a
    JAX CPU (and for a `GRU` or `SimpleRNN` on a JAX GPU) the rows run in
    length tiers that carry each row's exact states and skip most padded
    steps (`maskedrnn.backends.jax_tiers`), and on
    torch on CPU PyTorch's fused kernel runs with the padded steps made
    no-ops for the cell state (forget gate 1, input gate 0), so its own
    final `c` is exact. `keras.layers.RNN(cell)`, custom
    cells and `recurrent_dropout > 0` have no fused kernel to keep: they
    run Keras' masked loop too, exact as well. That loop reads any mask,
    so given `mask=` it runs on the data as it is (no reordering; masked
    inputs zeroed); given `lengths=`, the same with their right-padded
    mask.
    `kernel_info()` says which code runs and why.

    Semantics (those of the wrapped layer under a mask, on TensorFlow and
    torch): with `return_sequences=True` a masked step repeats the last valid
    output, steps before a row's first valid step are zeros, and with
    `zero_output_for_mask=True` every masked step is zeros. The last output
    (`return_sequences=False`) is the output at the last valid step (zeros
    for an all-padding row; with `zero_output_for_mask=True`, zeros when the
    last step is masked). `return_state=True` adds the states after each
    row's last valid step (the initial state for an all-padding row).
    `go_backwards=True` reads the time axis reversed and returns outputs in
    that reversed order, as Keras does. (Keras' JAX backend repeats the
    *initial* `h` before a row's first valid step instead of zeros; that
    differs only with a non-zero `initial_state` and leading padding, and
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

    # ------------------------------------------------------------------ build

    def build(self, inputs_shape, initial_state_shape=None, lengths_shape=None):
        inputs_shape = _checks.check_input_shape(inputs_shape, "MaskedRNN")
        self._input_features = inputs_shape[-1]
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
        """Says which code computes the wrapped RNN, and why.

        Args:
            inputs: Optional tensor the layer would be called on; on the
                torch backend its device decides (CPU: PyTorch's native
                kernels; CUDA: Keras' cuDNN path). Defaults to `None`: the
                device of the layer's weights. The layer must be built.

        Returns:
            A dict with the key `"layer"` and a sentence: PyTorch's native
            kernel, Keras' unmasked layer (its backend's fused kernel where
            one exists, else Keras' step loop without a mask), or Keras'
            masked step loop, with the reason.
        """
        return self._kernel_info({"layer": self.layer}, inputs)

    @property
    def uses_fast_path(self):
        """Whether the wrapped RNN is handed no mask here (read from the
        plan for the layer's weights, as `kernel_info()`)."""
        return self._uses_fast_path({"layer": self.layer})

    # ------------------------------------------------------------------- call

    def call(self, inputs, initial_state=None, mask=None, training=None, lengths=None):
        x = _checks.check_inputs(inputs, "MaskedRNN", self._input_features)
        if x.shape[0] == 0:
            return self._empty_batch_outputs(x)
        steps = Steps.from_call(x, mask, lengths)
        plan = self._plan({"layer": self.layer}, x, steps.masked, training)
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
        state = None if state is None else state[0]
        if plan.route == "torch":
            y, states = self._run_in_torch(plan, x, steps, state)
        elif plan.route == "masked_loop":
            y, states = self._run_masked_loop(x, steps, state, training)
        else:
            y, states = self._run_valid_first(plan, x, steps, state, training)
        outputs = [ops.cast(t, self.compute_dtype) for t in [y] + list(states)]
        return self._returned(outputs, steps.bad_rows)

    def _run_in_torch(self, plan, x, steps, state):
        """Outputs and states on PyTorch's kernel, straight from and back to
        the reading order (the backend's `run_direction`)."""
        if self.go_backwards:
            # As Keras: the whole padded time axis and the mask reversed.
            x, steps = ops.flip(x, 1), steps.flipped()
        if not self.return_sequences:
            place = "last"
        else:
            place = "held_zeros" if self.zero_output_for_mask else "held"
        backend = backends.current()
        y, states = backend.run_direction(
            plan.way(),
            self.layer,
            x,
            backend.layout(steps),
            state,
            place=place,
            want_states=self.return_state,
        )
        if not self.return_sequences:
            y = self._zero_if_last_step_masked(y, steps.mask)
        return y, states

    def _run_masked_loop(self, x, steps, state, training):
        """Keras' masked loop on the reading order, handed the mask as it is
        (`direction.run_masked_loop`)."""
        mask = steps.mask
        if self.go_backwards:
            # As Keras: the whole padded time axis and the mask reversed.
            x, mask = ops.flip(x, 1), ops.flip(mask, 1)
        y, states = direction.run_masked_loop(self.layer, x, mask, state, training)
        y = y if self.return_sequences else y[:, -1]
        return y, states if self.return_state else []

    def _run_valid_first(self, plan, x, steps, state, training):
        """Outputs and states from valid-first `x` (`direction.run`, or the
        backend's `run_fused` on the `"fused"` route), the outputs placed as
        Keras' masked `RNN` returns them."""
        read_mask = None
        if steps.right_padded:
            read_mask = steps.valid
            if self.go_backwards:
                # The valid-first form of the reversed rows: each row's
                # valid steps, reversed by its own length.
                x = mops.gather_time(x, steps.reverse)
                read_mask = ops.flip(read_mask, 1)
        else:
            if self.go_backwards:
                # As Keras: the whole padded time axis (and mask) reversed.
                x, steps = ops.flip(x, 1), steps.flipped()
            if steps.masked:
                read_mask = steps.mask
        if plan.route == "fused":
            # The backend's one-call way: one kernel call on valid-first
            # data with zeros at padding (`MaskedBidirectional`'s input too).
            y, states = backends.current().run_fused(
                plan.way(), [self.layer], direction.valid_first_zeroed(x, steps),
                steps, [state], training, self.return_state,
            )
            states = states[0]
        else:
            y, states = direction.run(
                plan.way(), self.layer, steps.valid_first(x), steps, state,
                training, self.return_state,
            )
        if self.return_sequences:
            if read_mask is not None:
                y = direction.held(y, read_mask, self.zero_output_for_mask, steps.rank)
        else:
            y = direction.last_output(y, steps)
            if read_mask is not None:
                y = self._zero_if_last_step_masked(y, read_mask)
        return y, states

    def _zero_if_last_step_masked(self, y, read_mask):
        """The last output `(batch, units)` as Keras' `RNN` returns it with
        `zero_output_for_mask=True`: zeros for a row whose last step (in
        reading order) is masked; `y` unchanged otherwise."""
        if not self.zero_output_for_mask:
            return y
        keep = ops.expand_dims(read_mask[:, -1], -1)
        return ops.where(keep, y, ops.zeros_like(y))

    # ---------------------------------------------------------------- config

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
