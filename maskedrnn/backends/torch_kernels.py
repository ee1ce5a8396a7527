"""PyTorch's RNN kernels in Keras' layout: parameters, calls, autograd.

The compute half of the torch backend: Keras' weights in PyTorch's layout
for `torch.lstm`/`gru`/`rnn_tanh`/`rnn_relu`, whose equations are Keras',
so gradients reach the Keras variables. A GRU or SimpleRNN in training runs
`GRUFunction`/`SimpleRNNFunction` instead (docs/design.md, "Kernels, one
per backend").
"""

import weakref

import keras
import torch

from maskedrnn._gate_layout import swap_gru_zr

LSTM, GRU, SimpleRNN = keras.layers.LSTM, keras.layers.GRU, keras.layers.SimpleRNN
TANH = (keras.activations.tanh, torch.tanh, keras.ops.tanh)


def autograd_function(inner):
    """`GRUFunction`/`SimpleRNNFunction` while gradients are recorded, else None.

    An LSTM keeps PyTorch's fused oneDNN kernel, which trains faster.
    """
    if not torch.is_grad_enabled():
        return None
    return {GRU: GRUFunction, SimpleRNN: SimpleRNNFunction}.get(type(inner))


def _unpacked(inner, data, states):
    """Outputs `(batch, time, units)` of `inner` over `data` from `states`."""
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
    """`(params, torch function, hx)` for `inner`."""
    cell = inner.cell
    kind = type(inner)
    if kind is LSTM:
        return _params(cell, _plain_params), torch.lstm, tuple(hx)
    if kind is GRU:
        return _params(cell, _gru_params), torch.gru, hx[0]
    fn = torch.rnn_tanh if cell.activation in TANH else torch.rnn_relu
    return _params(cell, _plain_params), fn, hx[0]


# cell -> {make: (source tensors, their versions, params)}, for inference.
_NO_GRAD_PARAMS = weakref.WeakKeyDictionary()


def _params(cell, make):
    """`make(cell)`, the kernel's params in PyTorch's layout.

    Without gradients they are reused while each weight is the same tensor
    at the same `_version`, which every Keras assignment bumps.
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


# Dwarfs any |h @ W_hh + b| and keeps the flag's gradient finite; float16
# ends at 65504.
_SATURATION = 1e15
_SATURATION_FLOAT16 = 1e4


def with_padding_row(t):
    """`t` `(n, features)` plus a zero flag column and a padded-step row `n`."""
    padded = torch.nn.functional.pad(t, (0, 1, 0, 1))
    padded[-1, -1] = 1.0
    return padded


def saturated_lstm(inner, data, states):
    """An LSTM whose padded steps keep `c`, so its final `c` is exact.

    A padding-flag feature with weights of +-`_SATURATION` saturates the
    forget gate to 1 and the input gate to 0 at padded steps only
    (docs/design.md, "Kernels, one per backend").

    Args:
        inner: The inner LSTM layer.
        data: Float tensor `(batch, time, features + 1)`, valid-first, its
            last feature the padding flag, the padded steps' other
            features zero.
        states: `[h0, c0]`, `(batch, units)` each.

    Returns:
        `(outputs, c)`: outputs `(batch, time, units)`, not to be read over
        the padded tail, and the final `c` `(batch, units)`.
    """
    params = _params(inner.cell, _saturated_lstm_params)
    hx = (states[0][None], states[1][None])
    # Unpacked form: (input, hx, params, *flags, batch_first).
    out, _, c = torch.lstm(data, hx, params, *_flags(inner.cell), True)
    return out, c[0]


def as_tensor(value):
    """The torch tensor of a Keras variable or tensor, skipping a conversion."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, keras.Variable):
        return value.value
    return keras.ops.convert_to_tensor(value)


def _plain_params(cell):
    """`[W_ih, W_hh(, b_ih, b_hh)]` of an LSTMCell or SimpleRNNCell.

    Same gate order (i, f, g, o), so the kernels are only transposed; Keras'
    one bias becomes `b_ih` and `b_hh` is zero.
    """
    params = [as_tensor(cell.kernel).T.contiguous()]
    params.append(as_tensor(cell.recurrent_kernel).T.contiguous())
    if cell.use_bias:
        bias = as_tensor(cell.bias)
        params += [bias, torch.zeros_like(bias)]
    return params


def _saturated_lstm_params(cell):
    """`_plain_params` with `W_ih`'s constant padding-flag column appended."""
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
    # Keras' z, r, h -> PyTorch's r, z, n, as the weight converters do it.
    return swap_gru_zr(w, -1, torch.chunk, torch.cat)


def _gru_params(cell):
    """`[W_ih, W_hh(, b_ih, b_hh)]` of a reset-after GRUCell: gates swapped."""
    params = [_swap_zr(as_tensor(cell.kernel)).T.contiguous()]
    params.append(_swap_zr(as_tensor(cell.recurrent_kernel)).T.contiguous())
    if cell.use_bias:
        bias = _swap_zr(as_tensor(cell.bias))
        params += [bias[0], bias[1]]
    return params


def _recurrent_weight_grad(d, h0, y):
    """Sum over steps of `d_t^T h_{t-1}`, time-major, in two matmuls."""
    batch, units = h0.shape
    grad = d[:batch].t().mm(h0)
    return grad.addmm_(d[batch:].t(), y[:-1].reshape(-1, units))


class GRUFunction(torch.autograd.Function):
    """One GRU direction for training: `torch.gru`'s equations, a cheaper backward.

    The backward pass runs only the state gradient's recurrence step by
    step, one matmul per step, and the rest over all steps at once. Once
    differentiable: a second derivative raises.

        r, z = sigmoid(gi_rz + gh_rz),  n = tanh(gi_n + r * gh_n)
        h_t = n + z * (h_{t-1} - n)

    `apply(x, h0, w_ih, w_hh, b_ih, b_hh)`: `x` `(batch, time, features)`,
    both > 0, `h0` `(batch, units)`, `_gru_params` weights (biases may be
    None); returns the outputs `(batch, time, units)`.
    """

    @staticmethod
    def forward(ctx, x, h0, w_ih, w_hh, b_ih, b_hh):
        batch, time, features = x.shape
        units = h0.shape[1]
        # Time-major from here on: step t is one contiguous block.
        xt = x.transpose(0, 1).reshape(time * batch, features)
        w_ih_t, w_hh_t = w_ih.t(), w_hh.t()
        gi = xt.mm(w_ih_t) if b_ih is None else torch.addmm(b_ih, xt, w_ih_t)
        # Few large buffers, as each fresh one costs page faults: each step
        # overwrites its gi block with its gates, and keeps only gh's n part.
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
        # `coef[t]`: d gh_t / dh_t for the blocks r, z, n, all steps at once.
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
        # dh[t]: the whole gradient reaching h_t; coef[t] becomes d gh_t.
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
        # Input side: r and z as the hidden side's, n without the reset gate.
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
    """One SimpleRNN direction for training, as `GRUFunction`.

        h_t = f(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh),  f tanh or relu

    `apply(x, h0, w_ih, w_hh, b_ih, b_hh, relu)`: as `GRUFunction`, with
    `_plain_params` weights and `relu` a bool (False: tanh).
    """

    @staticmethod
    def forward(ctx, x, h0, w_ih, w_hh, b_ih, b_hh, relu):
        batch, time, features = x.shape
        units = h0.shape[1]
        # Time-major: step t's block becomes h_t.
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
        # f' of every step, read off the outputs, in the buffer of d pre.
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
