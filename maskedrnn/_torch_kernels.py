"""PyTorch's native RNN kernels for the masked layers on the torch backend.

Keras' torch backend hands an unmasked `LSTM`/`GRU` to PyTorch's fused kernel
(`torch.lstm`/`torch.gru`, cuDNN) on CUDA only. On a CPU it steps through time
in Python (`keras/src/backend/torch/rnn.py`, `_fallback_lstm`: a matmul and a
few elementwise ops per step, each dispatched separately), and `SimpleRNN`
always runs Keras' generic loop. PyTorch's own kernels do the same arithmetic
in C++; at the CPU benchmark's sizes (B=32 T=100 D=U=64) that makes the
layer 4.3x / 2.4x faster than Keras' unmasked loop for LSTM and 1.9x / 1.1x
for GRU, fwd+bwd / fwd (`scripts/bench_cpu.sh torch-lstm torch-gru`, results
in docs/results/cpu-torch-{lstm,gru}.json and docs/benchmarks.md). So on
the torch backend, on CPU, `MaskedBidirectional` and `MaskedRNN` call them
directly for each direction (`maskedrnn.layers.kernels`), on the same
valid-first / reversed data as on every other path. The outputs are the same
function of the same weights (PyTorch's LSTM and reset-after GRU equations
are Keras'; only the GRU gate order differs, see `_gru_params`), so gradients
reach the Keras variables through PyTorch's autograd.

Nothing is tried and caught. `unavailable_reason` checks every condition up
front and says in words why a call cannot use these kernels; the layer then
calls its Keras inner layer as on the other backends (exact as well, slower
on CPU), and `MaskedBidirectional.kernel_info()` reports which path runs.
"""

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


def packed_preferred(inner, want_states):
    """Whether `run` should use the packed kernel for `inner` now: when no
    gradient is being recorded (inference), for a GRU or SimpleRNN, and for
    an LSTM whose final states are wanted.

    PyTorch's packed CPU kernels skip the padded steps and return exact final
    states, but their backward pass is slower than the unpacked kernels',
    and an unpacked LSTM runs PyTorch's fused oneDNN kernel, which the packed
    one does not (the CPU benchmark, B=32 T=100 D=U=64, 38% padding, one
    thread, `torch_packed` / `torch_unpacked` in
    docs/results/cpu-torch-rnn-*.json: `nn.LSTM` fwd+bwd 28.9 / 6.4 ms, fwd
    4.9 / 1.8 ms; `nn.GRU` fwd+bwd 24.1 / 16.8 ms, fwd 3.7 / 3.9 ms). So
    training runs the unpacked kernel over the zero-padded valid-first data
    (the caller then reads the states at each row's length, recomputing an
    LSTM's cell state), and so does an LSTM's inference without states;
    other inference runs packed (for an LSTM with states that is cheaper
    than the recomputation: 6.8 against 8.6 ms in the benchmark's forward
    pass).
    """
    if torch.is_grad_enabled():
        return False
    return type(inner) is not LSTM or want_states


def run(inner, x, initial_state, lengths, packed):
    """Runs `inner` over valid-first `x` with PyTorch's kernel.

    Call only when `unavailable_reason(inner, x.device)` is None.

    With `packed=True` only the valid steps run: they are packed as
    `torch.nn.utils.rnn.pack_padded_sequence` packs them (time-major, rows
    sorted by decreasing length, `batch_sizes[t]` rows at step `t`) and the
    kernel's packed form returns the states after each row's last valid step,
    exact, as `nn.LSTM` does on a `PackedSequence`. With `packed=False` the
    kernel runs over every step of `x` (whose padded tail the caller has
    zeroed) and returns no states.

    Args:
        inner: The inner LSTM, GRU or SimpleRNN layer.
        x: Float tensor `(batch, time, features)`, valid-first: row `i`'s
            `lengths[i]` valid steps first, in the order the direction reads
            them; no mask. With `packed=True` the padded tail is never read
            (its gradient is zero).
        initial_state: List of `(batch, units)` tensors: `[h, c]` for an
            LSTM, `[h]` otherwise.
        lengths: Integer tensor `(batch,)` in `[0, time]`.
        packed: Python bool, see above (`packed_preferred`).

    Returns:
        `(outputs, states)`: the output sequence `(batch, time, units)` (`h_t`
        at each valid step; zeros after it when packed, the kernel's values
        over the padding otherwise) and, when packed, the list of states
        after each row's last valid step (the initial state for a row with
        no valid step), else None.
    """
    cell = inner.cell
    dtype = _tensor(cell.kernel).dtype
    x = _tensor(x).to(dtype)
    states = [_tensor(state).to(dtype) for state in initial_state]
    if packed:
        return _run_packed(inner, x, states, lengths)
    # PyTorch's states are (num_layers * num_directions, batch, units).
    params, fn, hx = _kernel(inner, [state[None] for state in states])
    # Unpacked form: (input, hx, params, *flags, batch_first); x is
    # (batch, time, features).
    outputs = fn(x, hx, params, *_flags(cell), True)
    return outputs[0], None


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
        return _plain_params(cell), torch.lstm, tuple(hx)
    if kind is GRU:
        return _gru_params(cell), torch.gru, hx[0]
    fn = torch.rnn_tanh if cell.activation in _TANH else torch.rnn_relu
    return _plain_params(cell), fn, hx[0]


def _run_packed(inner, x, states, lengths):
    """`run(..., packed=True)` for `x` and `states` already in the weights'
    dtype."""
    cell = inner.cell
    batch, time = x.shape[0], x.shape[1]
    lengths = _tensor(lengths).to("cpu", torch.int64)
    # Rows by decreasing length; ties keep their order (any order would do).
    sorted_lengths, sorted_rows = torch.sort(lengths, descending=True, stable=True)
    steps = int(sorted_lengths[0]) if batch else 0
    units = _tensor(cell.recurrent_kernel).shape[0]
    if steps == 0:
        # No row has a valid step: no kernel call, zeros and the initial
        # states (the layers pack only when no gradient is recorded,
        # `packed_preferred`, so nothing needs to flow back from here).
        return x.new_zeros((batch, time, units)), states
    # packed[k] = x[row, t] for the k-th (t, row) pair, t-major, rows in
    # sorted order, kept while t < that row's length: PyTorch's packed layout.
    t = torch.arange(steps)
    flat = sorted_rows[None, :] * time + t[:, None]  # (steps, batch)
    keep = t[:, None] < sorted_lengths[None, :]
    index = flat[keep]
    batch_sizes = keep.sum(1)  # int64 on the CPU, as the kernel requires
    data = x.reshape(batch * time, x.shape[2]).index_select(0, index)
    # PyTorch's states are (num_layers * num_directions, rows, units), for
    # the rows that have at least one step (batch_sizes[0] of them).
    active = sorted_rows[: int(batch_sizes[0])]
    hx = [state.index_select(0, active)[None] for state in states]
    params, fn, hx = _kernel(inner, hx)
    # Packed form: (data, batch_sizes, hx, params, *flags).
    packed_out, *final = fn(data, batch_sizes, hx, params, *_flags(cell))
    # Back to (batch, time, units): each packed row to its (row, t) slot,
    # zeros at the padded steps.
    outputs = packed_out.new_zeros((batch * time, units)).index_copy(
        0, index, packed_out
    )
    # Final states of the active rows into their places; the others keep
    # their initial state.
    states = [
        state.index_copy(0, active, last[0]) for state, last in zip(states, final)
    ]
    return outputs.reshape(batch, time, units), states


def _tensor(variable):
    return keras.ops.convert_to_tensor(variable)


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
