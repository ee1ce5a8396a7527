"""How the JAX backend moves rows: `take_rows`, `move_rows` (a gather
whose gradient is a gather too), `SortedRows` (the length tiers' rows
sorted by span) and `per_direction` (each direction's indices side by
side).

A row permutation's gradient is its inverse permutation. JAX cannot know
that a gather's indices are a permutation, so it differentiates `x[index]`
as a scatter-add into zeros: three kernels for XLA to compile on every
first call (the zeros, the scatter and its index clamp) where one gather
does. `move_rows` takes the inverse map from the caller.

Index arithmetic is written with `jax.lax`: each `jax.numpy` function (and
operator on an array) is a jit of its own, which a program's trace traces
anew for each new signature after `jax.clear_caches()` or in a new process,
a cost every first call pays.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def take_rows(flat, index):
    """`flat[index]`, shape `index.shape + flat.shape[1:]`.

    Out-of-range indices are clamped (`mode="clip"`), not filled: XLA
    compiles the fill of `keras.ops.take` (a bounds mask and a select over
    the result) several times slower than the gather itself, on every
    first call. Every caller passes indices in range or discards what they
    read.
    """
    dims = lax.GatherDimensionNumbers(
        offset_dims=tuple(range(index.ndim, index.ndim + flat.ndim - 1)),
        collapsed_slice_dims=(0,),
        start_index_map=(0,),
    )
    starts = lax.expand_dims(index, (index.ndim,))
    return lax.gather(
        flat, starts, dims, (1,) + flat.shape[1:], mode=lax.GatherScatterMode.CLIP
    )


def per_direction(directions, axis, forward, backward):
    """`forward` (and `backward` for a second direction) on a new axis
    `axis` (0 or -1): a select on that axis, where a stack would be a
    concatenate, slow for XLA to compile at small sizes."""
    axis = axis % (forward.ndim + 1)
    if directions == 1:
        return lax.expand_dims(forward, (axis,))
    shape = list(forward.shape)
    shape.insert(axis, directions)
    dims = tuple(d for d in range(len(shape)) if d != axis)
    first = lax.eq(lax.broadcasted_iota(jnp.int32, shape, axis), np.int32(0))
    forward = lax.broadcast_in_dim(forward, shape, dims)
    backward = lax.broadcast_in_dim(backward, shape, dims)
    return lax.select(first, forward, backward)


@jax.custom_vjp
def move_rows(flat, index, back, valid):
    """`flat[index]` (`take_rows`), differentiated by a gather through
    `back`.

    Args:
        flat: `(rows, ...)` array.
        index: Int array of any shape `S`: the row of `flat` each output
            row reads.
        back: Int `(rows, k)`: for each row of `flat`, the `k` output rows
            (flat indices into `S`) that read it.
        valid: Bool `(rows,)`: False for a row of `flat` whose gradient is
            zero; None: every row is valid.

    Returns:
        `flat[index]`, shape `S + flat.shape[1:]`. Its gradient is exact
        when every output row with a nonzero gradient reads a valid row of
        `flat` that lists it in `back`, and every other output row's
        gradient is zero: the gradient of row `r` of `flat` is the sum of
        the gradients of the output rows `back[r]`, zero where not
        `valid[r]`.

    Example:

    ```python
    flat = jnp.arange(6.0).reshape(3, 2)
    index = jnp.array([2, 0])  # output row 0 reads row 2, row 1 reads 0
    back = jnp.array([[1], [0], [0]])  # row 1 is read by no output row:
    valid = jnp.array([True, False, True])  # its gradient is zero
    move_rows(flat, index, back, valid)  # [[4., 5.], [0., 1.]]
    ```
    """
    return take_rows(flat, index)


def _move_rows_fwd(flat, index, back, valid):
    return take_rows(flat, index), (index, back, valid)


def _move_rows_bwd(residuals, d_out):
    index, back, valid = residuals
    d_out = jnp.reshape(d_out, (-1,) + d_out.shape[index.ndim :])
    # The k readers of each row, summed by adds (no reduction to compile).
    reads = [take_rows(d_out, back[:, k]) for k in range(back.shape[1])]
    d_flat = reads[0]
    for other in reads[1:]:
        d_flat = d_flat + other
    if valid is not None:
        keep = lax.broadcast_in_dim(valid, d_flat.shape, (0,))
        d_flat = lax.select(keep, d_flat, lax.full_like(d_flat, 0))
    return d_flat, None, None, None


move_rows.defvjp(_move_rows_fwd, _move_rows_bwd)


class SortedRows:
    """Rows sorted by `spans` (longest first, stable) in equal groups.

    Args:
        spans: Int32 `(batch,)`, the steps each row runs.
        groups: Static number of row groups (at most `batch` are made);
            rows of span 0 pad the batch to a multiple of the group size.
        carry: `(batch,)` int32 values sorted along with the spans, in
            `carried` (one sort, no gather per value to compile).
    """

    def __init__(self, spans, groups, carry=()):
        batch = spans.shape[0]
        index = lax.iota(jnp.int32, batch)
        keyed = lax.sort(
            (lax.neg(spans), index) + tuple(carry), num_keys=1, is_stable=True
        )
        self.order = keyed[1]
        # The inverse permutation, to put rows back: a sort too, where a
        # scatter would compile three kernels more.
        self.inverse = lax.sort((self.order, index), num_keys=1)[1]
        groups = min(groups, batch)
        size = -(-batch // groups)
        self.groups = -(-batch // size)
        self.pad = self.groups * size - batch
        # Each sorted row's span: its group's loop bound and its steps' keep.
        self.sorted_spans = self._padded(lax.neg(keyed[0]))
        self.carried = [self._padded(v) for v in keyed[2:]]

    def sort(self, value):
        """The sorted rows of `value`, a `(batch, ...)` array in the
        caller's rows: `value[order]` (`move_rows`, its gradient a gather
        through `inverse`)."""
        back = lax.expand_dims(self.inverse, (1,))
        return move_rows(value, self.order, back, None)

    def unsort(self, value):
        """The caller's rows of `value`, a `(batch + pad, ...)` array in
        sorted rows: `value[inverse]` (`move_rows`, its gradient a gather
        through `order`, zero for the padding rows)."""
        rows = self.order.shape[0] + self.pad
        back = lax.expand_dims(self.caller_rows, (1,))
        valid = lax.lt(lax.iota(jnp.int32, rows), np.int32(self.order.shape[0]))
        return move_rows(value, self.inverse, back, valid)

    @property
    def caller_rows(self):
        """`(batch + pad,)`: each sorted row's row in the caller's order, 0
        for the padding rows."""
        return self._padded(self.order)

    def _padded(self, value):
        """A `(batch,)` int32 value with `pad` zeros after it."""
        return lax.pad(value, np.int32(0), [(0, self.pad, 0)])

    def offsets(self, time):
        """Each sorted row's first index in the `(batch * time,)` view,
        `(1, 1, batch + pad)`."""
        offsets = lax.mul(self.caller_rows, np.int32(time))
        return lax.expand_dims(offsets, (0, 1))

    def slots(self, positions, time):
        """The flat index in the kernel's `(directions, time, rows, ...)`
        steps of `(e, positions[b, s, e], row of b)`, for each `(b, s, e)`."""
        rows = self.order.shape[0] + self.pad
        e = lax.broadcasted_iota(jnp.int32, positions.shape, 2)
        step = lax.add(lax.mul(e, np.int32(time)), positions)
        row = lax.broadcast_in_dim(self.inverse, positions.shape, (0,))
        return lax.add(lax.mul(step, np.int32(rows)), row)

    def gather(self, ys, positions):
        """`(batch, time, directions * units)`: direction `e` of row `b` at
        step `t` reads the kernel's `ys[e, positions[b, t, e], row of b]`."""
        directions, time, rows, units = ys.shape
        batch = positions.shape[0]
        y = take_rows(jnp.reshape(ys, (-1, units)), self.slots(positions, time))
        return jnp.reshape(y, (batch, positions.shape[1], directions * units))
