"""One masked direction on an unmasked RNN, in Keras ops, and the one
dispatch of both layers (`run_plan`).

A direction reads *valid-first* data: each row's valid steps moved to the
front (`Steps.order`), or reversed by the row's own length
(`Steps.reverse`) for a backward direction, so it reads `3 2 1`, not
`0 0 3 2 1`. The padded tail is zeroed, the plan's kernel runs, the final
states are read after each row's last valid step, and the outputs are put
back where the layer's convention wants them (`in_place`, `held`,
`last_output`). docs/design.md explains each strategy of a plan.
"""

import keras
from keras import ops

from maskedrnn import backends
from maskedrnn import ops as mops
from maskedrnn._keras_private import set_keras_mask
from maskedrnn.layers import final_state


def zero_padding(x, steps):
    """`x` (valid-first) with zeros at every padded step."""
    return zero_where_masked(x, steps.valid)


def valid_first_zeroed(x, steps, kernels):
    """`x` valid-first with zeros at padded steps: the input of every
    direction `kernels` run (`run`, the one-call kernels). The zeros are set
    once, in the caller's order, before the gather moves them to each row's
    tail (a backward direction's reversal by length keeps them there). Only
    the packed kernel reads no padded step: run alone, it gets none."""
    if steps.masked and any(k != "torch-packed" for k in kernels):
        x = zero_where_masked(x, steps.mask)
    return steps.valid_first(x)


def zero_where_masked(x, mask):
    """`x` with zeros at every step where the `(batch, time)` `mask` is False:
    a select against a scalar zero, so no tensor of zeros is made."""
    return ops.where(ops.expand_dims(mask, -1), x, ops.zeros((), x.dtype))


def zero_masked_inputs(x, mask):
    """`zero_where_masked(x, mask)` written time-major, so that XLA fuses it
    into the transpose Keras' step loop starts with."""
    time_major = ops.transpose(x, (1, 0, 2))
    mask = ops.expand_dims(ops.transpose(mask, (1, 0)), -1)
    time_major = ops.where(mask, time_major, ops.zeros((), x.dtype))
    return ops.transpose(time_major, (1, 0, 2))


def run_masked_loop(inner, x, mask, initial_state=None, training=None):
    """Runs `inner` in Keras' masked step loop over `x` as it is; returns
    `(outputs, states)`, the outputs in Keras' `RNN` convention (`held`).
    Masked inputs are zeroed first, so inf or NaN there reach nothing."""
    y, *states = inner(
        zero_masked_inputs(x, mask),
        mask=mask,
        initial_state=initial_state,
        training=training,
    )
    # The wrapper's `compute_mask` gives the outputs their mask.
    set_keras_mask(y, None)
    if initial_state is not None:
        # Keras' JAX loop outputs the initial h before a row's first valid
        # step; `held`, and Keras' other backends, output zeros there.
        started = ops.cumsum(ops.cast(mask, "int32"), axis=1) > 0
        y = zero_where_masked(y, started)
    return y, list(states)


def run(kernel, inner, x, steps, initial_state=None, training=None, want_states=True):
    """Runs `inner` over valid-first `x` (zeros at padded steps, see
    `valid_first_zeroed`) with the kernel `kernel`; returns `(outputs,
    states)`: outputs exact at each row's valid steps (the padded tail is
    never read), the states after each row's last valid step (`[]` unless
    `want_states`)."""
    if kernel != "keras-masked" and training and inner.cell.dropout:
        # Applied here, so that the state recomputation sees the same
        # dropped x; Keras' layers (the unmasked kernel) must not drop again.
        x = input_dropout(inner, x)
        training = False
    if initial_state is None:
        batch = ops.shape(x)[0]
        initial_state = [
            ops.zeros((batch, size), dtype=inner.compute_dtype)
            for size in state_sizes(inner)
        ]
    y, states = backends.current().run(
        kernel, inner, x, initial_state, training, steps, want_states
    )
    if not want_states:
        return y, []
    if states is None:
        states = final_state.states_at_length(inner, x, y, initial_state, steps)
    return y, states


def input_dropout_mask(inner, x):
    """The input dropout mask of `inner`'s cell for `x`, `(batch,
    features)`: one per row for every step, drawn as Keras' cells draw it
    (once per call). A row's mask does not depend on the order of its
    steps, so `x` may be in the caller's order or valid-first."""
    cell = inner.cell
    dp_mask = cell.get_dropout_mask(x[:, 0, :])
    cell.reset_dropout_mask()
    return dp_mask


def input_dropout(inner, x):
    """`x` times `inner`'s input dropout mask (`input_dropout_mask`)."""
    return x * ops.expand_dims(input_dropout_mask(inner, x), 1)


def in_place(y, steps):
    """Valid-first outputs back at the caller's positions, zeros at padding
    (the `Bidirectional` convention)."""
    if steps.inverse is None:
        # Valid-first already (right-padded): nothing to move.
        return zero_padding(y, steps)
    index = steps.inverse
    return gather_or_zero(y, index, index < ops.expand_dims(steps.lengths, 1))


def gather_or_zero(y, index, keep):
    """`gather_time(y, index)` where `keep` is True, zeros elsewhere (the
    backend's `gather_or_zero`); what `index` points at where `keep` is
    False is never read, nor reached by a gradient."""
    return backends.current().gather_or_zero(y, index, keep)


def last_output(y, steps):
    """The output at each row's last valid step; zeros for an empty row."""
    y = final_state.take_at(y, steps.last)
    return ops.where(steps.has_steps, y, ops.zeros_like(y))


def held(y, read_mask, rank=None):
    """Valid-first outputs placed as Keras' `RNN` returns them under
    `read_mask`: a masked step repeats the last valid output, zeros before
    the first. `rank` is `cumsum(read_mask) - 1` when the caller has it."""
    if rank is None:
        rank = ops.cumsum(ops.cast(read_mask, "int32"), axis=1) - 1
    return gather_or_zero(y, rank, rank >= 0)


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
    # Keras 3.16's RNN warns it "will destroy the mask" when handed one; the
    # wrapper keeps the mask itself, so its private copies may take one.
    inner.supports_masking = True
    return inner


PLACES = ("zeros", "held", "last")


def read_backwards(x, steps):
    """`x` and its `steps` with the whole time axis reversed, as Keras' RNN
    reads with `go_backwards=True` (padding included: a right-padded row
    becomes left-padded)."""
    return ops.flip(x, 1), steps.flipped()


def run_plan(
    plan, x, steps, initial_states, training, want_states, place, joined=False
):
    """Runs every direction of `plan` and places its outputs: the one
    dispatch of `MaskedRNN` and `MaskedBidirectional`.

    The first direction reads each row forward; a second one (the backward
    direction of `MaskedBidirectional`) reads each row's valid steps last to
    first, by the row's own length.

    Args:
        plan: The call's `maskedrnn.backends.Plan`.
        x: Float tensor `(batch, time, features)`, in the order the layer
            reads (see `read_backwards`).
        steps: The batch's `maskedrnn.steps.Steps`, in the same order.
        initial_states: One entry per direction: its list of initial
            states, or None for zeros.
        training: The call's `training`.
        want_states: Bool, whether the final states are returned.
        place: Where the outputs go. `"zeros"`: each valid step's output at
            its position, zeros at padded steps (Keras' `Bidirectional`).
            `"held"`: Keras' `RNN` under a mask, a padded step repeats the
            last valid output, zeros before the first (forward only).
            `"last"`: `(batch, units)`, the output after the last step each
            direction reads; zeros for a row with no valid step.
        joined: Bool, return the directions' outputs concatenated on the
            last axis as one tensor instead of a list.

    Returns:
        `(outputs, states)`: the outputs, one tensor per direction (or one
        tensor when `joined`), and one list of final states per direction,
        each the state after the last valid step it reads (the initial
        state for a row with none); `[]` when `want_states` is False.
    """
    if place not in PLACES:
        raise ValueError(f"place must be one of {PLACES}; got {place!r}.")
    directions = plan.directions
    backward = [d.key == "backward" for d in directions]
    strategy = plan.strategy
    backend = backends.current()
    dropped = [
        bool(training and getattr(d.inner.cell, "dropout", 0)) for d in directions
    ]
    placed = strategy == "one_call" and plan.kernel(0) in backend.IN_PLACE_KERNELS
    if strategy in ("caller_order", "one_call") and any(dropped) and not placed:
        # One direction: the plan runs two valid-first under input dropout,
        # unless their kernel reads each one's own dropped inputs.
        if len(directions) > 1:
            raise ValueError(
                f"plan has strategy {strategy!r} for two directions with "
                "input dropout; make the plan with the call's `training`."
            )
        x = input_dropout(directions[0].inner, x)
    if strategy == "caller_order":
        layout = backend.layout(steps)
        results = [
            backend.run_direction(
                d.kernel, d.inner, x, layout, state, back, place, want_states
            )
            for d, state, back in zip(directions, initial_states, backward)
        ]
    elif strategy == "masked_loop":
        results = [
            _masked_loop(d.inner, x, steps.mask, state, training, back, place)
            for d, state, back in zip(directions, initial_states, backward)
        ]
    elif strategy == "one_call":
        kernel = plan.kernel(0)
        inners = [d.inner for d in directions]
        if placed:
            # The kernel reads the caller's order, each direction's inputs
            # times its own dropout mask, and places its outputs.
            masks = [
                input_dropout_mask(d.inner, x) if drop else None
                for d, drop in zip(directions, dropped)
            ]
            y, states = backend.run_one_call_in_place(
                kernel, inners, x, steps, initial_states, masks, want_states, place
            )
            if joined:
                return y, states
        else:
            y, states = backend.run_one_call(
                kernel,
                inners,
                valid_first_zeroed(x, steps, [kernel]),
                steps,
                initial_states,
                want_states,
            )
            if joined and place == "zeros":
                return (in_place(y, steps) if steps.masked else y), states
        sizes = [output_size(d.inner) for d in directions]
        ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
        results = []
        for size, end, back, st in zip(sizes, ends, backward, states):
            y_d = y[..., end - size : end]
            results.append((y_d if placed else _place(y_d, steps, place, back), st))
    else:
        x = valid_first_zeroed(x, steps, [d.kernel for d in directions])
        results = []
        for d, state, back in zip(directions, initial_states, backward):
            xd = mops.gather_time(x, steps.reverse) if back else x
            with backends.running_directions(len(directions)):
                y, st = run(d.kernel, d.inner, xd, steps, state, training, want_states)
            if back and place == "last":
                # After reading every valid step: its own last output.
                y = last_output(y, steps)
            else:
                if back:
                    y = mops.gather_time(y, steps.reverse)
                y = _place(y, steps, place, back)
            results.append((y, st))
    outputs = [y for y, _ in results]
    states = [list(st) if want_states else [] for _, st in results]
    if joined:
        outputs = ops.concatenate(outputs, axis=-1)
    return outputs, states


def _place(y, steps, place, backward):
    """Aligned valid-first outputs (slot `k`: the output after reading valid
    step `k`) placed as `run_plan`'s `place` says."""
    if place == "last":
        if not backward:
            return last_output(y, steps)
        y = y[:, 0]
        return ops.where(steps.has_steps, y, ops.zeros_like(y))
    if not steps.masked:
        return y
    if place == "held":
        return held(y, steps.mask, steps.rank)
    return in_place(y, steps)


def _masked_loop(inner, x, mask, state, training, backward, place):
    """`run_masked_loop` for `run_plan`: a backward direction reads the
    flipped time axis and mask, as Keras' `Bidirectional` runs it."""
    if backward:
        x, mask_read = ops.flip(x, 1), ops.flip(mask, 1)
    else:
        mask_read = mask
    y, states = run_masked_loop(inner, x, mask_read, state, training)
    if place == "last":
        return y[:, -1], states
    if backward:
        y = ops.flip(y, 1)
    if place == "zeros":
        y = zero_where_masked(y, mask)
    return y, states
