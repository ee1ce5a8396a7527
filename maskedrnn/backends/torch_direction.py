"""One masked direction on PyTorch's kernels, from and back to the caller's order.

The torch-ops twin of `maskedrnn.layers.direction`, in a few torch ops
around the kernel instead of many Keras ones.
"""

import functools

import torch

from maskedrnn.backends import torch_kernels
from maskedrnn.backends.torch_kernels import LSTM, as_tensor, with_padding_row


class Layout:
    """Where each valid step of a masked batch goes, for `run_direction`.

    Made once per call from the mask (any pattern) and shared by both
    directions, so each gathers straight from the caller's `x` and puts its
    outputs straight back. Step `k` of row `b` is kernel row `b * time + k`
    valid-first, or `offsets[k] + slot[b]` packed (as
    `pack_padded_sequence`: time-major, rows by decreasing length).

    Args:
        mask: Bool `(batch, time)` CPU tensor, True at valid steps.
        lengths: Optional integer `(batch,)`, when already known.

    Attributes:
        batch, time: Python ints.
        lengths: Int64 `(batch,)`, valid steps per row.
        steps: Python int, the longest row's length (0: no valid step).
        total: Python int, the number of valid steps (packed rows).
        batch_sizes: Int64 `(steps,)` on the mask's device (the packed
            kernels take a host copy).
        active: Int64 `(batch_sizes[0],)`: rows with a valid step, by
            decreasing length, as the packed kernel's final states come.
    """

    def __init__(self, mask, lengths=None):
        mask = as_tensor(mask).to(torch.bool)
        self.batch, self.time = mask.shape[0], mask.shape[1]
        self.mask = mask
        self.device = mask.device
        # count[b, t]: valid steps of row b at or before t.
        self.count = torch.cumsum(mask, 1)
        if lengths is None:
            self.lengths = self.count[:, -1]
        else:  # int64, as torch's index ops want
            self.lengths = as_tensor(lengths).to(torch.int64)
        # Flat `b * time + t` of every valid step, row by row.
        self.valid = mask.reshape(-1).nonzero().squeeze(1)
        self.total = self.valid.shape[0]
        self.has_steps = self.lengths > 0
        self.steps = int(self.lengths.max()) if self.batch else 0

    # The packed form's fields: on first use, as training never needs them.

    @functools.cached_property
    def _sorted(self):
        # Rows by decreasing length (stable, as pack_padded_sequence sorts).
        return torch.sort(self.lengths, descending=True, stable=True)

    @functools.cached_property
    def batch_sizes(self):
        sorted_lengths = self._sorted[0]
        k = torch.arange(self.steps, device=self.device)
        return (k[:, None] < sorted_lengths[None, :]).sum(1)

    @functools.cached_property
    def offsets(self):
        # offsets[k]: packed rows before step k.
        return torch.cumsum(self.batch_sizes, 0) - self.batch_sizes

    @functools.cached_property
    def slot(self):
        # slot[b]: row b's place in the sorted order.
        sorted_rows = self._sorted[1]
        slot = torch.empty_like(sorted_rows)
        slot[sorted_rows] = torch.arange(self.batch, device=self.device)
        return slot

    @functools.cached_property
    def active(self):
        return self._sorted[1][: int(self.batch_sizes[0])]

    def row(self, k, b, packed):
        """The kernel row of step `k` (reading order) of row `b`."""
        if packed:
            return self.offsets.take(k) + self.slot.take(b)
        return b * self.time + k

    def read_index(self, packed, reverse=False):
        """Int64 `(rows(packed),)`: kernel row `p` reads flat step `index[p]`.

        A padded tail reads the zero row `batch * time` (`with_zero_row`);
        `reverse=True` reads each row's valid steps last to first.
        """
        count = self.count.take(self.valid)  # 1 .. length, in order
        rows = torch.div(self.valid, self.time, rounding_mode="floor")
        rank = self.lengths.take(rows) - count if reverse else count - 1
        zero_row = self.batch * self.time
        index = torch.full(
            (self.rows(packed),), zero_row, dtype=self.valid.dtype, device=self.device
        )
        return index.scatter_(0, self.row(rank, rows, packed), self.valid)

    def rows(self, packed):
        """The number of kernel rows: `total` packed, `batch * time` else."""
        return self.total if packed else self.batch * self.time

    def place_index(self, place, packed, reverse=False):
        """Int64 `(batch * time,)`: the kernel row each caller step takes.

        `rows(packed)`, the appended zero row, gives zeros; `place` as in
        `run_direction`.
        """
        if place == "zeros":
            rank = self.lengths[:, None] - self.count if reverse else self.count - 1
            keep = self.mask
        else:
            rank = self.count - 1
            keep = rank >= 0
        rank = rank.clamp(0, max(self.steps - 1, 0))
        rows = torch.arange(self.batch, device=self.device)[:, None]
        index = torch.where(keep, self.row(rank, rows, packed), self.rows(packed))
        return index.reshape(-1)

    def last_index(self, packed):
        """Int64 `(batch,)`: kernel row of each row's last valid step, or zeros."""
        last = (self.lengths - 1).clamp(min=0)
        rows = torch.arange(self.batch, device=self.device)
        return torch.where(
            self.has_steps, self.row(last, rows, packed), self.rows(packed)
        )


def with_zero_row(t):
    """`t` `(n, size)` with a zero row `n` appended: cheaper than a masked fill."""
    return torch.cat([t, t.new_zeros((1, t.shape[1]))])


_PLACES = ("zeros", "held", "last")


def run_direction(
    inner,
    x,
    initial_state,
    layout,
    reverse=False,
    place="zeros",
    packed=False,
    want_states=True,
):
    """Runs one direction of a masked batch on PyTorch's kernel.

    Gathers the valid steps, runs the kernel, and puts the outputs back in
    the caller's order; as `direction.run` plus the placement. Call only
    when `unavailable_reason(inner, x)` is None.

    Args:
        inner: The inner LSTM, GRU or SimpleRNN layer.
        x: Float tensor `(batch, time, features)` in the caller's order; its
            padded steps are never read (their gradient is zero).
        initial_state: List of `(batch, units)` tensors (`[h, c]` for an
            LSTM, `[h]` otherwise), or None for zeros.
        layout: The batch's `Layout`.
        reverse: Bool, read each row's valid steps last to first (a
            backward direction). Defaults to `False`.
        place: Where the outputs go: `"zeros"` (zeros at masked steps,
            `Bidirectional`'s convention), `"held"` (the last valid output
            repeated, Keras' `RNN` convention; forward only) or `"last"`
            (each row's last valid output, zeros for a row with none).
            Defaults to `"zeros"`.
        packed: Bool: the packed kernel (valid steps only; inference) or
            the unpacked one over valid-first data. Defaults to `False`.
        want_states: Bool, whether to return the final states. Defaults to
            `True`.

    Returns:
        `(outputs, states)`: outputs `(batch, time, units)`, or `(batch,
        units)` for `"last"`, and the list of states after each row's last
        valid step (the initial state for a row with no valid step), or
        `[]` when `want_states` is False.
    """
    if place not in _PLACES:
        raise ValueError(f"place must be one of {_PLACES}; got {place!r}")
    return _direction(
        inner, x, initial_state, layout, reverse, place, packed, want_states
    )


def _direction(inner, x, initial_state, layout, reverse, place, packed, want_states):
    """`run_direction` after its argument check (also called by `run`)."""
    cell = inner.cell
    dtype = as_tensor(cell.kernel).dtype
    units = as_tensor(cell.recurrent_kernel).shape[0]
    batch, time = layout.batch, layout.time
    x = as_tensor(x).to(dtype)
    if initial_state is None:
        sizes = 2 if type(inner) is LSTM else 1
        states = [x.new_zeros((batch, units)) for _ in range(sizes)]
    else:
        states = [as_tensor(state).to(dtype) for state in initial_state]
    if packed and layout.steps == 0:
        # No valid step anywhere: zeros and the initial states.
        shape = (batch, units) if place == "last" else (batch, time, units)
        return x.new_zeros(shape), states if want_states else []
    x = x.reshape(batch * time, x.shape[2])
    index = layout.read_index(packed, reverse)
    if packed:
        data = x.index_select(0, index)
        # States (num_layers * num_directions, rows, units), active rows.
        active = layout.active
        hx = [state.index_select(0, active)[None] for state in states]
        params, fn, hx = torch_kernels._kernel(inner, hx)
        # Packed form: (data, batch_sizes, hx, params, *flags).
        out, *final = fn(
            data, layout.batch_sizes.cpu(), hx, params, *torch_kernels._flags(cell)
        )
        # Rows with no valid step keep their initial state.
        if want_states:
            states = [
                state.index_copy(0, active, last[0])
                for state, last in zip(states, final)
            ]
        out = with_zero_row(out)
    else:
        # Valid-first: the padded tail reads the appended zero row.
        saturate = want_states and type(inner) is LSTM
        source = with_padding_row(x) if saturate else with_zero_row(x)
        data = source.index_select(0, index).reshape(batch, time, -1)
        if saturate:
            out, c = torch_kernels.saturated_lstm(inner, data, states)
        else:
            out = torch_kernels._unpacked(inner, data, states)
        out = with_zero_row(out.reshape(batch * time, units))
        if want_states:
            # h read off the outputs; an LSTM's c is the kernel's own.
            has_steps = layout.has_steps[:, None]
            h = out.index_select(0, layout.last_index(False))
            states = [torch.where(has_steps, h, states[0])] + (
                [torch.where(has_steps, c, states[1])] if saturate else []
            )
    if not want_states:
        states = []
    if place == "last":
        return out.index_select(0, layout.last_index(packed)), states
    y = out.index_select(0, layout.place_index(place, packed, reverse))
    return y.reshape(batch, time, units), states
