"""PyTorch's native RNN kernels for the masked layers on the torch backend.

Keras' torch backend hands an unmasked `LSTM`/`GRU` to PyTorch's fused kernel
(`torch.lstm`/`torch.gru`, cuDNN) on CUDA only. On a CPU it steps through time
in Python (`keras/src/backend/torch/rnn.py`, `_fallback_lstm`: a matmul and a
few elementwise ops per step, each dispatched separately), and `SimpleRNN`
always runs Keras' generic loop. PyTorch's own kernels do the same arithmetic
in C++; at the CPU benchmark's sizes (B=32 T=100 D=U=64) that makes the
layer 4.9x / 3.1x faster than Keras' unmasked loop for LSTM and 2.6x / 1.8x
for GRU, fwd+bwd / fwd (`scripts/bench_cpu.sh torch-lstm torch-gru`, results
in docs/results/cpu-torch-{lstm,gru}.json and docs/benchmarks.md). So on
the torch backend, on CPU, `MaskedBidirectional` and `MaskedRNN` call them
directly for each direction (`maskedrnn.layers.kernels`). The outputs are
the same function of the same weights (PyTorch's LSTM and reset-after GRU
equations are Keras'; only the GRU gate order differs, see `_gru_params`),
so gradients reach the Keras variables through PyTorch's autograd. One
exception to "PyTorch's kernel": a GRU or SimpleRNN whose gradients are
recorded runs `GRUFunction` / `SimpleRNNFunction`, the same equations in
torch ops with a cheaper backward pass than the autograd replay of
`torch.gru`'s / `torch.rnn_tanh`'s per-step ops (`autograd_function`).

The same direction logic as `maskedrnn.layers.direction` (valid steps
first, reversed by each row's own length for a backward direction, padding
never read, outputs placed back by Keras' conventions), written in torch
ops for these kernels: `run_direction` takes the batch in the caller's order
and a `Layout` of its mask, and does the whole direction in about a dozen
torch ops around the kernel (the Keras-ops path costs about fifty dispatches,
over a millisecond on eager torch). `run` serves callers that already hold
valid-first data.

Nothing is tried and caught. `unavailable_reason` checks every condition up
front and says in words why a call cannot use these kernels; the layer then
calls its Keras inner layer as on the other backends (exact as well, slower
on CPU), and `MaskedBidirectional.kernel_info()` reports which path runs.
"""

import functools
import weakref

import keras
import torch

from maskedrnn.convert.gate_layout import swap_gru_zr

LSTM, GRU, SimpleRNN = keras.layers.LSTM, keras.layers.GRU, keras.layers.SimpleRNN
_SIGMOID = (keras.activations.sigmoid, torch.sigmoid, keras.ops.sigmoid)
_TANH = (keras.activations.tanh, torch.tanh, keras.ops.tanh)
_RELU = (keras.activations.relu, torch.relu, keras.ops.relu)


def unavailable_reason(inner, where):
    """Why `inner` cannot run on PyTorch's native kernel here, or None if it can.

    Args:
        inner: The inner RNN layer (built).
        where: Where the data is: a tensor or Keras variable (its device), a
            `torch.device`, or a device string such as `"cpu"` or `"cuda"`.

    Returns:
        None when `run` may be called; otherwise a sentence naming the
        condition that fails and what runs instead.
    """
    kind = type(inner)
    if kind not in (LSTM, GRU, SimpleRNN):
        return (
            f"{kind.__name__} has no PyTorch kernel (LSTM, GRU and SimpleRNN do)"
        )
    device_type = _device_type(where)
    if device_type == "cuda":
        return (
            "on CUDA, Keras' backend already calls PyTorch's cuDNN kernel for "
            "an unmasked LSTM/GRU"
        )
    if device_type != "cpu":
        return f"inputs are on a {device_type!r} device, not the CPU"
    if getattr(inner, "use_cudnn", "auto") is False:
        return "the inner layer has use_cudnn=False, which asks for Keras' loop"
    compiling = getattr(torch.compiler, "is_compiling", lambda: False)
    if torch.jit.is_tracing() or compiling():
        return "inside torch.jit tracing or torch.compile, Keras' loop is traced"
    cell = inner.cell
    if cell.recurrent_dropout:
        return "recurrent_dropout > 0 (PyTorch's kernels have none)"
    if inner.activity_regularizer is not None:
        return "the inner layer has an activity_regularizer (applied by Keras' call)"
    if cell.variable_dtype not in ("float32", "float64") or (
        cell.compute_dtype != cell.variable_dtype
    ):
        return (
            f"dtype policy {cell.dtype_policy.name!r}: the native path is used "
            "for float32 and float64 only"
        )
    if kind is SimpleRNN:
        if cell.activation not in _TANH + _RELU:
            return "SimpleRNN activation is not tanh or relu"
        return None
    if cell.activation not in _TANH or cell.recurrent_activation not in _SIGMOID:
        return "activation must be tanh and recurrent_activation sigmoid"
    if kind is GRU and not cell.reset_after:
        return "GRU with reset_after=False (PyTorch's GRU is reset-after)"
    return None


def _device_type(where):
    """`"cpu"`, `"cuda"`, `"meta"`, ... for a device, tensor or variable."""
    if isinstance(where, keras.Variable):
        where = where.value
    if isinstance(where, str):
        where = torch.device(where)
    if isinstance(where, torch.device):
        return where.type
    if isinstance(where, torch.Tensor):
        return where.device.type
    return _tensor(where).device.type  # numpy or lists: where Keras puts them


def packed_preferred(inner):
    """Whether `run` should use the packed kernel for `inner` now: when no
    gradient is being recorded (inference) and `inner` is a GRU or
    SimpleRNN, with or without final states (an LSTM's exact final states
    come from its unpacked kernel, `saturated_lstm`).

    PyTorch's packed CPU kernels skip the padded steps and return exact
    final states, but their backward pass is slower than the unpacked
    kernels', and an unpacked LSTM runs PyTorch's fused oneDNN kernel,
    which the packed one does not (the CPU benchmark, B=32 T=100 D=U=64,
    38% padding, one thread, `torch_packed` / `torch_unpacked` in
    docs/results/cpu-torch-rnn-{lstm,gru}.json: `nn.LSTM` fwd+bwd 23.8 /
    4.8 ms, fwd 4.3 / 1.4 ms; `nn.GRU` fwd+bwd 20.2 / 13.5 ms, fwd 3.1 /
    3.4 ms). So training runs the unpacked kernel over the zero-padded
    valid-first data (a GRU's is `GRUFunction`, 11.8 ms for the whole
    layer there), and so does every LSTM call: with its final states
    wanted, the padded steps are made to leave the cell state untouched
    (`saturated_lstm`), so the kernel's own final `c` is exact; `h` is
    read at each row's length. A GRU's or SimpleRNN's inference runs
    packed (their packed kernel is the faster one there).
    """
    if torch.is_grad_enabled():
        return False
    return type(inner) is not LSTM


def run(inner, x, initial_state, lengths, packed, want_states=False):
    """Runs `inner` over valid-first `x` with PyTorch's kernel.

    Call only when `unavailable_reason(inner, x.device)` is None.

    With `packed=True` only the valid steps run: they are packed as
    `torch.nn.utils.rnn.pack_padded_sequence` packs them (time-major, rows
    sorted by decreasing length, `batch_sizes[t]` rows at step `t`) and the
    kernel's packed form returns the states after each row's last valid step,
    exact, as `nn.LSTM` does on a `PackedSequence`. With `packed=False` the
    kernel runs over every step of `x` (whose padded tail the caller has
    zeroed); with `want_states` it returns the states after each row's last
    valid step too (`h` read off the outputs, an LSTM's `c` from the
    kernel, its padded steps made no-ops for `c` by `saturated_lstm`).

    Args:
        inner: The inner LSTM, GRU or SimpleRNN layer.
        x: Float tensor `(batch, time, features)`, valid-first: row `i`'s
            `lengths[i]` valid steps first, in the order the direction reads
            them; no mask. With `packed` or `want_states` its padded tail
            is never read (its gradient is zero); otherwise the kernel reads
            it, so the caller zeroes it.
        initial_state: List of `(batch, units)` tensors: `[h, c]` for an
            LSTM, `[h]` otherwise.
        lengths: Integer tensor `(batch,)` in `[0, time]`.
        packed: Python bool, see above (`packed_preferred`).
        want_states: Python bool, whether the unpacked form returns the
            final states (the packed form always does). Defaults to `False`.

    Returns:
        `(outputs, states)`: the output sequence `(batch, time, units)` (`h_t`
        at each valid step, zeros after it) and the list of states after
        each row's last valid step (the initial state for a row with no
        valid step), or None when neither `packed` nor `want_states`.
    """
    if packed or want_states:
        layout = Layout.from_lengths(lengths, x.shape[1])
        return _direction(inner, x, initial_state, layout, False, "zeros", packed, True)
    dtype = _tensor(inner.cell.kernel).dtype
    x = _tensor(x).to(dtype)
    states = [_tensor(state).to(dtype) for state in initial_state]
    return _unpacked(inner, x, states), None


def autograd_function(inner):
    """The `torch.autograd.Function` that runs the unpacked kernel for
    `inner` now, or None for PyTorch's own kernel function: while gradients
    are recorded, `GRUFunction` for a GRU and `SimpleRNNFunction` for a
    SimpleRNN (the same equations with a cheaper backward pass; PyTorch's
    LSTM training kernel is its fused oneDNN one, faster than either)."""
    if not torch.is_grad_enabled():
        return None
    return {GRU: GRUFunction, SimpleRNN: SimpleRNNFunction}.get(type(inner))


def _unpacked(inner, data, states):
    """The outputs `(batch, time, units)` of the unpacked kernel over
    `data` `(batch, time, features)` from `states` (a list of `(batch,
    units)` tensors). With gradients recorded a GRU or SimpleRNN runs its
    `autograd_function` (the same equations, a cheaper backward pass)."""
    cell = inner.cell
    # PyTorch's states are (num_layers * num_directions, batch, units).
    params, fn, hx = _kernel(inner, [state[None] for state in states])
    function = autograd_function(inner)
    if function is not None and data.numel():
        biases = params[2:] if cell.use_bias else [None, None]
        args = (data, states[0], params[0], params[1], *biases)
        if function is SimpleRNNFunction:
            args += (fn is torch.rnn_relu,)
        return function.apply(*args)
    # Unpacked form: (input, hx, params, *flags, batch_first).
    return fn(data, hx, params, *_flags(cell), True)[0]


def _flags(cell):
    """The arguments both kernel forms take after `params`."""
    return (
        cell.use_bias,  # has_biases: params holds biases only then
        1,  # num_layers
        0.0,  # dropout between layers (one layer: none)
        torch.is_grad_enabled(),  # train: keep what backward needs
        False,  # bidirectional: one direction per call
    )


def _kernel(inner, hx):
    """`(params, torch function, hx)` for `inner`; `hx` a list of
    `(1, rows, units)` states."""
    cell = inner.cell
    kind = type(inner)
    if kind is LSTM:
        return _params(cell, _plain_params), torch.lstm, tuple(hx)
    if kind is GRU:
        return _params(cell, _gru_params), torch.gru, hx[0]
    fn = torch.rnn_tanh if cell.activation in _TANH else torch.rnn_relu
    return _params(cell, _plain_params), fn, hx[0]


# cell -> {make: (source tensors, their versions, params)}: the kernel's
# params made without gradients by `make`, kept while the weights are
# unchanged (an LSTM's params have two forms: `_plain_params` and
# `_saturated_lstm_params`).
_NO_GRAD_PARAMS = weakref.WeakKeyDictionary()


def _params(cell, make):
    """`make(cell)`, the kernel's params in PyTorch's layout.

    With gradients recorded they are made on every call (autograd must
    connect them to the Keras variables). Without (inference), they are
    made once and reused while every weight tensor is the same object at
    the same version: PyTorch bumps a tensor's `_version` on each in-place
    write, which is how Keras assigns a variable (`assign`, `set_weights`,
    optimizer steps), so changed weights are never missed. This saves the
    transposes (and the GRU's gate reorder) on each inference call.
    """
    if torch.is_grad_enabled():
        return make(cell)
    sources = [_tensor(cell.kernel), _tensor(cell.recurrent_kernel)]
    if cell.use_bias:
        sources.append(_tensor(cell.bias))
    versions = [t._version for t in sources]
    kept = _NO_GRAD_PARAMS.setdefault(cell, {})
    cached = kept.get(make)
    if (
        cached is not None
        and all(a is b for a, b in zip(cached[0], sources))
        and cached[1] == versions
    ):
        return cached[2]
    params = make(cell)
    kept[make] = (sources, versions, params)
    return params


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

    def __init__(self, mask):
        mask = _tensor(mask).to(torch.bool)
        self.batch, self.time = mask.shape[0], mask.shape[1]
        self.mask = mask
        # count[b, t]: valid steps of row b at or before t.
        self.count = torch.cumsum(mask, 1)
        self.lengths = self.count[:, -1]
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

    @classmethod
    def from_lengths(cls, lengths, time):
        """Right-padded data: row `i` has `lengths[i]` valid steps first."""
        lengths = _tensor(lengths).to("cpu", torch.int64)
        return cls(torch.arange(time)[None, :] < lengths[:, None])

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
        steps (`reverse` as in `read_index`). `"held"` / `"held_zeros"`
        (forward reading only): Keras' `RNN` convention, the output of the
        last valid step at or before each step, zeros before a row's first
        valid step and, for `"held_zeros"`, at every masked step.
        """
        if place == "zeros":
            rank = self.lengths[:, None] - self.count if reverse else self.count - 1
            keep = self.mask
        else:
            rank = self.count - 1
            keep = rank >= 0
            if place == "held_zeros":
                keep = keep & self.mask
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
    cost less than a gather and a masked fill (96 against 115 us forward
    and backward for 3200 x 64 floats), and read no padding at all."""
    return torch.cat([t, t.new_zeros((1, t.shape[1]))])


_PLACES = ("zeros", "held", "held_zeros", "last")


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
            `Bidirectional` convention, `direction.in_place`), `"held"` or
            `"held_zeros"` (Keras' `RNN` convention, `direction.held`, without
            and with `zero_output_for_mask`; forward reading only), `"last"`
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
    dtype = _tensor(cell.kernel).dtype
    units = _tensor(cell.recurrent_kernel).shape[0]
    batch, time = layout.batch, layout.time
    x = _tensor(x).to(dtype)
    if initial_state is None:
        sizes = 2 if type(inner) is LSTM else 1
        states = [x.new_zeros((batch, units)) for _ in range(sizes)]
    else:
        states = [_tensor(state).to(dtype) for state in initial_state]
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
        params, fn, hx = _kernel(inner, hx)
        # Packed form: (data, batch_sizes, hx, params, *flags).
        out, *final = fn(data, layout.batch_sizes, hx, params, *_flags(cell))
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
            out, c = saturated_lstm(inner, data, states)
        else:
            out = _unpacked(inner, data, states)
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
_SATURATION = 1e15
_SATURATION_FLOAT16 = 1e4


def with_padding_row(t):
    """`t` of shape `(n, features)` with a zero column appended (the padding
    flag) and then the row `[0, ..., 0, 1]`: gathering row `n` reads a
    padded step, zeros with the flag set (`saturated_lstm`)."""
    padded = torch.nn.functional.pad(t, (0, 1, 0, 1))
    padded[-1, -1] = 1.0
    return padded


def saturated_lstm(inner, data, states):
    """An LSTM over valid-first `data` whose padded steps leave `c` as it is,
    so that the unpacked (fused oneDNN) kernel's final `c` is the cell state
    after each row's last valid step, exact.

    The cell update is `c_t = f_t * c_{t-1} + i_t * g_t`. `data` has one
    feature more than the layer reads, the padding flag (1 at a padded
    step, 0 at a valid one: `with_padding_row`), and `W_ih` one column
    more: `+_SATURATION` for the forget gate, `-_SATURATION` for the input
    gate, 0 for the others (`_saturated_lstm_params`). At a valid step the
    flag adds exactly zero: gates, outputs and states are the LSTM's own.
    At a padded step the forget gate's sigmoid is exactly 1 and the input
    gate's exactly 0 (or a denormal, below the rounding of any `c`), so
    `c_t = c_{t-1}`: the tail carries each row's `c` to the end unchanged,
    and no gradient flows into the tail's gates (both sigmoid derivatives
    are 0 there). Only `c` passes through: `h` over the tail is not the
    row's final `h`, which is read off the outputs. The price is one input
    feature (at the CPU benchmark's size the layer's forward pass takes 2.6
    ms with states against 2.4 without, docs/results/cpu-torch-rnn-lstm*.
    json); the alternatives cost more (PyTorch's packed LSTM, 1.5-2.9x
    this in inference; a second pass over every step to recompute `c`,
    1.6-2.7x this in training: scripts/torch_lstm_state_paths.py,
    docs/results/torch-lstm-state-paths.txt).

    Args:
        inner: The inner LSTM layer.
        data: Float tensor `(batch, time, features + 1)`, valid-first, its
            last feature the padding flag, the padded steps' other
            features zero.
        states: `[h0, c0]`, `(batch, units)` each.

    Returns:
        `(outputs, c)`: the output sequence `(batch, time, units)` (over
        the padded tail: not the LSTM's outputs, never to be read) and the
        kernel's final `c` `(batch, units)`.
    """
    params = _params(inner.cell, _saturated_lstm_params)
    hx = (states[0][None], states[1][None])
    # Unpacked form: (input, hx, params, *flags, batch_first).
    out, _, c = torch.lstm(data, hx, params, *_flags(inner.cell), True)
    return out, c[0]


def _tensor(value):
    """The torch tensor of a Keras variable (its `.value`: autocast and
    stateless scopes apply, as in `keras.ops.convert_to_tensor`) or of a
    tensor. Tensors reaching this module were converted by the layer's
    checks already (on Keras' device), so they pass as they are: the
    generic conversion costs a few microseconds per call, about ten times
    per direction."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, keras.Variable):
        return value.value
    return keras.ops.convert_to_tensor(value)


def _plain_params(cell):
    """`[W_ih, W_hh(, b_ih, b_hh)]` of `torch.lstm` / `torch.rnn_tanh` /
    `torch.rnn_relu` from a Keras LSTMCell or SimpleRNNCell.

    LSTM. Keras: kernel `(D, 4U)`, recurrent_kernel `(U, 4U)`, bias `(4U,)`,
    gates ordered i, f, c, o along the last axis. PyTorch: W_ih `(4U, D)`,
    W_hh `(4U, U)`, b_ih and b_hh `(4U,)`, gates i, f, g, o: the same order,
    so the matrices are only transposed.
    SimpleRNN. Keras: kernel `(D, U)`, recurrent_kernel `(U, U)`, bias
    `(U,)`; PyTorch: the transposes, b_ih and b_hh `(U,)`.
    Keras has one bias: it becomes b_ih, and b_hh is zero.
    """
    params = [_tensor(cell.kernel).T.contiguous()]
    params.append(_tensor(cell.recurrent_kernel).T.contiguous())
    if cell.use_bias:
        bias = _tensor(cell.bias)
        params += [bias, torch.zeros_like(bias)]
    return params


def _saturated_lstm_params(cell):
    """`_plain_params` of an LSTMCell with one column appended to `W_ih`
    `(4U, D)` -> `(4U, D + 1)`, the weights of `saturated_lstm`'s padding
    flag: per gate block (PyTorch's and Keras' order i, f, g, o)
    `-_SATURATION`, `+_SATURATION`, 0, 0. A constant: no gradient reaches it
    (the other weights get theirs through `_plain_params`)."""
    params = _plain_params(cell)
    w_ih = params[0]
    units = w_ih.shape[0] // 4
    flag = w_ih.new_zeros((4, units))
    value = _SATURATION_FLOAT16 if w_ih.dtype == torch.float16 else _SATURATION
    flag[0] = -value  # input gate i: sigmoid -> 0, no new input
    flag[1] = value  # forget gate f: sigmoid -> 1, c kept
    params[0] = torch.cat([w_ih, flag.reshape(4 * units, 1)], 1)
    return params


def _swap_zr(w):
    # Keras GRU gate blocks z, r, h on the last axis -> PyTorch's r, z, n: the
    # one definition of this permutation lives with the weight converters.
    return swap_gru_zr(w, -1, torch.chunk, torch.cat)


def _gru_params(cell):
    """`[W_ih, W_hh(, b_ih, b_hh)]` of `torch.gru` from a Keras GRUCell with
    `reset_after=True`.

    Keras: kernel `(D, 3U)`, recurrent_kernel `(U, 3U)`, gates z, r, h along
    the last axis; bias `(2, 3U)`, row 0 the input bias and row 1 the
    recurrent bias (reset-after keeps them apart because the reset gate
    multiplies `h @ W_hh + b_hh`, exactly as in PyTorch). PyTorch: W_ih
    `(3U, D)`, W_hh `(3U, U)`, b_ih and b_hh `(3U,)`, gates r, z, n. So each
    block is reordered z, r, h -> r, z, h, then the matrices transposed.
    """
    params = [_swap_zr(_tensor(cell.kernel)).T.contiguous()]
    params.append(_swap_zr(_tensor(cell.recurrent_kernel)).T.contiguous())
    if cell.use_bias:
        bias = _swap_zr(_tensor(cell.bias))
        params += [bias[0], bias[1]]
    return params


def _recurrent_weight_grad(d, h0, y):
    """The gradient of `W_hh` in `h_{t-1} W_hh^T`: the sum over steps of
    `d_t^T h_{t-1}`, from `d` `(time * batch, gates * units)` (time-major)
    and the states `h0` `(batch, units)` and `y` `(time, batch, units)`
    (`h_{-1} = h0`, `h_{t-1} = y_{t-1}`): two matmuls over all steps."""
    batch, units = h0.shape
    grad = d[:batch].t().mm(h0)
    return grad.addmm_(d[batch:].t(), y[:-1].reshape(-1, units))


class GRUFunction(torch.autograd.Function):
    """One GRU direction for training on a CPU: PyTorch's equations, a
    backward pass with one small matmul per step.

    `torch.gru` records its steps for autograd op by op, and its backward
    pass replays them: per step two small matmuls (the gradients of the
    previous state and of the recurrent weights) and about twenty more
    ops. This forward pass runs the same equations step by step in torch
    ops and keeps the gates; the backward pass then computes each step's
    local derivatives for all steps at once (a few elementwise ops over
    the whole sequence), runs only the recurrence of the state's gradient
    backwards (per step an elementwise product, an `addcmul` and one
    `(batch, 3 units) x (3 units, units)` matmul) and gets the gradients
    of the weights and the inputs with one matmul each over all steps.
    At the CPU benchmark's size (B=32 T=100 D=U=64, 38% padding, one
    thread) a whole training step of `MaskedRNN(GRU)` or
    `MaskedBidirectional(GRU)` takes 0.79-0.88 of unpacked `nn.GRU`'s over
    the same padded batch (`maskedrnn/torch_unpacked`,
    fwd+bwd, docs/results/cpu-torch-{gru,rnn-gru*}.json), where with
    `torch.gru` it took 1.10; the direction alone takes 0.72 of `torch.gru`
    unpacked's time there, and 0.36-0.92 at six other sizes
    (scripts/torch_gru_paths.py, docs/results/torch-gru-paths.txt).

    Equations (PyTorch's gate order r, z, n; `*` elementwise; `h_{-1}`
    the initial state):

        gi_t = x_t W_ih^T + b_ih,  gh_t = h_{t-1} W_hh^T + b_hh
        r_t = sigmoid(gi_r + gh_r),  z_t = sigmoid(gi_z + gh_z)
        n_t = tanh(gi_n + r_t * gh_n)
        h_t = n_t + z_t * (h_{t-1} - n_t)

    Backward, with `dh_t` the whole gradient reaching `h_t` (from the
    output `y_t = h_t` and from step `t + 1`) and `a_t = (1 - z_t)(1 -
    n_t^2)`:

        d gh_r = dh_t * a_t * gh_n * r_t (1 - r_t)
        d gh_z = dh_t * (h_{t-1} - n_t) * z_t (1 - z_t)
        d gh_n = dh_t * a_t * r_t,      d gi_n = dh_t * a_t
        d gi_r, d gi_z = d gh_r, d gh_z
        dh_{t-1} = dy_{t-1} + dh_t * z_t + d gh_t W_hh

    Its backward pass is not differentiable again (`once_differentiable`):
    a second derivative through it raises an error, never a wrong number.

    `GRUFunction.apply(x, h0, w_ih, w_hh, b_ih, b_hh)`: `x` `(batch, time,
    features)` with `batch, time > 0`, `h0` `(batch, units)`, the weights
    in PyTorch's layout (`_gru_params`), the biases None without biases.
    Returns the outputs `(batch, time, units)`.
    """

    @staticmethod
    def forward(ctx, x, h0, w_ih, w_hh, b_ih, b_hh):
        batch, time, features = x.shape
        units = h0.shape[1]
        # Time-major from here on: step t is one contiguous block.
        xt = x.transpose(0, 1).reshape(time * batch, features)
        w_ih_t, w_hh_t = w_ih.t(), w_hh.t()
        gi = xt.mm(w_ih_t) if b_ih is None else torch.addmm(b_ih, xt, w_ih_t)
        # Few large buffers: on a CPU each fresh one costs page faults, about
        # a tenth of the step at the benchmark's size. Each step overwrites
        # its block of gi with its gates r | z | n once read; of the hidden
        # side h_{t-1} W_hh^T + b_hh (one reused (batch, 3 units) block) the
        # backward pass needs only the n part, kept in gh_n.
        gates = gi.view(time, batch, 3 * units)
        gh = x.new_empty(batch, 3 * units)
        gh_rz, gh_n_t = gh[:, : 2 * units], gh[:, 2 * units :]
        gh_n = x.new_empty(time, batch, units)
        y = x.new_empty(time, batch, units)
        h = h0
        for g_t, n_keep, y_t in zip(gates.unbind(0), gh_n.unbind(0), y.unbind(0)):
            if b_hh is None:
                torch.mm(h, w_hh_t, out=gh)
            else:
                torch.addmm(b_hh, h, w_hh_t, out=gh)
            rz_t = g_t[:, : 2 * units]
            rz_t.add_(gh_rz).sigmoid_()
            n_t = g_t[:, 2 * units :]
            n_t.addcmul_(rz_t[:, :units], gh_n_t).tanh_()
            n_keep.copy_(gh_n_t)
            # n + z * (h - n)
            h = torch.lerp(n_t, h, rz_t[:, units:], out=y_t)
        ctx.save_for_backward(xt, h0, w_ih, w_hh, y, gates, gh_n)
        ctx.has_biases = b_ih is not None
        return y.transpose(0, 1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y):
        xt, h0, w_ih, w_hh, y, gates, gh_n = ctx.saved_tensors
        time, batch, units = y.shape
        r, z = gates[..., :units], gates[..., units : 2 * units]
        n = gates[..., 2 * units :]
        # Each step's local derivatives, all steps at once; `coef[t]` holds
        # d gh_t / dh_t for the blocks r, z, n.
        coef = y.new_empty(time, batch, 3, units)
        one_minus = torch.sub(1, z)
        a = torch.mul(n, n).neg_().add_(1).mul_(one_minus)  # (1-z)(1-n^2)
        # z: (h_{t-1} - n) z (1 - z), with h_{-1} = h0 and h_{t-1} = y_{t-1}
        torch.sub(y[:-1], n[1:], out=coef[1:, :, 1])
        torch.sub(h0, n[0], out=coef[0, :, 1])
        coef[:, :, 1].mul_(z).mul_(one_minus)
        # r: a gh_n r (1 - r); n: a r
        one_minus = torch.addcmul(r, r, r, value=-1, out=one_minus)
        torch.mul(a, gh_n, out=coef[:, :, 0]).mul_(one_minus)
        torch.mul(a, r, out=coef[:, :, 2])
        del one_minus
        # The recurrence: dh[t] is the whole gradient reaching h_t; coef[t]
        # becomes d gh_t = coef[t] * dh[t] (in place: read once).
        grad_y = grad_y.transpose(0, 1)
        dh = y.new_empty(time, batch, units)
        dh[-1] = grad_y[-1]
        dh_t, dgh_t = dh.unbind(0), coef.unbind(0)
        z_t, grad_t = z.unbind(0), grad_y.unbind(0)
        for t in range(time - 1, 0, -1):
            dgh_t[t].mul_(dh_t[t][:, None])
            torch.addcmul(grad_t[t - 1], dh_t[t], z_t[t], out=dh_t[t - 1])
            dh_t[t - 1].addmm_(dgh_t[t].view(batch, 3 * units), w_hh)
        dgh_t[0].mul_(dh_t[0][:, None])
        dgh = coef.view(time * batch, 3 * units)
        grad_h0 = torch.mul(dh_t[0], z_t[0]).addmm_(dgh[:batch], w_hh)
        # The input side's gate gradients: r and z as the hidden side's
        # (dgh's first two blocks), n without the reset gate (in a's memory).
        dgi_rz = dgh[:, : 2 * units]
        dgi_n = a.mul_(dh).view(time * batch, units)
        grad_x = grad_w_ih = grad_w_hh = grad_b_ih = grad_b_hh = None
        if ctx.needs_input_grad[0]:
            # dgi W_ih, split along W_ih's rows r | z and n
            grad_x = dgi_rz.mm(w_ih[: 2 * units]).addmm_(dgi_n, w_ih[2 * units :])
            grad_x = grad_x.view(time, batch, -1).transpose(0, 1)
        if ctx.needs_input_grad[2]:
            # dgi^T x, the same split
            grad_w_ih = w_ih.new_empty(w_ih.shape)
            torch.mm(dgi_rz.t(), xt, out=grad_w_ih[: 2 * units])
            torch.mm(dgi_n.t(), xt, out=grad_w_ih[2 * units :])
        if ctx.needs_input_grad[3]:
            grad_w_hh = _recurrent_weight_grad(dgh, h0, y)
        if ctx.has_biases:
            grad_b_ih = torch.cat([dgi_rz.sum(0), dgi_n.sum(0)])
            grad_b_hh = dgh.sum(0)
        return grad_x, grad_h0, grad_w_ih, grad_w_hh, grad_b_ih, grad_b_hh


class SimpleRNNFunction(torch.autograd.Function):
    """One SimpleRNN direction for training on a CPU: PyTorch's equations
    (`torch.rnn_tanh` / `torch.rnn_relu`), a backward pass with one small
    matmul per step.

    As `GRUFunction`: the forward pass runs the steps in torch ops (the
    input projections of all steps in one matmul, per step one `addmm_`
    and the activation in place) and keeps the outputs; the backward pass
    runs only the recurrence of the state's gradient step by step (per
    step an elementwise product and one `(batch, units) x (units, units)`
    matmul) and gets the gradients of the weights and the inputs with one
    matmul each over all steps, where autograd's replay of `torch.rnn_tanh`
    runs several ops and two matmuls per step. One thread: 0.66 (tanh) /
    0.70 (relu) of PyTorch's kernel's fwd+bwd time at B=32 T=100 D=U=64,
    0.38-0.97 at six other sizes (scripts/torch_rnn_paths.py,
    docs/results/torch-rnn-paths.txt).

    Equations (`h_{-1}` the initial state, `f` tanh or relu):

        h_t = f(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)

    Backward, with `dh_t` the whole gradient reaching `h_t` (from the
    output `y_t = h_t` and from step `t + 1`) and `f'` read off the output
    (`1 - h_t^2` for tanh; `h_t > 0` for relu, as PyTorch's relu backward):

        d pre_t = dh_t * f'_t,   dh_{t-1} = dy_{t-1} + d pre_t W_hh

    Once differentiable, as `GRUFunction`.

    `SimpleRNNFunction.apply(x, h0, w_ih, w_hh, b_ih, b_hh, relu)`: `x`
    `(batch, time, features)` with `batch, time > 0`, `h0` `(batch,
    units)`, the weights in PyTorch's layout (`_plain_params`), the biases
    None without biases, `relu` a bool (False: tanh). Returns the outputs
    `(batch, time, units)`.
    """

    @staticmethod
    def forward(ctx, x, h0, w_ih, w_hh, b_ih, b_hh, relu):
        batch, time, features = x.shape
        units = h0.shape[1]
        # Time-major: step t is one contiguous block, which becomes h_t.
        xt = x.transpose(0, 1).reshape(time * batch, features)
        w_ih_t, w_hh_t = w_ih.t(), w_hh.t()
        if b_ih is None:
            y = xt.mm(w_ih_t)
        else:
            y = torch.addmm(b_ih + b_hh, xt, w_ih_t)
        y = y.view(time, batch, units)
        h = h0
        for y_t in y.unbind(0):
            h = y_t.addmm_(h, w_hh_t)
            h = h.relu_() if relu else h.tanh_()
        ctx.save_for_backward(xt, h0, w_ih, w_hh, y)
        ctx.has_biases, ctx.relu = b_ih is not None, relu
        return y.transpose(0, 1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y):
        xt, h0, w_ih, w_hh, y = ctx.saved_tensors
        time, batch, units = y.shape
        # f' of every step at once, in the buffer that becomes d pre.
        if ctx.relu:
            dpre = (y > 0).to(y.dtype)
        else:
            dpre = torch.mul(y, y).neg_().add_(1)
        grad_y = grad_y.transpose(0, 1)
        dh = grad_y[-1].clone()  # the whole gradient reaching h_t
        dpre_t, grad_t = dpre.unbind(0), grad_y.unbind(0)
        for t in range(time - 1, 0, -1):
            dpre_t[t].mul_(dh)
            torch.addmm(grad_t[t - 1], dpre_t[t], w_hh, out=dh)
        dpre_t[0].mul_(dh)
        grad_h0 = dpre_t[0].mm(w_hh)
        dpre = dpre.view(time * batch, units)
        grad_x = grad_w_ih = grad_w_hh = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = dpre.mm(w_ih).view(time, batch, -1).transpose(0, 1)
        if ctx.needs_input_grad[2]:
            grad_w_ih = dpre.t().mm(xt)
        if ctx.needs_input_grad[3]:
            grad_w_hh = _recurrent_weight_grad(dpre, h0, y)
        if ctx.has_biases:
            grad_b = dpre.sum(0)
        return grad_x, grad_h0, grad_w_ih, grad_w_hh, grad_b, grad_b, None
