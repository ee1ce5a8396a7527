"""The JAX backend's length tiers: only the valid steps of a masked batch run.

The `"jax-tiers"` kernel for Keras' `LSTM`, `GRU` and `SimpleRNN`: rows
sorted by length run in phases of static row groups that leave once their
longest row ends, with a gradient of its own (`jax.custom_vjp`) walking
the same phases back (docs/design.md, "Kernels, one per backend"). Steps
compute in the layer's compute dtype; weight gradients sum in float32.
"""

import functools

import jax
import jax.numpy as jnp
import keras
from jax import lax

from maskedrnn.backends.gather import gather_time

KERNEL = "jax-tiers"
# Row groups per direction. Each is one more loop, forward and backward,
# for XLA to compile on every first call; fewer skip fewer padded steps on
# every later call.
TIERS = 4
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
        f"length, each of {TIERS} row groups leaving the recurrence once its "
        "longest row has ended (padded steps skipped, no host sync), exact "
        "final states carried to each row's last valid step, its own "
        "gradient (jax.custom_vjp); the directions of a call stacked in one "
        "recurrence"
    )


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


def run(inner, x, lengths, initial_state, tiers=TIERS):
    """Runs the Keras RNN `inner` over valid-first `x` in length tiers.

    Args:
        inner: A built Keras `LSTM`, `GRU` or `SimpleRNN`.
        x: Float `(batch, time, features)`, valid-first, finite at padded
            steps.
        lengths: Int `(batch,)`, each row's valid steps, in `[0, time]`.
        initial_state: List of `(batch, units)` states (`[h, c]` for an
            LSTM, `[h]` otherwise).
        tiers: Static number of row groups (at most `batch`).

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
    (y,), (states,) = run_directions([inner], [x], lengths, [initial_state], tiers)
    return y, states


def run_one_call(inners, x, steps, initial_states, want_states, tiers=TIERS):
    """Every direction of a call in one tiered recurrence, weights stacked."""
    xs = [x]
    if len(inners) == 2:
        xs.append(gather_time(x, steps.reverse))
    batch = x.shape[0]
    initial = [
        s
        if s is not None
        else [
            jnp.zeros((batch, inner.cell.units), _dtype(inner))
            for _ in range(2 if type(inner) is keras.layers.LSTM else 1)
        ]
        for s, inner in zip(initial_states, inners)
    ]
    ys, states = run_directions(inners, xs, steps.lengths, initial, tiers)
    if len(inners) == 2:
        ys[1] = gather_time(ys[1], steps.reverse)
    y = ys[0] if len(ys) == 1 else jnp.concatenate(ys, axis=-1)
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


def run_directions(inners, xs, lengths, initial_states, tiers=TIERS):
    """`run` for several directions at once, one entry per direction."""
    dtype = _dtype(inners[0])
    x_all = jnp.stack([jnp.asarray(x).astype(dtype) for x in xs])
    batch, time = x_all.shape[1], x_all.shape[2]
    states = [[jnp.asarray(s).astype(dtype) for s in i] for i in initial_states]
    if batch == 0 or time == 0:
        units = inners[0].cell.units
        return [jnp.zeros((batch, time, units), dtype) for _ in inners], states
    lengths = jnp.clip(jnp.asarray(lengths).astype(jnp.int32), 0, time)
    # Longest first (stable), and the inverse permutation to put rows back.
    order = jnp.argsort(-lengths, stable=True)
    inverse = (
        jnp.zeros_like(order)
        .at[order]
        .set(jnp.arange(batch, dtype=order.dtype), unique_indices=True)
    )
    # (time, directions, batch, features), rows sorted.
    x_tm = jnp.transpose(_take(x_all, order, 1), (2, 0, 1, 3))
    sorted_states = tuple(
        jnp.stack([_take(s[k], order, 0) for s in states])
        for k in range(len(states[0]))
    )
    kind = _kind(inners[0])
    params = _stacked_weights(inners, kind, dtype)
    ys, finals = _tiers(
        kind, min(tiers, batch), x_tm, _take(lengths, order, 0), sorted_states, params
    )
    outputs = [
        _take(jnp.swapaxes(ys[:, d], 0, 1), inverse, 0) for d in range(len(inners))
    ]
    finals = [[_take(s[d], inverse, 0) for s in finals] for d in range(len(inners))]
    return outputs, finals


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


def _groups(batch, tiers):
    """Static row counts of the phases, decreasing from `batch`, then 0."""
    return [batch - (k * batch) // tiers for k in range(tiers)] + [0]


def _bounds(lengths, rows):
    """Each phase's `(start, stop)`: the longest length of the rows leaving."""
    stops = [
        lengths[rows[k + 1]] if rows[k + 1] > 0 else lengths[0]
        for k in range(len(rows) - 1)
    ]
    starts = [jnp.int32(0)] + stops[:-1]
    return list(zip(starts, stops))


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


def _step_grads(kind, params, x_tm, d_pre, h_prev, saved):
    """`(dx, d_kernel, d_recurrent, d_bias)` of steps from their `d_pre`."""
    kernel, recurrent, bias = params
    # At least float32 (float64 stays float64).
    acc = jnp.promote_types(x_tm.dtype, jnp.float32)
    f32 = functools.partial(jnp.einsum, preferred_element_type=acc)
    dx = f32("tebg,edg->tebd", d_pre, kernel).astype(x_tm.dtype)
    d_kernel = f32("tebd,tebg->edg", x_tm, d_pre)
    d_in_bias = jnp.sum(d_pre, axis=(0, 2), dtype=acc)[:, None]
    if kind[0] != "gru":
        d_rec = f32("tebu,tebg->eug", h_prev, d_pre)
        return dx, d_kernel, d_rec, d_in_bias
    xz, hz = saved
    units = h_prev.shape[-1]
    r = jax.nn.sigmoid(xz[..., units : 2 * units] + hz[..., units : 2 * units])
    d_zr, da = d_pre[..., : 2 * units], d_pre[..., 2 * units :]
    if kind[1]:
        d_hz = jnp.concatenate([d_zr, da * r], axis=-1)
        d_rec = f32("tebu,tebg->eug", h_prev, d_hz)
        d_bias = jnp.stack([d_in_bias, jnp.sum(d_hz, axis=(0, 2), dtype=acc)[:, None]])
        return dx, d_kernel, d_rec, d_bias
    d_rec = jnp.concatenate(
        [f32("tebu,tebg->eug", h_prev, d_zr), f32("tebu,tebg->eug", r * h_prev, da)],
        axis=-1,
    )
    return dx, d_kernel, d_rec, d_in_bias


# ---- the phases, forward and back, with their VJP.


def _forward(kind, tiers, x_tm, lengths, states, params, save):
    """Runs the phases; `(outputs, final_states, buffers)`, filled with `save`."""
    time, batch = x_tm.shape[0], x_tm.shape[2]
    rows = _groups(batch, tiers)
    dtype = x_tm.dtype

    def zeros_like_step(n):
        # Shapes of one step's outputs on n rows, for the buffers.
        return jax.eval_shape(
            lambda s: _step(kind, params, x_tm[0, :, :n], s),
            tuple(s[:, :n] for s in states),
        )

    state_shapes, saved_shapes = zeros_like_step(batch)
    buf_states = tuple(jnp.zeros((time,) + s.shape, dtype) for s in state_shapes)
    if not save:
        buf_states = buf_states[:1]
    buf_saved = jax.tree.map(
        lambda s: jnp.zeros((time,) + s.shape, dtype), saved_shapes
    )
    if not save:
        buf_saved = ()
    carry = states
    for k, (start, stop) in enumerate(_bounds(lengths, rows)):
        n = rows[k]
        live = lengths[:n, None]

        def body(t, loop, n=n, live=live):
            state, bufs, saved_bufs = loop
            new, saved = _step(kind, params, x_tm[t, :, :n], state)
            keep = t < live
            new = tuple(jnp.where(keep, a, b) for a, b in zip(new, state))
            bufs = tuple(
                lax.dynamic_update_index_in_dim(b, s, t, 0) for b, s in zip(bufs, new)
            )
            if save:
                saved_bufs = jax.tree.map(
                    lambda b, s: lax.dynamic_update_index_in_dim(b, s, t, 0),
                    saved_bufs,
                    saved,
                )
            return new, bufs, saved_bufs

        part = tuple(s[:, :n] for s in carry)
        part, buf_states, buf_saved = lax.fori_loop(
            start, stop, body, (part, buf_states, buf_saved)
        )
        carry = tuple(
            jnp.concatenate([p, s[:, n:]], axis=1) for p, s in zip(part, carry)
        )
    return buf_states[0], carry, (buf_states, buf_saved)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _tiers(kind, tiers, x_tm, lengths, states, params):
    """The tiered recurrence over sorted, time-major `x_tm`:
    `(outputs (time, batch, units), final states)`."""
    ys, finals, _ = _forward(kind, tiers, x_tm, lengths, states, params, save=False)
    return ys, finals


def _tiers_fwd(kind, tiers, x_tm, lengths, states, params):
    ys, finals, buffers = _forward(
        kind, tiers, x_tm, lengths, states, params, save=True
    )
    return (ys, finals), (x_tm, lengths, states, params, buffers)


def _tiers_bwd(kind, tiers, residuals, cotangents):
    x_tm, lengths, states, params, (buf_states, buf_saved) = residuals
    d_ys, d_finals = cotangents
    batch = x_tm.shape[2]
    rows = _groups(batch, tiers)
    dtype = x_tm.dtype
    d_pre_shape = jax.eval_shape(
        lambda: _step_back(
            kind,
            params,
            states,
            jax.tree.map(lambda b: b[0], buf_saved),
            states,
            states,
        )[1]
    )
    carry = tuple(jnp.asarray(d, dtype) for d in d_finals)
    bounds = _bounds(lengths, rows)

    def state_at(t, n):
        # The states after step t - 1 (the initial ones before step 0).
        prev = tuple(
            lax.dynamic_index_in_dim(b, jnp.maximum(t - 1, 0), 0, keepdims=False)[:, :n]
            for b in buf_states
        )
        return tuple(jnp.where(t > 0, p, s[:, :n]) for p, s in zip(prev, states))

    # The gradients of the inputs (a buffer) and of the weights (sums).
    shapes = jax.eval_shape(
        lambda: _step_grads(
            kind,
            params,
            x_tm[:1],
            jnp.zeros((1,) + d_pre_shape.shape, dtype),
            states[0][None],
            jax.tree.map(lambda b: b[:1], buf_saved),
        )
    )
    grads = (jnp.zeros_like(x_tm),) + tuple(
        jnp.zeros(a.shape, a.dtype) for a in shapes[1:]
    )
    for k in reversed(range(len(bounds))):
        start, stop = bounds[k]
        n = rows[k]
        live = lengths[:n, None]

        def body(i, loop, n=n, live=live, stop=stop):
            d_state, grads = loop
            t = stop - 1 - i
            keep = t < live
            dy = lax.dynamic_index_in_dim(d_ys, t, 0, keepdims=False)[:, :n]
            d_in = (d_state[0] + jnp.where(keep, dy, 0),) + d_state[1:]
            saved = jax.tree.map(
                lambda b: lax.dynamic_index_in_dim(b, t, 0, keepdims=False)[:, :n],
                buf_saved,
            )
            new = tuple(
                lax.dynamic_index_in_dim(b, t, 0, keepdims=False)[:, :n]
                for b in buf_states
            )
            prev = state_at(t, n)
            d_prev, d_pre = _step_back(kind, params, d_in, saved, prev, new)
            d_state = tuple(jnp.where(keep, a, b) for a, b in zip(d_prev, d_state))
            d_pre = jnp.where(keep, d_pre, 0)
            x_t = lax.dynamic_index_in_dim(x_tm, t, 0, keepdims=True)[:, :, :n]
            dx, *dw = _step_grads(
                kind,
                params,
                x_t,
                d_pre[None],
                prev[0][None],
                jax.tree.map(lambda a: a[None], saved),
            )
            dx_buf = lax.dynamic_update_slice_in_dim(grads[0], dx, t, 0)
            return d_state, (dx_buf,) + tuple(a + b for a, b in zip(grads[1:], dw))

        part = tuple(d[:, :n] for d in carry)
        part, grads = lax.fori_loop(0, stop - start, body, (part, grads))
        carry = tuple(
            jnp.concatenate([p, d[:, n:]], axis=1) for p, d in zip(part, carry)
        )
    dx, d_kernel, d_rec, d_bias = grads
    d_params = tuple(
        d.astype(p.dtype) for d, p in zip((d_kernel, d_rec, d_bias), params)
    )
    return dx, None, carry, d_params


_tiers.defvjp(_tiers_fwd, _tiers_bwd)
