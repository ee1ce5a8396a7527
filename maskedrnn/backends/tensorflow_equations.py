"""Keras' GRU and SimpleRNN equations in TensorFlow ops, for `tensorflow_cells`.

`step` is one step of a cell over its inputs' projections (`step_inputs`);
`grads` the gradients of a run of steps, every step's gates recomputed at
once from the states before each step, the gradient w.r.t. the state
carried back by the caller's loop. `kind` is "gru" or "rnn" (a SimpleRNN).
Sums over steps and rows of half-precision values are taken in float32.
"""

import tensorflow as tf

from maskedrnn.backends.tensorflow_shapes import leading_shape


def flat_matmul(a, b, bias=None):
    """`a @ b` (plus `bias`, where given) over the last axis of a 3-d `a`."""
    out = tf.matmul(tf.reshape(a, [-1, a.shape[2]]), b)
    if bias is not None:
        out = tf.nn.bias_add(out, bias)
    return tf.reshape(out, leading_shape(a, 2, [b.shape[1]]))


def sum_dtype(dtype):
    """float32 for sums over half-precision steps, else `dtype`."""
    return "float32" if dtype in (tf.float16, tf.bfloat16) else dtype


def sum_matmul(a, b):
    """Sum over steps and rows of `a^T b`, in `sum_dtype`."""
    dtype = sum_dtype(a.dtype)
    a = tf.cast(tf.reshape(a, [-1, a.shape[-1]]), dtype)
    b = tf.cast(tf.reshape(b, [-1, b.shape[-1]]), dtype)
    return tf.matmul(a, b, transpose_a=True)


def step_inputs(kind, xp, units):
    """A step's inputs from the input projections `xp` `(..., width)`: a
    GRU's gates (z, r) and candidate apart, a SimpleRNN's as they are."""
    if kind == "gru":
        return tf.split(xp, [2 * units, units], axis=-1)
    return [xp]


def step(kind, u, bh, reset_after):
    """One step of the cell, `step(h, inputs) -> (h, [h])`, on the inputs
    of `step_inputs`."""
    units = u.shape[0]
    if kind == "rnn":

        def rnn_step(h, inputs):
            h = tf.tanh(inputs[0] + tf.matmul(h, u))
            return h, [h]

        return rnn_step
    if not reset_after:
        u_zr, u_h = tf.split(u, [2 * units, units], axis=1)

    def gru_step(h, inputs):
        x_zr, x_h = inputs
        if reset_after:
            hp = tf.nn.bias_add(tf.matmul(h, u), bh)
            hp_zr, hp_h = tf.split(hp, [2 * units, units], axis=1)
            z, r = tf.split(tf.sigmoid(x_zr + hp_zr), 2, axis=1)
            hh = tf.tanh(x_h + r * hp_h)
        else:
            z, r = tf.split(tf.sigmoid(x_zr + tf.matmul(h, u_zr)), 2, axis=1)
            hh = tf.tanh(x_h + tf.matmul(r * h, u_h))
        # z * h + (1 - z) * hh, in one op fewer.
        h = hh + z * (h - hh)
        return h, [h]

    return gru_step


def _gru_grads(xs, h_prev, dhs, u, bh, reset_after, recur):
    """The gradients of GRU steps: their gates recomputed from the step
    inputs `xs` and states before each step `h_prev`, `dh` carried back by
    `recur(step, seqs, widths) -> (dh0, outs)` (`seqs` the time-major
    inputs of `step`). Returns `(dh0, d_xp, d_u, d_bh)`, the weights' in
    `sum_dtype`, `d_bh` None without reset_after (no recurrent bias)."""
    units = u.shape[0]
    dtype = h_prev.dtype
    u_zr, u_h = tf.split(u, [2 * units, units], axis=1)
    x_zr, x_h = xs
    if reset_after:
        hp_zr, hp_h = tf.split(flat_matmul(h_prev, u, bh), [2 * units, units], 2)
        z, r = tf.split(tf.sigmoid(x_zr + hp_zr), 2, axis=2)
        hh = tf.tanh(x_h + r * hp_h)
    else:
        z, r = tf.split(tf.sigmoid(x_zr + flat_matmul(h_prev, u_zr)), 2, axis=2)
        rh = r * h_prev
        hh = tf.tanh(x_h + flat_matmul(rh, u_h))
    # d(pre-activation) = g * coefficient, g the gradient of the step's h.
    c_z = (h_prev - hh) * z * (1 - z)
    c_h = (1 - z) * (1 - hh * hh)
    if reset_after:
        c_r = c_h * hp_h * r * (1 - r)
        # The gradient of h U + c (the recurrent pre-activations).
        c_rec = tf.concat([c_z, c_r, c_h * r], axis=2)
        u_t = tf.transpose(u)

        def step_after(dh, inputs):
            dh_t, z_t, c_t = inputs
            g = dh_t + dh
            d_rec = tf.concat([g, g, g], axis=1) * c_t
            return g * z_t + tf.matmul(d_rec, u_t), [g]

        dh0, (g,) = recur(step_after, [dhs, z, c_rec], [units])
        g3 = tf.concat([g, g, g], axis=2)
        d_rec = g3 * c_rec
        d_xp = g3 * tf.concat([c_z, c_r, c_h], axis=2)
        d_bh = tf.reduce_sum(tf.cast(d_rec, sum_dtype(dtype)), axis=(0, 1))
        return dh0, d_xp, sum_matmul(h_prev, d_rec), d_bh
    c_r = h_prev * r * (1 - r)
    u_zr_t, u_h_t = tf.transpose(u_zr), tf.transpose(u_h)

    def step(dh, inputs):
        dh_t, z_t, r_t, c_z_t, c_h_t, c_r_t = inputs
        g = dh_t + dh
        d_rh = tf.matmul(g * c_h_t, u_h_t)
        d_r = d_rh * c_r_t
        d_zr = tf.concat([g * c_z_t, d_r], axis=1)
        return g * z_t + d_rh * r_t + tf.matmul(d_zr, u_zr_t), [g, d_r]

    dh0, (g, d_r) = recur(step, [dhs, z, r, c_z, c_h, c_r], [units, units])
    d_zr = tf.concat([g * c_z, d_r], axis=2)
    d_h = g * c_h
    d_u = tf.concat([sum_matmul(h_prev, d_zr), sum_matmul(rh, d_h)], axis=1)
    return dh0, tf.concat([d_zr, d_h], axis=2), d_u, None


def _rnn_grads(xs, h_prev, hs, dhs, u, recur):
    """The gradients of SimpleRNN steps `h' = tanh(xp_t + h U)`, as
    `_gru_grads`' (`hs` the states after each step; no `d_bh`)."""
    del xs  # The outputs hold the activations.
    units = u.shape[0]
    u_t = tf.transpose(u)

    def step(dh, inputs):
        d = (inputs[0] + dh) * inputs[1]
        return tf.matmul(d, u_t), [d]

    dh0, (d,) = recur(step, [dhs, 1 - hs * hs], [units])
    return dh0, d, sum_matmul(h_prev, d), None


def grads(kind, xs, h_prev, hs, dhs, u, bh, reset_after, recur):
    """`_gru_grads` or `_rnn_grads` for `kind`."""
    if kind == "gru":
        return _gru_grads(xs, h_prev, dhs, u, bh, reset_after, recur)
    return _rnn_grads(xs, h_prev, hs, dhs, u, recur)


def states_before(h0, hs):
    """The states before each step: `h0`, then `hs` but the last."""
    return tf.concat([h0[None], hs], axis=0)[:-1]
