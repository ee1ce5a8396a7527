"""PyTorch's RNN kernels in Keras' layout: parameters, calls, autograd.

The compute half of the torch backend (`maskedrnn.backends.torch` decides
when these run; `maskedrnn.backends.torch_direction` runs one direction
from the caller's order around them). Keras' torch backend hands an
unmasked `LSTM`/`GRU` to PyTorch's fused kernel (`torch.lstm`/`torch.gru`,
cuDNN) on CUDA only; on a CPU it steps through time in Python, and
`SimpleRNN` always runs Keras' generic loop. PyTorch's own kernels do the
same arithmetic in C++ (docs/benchmarks.md). The outputs are the same
function of the same weights (PyTorch's LSTM and reset-after GRU equations
are Keras'; only the GRU gate order differs, see `_gru_params`), so
gradients reach the Keras variables through PyTorch's autograd. One
exception to "PyTorch's kernel": a GRU or SimpleRNN whose gradients are
recorded runs `GRUFunction` / `SimpleRNNFunction`, the same equations in
torch ops with a cheaper backward pass than the autograd replay of
`torch.gru`'s / `torch.rnn_tanh`'s per-step ops (`autograd_function`).
"""

import weakref

import keras
import torch

from maskedrnn._gate_layout import swap_gru_zr

LSTM, GRU, SimpleRNN = keras.layers.LSTM, keras.layers.GRU, keras.layers.SimpleRNN
TANH = (keras.activations.tanh, torch.tanh, keras.ops.tanh)


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
    fn = torch.rnn_tanh if cell.activation in TANH else torch.rnn_relu
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
    sources = [as_tensor(cell.kernel), as_tensor(cell.recurrent_kernel)]
    if cell.use_bias:
        sources.append(as_tensor(cell.bias))
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
    feature; the alternatives cost more (PyTorch's packed LSTM in
    inference, a second pass over every step to recompute `c` in training:
    docs/benchmarks.md, "An LSTM's exact states on torch").

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


def as_tensor(value):
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
    params = [as_tensor(cell.kernel).T.contiguous()]
    params.append(as_tensor(cell.recurrent_kernel).T.contiguous())
    if cell.use_bias:
        bias = as_tensor(cell.bias)
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
    params = [_swap_zr(as_tensor(cell.kernel)).T.contiguous()]
    params.append(_swap_zr(as_tensor(cell.recurrent_kernel)).T.contiguous())
    if cell.use_bias:
        bias = _swap_zr(as_tensor(cell.bias))
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
    of the weights and the inputs with one matmul each over all steps:
    faster in training than `torch.gru`'s autograd replay on a CPU
    (docs/benchmarks.md).

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
    runs several ops and two matmuls per step (docs/benchmarks.md).

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
