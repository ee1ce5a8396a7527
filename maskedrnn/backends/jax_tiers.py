"""The JAX backend's length tiers: only the valid steps of a masked batch run.

The `"jax-tiers"` kernel for Keras' `LSTM`, `GRU` and `SimpleRNN`: rows
sorted by length run in static groups of equal size, each group only up to
its own longest row, with a gradient of its own (`jax.custom_vjp`) walking
the same steps back (docs/design.md, "Kernels, one per backend"). Steps
compute in the layer's compute dtype; weight gradients sum in float32.

One loop over the groups holds one loop over a group's steps, forward and
backward: every group runs the same compiled step, so XLA compiles one
recurrence whatever the number of groups (a loop per group, or per phase of
a shrinking batch, would each be compiled anew).
"""

import functools

import jax
import jax.numpy as jnp
import keras
from jax import lax

KERNEL = "jax-tiers"
# Row groups on a CPU: more skip more padded steps, but run more, smaller
# steps one after another. The compiled program is the same for any number.
GROUPS = 4
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
        f"{name} in length tiers over valid-first data: rows sorted by "
        f"length, in {default_groups()} row group(s) that each run to their "
        "own longest row (padded steps skipped, no host sync), exact final "
        "states carried to each row's last valid step, its own gradient "
        "(jax.custom_vjp); the directions of a call stacked in one recurrence"
    )


def default_groups():
    """`GROUPS` on a CPU; 1 elsewhere, where a step's time hardly depends on
    its rows and more groups would only run more steps one after another."""
    return GROUPS if jax.default_backend() == "cpu" else 1


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
        groups: Static number of row groups (`default_groups()` if None;
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
    dtype = _dtype(inners[0])
    x = jnp.asarray(x).astype(dtype)
    batch, time = x.shape[0], x.shape[1]
    directions = len(inners)
    units = inners[0].cell.units
    count = 2 if type(inners[0]) is keras.layers.LSTM else 1
    states = [
        [jnp.asarray(s).astype(dtype) for s in i] if i is not None else None
        for i in initial_states
    ]
    if batch == 0 or time == 0:
        zeros = [jnp.zeros((batch, units), dtype)] * count
        return jnp.zeros((batch, time, units * directions), dtype), [
            s if s is not None else zeros for s in states
        ]
    lengths = jnp.clip(jnp.asarray(lengths).astype(jnp.int32), 0, time)
    # Longest first (stable), and the inverse permutation to put rows back.
    order = jnp.argsort(-lengths, stable=True).astype(jnp.int32)
    inverse = (
        jnp.zeros_like(order)
        .at[order]
        .set(jnp.arange(batch, dtype=order.dtype), unique_indices=True)
    )
    # Equal groups: rows of length 0 pad the batch to a multiple of the size.
    groups = min(default_groups() if groups is None else groups, batch)
    size = -(-batch // groups)
    groups = -(-batch // size)
    pad = groups * size - batch
    sorted_lengths = jnp.pad(_take(lengths, order, 0), (0, pad))
    # One gather makes the kernel's (directions, time, batch, features)
    # input: rows sorted (the padding rows read row 0 and never use it),
    # each row's steps along the second axis, a backward direction's reversed
    # by length.
    t = jnp.arange(time, dtype=jnp.int32)[:, None]
    read = _read_steps(t, sorted_lengths[None], directions)
    read = jnp.transpose(read, (2, 0, 1))
    rows = jnp.pad(order, (0, pad))[None, None] * time
    flat = jnp.reshape(x, (batch * time,) + x.shape[2:])
    x_dt = _take(flat, read + rows, 0)
    sorted_states = _sorted_states(states, order, pad, (units, count, dtype))
    kind = _kind(inners[0])
    params = _stacked_weights(inners, kind, dtype)
    ys, finals = _tiers(kind, groups, x_dt, sorted_lengths, sorted_states, params)
    # One gather back: (batch, time, directions) slots of the kernel's
    # (directions, time, batch) outputs, rows in the caller's order.
    tb = jnp.arange(time, dtype=jnp.int32)[None]
    back = _read_steps(tb, lengths[:, None], directions)
    d = jnp.arange(directions, dtype=jnp.int32)
    index = (d * time + back) * (batch + pad) + inverse[:, None, None]
    ys_flat = jnp.reshape(ys, (-1, units))
    y = jnp.reshape(_take(ys_flat, index, 0), (batch, time, directions * units))
    finals = [
        [_take(s[e], inverse, 0) for s in finals] for e in range(directions)
    ]
    return y, finals


def _sorted_states(states, order, pad, spec):
    """The initial states as the kernel reads them: one `(directions,
    batch + pad, units)` array per state, rows in `order`. All zeros are
    made in place, with no gather to compile."""
    units, count, dtype = spec
    rows = order.shape[0] + pad
    if all(s is None for s in states):
        return tuple(
            jnp.zeros((len(states), rows, units), dtype) for _ in range(count)
        )
    zeros = [jnp.zeros((order.shape[0], units), dtype)] * count
    states = [s if s is not None else zeros for s in states]
    return tuple(
        jnp.pad(
            jnp.stack([_take(s[k], order, 0) for s in states]),
            ((0, 0), (0, pad), (0, 0)),
        )
        for k in range(count)
    )


def _read_steps(t, lengths, directions):
    """The step each direction reads at slot `t` (broadcast with
    `lengths`): `t`, and for a second direction `lengths - 1 - t` over the
    valid steps (the padded ones in place), stacked on a new axis after the
    slots' axes."""
    reads = [jnp.broadcast_to(t, jnp.broadcast_shapes(t.shape, lengths.shape))]
    if directions == 2:
        reads.append(jnp.where(t < lengths, lengths - 1 - t, t))
    return jnp.stack(reads, axis=-1)


def _take(x, index, axis):
    """`jnp.take` of in-range indices, with no out-of-range fill for XLA to
    compile (`mode="clip"`)."""
    return jnp.take(x, index, axis=axis, mode="clip")


def _stacked_weights(inners, kind, dtype):
    """The directions' `(kernel, recurrent_kernel, bias)` on a leading axis."""
    weights = [_weights(inner, dtype) for inner in inners]
    kernel = jnp.stack([w[0] for w in weights])
    recurrent = jnp.stack([w[1] for w in weights])
    bias = jnp.stack([w[2] for w in weights])
    if kind == ("gru", True):
        bias = jnp.transpose(bias, (1, 0, 2))[:, :, None]
    else:
        bias = bias[:, None]
    return kernel, recurrent, bias


def _t(matrix):
    """The transpose of each matrix of a stack."""
    return jnp.swapaxes(matrix, -1, -2)


# ---- the cells: one step forward, one step back, the all-steps gradients.


def _step(kind, params, x_t, states):
    """One step of the cell on `(n, ...)` rows: `(new_states, saved)`, with
    `saved` the pre-activations the backward step needs."""
    kernel, recurrent, bias = params
    if kind[0] == "lstm":
        h, c = states
        z = x_t @ kernel + h @ recurrent + bias
        i, f, g, o = jnp.split(z, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return (jax.nn.sigmoid(o) * jnp.tanh(c), c), z
    if kind[0] == "rnn":
        (h,) = states
        z = x_t @ kernel + bias + h @ recurrent
        return (jnp.tanh(z),), ()
    (h,) = states
    units = h.shape[-1]
    if kind[1]:
        xz = x_t @ kernel + bias[0]
        hz = h @ recurrent + bias[1]
        z = jax.nn.sigmoid(xz[..., :units] + hz[..., :units])
        r = jax.nn.sigmoid(xz[..., units : 2 * units] + hz[..., units : 2 * units])
        hh = jnp.tanh(xz[..., 2 * units :] + r * hz[..., 2 * units :])
    else:
        xz = x_t @ kernel + bias
        hz = h @ recurrent[..., : 2 * units]
        z = jax.nn.sigmoid(xz[..., :units] + hz[..., :units])
        r = jax.nn.sigmoid(xz[..., units : 2 * units] + hz[..., units:])
        q = (r * h) @ recurrent[..., 2 * units :]
        hh = jnp.tanh(xz[..., 2 * units :] + q)
        hz = jnp.concatenate([hz, q], axis=-1)
    return (z * h + (1 - z) * hh,), (xz, hz)


def _step_back(kind, params, d_states, saved, prev, new):
    """The VJP of one step: `(d_prev_states, d_pre)` from the gradients
    `d_states` of its new states, its `saved` pre-activations and its
    `prev` and `new` states; `d_pre` is what `_step_grads` reads."""
    kernel, recurrent, bias = params
    if kind[0] == "lstm":
        dh, dc = d_states
        c_prev = prev[1]
        c = new[1]
        i, f, g, o = jnp.split(saved, 4, axis=-1)
        i, f, g, o = (
            jax.nn.sigmoid(i),
            jax.nn.sigmoid(f),
            jnp.tanh(g),
            jax.nn.sigmoid(o),
        )
        tc = jnp.tanh(c)
        dc = dc + dh * o * (1 - tc * tc)
        dz = jnp.concatenate(
            [
                dc * g * i * (1 - i),
                dc * c_prev * f * (1 - f),
                dc * i * (1 - g * g),
                dh * tc * o * (1 - o),
            ],
            axis=-1,
        )
        return (dz @ _t(recurrent), dc * f), dz
    if kind[0] == "rnn":
        (dh,) = d_states
        h = new[0]
        dz = dh * (1 - h * h)
        return (dz @ _t(recurrent),), dz
    (dh,) = d_states
    h_prev = prev[0]
    xz, hz = saved
    units = h_prev.shape[-1]
    z = jax.nn.sigmoid(xz[..., :units] + hz[..., :units])
    r = jax.nn.sigmoid(xz[..., units : 2 * units] + hz[..., units : 2 * units])
    rec_h = hz[..., 2 * units :]
    pre_h = xz[..., 2 * units :] + (r * rec_h if kind[1] else rec_h)
    hh = jnp.tanh(pre_h)
    da = dh * (1 - z) * (1 - hh * hh)
    dz = dh * (h_prev - hh) * z * (1 - z)
    d_prev = dh * z
    if kind[1]:
        dr = da * rec_h * r * (1 - r)
        d_prev = d_prev + jnp.concatenate([dz, dr, da * r], axis=-1) @ _t(recurrent)
    else:
        ds = da @ _t(recurrent[..., 2 * units :])
        dr = ds * h_prev * r * (1 - r)
        d_zr = jnp.concatenate([dz, dr], axis=-1)
        d_prev = d_prev + ds * r + d_zr @ _t(recurrent[..., : 2 * units])
    return (d_prev,), jnp.concatenate([dz, dr, da], axis=-1)


def _step_grads(kind, params, x_dt, d_pre, h_prev, saved):
    """`(dx, d_kernel, d_recurrent, d_bias)` of all steps from their
    `d_pre`; `h_prev` holds the states before each step."""
    kernel, recurrent, bias = params
    # At least float32 (float64 stays float64).
    acc = jnp.promote_types(x_dt.dtype, jnp.float32)
    f32 = functools.partial(jnp.einsum, preferred_element_type=acc)
    # Directions lead, then (time, batch): no transpose of the step axes.
    dx = f32("etbg,edg->etbd", d_pre, kernel).astype(x_dt.dtype)
    d_kernel = f32("etbd,etbg->edg", x_dt, d_pre)
    d_in_bias = jnp.sum(d_pre, axis=(1, 2), dtype=acc)[:, None]
    if kind[0] != "gru":
        d_rec = f32("etbu,etbg->eug", h_prev, d_pre)
        return dx, d_kernel, d_rec, d_in_bias
    xz, hz = saved
    units = h_prev.shape[-1]
    r = jax.nn.sigmoid(xz[..., units : 2 * units] + hz[..., units : 2 * units])
    d_zr, da = d_pre[..., : 2 * units], d_pre[..., 2 * units :]
    if kind[1]:
        d_hz = jnp.concatenate([d_zr, da * r], axis=-1)
        d_rec = f32("etbu,etbg->eug", h_prev, d_hz)
        d_bias = jnp.stack([d_in_bias, jnp.sum(d_hz, axis=(1, 2), dtype=acc)[:, None]])
        return dx, d_kernel, d_rec, d_bias
    d_rec = jnp.concatenate(
        [f32("etbu,etbg->eug", h_prev, d_zr), f32("etbu,etbg->eug", r * h_prev, da)],
        axis=-1,
    )
    return dx, d_kernel, d_rec, d_in_bias


# ---- the groups, forward and back, with their VJP.
#
# `x_dt` is `(directions, time, batch, features)` with the rows sorted
# longest first and `batch` a multiple of `groups`: group `j` is the rows
# `j * size` to `(j + 1) * size`, and its first row is its longest.


def _rows(x, first, size):
    """Rows `first` to `first + size` of `(directions, batch, ...)` `x`."""
    return lax.dynamic_slice_in_dim(x, first, size, axis=1)


def _starts(buffer, t, first):
    """The start indices of step `t`, row `first` in a `(directions, time,
    batch, ...)` buffer, in one index dtype (under jax_enable_x64 the
    literals would be int64)."""
    start = (0, t, first) + (0,) * (buffer.ndim - 3)
    return tuple(lax.convert_element_type(i, jnp.int32) for i in start)


def _at(buffer, t, first, size):
    """`buffer[:, t, first:first + size]` of a `(directions, time, batch,
    ...)` buffer."""
    sizes = (buffer.shape[0], 1, size) + buffer.shape[3:]
    return lax.dynamic_slice(buffer, _starts(buffer, t, first), sizes)[:, 0]


def _put(buffer, value, t, first):
    """`buffer` with `value` written at step `t`, rows from `first`."""
    return lax.dynamic_update_slice(
        buffer, value[:, None], _starts(buffer, t, first)
    )


def _buffer(shape, time, dtype):
    """Zeros for every step of a `(directions, batch, ...)` value."""
    return jnp.zeros(shape[:1] + (time,) + shape[1:], dtype)


def _forward(kind, groups, x_dt, lengths, states, params, save):
    """Runs every group: `(outputs, final_states, buffers)`, the buffers
    filled with `save` (the states and pre-activations of every step)."""
    time, batch = x_dt.shape[1], x_dt.shape[2]
    size = batch // groups
    dtype = x_dt.dtype
    state_shapes, saved_shapes = jax.eval_shape(
        lambda s: _step(kind, params, x_dt[:, 0], s), states
    )
    buf_states = tuple(_buffer(s.shape, time, dtype) for s in state_shapes)
    if not save:
        buf_states = buf_states[:1]
    buf_saved = jax.tree.map(lambda s: _buffer(s.shape, time, dtype), saved_shapes)
    if not save:
        buf_saved = ()

    def group(j, loop):
        finals, buf_states, buf_saved = loop
        first = j * size
        live = lax.dynamic_slice_in_dim(lengths, first, size)[:, None]

        def step(t, loop):
            state, buf_states, buf_saved = loop
            new, saved = _step(kind, params, _at(x_dt, t, first, size), state)
            keep = t < live
            new = tuple(jnp.where(keep, a, b) for a, b in zip(new, state))
            buf_states = tuple(
                _put(b, s, t, first) for b, s in zip(buf_states, new)
            )
            if save:
                buf_saved = jax.tree.map(
                    lambda b, s: _put(b, s, t, first), buf_saved, saved
                )
            return new, buf_states, buf_saved

        initial = tuple(_rows(s, first, size) for s in states)
        state, buf_states, buf_saved = lax.fori_loop(
            0, lengths[first], step, (initial, buf_states, buf_saved)
        )
        finals = tuple(
            lax.dynamic_update_slice_in_dim(f, s, first, axis=1)
            for f, s in zip(finals, state)
        )
        return finals, buf_states, buf_saved

    finals, buf_states, buf_saved = lax.fori_loop(
        0, groups, group, (states, buf_states, buf_saved)
    )
    return buf_states[0], finals, (buf_states, buf_saved)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _tiers(kind, groups, x_dt, lengths, states, params):
    """The grouped recurrence over sorted `(directions, time, batch,
    features)` `x_dt`: `(outputs (directions, time, batch, units), final
    states)`."""
    ys, finals, _ = _forward(kind, groups, x_dt, lengths, states, params, save=False)
    return ys, finals


def _tiers_fwd(kind, groups, x_dt, lengths, states, params):
    ys, finals, buffers = _forward(
        kind, groups, x_dt, lengths, states, params, save=True
    )
    return (ys, finals), (x_dt, lengths, states, params, buffers)


def _tiers_bwd(kind, groups, residuals, cotangents):
    x_dt, lengths, states, params, (buf_states, buf_saved) = residuals
    d_ys, d_finals = cotangents
    time, batch = x_dt.shape[1], x_dt.shape[2]
    size = batch // groups
    dtype = x_dt.dtype
    saved0 = jax.tree.map(lambda b: b[:, 0], buf_saved)
    d_pre_shape = jax.eval_shape(
        lambda: _step_back(kind, params, states, saved0, states, states)[1]
    )
    # Every step's pre-activation gradients (zeros at the steps skipped).
    d_pre = _buffer(d_pre_shape.shape, time, dtype)
    d_finals = tuple(jnp.asarray(d, dtype) for d in d_finals)

    def group(j, loop):
        d_initial, d_pre = loop
        first = j * size
        live = lax.dynamic_slice_in_dim(lengths, first, size)[:, None]
        steps = lengths[first]
        initial = tuple(_rows(s, first, size) for s in states)

        def step(i, loop):
            d_state, d_pre = loop
            t = steps - 1 - i
            keep = t < live
            dy = _at(d_ys, t, first, size)
            d_in = (d_state[0] + jnp.where(keep, dy, 0),) + d_state[1:]
            saved = jax.tree.map(lambda b: _at(b, t, first, size), buf_saved)
            new = tuple(_at(b, t, first, size) for b in buf_states)
            prev = _state_before(buf_states, initial, t, first, size)
            d_prev, d_step = _step_back(kind, params, d_in, saved, prev, new)
            d_state = tuple(jnp.where(keep, a, b) for a, b in zip(d_prev, d_state))
            return d_state, _put(d_pre, jnp.where(keep, d_step, 0), t, first)

        d_last = tuple(_rows(d, first, size) for d in d_finals)
        d_state, d_pre = lax.fori_loop(0, steps, step, (d_last, d_pre))
        d_initial = tuple(
            lax.dynamic_update_slice_in_dim(d, s, first, axis=1)
            for d, s in zip(d_initial, d_state)
        )
        return d_initial, d_pre

    d_initial, d_pre = lax.fori_loop(0, groups, group, (d_finals, d_pre))
    # The inputs' and the weights' gradients, every step at once.
    h_prev = jnp.concatenate([states[0][:, None], buf_states[0][:, :-1]], axis=1)
    dx, d_kernel, d_rec, d_bias = _step_grads(
        kind, params, x_dt, d_pre, h_prev, buf_saved
    )
    d_params = tuple(
        d.astype(p.dtype) for d, p in zip((d_kernel, d_rec, d_bias), params)
    )
    return dx, None, d_initial, d_params


def _state_before(buf_states, initial, t, first, size):
    """The states after step `t - 1` of a group (its initial ones at 0)."""
    before = tuple(_at(b, jnp.maximum(t - 1, 0), first, size) for b in buf_states)
    return tuple(jnp.where(t > 0, b, s) for b, s in zip(before, initial))


_tiers.defvjp(_tiers_fwd, _tiers_bwd)
