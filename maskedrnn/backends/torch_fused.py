"""Every direction of a call in one PyTorch kernel call: the `"torch-fused"` way.

`run` hands both directions of a bidirectional LSTM or GRU to one
`torch._VF.lstm` / `torch._VF.gru` call with `bidirectional=True` (the one
fused cuDNN call Keras' unmasked `Bidirectional` makes on CUDA; on a CPU
PyTorch's own kernels compute the same equations), or the one direction of
a `MaskedRNN` to the one-direction form, over valid-first data: each row's
valid steps first, its padded tail zeros.

The padded tail is made to hold the state, so that no gather reverses a
row and no pass recomputes a state. The input gets one more feature, the
padding flag (1 at a padded step, 0 at a valid one), and `W_ih` one more
column, the flag's weights: `+_SATURATION` on an LSTM's forget gate and
`-_SATURATION` on its input gate (f = 1, i = 0, so `c_t = c_{t-1}`
exactly), `+_SATURATION` on a GRU's update gate (z = 1, so `h_t = h_{t-1}`,
to one rounding per padded step on PyTorch's CPU kernel, which computes
`(h - n) z + n`). At a valid step the flag adds exactly zero. Zero
columns (input and weights) follow the flag up to a multiple of `ALIGN`
input features: cuDNN's input GEMM keeps tensor cores for such widths
(D=512 would give 513), and zeros change no value and no gradient. Then:

- the forward direction reads each row's valid steps and then its tail:
  its outputs at the valid steps are exact, its final `h` is read at the
  row's last valid step (an LSTM's `h` is not held over the tail:
  `o * tanh(c)` changes with `o`), its final `c` is the kernel's own;
- the backward direction crosses the tail first, from the initial state,
  then reads the row's valid steps last to first: exact when the tail
  leaves its initial state as it is. A GRU's is held; an LSTM's `c` is
  held and, from a zero state, `h = o * tanh(0) = 0` too. An LSTM's given
  initial state is not held (`o * tanh(c0) != h0`): then the backward
  direction runs in its own one-direction call over its rows reversed by
  their lengths (`run` does this by itself; `kernel_info()` says so).

No host sync in the call: no `.item()`, `nonzero()`, `int(max)` or copy to
the CPU; the lengths stay on the device (tests/test_torch_fused.py checks
this on a CPU by making those calls raise).
"""

import torch

from maskedrnn.backends.gather import gather_time
from maskedrnn.backends.torch_kernels import (
    _SATURATION,
    _SATURATION_FLOAT16,
    GRU,
    LSTM,
    _params,
    _swap_zr,
    as_tensor,
)

KINDS = (LSTM, GRU)
# The kernel's input width (features, the flag, zero columns) is a multiple
# of this: cuDNN's GEMMs use tensor cores for such widths.
ALIGN = 8


def extra_columns(features):
    """How many zero columns follow the flag so that `features + 1 +
    extra_columns(features)` is a multiple of `ALIGN`."""
    return -(features + 1) % ALIGN


def compute_dtype(inner):
    """The torch dtype the kernel runs in: the inner layer's compute dtype
    (float16 or bfloat16 under a mixed-precision policy)."""
    return getattr(torch, inner.cell.compute_dtype)


def _fused_params(cell):
    """`[W_ih, W_hh(, b_ih, b_hh)]` of one direction, in PyTorch's layout and
    the cell's compute dtype, `W_ih` with the padding flag's column after
    the features' and then `extra_columns` zero columns.

    LSTM: Keras' gate order i, f, c, o is PyTorch's i, f, g, o; the flag's
    weights are `-S` (i), `+S` (f), 0, 0; Keras' one bias becomes `b_ih`,
    `b_hh` is zero. GRU (reset-after): Keras' z, r, h become PyTorch's r,
    z, n (`_swap_zr`); the flag's weights `+S` on z; the bias rows are
    `b_ih` and `b_hh`. `W_ih` costs one copy (two for a GRU: the gate
    reorder), `W_hh` one (the transpose cuDNN's weight buffer is filled
    from; a GRU's reorder in the same copy).
    """
    dtype = getattr(torch, cell.compute_dtype)
    kernel = as_tensor(cell.kernel).to(dtype)
    recurrent = as_tensor(cell.recurrent_kernel).to(dtype)
    units = recurrent.shape[0]
    value = _SATURATION_FLOAT16 if dtype == torch.float16 else _SATURATION
    # The flag's row, then the alignment's zero rows (`extra_columns`).
    flag = kernel.new_zeros((1 + extra_columns(kernel.shape[0]), kernel.shape[1]))
    lstm = recurrent.shape[1] == 4 * units
    if lstm:
        flag[0, :units] = -value  # input gate i: sigmoid -> 0
        flag[0, units : 2 * units] = value  # forget gate f: sigmoid -> 1
        w_ih = torch.cat([kernel.T, flag.T], 1)
        w_hh = recurrent.T.contiguous()
    else:
        flag[0, :units] = value  # update gate z: sigmoid -> 1
        w_ih = _swap_zr(torch.cat([kernel, flag], 0)).T.contiguous()
        w_hh = _swap_zr(recurrent).T.contiguous()
    params = [w_ih, w_hh]
    if cell.use_bias:
        bias = as_tensor(cell.bias).to(dtype)
        if lstm:
            params += [bias, torch.zeros_like(bias)]
        else:
            bias = _swap_zr(bias)
            params += [bias[0], bias[1]]
    return params


def run(inners, x, steps, initial_states, want_states):
    """Runs `inners` (one direction, or forward and backward) over
    valid-first `x` in one kernel call: `maskedrnn.backends`' `run_fused`
    contract.

    Args:
        inners: List of one or two built inner LSTMs or GRUs of the same
            type, units and bias (`fused_why`).
        x: Float `(batch, time, features)`, valid-first, zeros at padded
            positions.
        steps: The batch's `maskedrnn.steps.Steps`.
        initial_states: List, one per inner: its `[h, c]` / `[h]` or None.
        want_states: Bool, whether to return the final states.

    Returns:
        `(outputs, states)`: outputs `(batch, time, units * len(inners))`,
        aligned to valid-first positions (unspecified finite values at
        padded ones), and one list of final states per inner (`[]` each
        when `want_states` is False).
    """
    lstm = type(inners[0]) is LSTM
    if len(inners) == 2 and lstm and initial_states[1] is not None:
        return _in_two_calls(inners, x, steps, initial_states, want_states)
    dtype = compute_dtype(inners[0])
    x = as_tensor(x).to(dtype)
    batch, time = x.shape[0], x.shape[1]
    units = as_tensor(inners[0].cell.recurrent_kernel).shape[0]
    valid = as_tensor(steps.valid)
    # The padding flag: 1 at a padded step, 0 at a valid one; then zero
    # columns up to a multiple of ALIGN features.
    flag = torch.logical_not(valid).to(dtype)[..., None]
    extra = extra_columns(x.shape[2])
    if extra:
        flag = torch.nn.functional.pad(flag, (0, extra))
    data = torch.cat([x, flag], 2)
    params = [p for inner in inners for p in _params(inner.cell, _fused_params)]
    sizes = 2 if lstm else 1
    zeros = None
    hx = []
    for i in range(sizes):
        per_direction = []
        for state in initial_states:
            if state is None:
                if zeros is None:
                    zeros = x.new_zeros((batch, units))
                per_direction.append(zeros)
            else:
                per_direction.append(as_tensor(state[i]).to(dtype))
        hx.append(torch.stack(per_direction))
    flags = (
        inners[0].cell.use_bias,  # has_biases
        1,  # num_layers
        0.0,  # dropout between layers (one layer: none)
        torch.is_grad_enabled(),  # train: keep what backward needs
        len(inners) == 2,  # bidirectional
        True,  # batch_first
    )
    if lstm:
        out, h, c = torch._VF.lstm(data, tuple(hx), params, *flags)
        final = [h, c]
    else:
        out, h = torch._VF.gru(data, hx[0], params, *flags)
        final = [h]
    if not want_states:
        return out, [[] for _ in inners]
    # Forward: h is the output at each row's last valid step (the initial
    # h for a row with none), c the kernel's own (held over the tail).
    has_steps = as_tensor(steps.has_steps)
    last = as_tensor(steps.last).to(torch.int64)
    rows = torch.arange(batch, device=out.device) * time + last
    h_last = out.reshape(batch * time, -1).index_select(0, rows)[:, :units]
    states = [[torch.where(has_steps, h_last, hx[0][0])] + [s[0] for s in final[1:]]]
    if len(inners) == 2:
        # Backward: the kernel's own final states (after valid step 0).
        states.append([s[1] for s in final])
    return out, states


def _in_two_calls(inners, x, steps, initial_states, want_states):
    """A bidirectional LSTM whose backward direction has an initial state:
    the forward direction in one call, the backward one in another over its
    rows reversed by their lengths (valid steps first again), its outputs
    reversed back."""
    forward, backward = inners
    y_f, states_f = run([forward], x, steps, initial_states[:1], want_states)
    reverse = as_tensor(steps.reverse)
    x_rev = gather_time(x, reverse)
    y_b, states_b = run([backward], x_rev, steps, initial_states[1:], want_states)
    y_b = gather_time(y_b, reverse)
    return torch.cat([y_f, as_tensor(y_b)], 2), states_f + states_b
