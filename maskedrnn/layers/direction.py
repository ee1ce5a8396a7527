"""Run one direction of a masked batch on an unmasked RNN, in Keras ops.

The shared core of `MaskedBidirectional` and `MaskedRNN`, for the plan's
`"valid_first"` route (`maskedrnn.backends.plan`). A masked batch is
described once per call by a `maskedrnn.steps.Steps`. Each direction then:

1. reads *valid-first* data: each row's valid steps moved to the front in
   order (`Steps.order`, one gather; none when the caller passes `lengths`),
   or reversed by the row's own length (`Steps.reverse`) for a backward
   direction, so it reads `3 2 1`, not `0 0 3 2 1`;
2. zeroes the padded tail of that input, so padding never matters (inf or
   NaN there cannot reach outputs or gradients); PyTorch's packed kernel
   never reads it at all;
3. runs the inner RNN the way the plan says (`run`: the backend's `run`);
4. reads its states after each row's last valid step (`final_state`) unless
   the way returned them exact.

The caller places the per-step outputs back (`in_place` for the zeros-at-
padding convention of `Bidirectional`, `held` for Keras' `RNN` convention
that a masked step repeats the last valid output).

On the `"masked_loop"` route (every direction in Keras' masked loop) a
masked batch skips steps 1-4: `run_masked_loop` runs that loop on the
caller's order, which reads any mask by itself. On the `"torch"` route the
backend runs steps 1-4 and the placement in torch ops
(`maskedrnn.backends.torch.run_direction`). On the `"fused"` route the
layer makes the valid-first input once (`valid_first_zeroed`) and the
backend runs every direction in one kernel call (`run_fused`), steps 3-4
included; the layer places the outputs with one gather.
"""

import keras
from keras import ops

from maskedrnn import _checks, backends
from maskedrnn import ops as mops
from maskedrnn._keras_private import set_keras_mask
from maskedrnn.layers import final_state


def zero_padding(x, steps):
    """`x` (valid-first) with zeros at every padded step."""
    return zero_where_masked(x, steps.valid)


def valid_first_zeroed(x, steps):
    """`x` (caller's order) valid-first with zeros at every padded position:
    the input of the one-call ways (`maskedrnn.backends`' `run_fused`). One
    gather from a mask (its padded slots read an appended zero step), one
    select from lengths, none without either."""
    if not steps.masked:
        return x
    if steps.order is None:
        return zero_padding(x, steps)
    return gather_or_zero(x, steps.order, steps.valid)


def zero_where_masked(x, mask):
    """`x` with zeros at every step where the `(batch, time)` `mask` is False."""
    return ops.where(ops.expand_dims(mask, -1), x, ops.zeros_like(x))


def zero_masked_inputs(x, mask):
    """`zero_where_masked(x, mask)` for the input of Keras' step loop.

    The same values and gradients, computed in time-major order: Keras'
    loop transposes its input to `(time, batch, features)` before stepping,
    and with the zeroing written in that order XLA fuses it into that
    transpose, so a forward pass makes one pass over `x`, as Keras' own
    masked loop does, instead of two (under a gradient both forms make
    three: XLA moves the transpose to the backward side; docs/benchmarks.md).

    Args:
        x: Float tensor `(batch, time, features)`.
        mask: Bool tensor `(batch, time)`, False at the steps to zero.

    Returns:
        `x` with zeros at every masked step.
    """
    time_major = ops.transpose(x, (1, 0, 2))
    mask = ops.expand_dims(ops.transpose(mask, (1, 0)), -1)
    time_major = ops.where(mask, time_major, ops.zeros_like(time_major))
    return ops.transpose(time_major, (1, 0, 2))


def run_masked_loop(inner, x, mask, initial_state=None, training=None):
    """Runs `inner` in Keras' masked step loop over the caller's order.

    The plan's `"masked_loop"` route (every direction's way
    `"keras-masked"`): Keras' own masked loop, exact, with no reordering.

    Args:
        inner: The inner RNN, returning sequences and states, reading
            forward (`go_backwards=False`), built.
        x: Float tensor `(batch, time, features)` in the order this
            direction reads it.
        mask: Bool `(batch, time)` in the same order.
        initial_state: Optional list of initial state tensors.
        training: Python boolean or None (dropout, applied by Keras' cell).

    Returns:
        `outputs`: `(batch, time, units)` in Keras' `RNN` convention under a
        mask (see `held`); `states`: the states after each row's last valid
        step (the initial state for a row with no valid step). Masked
        inputs are zeroed first, so inf or NaN there reach neither outputs
        nor gradients.
    """
    y, *states = inner(
        zero_masked_inputs(x, mask),
        mask=mask,
        initial_state=initial_state,
        training=training,
    )
    # The inner layer attached its output mask, the mask in this reading
    # order (reversed for a `go_backwards` layer). Cleared: the wrapper's
    # `compute_mask` gives its outputs their mask, the input mask as it is.
    set_keras_mask(y, None)
    if initial_state is not None:
        # Keras' JAX loop outputs the initial h before a row's first valid
        # step; `held`, and Keras' other backends, output zeros there.
        started = ops.cumsum(ops.cast(mask, "int32"), axis=1) > 0
        y = zero_where_masked(y, started)
    return y, list(states)


def run(way, inner, x, steps, initial_state=None, training=None, want_states=True):
    """Runs `inner` over valid-first `x` the plan's `way`; returns
    `(outputs, states)`.

    Args:
        way: The direction's way (`maskedrnn.backends.WAYS`).
        inner: The inner RNN, returning sequences and states, reading
            forward (`go_backwards=False`), built.
        x: Valid-first float tensor `(batch, time, features)`, in the order
            this direction reads it.
        steps: The `maskedrnn.steps.Steps` of the batch.
        initial_state: Optional list of initial state tensors.
        training: Python boolean or None (dropout).
        want_states: Whether the caller needs the final states; when False
            the state work is skipped and `states` is `[]`.

    Returns:
        `outputs`: `(batch, time, units)`, exact at each row's valid steps
        (the padded tail holds whatever the RNN computed there, never read
        by the callers); `states`: the states after each row's last valid
        step (the initial state for a row with no valid step).
    """
    cell = inner.cell
    if way != "torch-packed":
        # PyTorch's packed kernel never reads the padded steps; every other
        # way reads them, so they must hold zeros (never inf or NaN).
        x = zero_padding(x, steps)
    if way != "keras-masked" and training and cell.dropout:
        # Input dropout applied here, one mask for all steps (as the fused
        # LSTM/GRU paths and SimpleRNN's cell do), so that the LSTM state
        # recomputation and PyTorch's kernels see the same dropped x.
        dp_mask = cell.get_dropout_mask(x[:, 0, :])
        cell.reset_dropout_mask()
        x = x * ops.expand_dims(dp_mask, 1)
        training = False
    if initial_state is None:
        batch = ops.shape(x)[0]
        initial_state = [
            ops.zeros((batch, size), dtype=inner.compute_dtype)
            for size in state_sizes(inner)
        ]
    y, states = backends.current().run(
        way, inner, x, initial_state, training, steps, want_states
    )
    if not want_states:
        return y, []
    if states is None:
        states = final_state.states_at_length(inner, x, y, initial_state, steps)
    return y, states


def with_zero_step(y):
    """`y` with one step of zeros appended to its time axis: gathering index
    `time` then reads zeros. Used instead of `where(mask, y, 0)` on the
    outputs, which PyTorch runs much slower than a gather on a CPU."""
    return ops.concatenate([y, ops.zeros_like(y[:, :1])], axis=1)


def in_place(y, steps):
    """Valid-first outputs back at the caller's positions, zeros at padding
    (the `Bidirectional` convention)."""
    time = ops.shape(y)[1]
    if steps.inverse is None:
        index = ops.expand_dims(ops.arange(time, dtype="int32"), 0)
        valid = steps.valid
    else:
        index = steps.inverse
        valid = index < ops.expand_dims(steps.lengths, 1)
    return gather_or_zero(y, index, valid)


def gather_or_zero(y, index, keep):
    """`gather_time(y, index)` where `keep` is True, zeros elsewhere: the
    positions not kept read the appended zero step (`with_zero_step`)."""
    time = backends.current().scalar(ops.shape(y)[1], "int32")
    index = ops.where(keep, index, time)
    return mops.gather_time(with_zero_step(y), index)


def last_output(y, steps):
    """The output at each row's last valid step; zeros for an empty row."""
    y = final_state.take_at(y, steps.last)
    return ops.where(steps.has_steps, y, ops.zeros_like(y))


def held(y, read_mask, zero_output_for_mask=False, rank=None):
    """Valid-first outputs placed as Keras' `RNN` returns them under a mask.

    Position `t` (in the order the layer reads) gets the output of the last
    valid step at or before `t`: the output itself at a valid step, the last
    valid output repeated at a masked one, zeros before the first valid step.
    With `zero_output_for_mask=True`, zeros at every masked step.

    Args:
        y: Valid-first outputs `(batch, time, units)`.
        read_mask: Bool `(batch, time)`, the mask in the order the layer
            reads (flipped for `go_backwards=True`).
        zero_output_for_mask: Bool, the wrapped layer's setting.
        rank: Optional int32 `(batch, time)`: `cumsum(read_mask) - 1` when
            the caller has it (`Steps.rank`), else computed here.
    """
    if rank is None:
        rank = ops.cumsum(ops.cast(read_mask, "int32"), axis=1) - 1
    keep = rank >= 0
    if zero_output_for_mask:
        keep = ops.logical_and(keep, read_mask)
    return gather_or_zero(y, rank, keep)


def state_sizes(inner):
    """The sizes of the states of `inner` (`[units, units]` for an LSTM)."""
    state_size = inner.cell.state_size
    if isinstance(state_size, (list, tuple)):
        return list(state_size)
    return [state_size]


def state_names(inner):
    """Names of the states of `inner` for messages: `["h", "c"]` for an
    LSTM, `["h"]` for a GRU or SimpleRNN, `["state 0", ...]` otherwise."""
    sizes = state_sizes(inner)
    if isinstance(inner, keras.layers.LSTM):
        return ["h", "c"]
    if isinstance(inner, (keras.layers.GRU, keras.layers.SimpleRNN)):
        return ["h"]
    return [f"state {i}" for i in range(len(sizes))]


def output_size(inner):
    """The size of the last axis of the outputs of `inner`."""
    size = getattr(inner.cell, "output_size", None)
    return size if size is not None else state_sizes(inner)[0]


def inner_copy(layer, name):
    """A fresh copy of `layer` that returns its whole sequence and its states,
    reading forward (`go_backwards=False`), with no weights shared."""
    config = keras.saving.serialize_keras_object(layer)
    inner_config = config["config"]
    inner_config["name"] = name
    inner_config["return_sequences"] = True
    inner_config["return_state"] = True
    inner_config["go_backwards"] = False
    inner = keras.saving.deserialize_keras_object(config)
    # `use_cudnn` is not part of the config (as in keras.layers.Bidirectional).
    if hasattr(layer, "use_cudnn"):
        inner.use_cudnn = layer.use_cudnn
    # The wrapper hands its inner RNNs masks itself (Keras' masked loop) and
    # keeps the mask for the layers after it. Keras 3.16's RNN says it does
    # not support masking and warns that it "will destroy the mask" whenever
    # it is called with one; these copies are private, so they say they do.
    inner.supports_masking = True
    return inner


def _weights_device(inner):
    """A weight of `inner` (its device decides on torch), or None before
    it is built (the default device)."""
    weights = inner.weights if inner.built else []
    return weights[0] if weights else None


class MaskedWrapper(keras.layers.Layer):
    """What `MaskedRNN` and `MaskedBidirectional` share as Keras layers.

    `compute_output_spec` runs the argument checks that need no values, so a
    bad `lengths`/`mask` fails when a Functional model is built from shapes;
    `_empty_batch_outputs` answers a batch of 0 rows without an RNN call;
    `_kernel_info` is what both `kernel_info()` methods report. Each
    subclass supplies `compute_output_shape`.
    """

    def _plan(self, inner_layers, where, masked=True, training=None):
        """The `maskedrnn.backends.Plan` of a call with inputs on the device
        of `where` (None: the default device), for the dict `inner_layers`
        `{key: inner RNN}`."""
        return backends.plan(
            inner_layers, where, self.return_state, masked=masked, training=training
        )

    def _kernel_info(self, inner_layers, inputs):
        """`{key: sentence}` of the plan for each inner RNN of the dict
        `inner_layers`, for data on the device of `inputs` (default: each
        inner layer's weights)."""
        if not self.built:
            raise ValueError(
                "kernel_info() needs a built layer: call it on data first or "
                "call layer.build(input_shape)."
            )
        where = inputs
        if where is None:
            where = _weights_device(next(iter(inner_layers.values())))
        return self._plan(inner_layers, where).info()

    def _uses_fast_path(self, inner_layers):
        """`uses_fast_path`: whether the plan for this layer's weights hands
        no inner RNN a mask."""
        where = _weights_device(next(iter(inner_layers.values())))
        return self._plan(inner_layers, where).unmasked

    def compute_output_spec(
        self, inputs, initial_state=None, mask=None, training=None, lengths=None
    ):
        # Functional models are built from shapes alone: run the checks that
        # need no values now, so a bad `lengths`/`mask` fails at model build.
        if lengths is not None:
            _checks.check_lengths_static(lengths, inputs)
        elif mask is not None:
            _checks.check_mask(mask, inputs)
        return super().compute_output_spec(
            inputs,
            initial_state=initial_state,
            mask=mask,
            training=training,
            lengths=lengths,
        )

    def _empty_batch_outputs(self, x):
        """Outputs of the right shapes for a batch of 0 rows (no RNN call)."""
        shapes = self.compute_output_shape(tuple(x.shape))
        if isinstance(shapes[0], int) or shapes[0] is None:
            shapes = [shapes]
        outputs = [
            ops.zeros(tuple(0 if d is None else d for d in shape), self.compute_dtype)
            for shape in shapes
        ]
        return self._returned(outputs)

    def _returned(self, outputs, bad_rows=None):
        """What `call` returns from its list of outputs: the rows flagged by
        `_checks.check_lengths` poisoned (`_checks.poison_rows`), then the
        one tensor alone or the tuple."""
        if bad_rows is not None:
            outputs = _checks.poison_rows(outputs, bad_rows)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
