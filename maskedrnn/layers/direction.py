"""Run one direction of a masked batch on an unmasked RNN.

The shared core of `MaskedBidirectional` and `MaskedRNN`. A masked batch is
described once per call by a `Steps` (lengths and the indices derived from
them). Each direction then:

1. reads *valid-first* data: each row's valid steps moved to the front in
   order (`Steps.order`, one gather; none when the caller passes `lengths`),
   or reversed by the row's own length (`Steps.reverse`) for a backward
   direction, so it reads `3 2 1`, not `0 0 3 2 1`;
2. zeroes the padded tail of that input, so padding never matters (inf or
   NaN there cannot reach outputs or gradients); PyTorch's packed kernel
   never reads it at all;
3. runs the inner RNN with no Keras mask, on the kernel `kernels.choose`
   picks (fused, PyTorch's packed kernel, or Keras' masked loop for layers
   that have no fused kernel and for an LSTM's exact states where Keras has
   no fused LSTM kernel);
4. reads its states after each row's last valid step (`final_state`) unless
   the kernel returned them exact.

The caller places the per-step outputs back (`in_place` for the zeros-at-
padding convention of `Bidirectional`, `held` for Keras' `RNN` convention
that a masked step repeats the last valid output).

When the kernel is Keras' masked loop anyway (`loops_over_mask`: layers with
no fused kernel to keep, an LSTM's exact states where Keras has no fused
LSTM kernel), a batch given with a mask skips steps 1-4: `run_masked_loop`
runs that loop on the caller's order, which reads any mask by itself.

When the kernel is PyTorch's own (`runs_in_torch`: the torch backend on
CPU), steps 1-4 and the placement run as torch ops in one call,
`run_in_torch` (`maskedrnn._torch_kernels.run_direction`): the same logic,
a dozen torch ops instead of about fifty Keras ones around the kernel.
"""

import keras
from keras import ops

from maskedrnn import _backend, _checks
from maskedrnn import ops as mops
from maskedrnn.layers import final_state, kernels


class Steps:
    """Everything a call derives from its lengths, computed once.

    Attributes:
        time: The size of the time axis (int, or a scalar tensor when it is
            unknown until run time).
        lengths: Int32 `(batch,)`, the number of valid steps of each row, in
            `[0, time]`.
        order: Int32 `(batch, time)` time gather from the caller's order to
            valid-first, or None when the data is valid-first already.
        inverse: The inverse permutation of `order` (None with it).
        rank: Int32 `(batch, time)` or None (with `order`): at each step of
            the caller's order, the valid-first slot of the last valid step
            at or before it, -1 before the first (`ops.valid_ranks`); the
            gather index of `held` for outputs read in the caller's order.
        valid: Bool `(batch, time)`: the valid steps of valid-first data
            (`sequence_mask(lengths, time)`).
        has_steps: Bool `(batch, 1)`: `lengths > 0`.
        last: Int32 `(batch,)`: `max(lengths - 1, 0)`, each row's last valid
            step in valid-first data.
        reverse: Int32 `(batch, time)`: the gather index that reverses each
            row's first `lengths` steps (`ops.reverse_index`).
    """

    def __init__(self, lengths, time, order=None, inverse=None, rank=None):
        self.time = time
        self.lengths = lengths
        self.order = order
        self.inverse = inverse
        self.rank = rank
        self.valid = mops.sequence_mask(lengths, time)
        self.has_steps = ops.expand_dims(lengths > 0, -1)
        self.last = ops.maximum(lengths - 1, 0)
        self._reverse = None

    @property
    def reverse(self):
        if self._reverse is None:
            self._reverse = mops.reverse_index(self.lengths, self.time)
        return self._reverse

    @classmethod
    def from_lengths(cls, lengths, time):
        """Right-padded data: row `i` has `lengths[i]` valid steps (int32,
        already checked and clipped to `[0, time]`)."""
        return cls(lengths, time)

    @classmethod
    def from_mask(cls, mask):
        """Any boolean `(batch, time)` mask (left padding, holes, ...)."""
        rank, inverse, lengths = mops.valid_ranks(mask)
        order = _backend.invert_permutation(inverse)
        return cls(lengths, ops.shape(mask)[1], order, inverse, rank)

    @classmethod
    def full(cls, batch, time):
        """No mask and no lengths: every step of every row is valid."""
        return cls(ops.full((batch,), time, dtype="int32"), time)

    def valid_first(self, x):
        """`x` in valid-first order (no copy when it already is)."""
        return x if self.order is None else mops.gather_time(x, self.order)


def zero_padding(x, steps):
    """`x` (valid-first) with zeros at every padded step."""
    return zero_where_masked(x, steps.valid)


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
    three: XLA moves the transpose to the backward side). JAX CPU, one
    thread: `KERAS_BACKEND=jax python scripts/masked_loop_zeroing.py`, which
    times both forms against Keras' masked layer (docs/results/
    masked-loop-zeroing-jax.txt).

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


def loops_over_mask(inner, where, want_states=False):
    """True when `kernels.choose` sends `inner` to Keras' masked step loop.

    That loop reads any mask (left padding, holes, all-padding rows) as it
    comes, so a batch given with `mask=` skips the valid-first reordering
    and runs `run_masked_loop` in the caller's order instead.
    """
    return kernels.choose(inner, where, want_states)[0] is kernels.run_keras_masked


def run_masked_loop(inner, x, mask, initial_state=None, training=None):
    """Runs `inner` in Keras' masked step loop over the caller's order.

    For the layers `kernels.choose` gives no fused kernel to keep (see
    `loops_over_mask`): Keras' own masked loop, exact, with no reordering.

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
    if initial_state is not None:
        # Keras' JAX loop outputs the initial h before a row's first valid
        # step; `held`, and Keras' other backends, output zeros there.
        started = ops.cumsum(ops.cast(mask, "int32"), axis=1) > 0
        y = zero_where_masked(y, started)
    return y, list(states)


def runs_in_torch(inner, where, want_states=False, training=None):
    """True when this direction runs on PyTorch's own kernels (the torch
    backend on CPU: `kernels.run_torch_packed` / `run_torch_native`).

    Then the layer runs the whole direction with `run_in_torch`, from and
    back to the caller's order, instead of making valid-first data and
    placing the outputs with `keras.ops`: the same results, with a dozen
    torch ops around the kernel instead of about fifty Keras ones. Input
    dropout (`training` with `dropout > 0`) takes `run`, which applies it.
    """
    if training and inner.cell.dropout:
        return False
    runner = kernels.choose(inner, where, want_states)[0]
    return runner in (kernels.run_torch_packed, kernels.run_torch_native)


def torch_layout(mask):
    """The layout of a batch for `run_in_torch` (computed once per call,
    shared by both directions): `mask` is bool `(batch, time)` in the
    caller's order."""
    return kernels.torch_kernels().Layout(mask)


def run_in_torch(
    inner, x, layout, initial_state=None, reverse=False, place="zeros", want_states=True
):
    """One direction on PyTorch's kernel, in the caller's order.

    Only where `runs_in_torch` is True. Reads each row's valid steps in
    order (`reverse=True`: last to first) straight from `x`, and returns the
    outputs placed as `place` says: `"zeros"` as `in_place`, `"held"` /
    `"held_zeros"` as `held` (without / with `zero_output_for_mask`),
    `"last"` as `last_output`; and the states after each row's last valid
    step (the initial state for a row with none; `[]` unless
    `want_states`). The kernel is the one `kernels.choose` picks: packed
    for a GRU's or SimpleRNN's inference, unpacked over valid-first data
    otherwise (an LSTM's final `c` from the kernel itself,
    `_torch_kernels.saturated_lstm`).
    See `maskedrnn._torch_kernels.run_direction`.
    """
    torch_kernels = kernels.torch_kernels()
    # As `kernels.choose` tells its two torch runners apart.
    packed = torch_kernels.packed_preferred(inner)
    return torch_kernels.run_direction(
        inner, x, initial_state, layout, reverse, place, packed, want_states
    )


def run(inner, x, steps, initial_state=None, training=None, want_states=True):
    """Runs `inner` over valid-first `x`; returns `(outputs, states)`.

    Args:
        inner: The inner RNN, returning sequences and states, reading
            forward (`go_backwards=False`), built.
        x: Valid-first float tensor `(batch, time, features)`, in the order
            this direction reads it.
        steps: The `Steps` of the batch.
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
    runner, _ = kernels.choose(inner, x, want_states)
    if runner is not kernels.run_torch_packed:
        # PyTorch's packed kernel never reads the padded steps; every other
        # runner reads them, so they must hold zeros (never inf or NaN).
        x = zero_padding(x, steps)
    if runner is not kernels.run_keras_masked and training and cell.dropout:
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
    y, states = runner(inner, x, initial_state, training, steps, want_states)
    if not want_states:
        return y, []
    if states is None:
        states = final_state.states_at_length(inner, x, y, initial_state, steps)
    return y, states


def with_zero_step(y):
    """`y` with one step of zeros appended to its time axis: gathering index
    `time` then reads zeros. Used instead of `where(mask, y, 0)` on the
    outputs, which PyTorch runs 8x slower than a gather on a CPU (32 x 100 x
    64 floats, one thread: 240 vs 30 us)."""
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
    index = ops.where(keep, index, ops.cast(ops.shape(y)[1], "int32"))
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


class MaskedWrapper(keras.layers.Layer):
    """What `MaskedRNN` and `MaskedBidirectional` share as Keras layers.

    `compute_output_spec` runs the argument checks that need no values, so a
    bad `lengths`/`mask` fails when a Functional model is built from shapes;
    `_empty_batch_outputs` answers a batch of 0 rows without an RNN call;
    `_kernel_info` is what both `kernel_info()` methods report. Each
    subclass supplies `compute_output_shape`.
    """

    def _kernel_info(self, inner_layers, inputs):
        """`{key: sentence}` of `kernels.choose` for each inner RNN of the
        dict `inner_layers`, for data on the device of `inputs` (default:
        each inner layer's weights)."""
        if not self.built:
            raise ValueError(
                "kernel_info() needs a built layer: call it on data first or "
                "call layer.build(input_shape)."
            )
        info = {}
        for key, inner in inner_layers.items():
            where = inner.cell.kernel if inputs is None else inputs
            _, info[key] = kernels.choose(inner, where, self.return_state)
        return info

    def compute_output_spec(
        self, inputs, mask=None, lengths=None, initial_state=None, training=None
    ):
        # Functional models are built from shapes alone: run the checks that
        # need no values now, so a bad `lengths`/`mask` fails at model build.
        if lengths is not None:
            _checks.check_lengths_static(lengths, inputs)
        elif mask is not None:
            _checks.check_mask(mask, inputs)
        return super().compute_output_spec(
            inputs,
            mask=mask,
            lengths=lengths,
            initial_state=initial_state,
            training=training,
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
