"""The `"torch-fused"` kernel: every direction of a call in one PyTorch kernel call.

Forced on a CPU (`maskedrnn.backends.force("torch-fused")`: PyTorch's CPU
kernels compute cuDNN's equations), against two independent oracles:

- Keras' masked layers (`use_cudnn=False`, handed the same mask): outputs,
  final states and the gradients of the inputs, of every weight and of the
  initial states; post- and pre-padding, holes, empty rows, `lengths=`,
  initial states (the backward LSTM's runs a call of its own), merge
  modes, `return_sequences` and `return_state`, `MaskedRNN` with
  `go_backwards`, mixed precision;
- `torch.nn.LSTM/GRU` on a `PackedSequence` (weights moved with
  `maskedrnn.convert`): outputs, `h_n`/`c_n` and every gradient.

Also: the plan (the default on CUDA, never on a CPU unless forced; the
directions must match; input dropout runs one direction per call), the
`kernel_info()` sentence, no host sync in the call (the calls that would
sync raise), and `lengths=` on an accelerator checked on the device (bad
rows NaN, no host read).

Device-agnostic: the tensors go where Keras puts the weights (CUDA on a
GPU, where `scripts/gpu_check.py` runs this module in its test subset and
the kernel runs cuDNN) and come back through `.cpu()`; TF32 is off for the
whole run (tests/conftest.py), so float32 stays float32 there.
"""

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional, MaskedRNN, backends, convert
from tests.helpers import (
    BACKEND,
    GPU_GRAD_ATOL,
    oracle_pair,
    spy_fused_kernels,
    to_np,
)

if BACKEND != "torch":
    pytest.skip(
        "the torch-fused kernel is the torch backend's", allow_module_level=True
    )

import torch  # noqa: E402

from maskedrnn._keras_private import keras_torch_device  # noqa: E402
from maskedrnn.backends import torch as torch_backend  # noqa: E402

# Where Keras puts the layers' weights and new tensors: the tests' tensors
# too.
DEVICE = torch.device(keras_torch_device())

B, T, D, U = 5, 6, 3, 4

# Each pattern has an empty row and rows of several lengths.
MASKS = {
    "post": np.array(
        [
            [1, 1, 1, 1, 1, 1],
            [1, 1, 1, 0, 0, 0],
            [0] * 6,
            [1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 0],
        ],
        bool,
    ),
    "pre": np.array(
        [
            [1, 1, 1, 1, 1, 1],
            [0, 0, 0, 1, 1, 1],
            [0] * 6,
            [0, 0, 0, 0, 0, 1],
            [0, 1, 1, 1, 1, 1],
        ],
        bool,
    ),
    "holes": np.array(
        [
            [1, 0, 1, 1, 0, 1],
            [0, 1, 0, 1, 1, 0],
            [0] * 6,
            [0, 0, 1, 0, 0, 0],
            [1, 1, 0, 0, 1, 1],
        ],
        bool,
    ),
}
LENGTHS = np.array([6, 3, 0, 1, 5], "int32")


def _t(data, **kwargs):
    """A tensor of `data` on `DEVICE`."""
    return torch.tensor(data, device=DEVICE, **kwargs)


def _np(t):
    """A tensor's values as numpy, from any device."""
    return t.detach().float().cpu().numpy()


def _x(seed=0):
    x = np.random.default_rng(seed).standard_normal((B, T, D)).astype("float32")
    return x


def _states(n, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, U)).astype("float32") * 0.5 for _ in range(n)]


def _n_states(kind, wrapper):
    per = 2 if kind == "lstm" else 1
    return per * (2 if wrapper == "bidirectional" else 1)


def _grads(layer, x, call_kwargs, initial_state=None, kernel=None):
    """Outputs and the gradients of a fixed random loss over every output
    with respect to `x`, every trainable weight and the initial states."""
    xt = _t(x, requires_grad=True)
    states = None
    if initial_state is not None:
        states = [_t(s, requires_grad=True) for s in initial_state]
        call_kwargs = dict(call_kwargs, initial_state=states)
    if kernel is None:
        outs = layer(xt, **call_kwargs)
    else:
        with backends.force(kernel):
            outs = layer(xt, **call_kwargs)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    rng = np.random.default_rng(7)
    loss = sum(
        (o.float() * _t(rng.standard_normal(tuple(o.shape)), dtype=torch.float32)).sum()
        for o in outs
    )
    wrt = [xt] + [v.value for v in layer.trainable_variables] + (states or [])
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    grads = [
        np.zeros(tuple(w.shape)) if g is None else _np(g) for g, w in zip(grads, wrt)
    ]
    return [_np(o) for o in outs], grads


def _assert_same(ours, ref, atol=1e-5):
    (outs_a, grads_a), (outs_b, grads_b) = ours, ref
    assert len(outs_a) == len(outs_b)
    for i, (a, b) in enumerate(zip(outs_a, outs_b)):
        np.testing.assert_allclose(a, b, atol=atol, rtol=atol, err_msg=f"output {i}")
    grad_atol = max(atol, GPU_GRAD_ATOL)
    for i, (a, b) in enumerate(zip(grads_a, grads_b)):
        np.testing.assert_allclose(
            a, b, atol=grad_atol, rtol=grad_atol, err_msg=f"gradient {i}"
        )


def _call_kwargs(data):
    if data == "lengths":
        return dict(lengths=LENGTHS), dict(mask=LENGTHS[:, None] > np.arange(T))
    return dict(mask=MASKS[data]), dict(mask=MASKS[data])


@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("return_sequences", [True, False])
@pytest.mark.parametrize("data", ["post", "pre", "holes", "lengths"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("wrapper", ["bidirectional", "rnn"])
def test_matches_keras_masked_outputs_states_and_gradients(
    wrapper, kind, data, return_sequences, initial
):
    """Forced `"torch-fused"` equals Keras' masked layer: outputs, final
    states, the gradients of the inputs, of every weight and of the initial
    states (a given initial state for a bidirectional LSTM makes its
    backward direction run in a call of its own)."""
    ours, ref = oracle_pair(
        kind,
        U,
        D,
        wrapper=wrapper,
        return_sequences=return_sequences,
        return_state=True,
    )
    ours_kwargs, ref_kwargs = _call_kwargs(data)
    initial_state = _states(_n_states(kind, wrapper)) if initial else None
    x = _x()
    with backends.record() as plans:
        got = _grads(ours, x, ours_kwargs, initial_state, "torch-fused")
    assert [p.strategy for p in plans] == ["one_call"]
    _assert_same(got, _grads(ref, x, ref_kwargs, initial_state))


@pytest.mark.parametrize("return_state", [False, True])
@pytest.mark.parametrize("data", ["holes", "lengths"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_masked_rnn_go_backwards_matches_keras(kind, data, return_state):
    """`MaskedRNN(go_backwards=True)`: the reading order reversed before
    the one-direction call, as Keras reverses it."""
    ours, ref = oracle_pair(
        kind,
        U,
        D,
        wrapper="rnn",
        return_sequences=True,
        return_state=return_state,
        go_backwards=True,
    )
    ours_kwargs, ref_kwargs = _call_kwargs(data)
    x = _x(2)
    _assert_same(
        _grads(ours, x, ours_kwargs, kernel="torch-fused"), _grads(ref, x, ref_kwargs)
    )


@pytest.mark.parametrize("return_sequences", [True, False])
@pytest.mark.parametrize("merge_mode", ["concat", "sum", "mul", "ave", None])
def test_merge_modes_without_states(merge_mode, return_sequences):
    """Every merge mode, outputs only (the kernel's states not read)."""
    ours, ref = oracle_pair(
        "gru", U, D, merge_mode=merge_mode, return_sequences=return_sequences
    )
    x = _x(3)
    kwargs = dict(mask=MASKS["pre"])
    _assert_same(_grads(ours, x, kwargs, kernel="torch-fused"), _grads(ref, x, kwargs))


def test_no_mask_runs_fused_over_every_step():
    """No mask and no lengths: one call over the data as it is."""
    ours, ref = oracle_pair("lstm", U, D, return_state=True, return_sequences=True)
    x = _x(4)
    with backends.record() as plans:
        got = _grads(ours, x, {}, kernel="torch-fused")
    assert plans[0].strategy == "one_call"
    _assert_same(got, _grads(ref, x, {}))


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_mixed_precision_matches_keras_masked(kind, policy):
    """Under a mixed-precision policy the kernel runs in the compute dtype
    (PyTorch's CPU kernels take float16 and bfloat16), as Keras' masked
    layer does: equal to its rounding."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        ours, ref = oracle_pair(kind, U, D, return_sequences=True, return_state=True)
    finally:
        keras.config.set_dtype_policy(previous)
    assert ours.forward_layer.cell.compute_dtype == policy.split("_")[1]
    x = _x(5)
    kwargs = dict(mask=MASKS["holes"])
    with backends.record() as plans:
        got = _grads(ours, x, kwargs, kernel="torch-fused")
    assert plans[0].strategy == "one_call"
    want = _grads(ref, x, kwargs)
    atol = 3e-2 if policy == "mixed_bfloat16" else 5e-3
    _assert_same(got, want, atol=atol)


@pytest.mark.parametrize("features", [3, 7, 8])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_kernel_input_width_is_a_multiple_of_eight(kind, features, monkeypatch):
    """The flag feature is followed by zero columns (input and `W_ih`) up to
    a multiple of 8 input features (cuDNN's input GEMM keeps tensor cores
    for such widths; D=512 would give 513): outputs, final states and the
    gradients of the inputs, every weight and the initial states equal
    Keras' masked layer's and the unpadded call's (`ALIGN = 1`)."""
    from maskedrnn.backends import torch_fused

    widths = []
    for name in ("lstm", "gru"):
        original = getattr(torch._VF, name)

        def spy(data, hx, params, *flags, _original=original):
            widths.append((data.shape[-1], params[0].shape[1]))
            return _original(data, hx, params, *flags)

        monkeypatch.setattr(torch._VF, name, spy)
    ours, ref = oracle_pair(kind, U, features, return_sequences=True, return_state=True)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((B, T, features)).astype("float32")
    initial = _states(_n_states(kind, "bidirectional"))
    kwargs = dict(mask=MASKS["holes"])
    got = _grads(ours, x, kwargs, initial, "torch-fused")
    padded = -(-(features + 1) // 8) * 8
    assert widths and all(w == (padded, padded) for w in widths), widths
    _assert_same(got, _grads(ref, x, kwargs, initial))
    widths.clear()
    monkeypatch.setattr(torch_fused, "ALIGN", 1)
    unpadded = _grads(ours, x, kwargs, initial, "torch-fused")
    assert widths and all(w == (features + 1,) * 2 for w in widths), widths
    _assert_same(got, unpadded, atol=1e-6)


# ----------------------------------------------- PyTorch's packed modules


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_matches_pytorch_packed_sequence(kind, bidirectional):
    """Independent oracle: `torch.nn.LSTM/GRU` on a `PackedSequence`
    (right-padded, lengths >= 1 as packing needs), weights moved with
    `maskedrnn.convert`: outputs, `h_n`/`c_n`, and the gradients of the
    inputs and of every weight (Keras' gradients moved the same way: the
    conversion is a permutation and a transpose)."""
    lengths = np.array([6, 4, 1, 2, 3], "int32")
    wrapper = "bidirectional" if bidirectional else "rnn"
    # zero_output_for_mask: a MaskedRNN's padded steps output zeros, as
    # PyTorch's padded outputs are.
    ours, _ = oracle_pair(
        kind,
        U,
        D,
        wrapper=wrapper,
        return_state=True,
        return_sequences=True,
        zero_output_for_mask=True,
    )
    inners = (
        [ours.forward_layer, ours.backward_layer] if bidirectional else [ours.layer]
    )
    x = _x(6)
    outs, grads = _grads(ours, x, dict(lengths=lengths), kernel="torch-fused")

    module_cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
    module = module_cls(D, U, batch_first=True, bidirectional=bidirectional)
    module.to(DEVICE)
    to_torch = {"lstm": convert.lstm_to_torch_lstm, "gru": convert.gru_to_torch_gru}[
        kind
    ]
    names = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
    with torch.no_grad():
        for suffix, inner in zip(("", "_reverse"), inners):
            for name, w in zip(names, to_torch(inner.get_weights())):
                getattr(module, name + suffix).copy_(_t(w))
    xt = _t(x, requires_grad=True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        xt, torch.tensor(lengths), batch_first=True, enforce_sorted=False
    )
    y, hidden = module(packed)
    y, _ = torch.nn.utils.rnn.pad_packed_sequence(y, batch_first=True, total_length=T)
    hidden = list(hidden) if kind == "lstm" else [hidden]
    # PyTorch: per kind (h, c), each (directions, batch, units); ours: the
    # forward direction's states, then the backward's.
    theirs = [y] + [h[d] for d in range(len(inners)) for h in hidden]
    for i, (a, b) in enumerate(zip(outs, theirs)):
        np.testing.assert_allclose(a, _np(b), atol=1e-5, err_msg=f"output {i}")
    rng = np.random.default_rng(7)  # the loss of `_grads`
    loss = sum(
        (t * _t(rng.standard_normal(tuple(t.shape)), dtype=torch.float32)).sum()
        for t in theirs
    )
    params = [
        getattr(module, n + s) for s in ("", "_reverse")[: len(inners)] for n in names
    ]
    their_grads = torch.autograd.grad(loss, [xt] + params)
    grad_atol = max(1e-5, GPU_GRAD_ATOL)
    np.testing.assert_allclose(grads[0], _np(their_grads[0]), atol=grad_atol)
    # Keras' gradients per inner (kernel, recurrent kernel, bias) moved to
    # PyTorch's layout; Keras' one LSTM bias is both of PyTorch's.
    ours_moved = []
    per = len(inners[0].trainable_variables)
    for d in range(len(inners)):
        moved = to_torch(grads[1 + d * per : 1 + (d + 1) * per])
        if kind == "lstm":
            moved[3] = moved[2]
        ours_moved += moved
    for i, (a, b) in enumerate(zip(ours_moved, their_grads[1:])):
        np.testing.assert_allclose(a, _np(b), atol=grad_atol, err_msg=f"weight {i}")


# ----------------------------------------------------------------- plans


def _bidirectional(kind="lstm", **kw):
    cls = keras.layers.LSTM if kind == "lstm" else keras.layers.GRU
    layer = MaskedBidirectional(cls(U, return_sequences=True), **kw)
    layer.build((None, None, D))
    return layer


def test_default_plan_is_fused_on_cuda_and_not_on_a_cpu():
    """The plan for data on CUDA (asked of the plan by device name: no GPU
    needed) takes the one-call kernel and the fused strategy; on a CPU the
    caller's-order kernels stay the default."""
    layer = _bidirectional()
    inners = {"forward": layer.forward_layer, "backward": layer.backward_layer}
    on_cuda = backends.plan(inners, "cuda", want_states=True)
    assert [d.kernel for d in on_cuda.directions] == ["torch-fused"] * 2
    assert on_cuda.strategy == "one_call"
    on_cpu = backends.plan(inners, "cpu", want_states=True)
    assert "torch-fused" not in [d.kernel for d in on_cpu.directions]
    assert on_cpu.strategy == "caller_order"
    simple = MaskedRNN(keras.layers.SimpleRNN(U))
    simple.build((None, None, D))
    plan = backends.plan({"layer": simple.layer}, "cuda", want_states=False)
    assert plan.kernel() == "keras-unmasked" and plan.strategy == "valid_first"


def test_kernel_info_says_one_call_and_why_not_by_default_on_a_cpu():
    layer = _bidirectional("lstm")
    on_cpu = torch.zeros((1, T, D), device="cpu")  # the plan for CPU data
    with backends.force("torch-fused"):
        info = layer.kernel_info(on_cpu)
    for sentence in info.values():
        assert sentence.startswith("forced by maskedrnn.backends.force('torch-fused')")
        assert "torch._VF.lstm" in sentence and "in one call" in sentence
        assert "forget gate 1 and input gate 0" in sentence
        assert "initial state for the backward direction" in sentence
        assert "not the default here" in sentence and "CUDA" in sentence
    gru = _bidirectional("gru")
    with backends.force("torch-fused"):
        sentence = gru.kernel_info(on_cpu)["backward"]
    assert "torch._VF.gru" in sentence and "update gate 1" in sentence
    cuda = torch_backend.describe(
        "torch-fused",
        gru.forward_layer,
        False,
        torch_backend.options(gru.forward_layer, "cuda", False),
    )
    assert "not the default" not in cuda


@pytest.mark.parametrize("case", ["reset_after", "unroll"])
def test_on_cuda_each_declined_kernel_says_its_own_reason(case):
    """The plan for data on CUDA (asked by device name: no GPU needed) of a
    layer the one-call kernel cannot run: a GRU with `reset_after=False`
    (cuDNN's GRU computes reset_after=True; the reason of every PyTorch kernel
    is that equation, not the device) or `unroll=True` (declined as on
    JAX). Keras' unmasked layer runs, and `kernel_info()`'s sentence gives
    the real reason, not a device one."""
    if case == "reset_after":
        inner = keras.layers.GRU(U, reset_after=False, return_sequences=True)
        reason = "reset_after=False (PyTorch's and cuDNN's GRU compute"
    else:
        inner = keras.layers.LSTM(U, unroll=True, return_sequences=True)
        reason = "unroll=True asks for Keras' unrolled loop"
    layer = MaskedBidirectional(inner)
    layer.build((None, None, D))
    inners = {"forward": layer.forward_layer, "backward": layer.backward_layer}
    plan = backends.plan(inners, "cuda", want_states=False)
    assert [d.kernel for d in plan.directions] == ["keras-unmasked"] * 2
    assert plan.strategy == "valid_first"
    reasons = dict(plan.directions[0].options)
    assert reasons["torch-fused"].blocking and reason in str(reasons["torch-fused"])
    for kernel in ("torch-packed", "torch-unpacked"):
        assert reasons[kernel].blocking
        if case == "reset_after":
            assert str(reasons[kernel]) == str(reasons["torch-fused"])
    for sentence in plan.info().values():
        assert reason in sentence
        if case == "reset_after":
            assert "on CUDA" not in sentence
    with backends.force("torch-fused"):
        with pytest.raises(backends.Declined, match=reason.split(" (")[0]):
            backends.plan(inners, "cuda", want_states=False)


def test_forcing_declines_what_one_call_cannot_run():
    """A SimpleRNN, directions of different sizes, `use_cudnn=False`:
    forcing raises `Declined` with the reason."""
    simple = MaskedBidirectional(keras.layers.SimpleRNN(U, return_sequences=True))
    with backends.force("torch-fused"):
        with pytest.raises(backends.Declined, match="SimpleRNN has no one-call"):
            simple(_x())
    different = MaskedBidirectional(
        keras.layers.LSTM(U, return_sequences=True),
        backward_layer=keras.layers.LSTM(
            U + 1, return_sequences=True, go_backwards=True
        ),
    )
    with backends.force("torch-fused"):
        with pytest.raises(backends.Declined, match="directions differ"):
            different(_x())
    loop = MaskedRNN(keras.layers.GRU(U, use_cudnn=False))
    with backends.force("torch-fused"):
        with pytest.raises(backends.Declined, match="use_cudnn=False"):
            loop(_x())


def test_input_dropout_while_training_runs_one_direction_per_call(monkeypatch):
    """Each direction has its own input dropout mask: while training, the
    plan's strategy is valid-first and each direction runs its own one-call
    kernel call on its dropped inputs; not training, one call for both."""
    layer = MaskedBidirectional(keras.layers.GRU(U, return_sequences=True, dropout=0.5))
    calls = spy_fused_kernels(monkeypatch)
    x = _x()
    with backends.force("torch-fused"), backends.record() as plans:
        y = layer(x, mask=MASKS["holes"], training=True)
        layer(x, mask=MASKS["holes"], training=False)
    assert [p.strategy for p in plans] == ["valid_first", "one_call"]
    assert calls == [
        [layer.forward_layer],
        [layer.backward_layer],
        [layer.forward_layer, layer.backward_layer],
    ]
    y = to_np(y)
    assert np.isfinite(y).all() and (y[~MASKS["holes"]] == 0).all()


# ------------------------------------------------------------- host syncs


_SYNCS = ("item", "tolist", "nonzero", "numpy", "cpu", "__bool__", "__int__")


@pytest.fixture
def no_host_sync(monkeypatch):
    """Makes the calls that wait on a device raise while `arm()`ed (on a
    CPU they would not wait, so their absence is what is checked): the
    tensor methods that read values on the host, and a tensor made from
    host data (`torch.tensor` / `torch.as_tensor` of a Python number or
    array: on CUDA a blocking host-to-device copy)."""
    armed = []
    for name in _SYNCS:
        original = getattr(torch.Tensor, name)

        def raising(self, *args, _name=name, _original=original, **kwargs):
            if armed:
                raise AssertionError(f"host sync: Tensor.{_name}() in the call")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, raising)
    for name in ("tensor", "as_tensor"):
        original = getattr(torch, name)

        def copying(data, *args, _name=name, _original=original, **kwargs):
            if armed and not isinstance(data, torch.Tensor):
                raise AssertionError(f"host copy: torch.{_name}({data!r}) in the call")
            return _original(data, *args, **kwargs)

        monkeypatch.setattr(torch, name, copying)
    # Lengths on an accelerator are checked on the device.
    monkeypatch.setattr(torch_backend, "HOST_DEVICE_TYPES", ())
    return armed


@pytest.mark.parametrize("return_sequences", [True, False])
@pytest.mark.parametrize(
    "call", ["mask", "float_mask", "lengths", "lengths_rnn", "none"]
)
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_call_makes_no_host_sync(kind, call, return_sequences, no_host_sync):
    """The whole layer call on the fused strategy (lengths checked on the
    device, bad rows poisoned there), with gradients recorded and final
    states, calls none of `.item()`, `.tolist()`, `nonzero()`, `.numpy()`,
    `.cpu()`, `bool()`, `int()` on a tensor and makes no tensor from host
    data."""
    cls = keras.layers.LSTM if kind == "lstm" else keras.layers.GRU
    inner = cls(U, return_sequences=return_sequences, return_state=True)
    layer = MaskedRNN(inner) if call == "lengths_rnn" else MaskedBidirectional(inner)
    x = _t(_x(), requires_grad=True)
    kwargs = {
        "mask": dict(mask=_t(MASKS["holes"])),
        "float_mask": dict(mask=_t(MASKS["holes"], dtype=torch.float32)),
        "none": {},
    }.get(call, dict(lengths=_t(LENGTHS)))
    layer(x, **kwargs)  # built outside the armed block
    with backends.force("torch-fused"):
        no_host_sync.append(True)
        outs = layer(x, **kwargs)
        loss = sum(o.sum() for o in outs)
        loss.backward()
        no_host_sync.clear()
    assert x.grad is not None


@pytest.mark.parametrize("case", ["initial_state", "dropout"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_initial_states_and_input_dropout_make_no_host_sync(kind, case, no_host_sync):
    """The other strategies a call can take on CUDA make no host sync either:
    given initial states (a bidirectional LSTM's backward direction then
    runs its own call over rows reversed by their lengths,
    `ops.reverse_index`) and input dropout while training (one call per
    direction on the valid-first strategy, rows reversed the same way)."""
    cls = keras.layers.LSTM if kind == "lstm" else keras.layers.GRU
    dropout = 0.3 if case == "dropout" else 0.0
    inner = cls(U, return_sequences=True, return_state=True, dropout=dropout)
    layer = MaskedBidirectional(inner)
    x = _t(_x(), requires_grad=True)
    kwargs = dict(lengths=_t(LENGTHS), training=case == "dropout")
    if case == "initial_state":
        kwargs["initial_state"] = [
            _t(s, requires_grad=True) for s in _states(_n_states(kind, "bidirectional"))
        ]
    layer(x, **kwargs)  # built outside the armed block
    with backends.force("torch-fused"), backends.record() as plans:
        no_host_sync.append(True)
        outs = layer(x, **kwargs)
        sum(o.sum() for o in outs).backward()
        no_host_sync.clear()
    assert plans[0].strategy == ("valid_first" if case == "dropout" else "one_call")
    assert x.grad is not None


@pytest.mark.skipif(
    DEVICE.type != "cpu", reason="PyTorch's caller's-order kernels run on a CPU"
)
def test_the_sync_check_catches_the_caller_order_kernels(no_host_sync):
    """The check bites: PyTorch's caller's-order layout (`Layout`) reads the
    lengths on the host (`nonzero`, `int(max)`)."""
    layer = MaskedBidirectional(keras.layers.GRU(U, return_sequences=True))
    x = torch.tensor(_x())
    mask = torch.tensor(MASKS["holes"])
    layer(x, mask=mask)
    with backends.force("torch-unpacked"):
        no_host_sync.append(True)
        with pytest.raises(AssertionError, match="host sync"):
            layer(x, mask=mask)
        # and Keras' conversion of a Python number to a device tensor
        with pytest.raises(AssertionError, match="host copy"):
            keras.ops.maximum(x, 0.0)
        no_host_sync.clear()


def test_lengths_on_an_accelerator_poison_bad_rows_instead_of_reading_them(
    monkeypatch,
):
    """Lengths on a device (here: the CPU treated as one) are not read on
    the host: out-of-range rows come out NaN, every other row exact; on a
    CPU the eager check raises as before."""
    layer, ref = oracle_pair("gru", U, D, return_sequences=True, return_state=True)
    x = _x(8)
    bad = np.array([6, 9, 2, -1, 0], "int32")
    if DEVICE.type == "cpu":
        with pytest.raises(ValueError, match="lengths must be >= 0"):
            layer(x, lengths=bad)
    monkeypatch.setattr(torch_backend, "HOST_DEVICE_TYPES", ())
    with backends.force("torch-fused"):
        outs = [to_np(o) for o in layer(x, lengths=bad)]
    good = np.array([True, False, True, False, True])
    mask = np.clip(bad, 0, T)[:, None] > np.arange(T)
    want = [to_np(o) for o in ref(x, mask=mask)]
    for got, expected in zip(outs, want):
        assert np.isnan(got[~good]).all()
        np.testing.assert_allclose(got[good], expected[good], atol=1e-5)
