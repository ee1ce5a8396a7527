"""The JAX backend's length tiers: only the valid steps of a masked batch run.

The `"jax-tiers"` kernel for Keras' `LSTM`, `GRU` and `SimpleRNN`: rows
sorted by length run in static groups of equal size, each group only up to
its own longest row, with a gradient of its own (`jax.custom_vjp`) walking
the same steps back (docs/design.md, "Kernels, one per backend"). Steps
compute in the layer's compute dtype; weight gradients sum in float32; the
cells' equations are in `jax_cells`.

A call's directions run from the caller's order (`run_in_place`): each row
from its first valid step to its last (a backward direction from its last
to its first), a masked step between them keeping the state as in Keras'
masked loop, so no step is moved and the mask needs no ranking; under
input dropout each direction reads its own dropped inputs. One direction
on valid-first data (`run`, where a call's directions run different
kernels) runs the same recurrence.

The groups' recurrence and its gradient are in `jax_groups`.
"""


import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax import lax

from maskedrnn.backends.jax_groups import recurrence, select
from maskedrnn.backends.jax_rows import (
    SortedRows,
    move_rows,
    per_direction,
    take_rows,
)

KERNEL = "jax-tiers"
# Row groups on a CPU: more skip more padded steps, but run more, smaller
# steps one after another. The compiled program is the same for any number.
GROUPS = 4
# The fewest rows a group has: a step on fewer rows is too small to gain
# from the steps it skips (and XLA's CPU kernels for it compile slower).
GROUP_ROWS = 8
DTYPES = ("float16", "bfloat16", "float32", "float64")

_TANH = (keras.activations.tanh, keras.ops.tanh, jnp.tanh)
_SIGMOID = (keras.activations.sigmoid, keras.ops.sigmoid, jax.nn.sigmoid)
KINDS = (keras.layers.LSTM, keras.layers.GRU, keras.layers.SimpleRNN)


def equations_reason(inner):
    """None when the tiers compute `inner` exactly, else why not."""
    kind = type(inner)
    if kind not in KINDS:
        return f"{kind.__name__} is not LSTM, GRU or SimpleRNN"
    cell = inner.cell
    if cell.activation not in _TANH:
        return "the tiers compute activation='tanh' only"
    if kind is not keras.layers.SimpleRNN and cell.recurrent_activation not in _SIGMOID:
        return "the tiers compute recurrent_activation='sigmoid' only"
    if cell.recurrent_dropout:
        return "recurrent_dropout > 0 (Keras' masked loop applies it per step)"
    if inner.unroll:
        return "unroll=True asks for Keras' unrolled loop"
    if inner.stateful:
        return "stateful=True keeps states across batches in Keras' layer"
    if inner.activity_regularizer is not None:
        return "the inner layer has an activity_regularizer (applied by Keras' call)"
    dtype = keras.backend.standardize_dtype(cell.compute_dtype)
    if dtype not in DTYPES:
        return f"compute dtype {dtype} (the tiers compute floating dtypes only)"
    return None


def describe(inner):
    """The `kernel_info()` sentence of the kernel."""
    name = type(inner).__name__
    return (
        f"{name} in length tiers: rows sorted by the span from their first "
        f"valid step to their last, in {_groups_text()} that "
        "each run to their own longest span (padded steps outside it "
        "skipped, masked steps inside it keeping the state; no host sync), "
        "exact final states carried to each row's last valid step, its own "
        "gradient (jax.custom_vjp); the directions of a call stacked in one "
        "recurrence"
    )


def default_groups(batch):
    """The row groups of a batch of `batch` rows (static): on a CPU,
    `GROUPS`, fewer where groups would have under `GROUP_ROWS` rows (at
    least 1); 1 elsewhere, where a step's time hardly depends on its rows
    and more groups would only run more steps one after another."""
    if jax.default_backend() != "cpu":
        return 1
    return max(1, min(GROUPS, batch // GROUP_ROWS))


def _groups_text():
    """The row groups `describe` names."""
    if jax.default_backend() != "cpu":
        return "1 row group"
    return f"up to {GROUPS} row groups of at least {GROUP_ROWS} rows"


def _groups(groups, batch):
    """The number of row groups asked for, `default_groups(batch)` if None."""
    return default_groups(batch) if groups is None else groups


def _kind(inner):
    """`("lstm",)`, `("gru", reset_after)` or `("rnn",)`."""
    if type(inner) is keras.layers.LSTM:
        return ("lstm",)
    if type(inner) is keras.layers.GRU:
        return ("gru", bool(inner.cell.reset_after))
    return ("rnn",)


def _weights(inner, dtype):
    """`(kernel, recurrent_kernel, bias)` of `inner` in `dtype`; bias zeros if none."""
    cell = inner.cell
    kernel = jnp.asarray(keras.ops.convert_to_tensor(cell.kernel)).astype(dtype)
    recurrent = jnp.asarray(keras.ops.convert_to_tensor(cell.recurrent_kernel))
    recurrent = recurrent.astype(dtype)
    if cell.use_bias:
        bias = jnp.asarray(keras.ops.convert_to_tensor(cell.bias)).astype(dtype)
    else:
        shape = (
            (2, kernel.shape[1])
            if _kind(inner) == ("gru", True)
            else (kernel.shape[1],)
        )
        bias = jnp.zeros(shape, dtype)
    return kernel, recurrent, bias


def run(inner, x, lengths, initial_state, groups=None):
    """Runs the Keras RNN `inner` over valid-first `x` in length tiers.

    Args:
        inner: A built Keras `LSTM`, `GRU` or `SimpleRNN`.
        x: Float `(batch, time, features)`, valid-first, finite at padded
            steps.
        lengths: Int `(batch,)`, each row's valid steps, in `[0, time]`.
        initial_state: List of `(batch, units)` states (`[h, c]` for an
            LSTM, `[h]` otherwise).
        groups: Static number of row groups (`default_groups(batch)` if None;
            at most `batch`).

    Returns:
        `(outputs, states)`: outputs `(batch, time, units)` in the compute
        dtype, finite but unspecified at padded steps; the states after
        each row's last valid step (initial ones for a row of length 0).

    Example:

    ```python
    gru = keras.layers.GRU(8)
    gru.build((None, None, 4))
    x = np.zeros((3, 5, 4), "float32")  # valid-first, zeros at padding
    y, [h] = run(gru, x, np.array([5, 2, 0]), [np.zeros((3, 8), "float32")])
    ```
    """
    y, (states,) = run_directions([inner], x, lengths, [initial_state], groups)
    return y, states


def run_one_call(inners, x, steps, initial_states, want_states, groups=None):
    """Every direction of a call in one tiered recurrence, weights stacked:
    a second direction reads each row's valid steps last to first. An
    initial state of None is zeros."""
    y, states = run_directions(inners, x, steps.lengths, initial_states, groups)
    return y, [list(s) if want_states else [] for s in states]


def same_shapes_reason(inners):
    """None when the directions `inners` can run stacked, else why not."""
    first = inners[0]
    for other in inners[1:]:
        if (
            type(other) is not type(first)
            or other.cell.units != first.cell.units
            or _dtype(other) != _dtype(first)
            or _kind(other) != _kind(first)
        ):
            return (
                "the two directions differ in RNN type, units, dtype or "
                "reset_after, and one tiered recurrence runs directions of "
                "one shape"
            )
    return None


def _dtype(inner):
    return keras.backend.standardize_dtype(inner.cell.compute_dtype)


def run_directions(inners, x, lengths, initial_states, groups=None):
    """`run` for one or two directions stacked in one recurrence.

    The first direction reads the valid-first `x`; a second one reads each
    row's valid steps last to first. An entry of `initial_states` may be
    None: zeros. Returns `(outputs, states)`: the outputs `(batch, time,
    units * directions)`, each direction's output at the slot of the valid
    step it read there (directions side by side on the last axis), and one
    list of final states per direction.
    """
    setup = _Setup(inners, x, initial_states)
    if setup.empty:
        return setup.empty_outputs("held"), setup.empty_states()
    time, directions = setup.time, setup.directions
    lengths = jnp.clip(jnp.asarray(lengths).astype(jnp.int32), 0, time)
    rows = SortedRows(lengths, _groups(groups, lengths.shape[0]))
    # One gather makes the kernel's (directions, time, batch, features)
    # input: rows sorted (the padding rows read row 0 and never use it),
    # each row's steps along the second axis, a backward direction's reversed
    # by length.
    t = jnp.arange(time, dtype=jnp.int32)[:, None]
    read = _read_steps(t, rows.sorted_spans[None], directions)
    read = jnp.transpose(read, (2, 0, 1))
    keep = jnp.broadcast_to(t < rows.sorted_spans[None], read.shape)
    ys, finals = setup.run(rows, read, keep)
    # One gather back: (batch, time, directions) slots of the kernel's
    # (directions, time, batch) outputs, rows in the caller's order.
    back = _read_steps(t.T, lengths[:, None], directions)
    return rows.gather(ys, back), finals


def run_in_place(
    inners, x, mask, initial_states, place, groups=None, dropout_masks=None
):
    """Every direction of a call in one tiered recurrence, steps in the
    caller's order: no step is moved, only rows are sorted.

    Each row runs from its first valid step to its last (a second
    direction from its last to its first); a masked step between them keeps
    the state, as in Keras' masked loop. Rows are sorted by that span and
    run in groups, each to its own longest span.

    Args:
        inners: One or two built Keras RNNs of one type and size.
        x: Float `(batch, time, features)` in the caller's order; masked
            steps are read as zeros.
        mask: Bool `(batch, time)`, or None: every step valid.
        initial_states: One entry per direction: its list of states, or
            None for zeros.
        place: `"zeros"`: each direction's output at every valid step,
            zeros at masked steps. `"held"` (one direction): Keras' `RNN`
            under a mask, a masked step repeats the last valid output,
            zeros before the first. `"last"`: `(batch, units)`, the output
            after the last step each direction reads; zeros for a row with
            no valid step.
        groups: Static number of row groups (`default_groups(batch)` if None).
        dropout_masks: None, or one entry per direction: a `(batch,
            features)` input dropout mask its inputs are multiplied by at
            every step, or None for none.

    Returns:
        `(outputs, states)`: the outputs `(batch, time, units * directions)`
        (`(batch, units * directions)` for `"last"`), directions side by
        side on the last axis, and one list of final states per direction,
        each the state after the last valid step it reads (the initial
        state for a row with none).
    """
    setup = _Setup(inners, x, initial_states)
    if setup.empty:
        return setup.empty_outputs(place), setup.empty_states()
    time, batch, directions = setup.time, setup.batch, setup.directions
    if mask is None:
        mask = jnp.ones((batch, time), bool)
    mask = jnp.asarray(mask).astype(bool)
    setup.x = select(lax.expand_dims(mask, (2,)), setup.x, lax.full_like(setup.x, 0))
    if dropout_masks is not None and any(m is not None for m in dropout_masks):
        setup.drop(dropout_masks)
    # Index arithmetic in `lax` (see `jax_rows`); `bt` is (batch, time).
    bt = (batch, time)
    tb = lax.broadcasted_iota(jnp.int32, bt, 1)
    # Each row's first and last valid step in one two-valued reduction:
    # XLA's CPU backend splits a long single reduction into two kernels.
    first, last = lax.reduce(
        (_where(mask, tb, time), _where(mask, tb, -1)),
        (np.int32(time), np.int32(-1)),
        lambda a, b: (lax.min(a[0], b[0]), lax.max(a[1], b[1])),
        (1,),
    )
    spans = lax.max(lax.add(lax.sub(last, first), np.int32(1)), np.int32(0))
    rows = SortedRows(spans, _groups(groups, batch), carry=(first, last))
    # The step each direction reads at span position i of a sorted row.
    first_sorted, last_sorted = rows.carried
    tp = (time, first_sorted.shape[0])  # (span position, sorted row)
    i = lax.broadcasted_iota(jnp.int32, tp, 0)
    ends = (first_sorted, last_sorted)
    firsts, lasts = (lax.broadcast_in_dim(v, tp, (1,)) for v in ends)
    read = per_direction(directions, 0, lax.add(firsts, i), lax.sub(lasts, i))
    read = _clip_step(read, time)
    flat_mask = jnp.reshape(mask, (-1,))
    read_rows = lax.add(read, rows.offsets(time))  # in the (batch * time,) view
    in_span = lax.lt(i, lax.broadcast_in_dim(rows.sorted_spans, tp, (1,)))
    keep = lax.bitwise_and(take_rows(flat_mask, read_rows), _per_step(in_span, read))
    # Each step's span position for each direction, and the kernel's slot
    # of it: the step's input goes there, its output comes from there.
    firsts, lasts = (lax.broadcast_in_dim(v, bt, (0,)) for v in (first, last))
    back = (lax.sub(tb, firsts), lax.sub(lasts, tb))
    positions = _clip_step(per_direction(directions, -1, *back), time)
    slots = rows.slots(positions, time)
    readers = jnp.reshape(slots, (batch * time, directions))
    ys, finals = setup.run(rows, read, keep, (readers, flat_mask))
    has_steps = lax.gt(spans, np.int32(0))
    if place == "last":
        y = _last_outputs(ys, rows, spans)
        return select(lax.expand_dims(has_steps, (1,)), y, lax.full_like(y, 0)), finals
    if place == "held":
        # A masked step after the last valid one shows that one's output.
        held = lax.max(lax.sub(spans, np.int32(1)), np.int32(0))
        held, has_steps = (lax.broadcast_in_dim(v, bt, (0,)) for v in (held, has_steps))
        position = lax.min(lax.max(back[0], np.int32(0)), held)
        shown = lax.bitwise_and(lax.ge(tb, firsts), has_steps)
        y = rows.gather(ys, lax.expand_dims(position, (2,)))
    else:
        # Each kept slot's output goes to one step: its gradient is a gather.
        e = lax.broadcasted_iota(jnp.int32, read.shape, 0)
        steps = lax.add(lax.mul(read_rows, np.int32(directions)), e)
        moved = (jnp.reshape(steps, (-1, 1)), jnp.reshape(keep, (-1,)))
        y = move_rows(jnp.reshape(ys, (-1, ys.shape[-1])), slots, *moved)
        y = jnp.reshape(y, (batch, time, -1))
        shown = mask
    return select(lax.expand_dims(shown, (2,)), y, lax.full_like(y, 0)), finals


def _last_outputs(ys, rows, spans):
    """`(batch, directions * units)`: each direction's output after the
    last step it reads, read from the kernel's outputs `ys` at its row's
    span position `span - 1` (by `move_rows`, its gradient a gather into
    the outputs' gradient), not from the final states: those are written
    and their gradient read per row group, two kernels more to compile."""
    directions, time, padded, units = ys.shape
    batch = spans.shape[0]
    last = lax.max(lax.sub(spans, np.int32(1)), np.int32(0))
    positions = lax.broadcast_in_dim(last, (batch, 1, directions), (0,))
    slots = rows.slots(positions, time)
    # Each slot `(e, t, r)` of `ys` is read by output `(row of r, e)` when
    # `t` is that row's last span position, by no output otherwise.
    shape = (directions, time, padded)
    e = lax.broadcasted_iota(jnp.int32, shape, 0)
    t = lax.broadcasted_iota(jnp.int32, shape, 1)
    spans_sorted = lax.broadcast_in_dim(rows.sorted_spans, shape, (2,))
    row = lax.broadcast_in_dim(rows.caller_rows, shape, (2,))
    reader = lax.add(lax.mul(row, np.int32(directions)), e)
    read = lax.eq(t, lax.sub(spans_sorted, np.int32(1)))
    y = move_rows(
        jnp.reshape(ys, (-1, units)),
        slots,
        jnp.reshape(reader, (-1, 1)),
        jnp.reshape(read, (-1,)),
    )
    return jnp.reshape(y, (batch, directions * units))


def _where(condition, value, other):
    """`value` where `condition`, else the int32 scalar `other`."""
    return lax.select(condition, value, lax.full_like(value, other))


def _clip_step(steps, time):
    """`steps` clipped to the steps `0` to `time - 1`."""
    return lax.clamp(np.int32(0), steps, np.int32(time - 1))


def _per_step(value, like):
    """A `(time, rows)` value broadcast over the directions of `like`,
    `(directions, time, rows)`."""
    return lax.broadcast_in_dim(value, like.shape, (1, 2))


class _Setup:
    """What both entry points share: the inputs in the compute dtype, the
    initial states, the stacked weights, and the kernel's call."""

    def __init__(self, inners, x, initial_states):
        self.dtype = dtype = _dtype(inners[0])
        self.x = jnp.asarray(x).astype(dtype)
        self.batch, self.time = self.x.shape[0], self.x.shape[1]
        self.inners = inners
        self.directions = len(inners)
        self.units = inners[0].cell.units
        self.count = 2 if type(inners[0]) is keras.layers.LSTM else 1
        self.states = [
            [jnp.asarray(s).astype(dtype) for s in i] if i is not None else None
            for i in initial_states
        ]
        self.empty = self.batch == 0 or self.time == 0

    def empty_outputs(self, place):
        width = self.units * self.directions
        if place == "last":
            return jnp.zeros((self.batch, width), self.dtype)
        return jnp.zeros((self.batch, self.time, width), self.dtype)

    def empty_states(self):
        zeros = [jnp.zeros((self.batch, self.units), self.dtype)] * self.count
        return [s if s is not None else zeros for s in self.states]

    def drop(self, masks):
        """Each direction's own inputs, `x` times its `(batch, features)`
        input dropout mask (None: `x` as it is); for two directions `x`
        becomes `(directions, batch, time, features)`, which `run` reads
        direction by direction."""
        dropped = []
        for m in masks:
            if m is not None:
                m = lax.expand_dims(jnp.asarray(m).astype(self.dtype), (1,))
            dropped.append(self.x if m is None else lax.mul(self.x, m))
        if self.directions == 1:
            self.x = dropped[0]
        else:
            self.x = per_direction(self.directions, 0, *dropped)

    def run(self, rows, read, keep, readers=None):
        """Runs the kernel on the sorted rows, reading step `read[e, i, p]`
        of sorted row `p` at position `i` (of direction `e`'s own inputs
        after `drop`); `(ys, finals)`, the final states in the caller's row
        order. `readers`: `(slots, valid)` of `move_rows`, each step's slots
        in the kernel's input (its gradient a gather), or None."""
        flat = jnp.reshape(self.x, (-1, self.x.shape[-1]))
        index = lax.add(read, rows.offsets(self.time))
        if self.x.ndim == 4:
            # Direction e reads its own inputs, e * batch * time rows on.
            e = lax.broadcasted_iota(jnp.int32, index.shape, 0)
            index = lax.add(index, lax.mul(e, np.int32(self.batch * self.time)))
            if readers is not None:
                # Each of those rows is read by its own direction's slot.
                slots, valid = readers
                shape = (self.directions,) + valid.shape
                readers = (
                    jnp.reshape(lax.transpose(slots, (1, 0)), (-1, 1)),
                    jnp.reshape(lax.broadcast_in_dim(valid, shape, (1,)), (-1,)),
                )
        if readers is None:
            x_dt = take_rows(flat, index)
        else:
            x_dt = move_rows(flat, index, *readers)
        spec = (self.units, self.count, self.dtype)
        states = _sorted_states(self.states, rows, spec)
        kind = _kind(self.inners[0])
        params = _stacked_weights(self.inners, self.dtype)
        ys, finals = recurrence(
            kind, rows.groups, x_dt, rows.sorted_spans, keep, states, params
        )
        finals = [[rows.unsort(s[e]) for s in finals] for e in range(self.directions)]
        return ys, finals


def _sorted_states(states, rows, spec):
    """The initial states as the kernel reads them: one `(directions,
    batch + pad, units)` array per state, in the `SortedRows` `rows`. All
    zeros are made in place, with no gather to compile."""
    units, count, dtype = spec
    batch = rows.order.shape[0]
    if all(s is None for s in states):
        return tuple(
            jnp.zeros((len(states), batch + rows.pad, units), dtype)
            for _ in range(count)
        )
    zeros = [jnp.zeros((batch, units), dtype)] * count
    states = [s if s is not None else zeros for s in states]
    return tuple(
        jnp.pad(
            jnp.stack([rows.sort(s[k]) for s in states]),
            ((0, 0), (0, rows.pad), (0, 0)),
        )
        for k in range(count)
    )


def _read_steps(t, lengths, directions):
    """The step each direction reads at slot `t` (broadcast with
    `lengths`): `t`, and for a second direction `lengths - 1 - t` over the
    valid steps (the padded ones in place), stacked on a new axis after the
    slots' axes."""
    forward = jnp.broadcast_to(t, jnp.broadcast_shapes(t.shape, lengths.shape))
    backward = jnp.where(t < lengths, lengths - 1 - t, t)
    return per_direction(directions, -1, forward, backward)


def _stacked_weights(inners, dtype):
    """The directions' `(kernel, recurrent_kernel, bias)` on a leading axis."""
    weights = [_weights(inner, dtype) for inner in inners]
    kernel = jnp.stack([w[0] for w in weights])
    recurrent = jnp.stack([w[1] for w in weights])
    # Each bias row on its own leading axis (no transpose to compile): a
    # GRU's (2, gates) bias as (2, directions, 1, gates), by a reshape for
    # one direction (a stack of two rows would be a concatenate to compile).
    bias = jnp.stack([w[2] for w in weights], axis=-2)
    return kernel, recurrent, jnp.expand_dims(bias, -2)
