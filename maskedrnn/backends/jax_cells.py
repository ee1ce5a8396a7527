"""The cells of the JAX length tiers (`jax_tiers`): one step forward, its
VJP, and the gradients of the inputs and weights over all steps at once.

`kind` is `("lstm",)`, `("gru", reset_after)` or `("rnn",)`; `params` are
the directions' `(kernel, recurrent_kernel, bias)` stacked on a leading
axis, in Keras' gate order. Arrays carry the directions first.
"""

import functools

import jax
import jax.numpy as jnp


def _t(matrix):
    """The transpose of each matrix of a stack."""
    return jnp.swapaxes(matrix, -1, -2)


def step(kind, params, x_t, states):
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


def saved_shapes(kind, rows, units):
    """The shapes of the arrays `step` saves for `rows` `(directions,
    batch)`, in the structure it returns them: one shape (an LSTM's
    pre-activations), two (a GRU's input and recurrent pre-activations)
    or none (`()`, a SimpleRNN)."""
    if kind[0] == "lstm":
        return rows + (4 * units,)
    if kind[0] == "rnn":
        return ()
    return (rows + (3 * units,), rows + (3 * units,))


def step_back(kind, params, d_states, saved, prev, new):
    """The VJP of one step: `(d_prev_states, d_pre)` from the gradients
    `d_states` of its new states, its `saved` pre-activations and its
    `prev` and `new` states; `d_pre` is what `step_grads` reads."""
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
        parts = [
            dc * g * i * (1 - i),
            dc * c_prev * f * (1 - f),
            dc * i * (1 - g * g),
            dh * tc * o * (1 - o),
        ]
        # Concatenated as rows of a matrix: XLA's CPU backend compiles a
        # concatenate of (2, 8, 64) blocks several times slower than one of
        # (16, 64) blocks.
        flat = [jnp.reshape(p, (-1, p.shape[-1])) for p in parts]
        dz = jnp.reshape(jnp.concatenate(flat, axis=-1), dh.shape[:-1] + (-1,))
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
    # One concatenate a step (XLA compiles each slowly at small sizes): the
    # recurrent kernel's gradient terms read slices or scalings of it.
    if kind[1]:
        dr = da * rec_h * r * (1 - r)
        d_pre = jnp.concatenate([dz, dr, da], axis=-1)
        # The candidate's recurrent term is r * (h @ R_h): its block scaled by r.
        widths = [(0, 0)] * (r.ndim - 1) + [(2 * units, 0)]
        d_rec = d_pre * jnp.pad(r, widths, constant_values=1)
        return (d_prev + d_rec @ _t(recurrent),), d_pre
    ds = da @ _t(recurrent[..., 2 * units :])
    dr = ds * h_prev * r * (1 - r)
    d_pre = jnp.concatenate([dz, dr, da], axis=-1)
    d_zr = d_pre[..., : 2 * units]
    d_prev = d_prev + ds * r + d_zr @ _t(recurrent[..., : 2 * units])
    return (d_prev,), d_pre


def step_grads(kind, params, x_dt, d_pre, h_prev, saved):
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
