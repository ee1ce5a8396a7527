"""One masked direction on PyTorch's kernels, from and back to the caller's order.

The torch-ops twin of the Keras-ops direction core (`maskedrnn.layers.
direction`: valid steps first, reversed by each row's own length for a
backward direction, padding never read, outputs placed back by Keras'
conventions), for the kernels of `maskedrnn.backends.torch_kernels`:
`run_direction` takes the batch in the caller's order and a `Layout` of its
mask, and does the whole direction in about a dozen torch ops around the
kernel (the Keras-ops path costs about fifty dispatches).
"""

import functools

import torch

from maskedrnn.backends import torch_kernels
from maskedrnn.backends.torch_kernels import LSTM, as_tensor, with_padding_row


class Layout:
    """Where each valid step of a masked batch goes, for `run_direction`.

    Derived once per call from the batch's mask in the caller's order (any
    pattern: left or right padding, holes, all-padding rows) and shared by
    both directions of a bidirectional layer, so that a direction gathers
    its kernel input straight from the caller's `x` (one `index_select`)
    and puts each output straight back where the caller wants it (one
    more): no valid-first copy in between, and about a dozen torch ops
    around the kernel instead of about fifty Keras ones.

    The kernel reads its input in one of two layouts. Step `k` (in reading
    order) of row `b` is kernel row `row(k, b, packed)`:

    - valid-first (`packed=False`, the unpacked kernel): `b * time + k`,
      each row's valid steps first, its padded tail zeroed;
    - packed (`packed=True`, as `torch.nn.utils.rnn.pack_padded_sequence`
      packs): time-major, rows sorted by decreasing length, `batch_sizes[k]`
      rows at step `k`, so `offsets[k] + slot[b]`.

    Args:
        mask: Bool `(batch, time)` tensor on the CPU: True at valid steps,
            in the order of the `x` the directions will read.
        lengths: Optional integer `(batch,)`, the valid steps of each row
            when the call knows them already (`Steps.known_lengths`); else
            they are read off the running count of valid steps the layout
            needs anyway.

    Attributes:
        batch, time: Python ints.
        lengths: Int64 `(batch,)`, valid steps per row.
        steps: Python int, the longest row's length (0: no valid step).
        total: Python int, the number of valid steps (packed rows).
        batch_sizes: Int64 `(steps,)` on the CPU, as the packed kernels want
            it (only when `steps > 0`).
        active: Int64 `(batch_sizes[0],)`: the rows with at least one valid
            step, by decreasing length (the packed kernel's final states are
            theirs, in that order).

    The packed form's fields (`batch_sizes`, `active` and the indices
    behind `row`) are computed on first use: a call that runs the unpacked
    kernel (training) never pays for them.
    """

    def __init__(self, mask, lengths=None):
        mask = as_tensor(mask).to(torch.bool)
        self.batch, self.time = mask.shape[0], mask.shape[1]
        self.mask = mask
        # count[b, t]: valid steps of row b at or before t.
        self.count = torch.cumsum(mask, 1)
        if lengths is None:
            self.lengths = self.count[:, -1]
        else:  # int64, as torch's index ops want the steps computed from it
            self.lengths = as_tensor(lengths).to(torch.int64)
        # Flat `b * time + t` of every valid step, row by row.
        self.valid = mask.reshape(-1).nonzero().squeeze(1)
        self.total = self.valid.shape[0]
        self.has_steps = self.lengths > 0
        self.steps = int(self.lengths.max()) if self.batch else 0

    # The packed form's fields, computed on first use: a training call runs
    # the unpacked kernel and never needs them (`packed_preferred`).

    @functools.cached_property
    def _sorted(self):
        # Rows by decreasing length (stable, as pack_padded_sequence sorts).
        return torch.sort(self.lengths, descending=True, stable=True)

    @functools.cached_property
    def batch_sizes(self):
        sorted_lengths = self._sorted[0]
        k = torch.arange(self.steps)
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
        slot[sorted_rows] = torch.arange(self.batch)
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
        """Int64: kernel row `p` reads flat step `index[p]` of `x`.

        `(total,)` packed; `(batch * time,)` valid-first, where the rows of
        a padded tail read flat step `batch * time`, a zero row appended to
        `x` (`with_zero_row`): padding is never read. The forward direction
        reads each row's valid steps in order; with `reverse=True` last to
        first, each row by its own length (a backward direction reads
        `3 2 1`, not `0 0 3 2 1`).
        """
        count = self.count.take(self.valid)  # 1 .. length, in order
        rows = torch.div(self.valid, self.time, rounding_mode="floor")
        rank = self.lengths.take(rows) - count if reverse else count - 1
        zero_row = self.batch * self.time
        index = torch.full((self.rows(packed),), zero_row, dtype=self.valid.dtype)
        return index.scatter_(0, self.row(rank, rows, packed), self.valid)

    def rows(self, packed):
        """The number of kernel rows: `total` packed, `batch * time` else."""
        return self.total if packed else self.batch * self.time

    def place_index(self, place, packed, reverse=False):
        """Int64 `(batch * time,)`: the kernel row whose output each step of
        the caller's order takes; `rows(packed)`, a zero row appended to the
        outputs (`with_zero_row`), where it takes zeros.

        `place="zeros"`: each valid step its own output, zeros at masked
        steps (`reverse` as in `read_index`). `"held"` (forward reading
        only): Keras' `RNN` convention, the output of the last valid step at
        or before each step, zeros before a row's first valid step.
        """
        if place == "zeros":
            rank = self.lengths[:, None] - self.count if reverse else self.count - 1
            keep = self.mask
        else:
            rank = self.count - 1
            keep = rank >= 0
        rank = rank.clamp(0, max(self.steps - 1, 0))
        rows = torch.arange(self.batch)[:, None]
        index = torch.where(keep, self.row(rank, rows, packed), self.rows(packed))
        return index.reshape(-1)

    def last_index(self, packed):
        """Int64 `(batch,)`: the kernel row of each row's last valid step;
        `rows(packed)`, the appended zero row, for a row with none."""
        last = (self.lengths - 1).clamp(min=0)
        rows = torch.arange(self.batch)
        return torch.where(
            self.has_steps, self.row(last, rows, packed), self.rows(packed)
        )


def with_zero_row(t):
    """`t` of shape `(n, size)` with a row of zeros appended, so that
    gathering row `n` reads zeros. On a CPU a concatenation and a gather
    cost less than a gather and a masked fill, and read no padding at
    all."""
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
    """Runs one direction of a masked batch on PyTorch's kernel, from and
    back to the caller's order: gather the valid steps, run the kernel, put
    the outputs in place. The torch-only twin of `direction.run` followed by
    the placement the layer asks for (the same results: tests/
    test_torch_kernels.py and the parity tests, with and without gradients).

    Call only when `unavailable_reason(inner, x)` is None.

    Args:
        inner: The inner LSTM, GRU or SimpleRNN layer.
        x: Float tensor `(batch, time, features)` in the caller's order; its
            padded steps are never read (their gradient is zero).
        initial_state: List of `(batch, units)` tensors (`[h, c]` for an
            LSTM, `[h]` otherwise), or None for zeros.
        layout: The batch's `Layout`.
        reverse: Bool, whether this direction reads each row's valid steps
            last to first (a bidirectional layer's backward direction).
            Defaults to `False`.
        place: Where the outputs go, in the caller's order: `"zeros"` (each
            valid step's own output, zeros at masked steps: the
            `Bidirectional` convention, `direction.in_place`), `"held"`
            (Keras' `RNN` convention, `direction.held`; forward reading
            only), `"last"`
            (the output after each row's last valid step, zeros for a row
            with none: `direction.last_output`). Defaults to `"zeros"`.
        packed: Bool: the packed kernel (only the valid steps run, final
            states exact from the kernel; for inference,
            `packed_preferred`) or the unpacked one over valid-first data
            (final `h` read at each row's length, an LSTM's `c` the
            kernel's own, its padded steps made no-ops for `c` by
            `saturated_lstm`). Defaults to `False`.
        want_states: Bool, whether to return the final states (the unpacked
            form skips their work otherwise). Defaults to `True`.

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
        # No row has a valid step: no kernel call, zeros and the initial
        # states (packed runs record no gradient, `packed_preferred`).
        shape = (batch, units) if place == "last" else (batch, time, units)
        return x.new_zeros(shape), states if want_states else []
    x = x.reshape(batch * time, x.shape[2])
    index = layout.read_index(packed, reverse)
    if packed:
        # Only valid steps are read.
        data = x.index_select(0, index)
        # PyTorch's states are (num_layers * num_directions, rows, units),
        # for the rows that have at least one step.
        active = layout.active
        hx = [state.index_select(0, active)[None] for state in states]
        params, fn, hx = torch_kernels._kernel(inner, hx)
        # Packed form: (data, batch_sizes, hx, params, *flags).
        out, *final = fn(
            data, layout.batch_sizes, hx, params, *torch_kernels._flags(cell)
        )
        # Final states of the active rows into their places; the others
        # keep their initial state.
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
            # h is the output after each row's last valid step (the initial
            # h for an empty row); an LSTM's c is the kernel's own.
            has_steps = layout.has_steps[:, None]
            h = out.index_select(0, layout.last_index(False))
            states = [torch.where(has_steps, h, states[0])] + (
                [torch.where(has_steps, c, states[1])] if saturate else []
            )
    if not want_states:
        states = []
    if place == "last":
        # An RNN's output is its h: the output after the last valid step.
        return out.index_select(0, layout.last_index(packed)), states
    y = out.index_select(0, layout.place_index(place, packed, reverse))
    return y.reshape(batch, time, units), states


# Added to the forget gate's pre-activation at a padded step by
# `saturated_lstm` (and subtracted from the input gate's). Any value that
# dwarfs `|h @ W_hh + b|` there (the input is zero, |h| < 1) saturates both
# sigmoids; 1e15 leaves a margin of 1e14 for the weights in float32,
# float64 and bfloat16 and keeps finite the gradient PyTorch computes for
# the padding flag (which is discarded). float16 (the weights' values under
# a mixed-precision outer layer's autocast) ends at 65504: 1e4 there, still
# exactly 0 at a valid step (0 * 1e4) and a margin of 9e3 at a padded one.
