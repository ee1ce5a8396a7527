"""Every direction of a call in one PyTorch kernel call: the `"torch-fused"` kernel.

Both directions of a bidirectional LSTM or GRU go to one
`torch._VF.lstm`/`gru` call with `bidirectional=True` (the cuDNN call of
Keras' unmasked `Bidirectional`) over valid-first data, a padding flag
holding the state over each row's tail (docs/design.md, "Kernels, one per
backend"). No host sync: the lengths stay on the device (tested).
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
# Input widths that are multiples of this keep cuDNN's tensor cores.
ALIGN = 8


def extra_columns(features):
    """Zero columns after the flag that align the input width to `ALIGN`."""
    return -(features + 1) % ALIGN


def compute_dtype(inner):
    """The torch dtype of the inner layer's compute dtype."""
    return getattr(torch, inner.cell.compute_dtype)


def _fused_params(cell):
    """`[W_ih, W_hh(, b_ih, b_hh)]` of one direction, with the flag's columns.

    The flag saturates an LSTM's input gate to 0 and forget gate to 1, a
    GRU's update gate to 1; `extra_columns` zero columns follow it.
    """
    dtype = getattr(torch, cell.compute_dtype)
    kernel = as_tensor(cell.kernel).to(dtype)
    recurrent = as_tensor(cell.recurrent_kernel).to(dtype)
    units = recurrent.shape[0]
    value = _SATURATION_FLOAT16 if dtype == torch.float16 else _SATURATION
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
    """Runs one or two directions over valid-first `x` in one kernel call.

    Args:
        inners: List of one or two built inner LSTMs or GRUs of the same
            type, units and bias.
        x: Float `(batch, time, features)`, valid-first, padded steps zero.
        steps: The batch's `maskedrnn.steps.Steps`.
        initial_states: List, one per inner: its `[h, c]` / `[h]` or None.
        want_states: Bool, whether to return the final states.

    Returns:
        `(outputs, states)`: outputs `(batch, time, units * len(inners))`,
        valid-first, finite but unspecified at padded steps, and the final
        states of each inner (`[]` without `want_states`).
    """
    lstm = type(inners[0]) is LSTM
    if len(inners) == 2 and lstm and initial_states[1] is not None:
        return _in_two_calls(inners, x, steps, initial_states, want_states)
    dtype = compute_dtype(inners[0])
    x = as_tensor(x).to(dtype)
    batch, time = x.shape[0], x.shape[1]
    units = as_tensor(inners[0].cell.recurrent_kernel).shape[0]
    valid = as_tensor(steps.valid)
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
                per_direction.append(as_tensor(state[i]).to(x.device, dtype))
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
    # Forward: h read at each row's last valid step; c held over the tail.
    has_steps = as_tensor(steps.has_steps)
    last = as_tensor(steps.last).to(torch.int64)
    rows = torch.arange(batch, device=out.device) * time + last
    h_last = out.reshape(batch * time, -1).index_select(0, rows)[:, :units]
    states = [[torch.where(has_steps, h_last, hx[0][0])] + [s[0] for s in final[1:]]]
    if len(inners) == 2:
        # Backward: the kernel's own, after valid step 0.
        states.append([s[1] for s in final])
    return out, states


def _in_two_calls(inners, x, steps, initial_states, want_states):
    """A backward LSTM with an initial state, which the tail would not hold.

    It runs in its own call over its rows reversed by their lengths.
    """
    forward, backward = inners
    y_f, states_f = run([forward], x, steps, initial_states[:1], want_states)
    reverse = as_tensor(steps.reverse)
    x_rev = gather_time(x, reverse)
    y_b, states_b = run([backward], x_rev, steps, initial_states[1:], want_states)
    y_b = gather_time(y_b, reverse)
    return torch.cat([y_f, as_tensor(y_b)], 2), states_f + states_b
