"""The JAX length tiers' recurrence: every row group, forward and back,
with its VJP (`recurrence`).

`x_dt` is `(directions, time, batch, features)` with the rows sorted
longest first (`jax_rows.SortedRows`) and `batch` a multiple of `groups`:
group `j` is the rows `j * size` to `(j + 1) * size`, and its first row is
its longest. Each group runs only up to its own longest span; its steps are
the cell's (`jax_cells`), read from and written to the step buffers of
`jax_steps`.

One loop over the groups holds one loop over a group's steps, forward and
backward: every group runs the same compiled step, so XLA compiles one
recurrence whatever the number of groups (a loop per group, or per phase of
a shrinking batch, would each be compiled anew).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from maskedrnn.backends import jax_cells as cells
from maskedrnn.backends.jax_steps import (
    group_rows,
    group_start,
    put_group_rows,
    put_step_rows,
    step_buffer,
    step_rows,
    value_at,
)


def select(keep, a, b):
    """`a` where `keep` (broadcast to it), else `b`: `jnp.where` without
    its nested jit, which each first call traces anew."""
    return lax.select(jnp.broadcast_to(keep, a.shape), a, b)


def _is_shape(value):
    """Whether `value` is one shape (a tuple of ints), a leaf of a tree."""
    return bool(value) and isinstance(value, tuple) and all(
        isinstance(d, int) for d in value
    )


def _forward(kind, groups, x_dt, spans, keep, states, params, save):
    """Runs every group: `(outputs, final_states, buffers)`, the buffers
    filled with `save` (the states and pre-activations of every step)."""
    time, batch = x_dt.shape[1], x_dt.shape[2]
    size = batch // groups
    dtype = x_dt.dtype
    rows = states[0].shape[:2]  # (directions, batch)
    buf_states = tuple(step_buffer(s.shape, time, dtype) for s in states)
    if not save:
        buf_states = buf_states[:1]
    buf_saved = ()
    if save:
        saved_shapes = cells.saved_shapes(kind, rows, params[1].shape[-2])
        buf_saved = jax.tree.map(
            lambda s: step_buffer(s, time, dtype), saved_shapes, is_leaf=_is_shape
        )

    def group(j, loop):
        finals, buf_states, buf_saved = loop
        first = group_start(j, size)

        def step(t, loop):
            state, buf_states, buf_saved = loop
            x_t = step_rows(x_dt, t, first, size)
            new, saved = cells.step(kind, params, x_t, state)
            kept = step_rows(keep, t, first, size)[..., None]
            new = tuple(select(kept, a, b) for a, b in zip(new, state))
            buf_states = tuple(
                put_step_rows(b, s, t, first) for b, s in zip(buf_states, new)
            )
            if save:
                buf_saved = jax.tree.map(
                    lambda b, s: put_step_rows(b, s, t, first), buf_saved, saved
                )
            return new, buf_states, buf_saved

        initial = tuple(group_rows(s, first, size) for s in states)
        state, buf_states, buf_saved = lax.fori_loop(
            0, value_at(spans, first), step, (initial, buf_states, buf_saved)
        )
        finals = tuple(put_group_rows(f, s, first) for f, s in zip(finals, state))
        return finals, buf_states, buf_saved

    finals, buf_states, buf_saved = lax.fori_loop(
        0, groups, group, (states, buf_states, buf_saved)
    )
    return buf_states[0], finals, (buf_states, buf_saved)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def recurrence(kind, groups, x_dt, spans, keep, states, params):
    """The grouped recurrence over sorted `(directions, time, batch,
    features)` `x_dt`: `(outputs (directions, time, batch, units), final
    states)`."""
    ys, finals, _ = _forward(
        kind, groups, x_dt, spans, keep, states, params, save=False
    )
    return ys, finals


def _recurrence_fwd(kind, groups, x_dt, spans, keep, states, params):
    ys, finals, buffers = _forward(
        kind, groups, x_dt, spans, keep, states, params, save=True
    )
    return (ys, finals), (x_dt, spans, keep, states, params, buffers)


def _recurrence_bwd(kind, groups, residuals, cotangents):
    x_dt, spans, keep, states, params, (buf_states, buf_saved) = residuals
    d_ys, d_finals = cotangents
    time, batch = x_dt.shape[1], x_dt.shape[2]
    size = batch // groups
    dtype = x_dt.dtype
    # Every step's pre-activation gradients (zeros at the steps skipped).
    d_pre = step_buffer(states[0].shape[:2] + params[1].shape[-1:], time, dtype)
    d_finals = tuple(jnp.asarray(d, dtype) for d in d_finals)

    def group(j, loop):
        d_initial, d_pre = loop
        first = group_start(j, size)
        steps = value_at(spans, first)
        initial = tuple(group_rows(s, first, size) for s in states)

        def step(i, loop):
            d_state, d_pre = loop
            t = lax.sub(lax.sub(steps, np.int32(1)), i)
            kept = step_rows(keep, t, first, size)[..., None]
            dy = step_rows(d_ys, t, first, size)
            # A step that keeps the state passes the gradient of its output
            # on to the step before: its output is the state it kept.
            d_in = (lax.add(d_state[0], dy),) + d_state[1:]
            saved = jax.tree.map(lambda b: step_rows(b, t, first, size), buf_saved)
            new = tuple(step_rows(b, t, first, size) for b in buf_states)
            prev = _state_before(buf_states, initial, t, first, size)
            d_prev, d_step = cells.step_back(kind, params, d_in, saved, prev, new)
            d_state = tuple(select(kept, a, b) for a, b in zip(d_prev, d_in))
            d_step = select(kept, d_step, jnp.zeros_like(d_step))
            return d_state, put_step_rows(d_pre, d_step, t, first)

        d_last = tuple(group_rows(d, first, size) for d in d_finals)
        d_state, d_pre = lax.fori_loop(0, steps, step, (d_last, d_pre))
        d_initial = tuple(
            put_group_rows(d, s, first) for d, s in zip(d_initial, d_state)
        )
        return d_initial, d_pre

    d_initial, d_pre = lax.fori_loop(0, groups, group, (d_finals, d_pre))
    # The inputs' and the weights' gradients, every step at once.
    h_prev = jnp.concatenate([states[0][:, None], buf_states[0][:, :-1]], axis=1)
    dx, d_kernel, d_rec, d_bias = cells.step_grads(
        kind, params, x_dt, d_pre, h_prev, buf_saved
    )
    d_params = tuple(
        d.astype(p.dtype) for d, p in zip((d_kernel, d_rec, d_bias), params)
    )
    return dx, None, None, d_initial, d_params


def _state_before(buf_states, initial, t, first, size):
    """The states after step `t - 1` of a group (its initial ones at 0)."""
    t_before = lax.max(lax.sub(t, np.int32(1)), np.int32(0))
    before = tuple(step_rows(b, t_before, first, size) for b in buf_states)
    started = lax.gt(t, np.int32(0))
    return tuple(lax.select(started, b, s) for b, s in zip(before, initial))


recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)
