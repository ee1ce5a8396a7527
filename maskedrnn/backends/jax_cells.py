"""The cells of the JAX length tiers (`jax_tiers`): one step forward, its
VJP, and the gradients of the inputs and weights over all steps at once.

`kind` is `("lstm",)`, `("gru", reset_after)` or `("rnn",)`; `params` are
the directions' `(kernel, recurrent_kernel, bias)` stacked on a leading
axis, in Keras' gate order. Arrays carry the directions first.

Products and activations are `jax.lax` calls: each `jax.numpy` function is
a jit of its own that a first call traces anew (see `jax_rows`).
"""

import jax.numpy as jnp
import numpy as np
from jax import lax

_sigmoid = lax.logistic
_tanh = lax.tanh


def _matmul(a, b):
    """`a @ b` for each direction: `a` `(directions, ..., k)`, `b`
    `(directions, k, n)`."""
    dims = (((a.ndim - 1,), (1,)), ((0,), (0,)))
    return lax.dot_general(a, b, dims)


def _matmul_t(a, b):
    """`a @ b.T` for each direction: `a` `(directions, ..., n)`, `b`
    `(directions, k, n)`."""
    dims = (((a.ndim - 1,), (2,)), ((0,), (0,)))
    return lax.dot_general(a, b, dims)


def _lstm_gates(z):
    """The activated gates `(i, f, g, o)` of an LSTM's pre-activations `z`
    `(..., 4 * units)`: sigmoid, sigmoid, tanh, sigmoid, in one tanh over
    all four (`sigmoid(x) = tanh(x / 2) / 2 + 1 / 2`), which XLA compiles
    as one kernel where an activation per gate would be three."""
    units = z.shape[-1] // 4
    # 1/2 for a sigmoid gate, 1 for the tanh one: `a * tanh(a * x) + 1 - a`.
    half = np.repeat(np.array([0.5, 0.5, 1.0, 0.5], z.dtype), units)
    return jnp.split(_tanh(z * half) * half + (1 - half), 4, axis=-1)


def step(kind, params, x_t, states):
    """One step of the cell on `(n, ...)` rows: `(new_states, saved)`, with
    `saved` the pre-activations the backward step needs."""
    kernel, recurrent, bias = params
    if kind[0] == "lstm":
        h, c = states
        z = _matmul(x_t, kernel) + _matmul(h, recurrent) + bias
        i, f, g, o = _lstm_gates(z)
        c = f * c + i * g
        return (o * _tanh(c), c), z
    if kind[0] == "rnn":
        (h,) = states
        z = _matmul(x_t, kernel) + bias + _matmul(h, recurrent)
        return (_tanh(z),), ()
    (h,) = states
    units = h.shape[-1]
    if kind[1]:
        xz = _matmul(x_t, kernel) + bias[0]
        hz = _matmul(h, recurrent) + bias[1]
        z = _sigmoid(xz[..., :units] + hz[..., :units])
        r = _sigmoid(xz[..., units : 2 * units] + hz[..., units : 2 * units])
        hh = _tanh(xz[..., 2 * units :] + r * hz[..., 2 * units :])
    else:
        xz = _matmul(x_t, kernel) + bias
        hz = _matmul(h, recurrent[..., : 2 * units])
        z = _sigmoid(xz[..., :units] + hz[..., :units])
        r = _sigmoid(xz[..., units : 2 * units] + hz[..., units:])
        q = _matmul(r * h, recurrent[..., 2 * units :])
        hh = _tanh(xz[..., 2 * units :] + q)
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
        i, f, g, o = _lstm_gates(saved)
        tc = _tanh(c)
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
        return (_matmul_t(dz, recurrent), dc * f), dz
    if kind[0] == "rnn":
        (dh,) = d_states
        h = new[0]
        dz = dh * (1 - h * h)
        return (_matmul_t(dz, recurrent),), dz
    (dh,) = d_states
    h_prev = prev[0]
    xz, hz = saved
    units = h_prev.shape[-1]
    z = _sigmoid(xz[..., :units] + hz[..., :units])
    r = _sigmoid(xz[..., units : 2 * units] + hz[..., units : 2 * units])
    rec_h = hz[..., 2 * units :]
    pre_h = xz[..., 2 * units :] + (r * rec_h if kind[1] else rec_h)
    hh = _tanh(pre_h)
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
        return (d_prev + _matmul_t(d_rec, recurrent),), d_pre
    ds = _matmul_t(da, recurrent[..., 2 * units :])
    dr = ds * h_prev * r * (1 - r)
    d_pre = jnp.concatenate([dz, dr, da], axis=-1)
    d_zr = d_pre[..., : 2 * units]
    d_prev = d_prev + ds * r + _matmul_t(d_zr, recurrent[..., : 2 * units])
    return (d_prev,), d_pre


def step_grads(kind, params, x_dt, d_pre, h_prev, saved):
    """`(dx, d_kernel, d_recurrent, d_bias)` of all steps from their
    `d_pre`; `h_prev` holds the states before each step."""
    kernel, recurrent, bias = params
    # At least float32 (float64 stays float64).
    acc = jnp.promote_types(x_dt.dtype, jnp.float32)

    def over_steps(a, b):
        # "etbx,etby->exy": directions lead, then (time, batch), summed.
        dims = (((1, 2), (1, 2)), ((0,), (0,)))
        return lax.dot_general(a, b, dims, preferred_element_type=acc)

    def sum_steps(a):
        a = lax.convert_element_type(a, acc)
        return lax.expand_dims(lax.reduce(a, acc.type(0), lax.add, (1, 2)), (1,))

    # "etbg,edg->etbd": no transpose of the step axes.
    dims = (((3,), (2,)), ((0,), (0,)))
    dx = lax.dot_general(d_pre, kernel, dims, preferred_element_type=acc)
    dx = dx.astype(x_dt.dtype)
    d_kernel = over_steps(x_dt, d_pre)
    d_in_bias = sum_steps(d_pre)
    if kind[0] != "gru":
        return dx, d_kernel, over_steps(h_prev, d_pre), d_in_bias
    xz, hz = saved
    units = h_prev.shape[-1]
    r = _sigmoid(xz[..., units : 2 * units] + hz[..., units : 2 * units])
    d_zr, da = d_pre[..., : 2 * units], d_pre[..., 2 * units :]
    if kind[1]:
        d_hz = jnp.concatenate([d_zr, da * r], axis=-1)
        d_rec = over_steps(h_prev, d_hz)
        d_bias = jnp.stack([d_in_bias, sum_steps(d_hz)])
        return dx, d_kernel, d_rec, d_bias
    d_rec = jnp.concatenate(
        [over_steps(h_prev, d_zr), over_steps(r * h_prev, da)], axis=-1
    )
    return dx, d_kernel, d_rec, d_in_bias
