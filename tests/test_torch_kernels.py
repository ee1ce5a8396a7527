"""`maskedrnn.backends.torch`: PyTorch's native RNN kernels on the torch backend.

On the torch backend on CPU, `MaskedBidirectional` runs its unmasked inner
LSTM/GRU/SimpleRNN on `torch.lstm` / `torch.gru` / `torch.rnn_tanh` /
`torch.rnn_relu` instead of Keras' Python loop. Specified here:

- which layers take that path (`kernel_info()`, and a spy on
  `maskedrnn.backends.torch.run_native`), and that every other
  configuration is refused up front with a reason and computed by the
  Keras inner layer instead;
- outputs, final states and gradients equal Keras' own masked
  `Bidirectional` (use_cudnn=False: its generic masked loop) and PyTorch's
  `nn.LSTM`/`nn.GRU(bidirectional=True)` on a `PackedSequence`, two
  oracles that share no code with this module.

The rest of the suite (parity, training, saving) runs through this path too
whenever the backend is torch, since it is the default there.
"""

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional, convert
from tests.helpers import (
    GPU_FLOAT32_ATOL,
    GPU_GRAD_ATOL,
    assert_close,
    loss_and_grads,
    spy_native_kernels,
    to_np,
)

if keras.backend.backend() != "torch":
    pytest.skip(
        "PyTorch's native kernels exist on the torch backend only",
        allow_module_level=True,
    )

import torch  # noqa: E402

from maskedrnn.backends import torch as torch_backend  # noqa: E402
from maskedrnn.backends import torch_direction, torch_kernels  # noqa: E402

# Keras' torch backend puts tensors on CUDA when it sees a GPU. On a CPU
# every NATIVE layer must take PyTorch's native kernel; on CUDA the layer
# follows `unavailable_reason` for that device (Keras already calls cuDNN
# for an unmasked LSTM/GRU there), and the results must match all the same.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def native_here(layer):
    """Whether `layer`'s inner RNNs must run on PyTorch's native kernels here."""
    if DEVICE == "cpu":
        return True
    return torch_backend.unavailable_reason(layer.forward_layer, DEVICE) is None

B, T, D, U = 5, 6, 3, 4
LENGTHS = np.array([6, 4, 1, 0, 3], "int32")
# Every pattern: right-padded, left-padded, holes, all padding, full.
MASK = np.array(
    [
        [1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1],
        [1, 0, 1, 0, 0, 1],
        [0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1],
    ],
    bool,
)

NATIVE = {
    "lstm": lambda **kw: keras.layers.LSTM(U, **kw),
    "gru": lambda **kw: keras.layers.GRU(U, **kw),
    "simple_tanh": lambda **kw: keras.layers.SimpleRNN(U, **kw),
    "simple_relu": lambda **kw: keras.layers.SimpleRNN(U, activation="relu", **kw),
    "lstm_no_bias": lambda **kw: keras.layers.LSTM(U, use_bias=False, **kw),
    "gru_no_bias": lambda **kw: keras.layers.GRU(U, use_bias=False, **kw),
}


def oracle_copy(layer):
    """The same layer config with Keras' generic (masked) loop forced."""
    clone = layer.__class__.from_config(layer.get_config())
    if hasattr(clone, "use_cudnn"):  # SimpleRNN has only the generic loop
        clone.use_cudnn = False
    return clone


def pair(make, **kw):
    """(ours, Keras Bidirectional oracle) with identical weights."""
    kw.setdefault("return_sequences", True)
    kw.setdefault("return_state", True)
    ours = MaskedBidirectional(make(**kw))
    ref = keras.layers.Bidirectional(oracle_copy(make(**kw)))
    ours.build((None, None, D))
    ref.build((None, None, D))
    rng = np.random.default_rng(7)
    weights = [
        rng.uniform(-0.6, 0.6, w.shape).astype(w.dtype) for w in ref.get_weights()
    ]
    ref.set_weights(weights)
    ours.set_weights(weights)
    return ours, ref


def inputs(seed=0):
    return np.random.default_rng(seed).standard_normal((B, T, D)).astype("float32")


@pytest.fixture
def native_calls(monkeypatch):
    """Records the inner layers `run_native` and `run_direction` are
    called with."""
    return spy_native_kernels(monkeypatch)


# -------------------------------------------------------- the native path


@pytest.fixture(params=["grad", "no_grad"])
def grad_mode(request):
    """Runs the test with gradients recorded (PyTorch's unpacked kernel) and
    without (its packed kernel, `torch_backend.packed_preferred`)."""
    with torch.set_grad_enabled(request.param == "grad"):
        yield request.param


@pytest.mark.parametrize("kind", sorted(NATIVE))
def test_native_kernel_matches_keras_masked(kind, native_calls):
    ours, ref = pair(NATIVE[kind])
    native = native_here(ours)
    info = ours.kernel_info().values()
    assert all(("PyTorch's native" in s) == native for s in info)
    x = inputs()
    assert_close(ours(x, mask=MASK), ref(x, mask=MASK))
    with torch.no_grad():  # the packed kernel
        assert_close(ours(x, mask=MASK), ref(x, mask=MASK))
    expected = [ours.forward_layer, ours.backward_layer] * 2
    assert native_calls == (expected if native else [])
    # Gradients w.r.t. the inputs and every Keras weight (through PyTorch's
    # autograd of torch.lstm/gru/rnn_*, back to the Keras variables).
    loss_o, grads_o = loss_and_grads(ours, x, mask=MASK)
    loss_r, grads_r = loss_and_grads(ref, x, mask=MASK)
    assert np.isclose(loss_o, loss_r, rtol=1e-5, atol=1e-4)
    assert len(grads_o) == len(grads_r) == 1 + len(ours.trainable_variables)
    for g_o, g_r in zip(grads_o, grads_r):
        np.testing.assert_allclose(g_o, g_r, atol=max(1e-5, GPU_GRAD_ATOL), rtol=1e-4)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_native_kernel_with_initial_state_and_lengths(kind, native_calls, grad_mode):
    ours, ref = pair(NATIVE[kind], return_sequences=False)
    n = 2 if kind == "lstm" else 1
    rng = np.random.default_rng(3)
    states = [rng.standard_normal((B, U)).astype("float32") for _ in range(2 * n)]
    x = inputs(1)
    mask = np.arange(T)[None, :] < LENGTHS[:, None]
    expected = ref(x, mask=mask, initial_state=states)
    assert_close(ours(x, lengths=LENGTHS, initial_state=states), expected)
    assert len(native_calls) == (2 if native_here(ours) else 0)


def test_float64_layers_use_the_native_kernel(native_calls, grad_mode):
    ours, ref = pair(NATIVE["lstm"], dtype="float64")
    assert ours.forward_layer.cell.kernel.dtype == "float64"
    x = inputs(2).astype("float64")
    assert_close(ours(x, mask=MASK), ref(x, mask=MASK), atol=1e-10)
    assert len(native_calls) == (2 if native_here(ours) else 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_lstm_cell_state_through_saturated_padding(dtype, scale, grad_mode):
    """An LSTM's final `c` is the unpacked kernel's own, its padded steps
    made no-ops for `c` (`torch_kernels.saturated_lstm`: forget gate
    exactly 1, input gate 0). Exact also where the weights are large (gate
    pre-activations in the hundreds: the saturation must dwarf them) and in
    float64; every mask pattern, an initial state, which the all-padding
    row keeps bit for bit. Oracles: Keras' masked Bidirectional (to float32
    precision: Keras' torch backend runs float64 matmuls in float32) and,
    to float64 precision, PyTorch's packed LSTM kernel, which runs only the
    valid steps (`run_direction(packed=True)`), both directions."""
    ours, ref = pair(NATIVE["lstm"], dtype=dtype)
    weights = [w * scale for w in ref.get_weights()]
    ours.set_weights(weights)
    ref.set_weights(weights)
    rng = np.random.default_rng(5)
    states = [rng.standard_normal((B, U)).astype(dtype) for _ in range(4)]
    x = inputs(5).astype(dtype)
    got = ours(x, mask=MASK, initial_state=states)
    want = ref(x, mask=MASK, initial_state=states)
    # On a GPU cuDNN's float32 sums round differently from Keras' loop and
    # between its packed and unpacked calls, the more so where pre-activations
    # are in the hundreds (`scale`); float64 stays at 1e-12 on either device,
    # so the saturation itself is exact.
    assert_close(got, want, atol=max(1e-5, 10 * GPU_FLOAT32_ATOL) * scale, rtol=1e-5)
    empty = ~MASK.any(1)
    for got_state, want_state in zip(got[1:], want[1:]):  # h, c fwd; h, c bwd
        # Its initial state, as Keras' masked loop carries it: bit for bit.
        np.testing.assert_array_equal(to_np(got_state)[empty], to_np(want_state)[empty])
    # Where the layer's weights are (CUDA when Keras sees a GPU).
    layout = torch_direction.Layout(torch.tensor(MASK, device=DEVICE))
    tol = 1e-12 if dtype == "float64" else max(1e-5, 10 * GPU_FLOAT32_ATOL)
    for inner, reverse, initial in (
        (ours.forward_layer, False, states[:2]),
        (ours.backward_layer, True, states[2:]),
    ):
        initial = [torch.tensor(s, device=DEVICE) for s in initial]
        xt = torch.tensor(x, device=DEVICE)
        with torch.no_grad():
            packed = torch_direction.run_direction(
                inner, xt, initial, layout, reverse, packed=True
            )
        saturated = torch_direction.run_direction(
            inner, xt, initial, layout, reverse, packed=False
        )
        assert_close(saturated, packed, atol=tol * scale, rtol=tol)


@pytest.mark.parametrize("kind", ["lstm", "gru", "simple_tanh"])
def test_input_dropout_uses_one_mask_for_all_steps(kind, native_calls):
    """Input dropout in training is applied before PyTorch's kernel, one mask
    per row for every step (what Keras' fused GRU path and SimpleRNN's cell
    do): with the dropout mask frozen, training outputs equal Keras'."""
    ours, ref = pair(NATIVE[kind], dropout=0.5)
    fixed = (np.random.default_rng(0).random((B, D)) > 0.5).astype("float32") * 2
    for layer in (ours, ref):
        for inner in (layer.forward_layer, layer.backward_layer):
            inner.cell.get_dropout_mask = lambda step_input: torch.tensor(
                fixed, device=DEVICE
            )
    x = inputs(3)
    assert_close(ours(x, mask=MASK, training=True), ref(x, mask=MASK, training=True))
    assert len(native_calls) == (2 if native_here(ours) else 0)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_native_kernel_matches_pytorch_packed_sequence(kind, grad_mode):
    """Independent oracle: `torch.nn.LSTM/GRU(bidirectional=True)` on a
    `PackedSequence`, weights moved with `maskedrnn.convert` (which its own
    tests check against PyTorch). Right-padded data, every output and the
    final states (PyTorch's h_n/c_n: forward after the last valid step,
    backward after the first)."""
    ours, _ = pair(NATIVE[kind])
    lengths = np.array([6, 4, 1, 2, 3], "int32")  # packing needs lengths >= 1
    x = inputs(4)
    out, *states = ours(x, lengths=lengths)
    module_cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
    module = module_cls(D, U, batch_first=True, bidirectional=True)
    to_torch = {"lstm": convert.lstm_to_torch_lstm, "gru": convert.gru_to_torch_gru}
    to_torch = to_torch[kind]
    forward = to_torch(ours.forward_layer.get_weights())
    backward = to_torch(ours.backward_layer.get_weights())
    names = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
    with torch.no_grad():
        for name, a, b in zip(names, forward, backward):
            getattr(module, name).copy_(torch.tensor(a))
            getattr(module, name + "_reverse").copy_(torch.tensor(b))
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            torch.tensor(x), torch.tensor(lengths), batch_first=True,
            enforce_sorted=False,
        )
        y, hidden = module(packed)
        y, _ = torch.nn.utils.rnn.pad_packed_sequence(
            y, batch_first=True, total_length=T
        )
    np.testing.assert_allclose(to_np(out), y.numpy(), atol=1e-5)
    hidden = hidden if kind == "lstm" else (hidden,)
    # PyTorch: per kind (h, c), each (2, batch, units) = forward, backward.
    # Ours: forward's states then backward's.
    expected = [h[0] for h in hidden] + [h[1] for h in hidden]
    for got, want in zip(states, expected):
        np.testing.assert_allclose(to_np(got), want.numpy(), atol=1e-5)


# ------------------------------------- Layout and run_direction (torch only)


def _valid_steps(mask, reverse):
    """Each row's flat step ids `b * T + t` in reading order (numpy)."""
    batch, time = mask.shape
    rows = []
    for b in range(batch):
        ids = [b * time + t for t in range(time) if mask[b, t]]
        rows.append(ids[::-1] if reverse else ids)
    return rows


def _pack_oracle(mask, reverse):
    """PyTorch's own packing of each row's valid steps (in order, or last to
    first): `pack_padded_sequence` over step ids moved valid-first by numpy,
    rows of distinct lengths so the order is unique. Empty rows are left out
    (PyTorch refuses them; nothing of theirs is packed). Returns (packed
    ids, batch_sizes)."""
    rows = [r for r in _valid_steps(mask, reverse) if r]
    padded = np.zeros((len(rows), mask.shape[1]), "int64")
    for b, r in enumerate(rows):
        padded[b, : len(r)] = r
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        torch.tensor(padded), torch.tensor([len(r) for r in rows]),
        batch_first=True, enforce_sorted=False,
    )
    return packed.data.numpy(), packed.batch_sizes.numpy()


# Distinct lengths 5, 2, 0, 3, 4, 1: left and right padding, holes, a full
# row's worth, an empty row.
PACK_MASK = np.array(
    [
        [1, 1, 1, 1, 1, 0],
        [0, 0, 0, 0, 1, 1],
        [0, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 1],
        [0, 1, 1, 1, 1, 0],
        [0, 0, 1, 0, 0, 0],
    ],
    bool,
)


@pytest.mark.parametrize("reverse", [False, True])
def test_layout_packed_matches_pack_padded_sequence(reverse):
    """Packed, `Layout.read_index` reads straight from the caller's order the
    steps PyTorch's `pack_padded_sequence` packs from valid-first data."""
    layout = torch_direction.Layout(torch.tensor(PACK_MASK))
    ids, batch_sizes = _pack_oracle(PACK_MASK, reverse)
    np.testing.assert_array_equal(layout.read_index(True, reverse).numpy(), ids)
    np.testing.assert_array_equal(layout.batch_sizes.numpy(), batch_sizes)
    assert layout.batch_sizes.dtype == torch.int64
    np.testing.assert_array_equal(
        layout.active.numpy(), [0, 4, 3, 1, 5]  # by decreasing length
    )


@pytest.mark.parametrize("reverse", [False, True])
def test_layout_valid_first_reads_each_rows_steps_first(reverse):
    """Unpacked, row `b`'s first `length` kernel rows read its valid steps
    in reading order (numpy), the rest the zero row appended to `x`."""
    layout = torch_direction.Layout(torch.tensor(PACK_MASK))
    index = layout.read_index(False, reverse).numpy().reshape(PACK_MASK.shape)
    for b, ids in enumerate(_valid_steps(PACK_MASK, reverse)):
        np.testing.assert_array_equal(index[b, : len(ids)], ids)
        assert (index[b, len(ids) :] == PACK_MASK.size).all()


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("place", ["zeros", "held"])
def test_layout_place_index_is_the_keras_conventions(place, packed):
    """`place_index`: "zeros", each valid step reads its own kernel row;
    "held", the row of the last valid step at or before it (numpy loop);
    the zero row (`rows(packed)`) before a row's first valid step, and at
    every masked step for "zeros"."""
    layout = torch_direction.Layout(torch.tensor(PACK_MASK))
    kernel_rows = layout.read_index(packed).numpy()
    where = {int(i): p for p, i in enumerate(kernel_rows) if i < PACK_MASK.size}
    zero_row = layout.rows(packed)
    assert zero_row == (len(where) if packed else PACK_MASK.size)
    batch, time = PACK_MASK.shape
    expected = np.full((batch, time), zero_row)
    for b in range(batch):
        last = None
        for t in range(time):
            if PACK_MASK[b, t]:
                last = where[b * time + t]
            if PACK_MASK[b, t] or (place == "held" and last is not None):
                expected[b, t] = last
    index = layout.place_index(place, packed).numpy().reshape(batch, time)
    np.testing.assert_array_equal(index, expected)
    last = [where[ids[-1]] if ids else zero_row for ids in _valid_steps(PACK_MASK, 0)]
    np.testing.assert_array_equal(layout.last_index(packed).numpy(), last)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("place", ["held", "zeros", "last"])
def test_run_direction_with_one_valid_step_in_a_batch_of_empty_rows(place, packed):
    """Fewer packed rows (1) than batch rows: every placement still reads
    only kernel rows that exist; Keras' GRU is the oracle."""
    mask = np.zeros((4, 5), bool)
    mask[2, 3] = True
    layer = keras.layers.GRU(U, return_sequences=True, return_state=True)
    layer.build((None, None, D))
    x = torch.tensor(np.random.default_rng(0).standard_normal((4, 5, D)))
    x = x.to(torch.float32).to(DEVICE)  # where the layer's weights are
    layout = torch_direction.Layout(torch.tensor(mask, device=DEVICE))
    with torch.no_grad():
        y, states = torch_direction.run_direction(
            layer, x, None, layout, place=place, packed=packed
        )
        ref, h = (to_np(t) for t in layer(x, mask=torch.tensor(mask, device=DEVICE)))
    atol = max(1e-6, GPU_FLOAT32_ATOL)  # cuDNN's rounding on a GPU
    np.testing.assert_allclose(to_np(states[0]), h, atol=atol)
    if place == "last":
        np.testing.assert_allclose(to_np(y), h, atol=atol)
        return
    y = to_np(y)
    np.testing.assert_allclose(y[2, 3], ref[2, 3], atol=atol)
    # After the valid step: held by Keras' RNN convention, else zeros.
    after = ref[2, 3] if place == "held" else np.zeros(U)
    np.testing.assert_allclose(y[2, 4], after, atol=atol)
    others = np.ones((4, 5), bool)
    others[2, 3:] = False
    assert not y[others].any()


@pytest.mark.parametrize("packed", [True, False])
def test_an_all_padding_batch(packed):
    """No valid step anywhere: zeros and the initial states; the packed form
    calls no kernel, the unpacked one (training) still connects the weights
    (zero gradients, no error)."""
    # Every tensor where the layer's weights are (CUDA when Keras sees a GPU).
    layout = torch_direction.Layout(
        torch.zeros((3, 4), dtype=torch.bool, device=DEVICE)
    )
    assert layout.steps == 0 and layout.total == 0
    layer = keras.layers.LSTM(U, return_sequences=True, return_state=True)
    layer.build((None, None, D))
    h0 = torch.ones((3, U), device=DEVICE)
    c0 = torch.full((3, U), 2.0, device=DEVICE)
    x = torch.ones((3, 4, D), device=DEVICE, requires_grad=not packed)
    with torch.set_grad_enabled(not packed):
        y, states = torch_direction.run_direction(
            layer, x, [h0, c0], layout, place="held", packed=packed
        )
    assert tuple(y.shape) == (3, 4, U) and not y.any()
    np.testing.assert_array_equal(to_np(states[0].detach()), to_np(h0))
    np.testing.assert_array_equal(to_np(states[1].detach()), to_np(c0))
    if not packed:
        (y.sum() + states[1].sum()).backward()
        assert not x.grad.any()


def test_run_direction_rejects_an_unknown_place():
    layer = keras.layers.GRU(U)
    layer.build((None, None, D))
    layout = torch_direction.Layout(torch.tensor(PACK_MASK, device=DEVICE))
    with pytest.raises(ValueError, match="place must be one of"):
        x = torch.ones((6, 6, D), device=DEVICE)
        torch_direction.run_direction(layer, x, None, layout, place="x")


@pytest.mark.skipif(DEVICE != "cpu", reason="the direct path is the CPU's")
@pytest.mark.parametrize("wrapper", ["rnn", "bidirectional"])
def test_a_masked_call_runs_each_direction_from_the_callers_order(
    wrapper, monkeypatch
):
    """A masked call runs `run_direction` once per direction on the caller's
    (unreordered) data, never the valid-first `run`: packed without
    gradients, unpacked with."""
    from maskedrnn import MaskedRNN

    calls = []
    for name in ("run_native", "run_direction"):
        original = getattr(torch_backend, name)

        def spy(kernel, inner, x, *args, _name=name, _original=original, **kwargs):
            calls.append((_name, x, kernel == "torch-packed"))
            return _original(kernel, inner, x, *args, **kwargs)

        monkeypatch.setattr(torch_backend, name, spy)
    make = NATIVE["gru"]
    if wrapper == "rnn":
        ours = MaskedRNN(make(return_sequences=True))
    else:
        ours = MaskedBidirectional(make(return_sequences=True))
    x = torch.tensor(inputs(6))
    directions = 1 if wrapper == "rnn" else 2
    for grad, packed in ((False, True), (True, False)):
        calls.clear()
        with torch.set_grad_enabled(grad):
            ours(x, mask=MASK)
        assert calls == [("run_direction", x, packed)] * directions


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_inference_params_follow_every_weight_change(kind):
    """The kernel's params are reused between calls without gradients; a
    changed weight (set_weights, an in-place assign, an optimizer step) is
    never missed."""
    ours, ref = pair(NATIVE[kind])
    x = inputs(7)
    rng = np.random.default_rng(11)
    with torch.no_grad():
        ours(x, mask=MASK)  # params made and kept
        new = [
            rng.uniform(-0.5, 0.5, w.shape).astype("float32")
            for w in ours.get_weights()
        ]
        ours.set_weights(new)
        ref.set_weights(new)
        assert_close(ours(x, mask=MASK), ref(x, mask=MASK))
        for layer in (ours, ref):
            layer.forward_layer.cell.kernel.assign(new[0] * 0.5)
        assert_close(ours(x, mask=MASK), ref(x, mask=MASK))
    for layer in (ours, ref):
        grads = [torch.ones_like(v.value) for v in layer.trainable_variables]
        keras.optimizers.SGD(0.5).apply(grads, layer.trainable_variables)
    with torch.no_grad():
        assert_close(ours(x, mask=MASK), ref(x, mask=MASK))


# ------------- GRUFunction, SimpleRNNFunction: the GRU and SimpleRNN in training

# kind -> (PyTorch module of one direction, the Function, the wrapped layer's
# key in NATIVE)
FUNCTIONS = {
    "gru": (
        lambda bias: torch.nn.GRU(D, U, batch_first=True, bias=bias),
        torch_kernels.GRUFunction,
        "gru",
    ),
    "rnn_tanh": (
        lambda bias: torch.nn.RNN(D, U, batch_first=True, bias=bias),
        torch_kernels.SimpleRNNFunction,
        "simple_tanh",
    ),
    "rnn_relu": (
        lambda bias: torch.nn.RNN(
            D, U, batch_first=True, bias=bias, nonlinearity="relu"
        ),
        torch_kernels.SimpleRNNFunction,
        "simple_relu",
    ),
}


def torch_module(kind, bias=True, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return FUNCTIONS[kind][0](bias).to(dtype)


def function_args(kind, module, x, h0):
    """The Function's arguments for `module`'s weights: (x, h0, w_ih, w_hh,
    b_ih, b_hh[, relu])."""
    biases = [module.bias_ih_l0, module.bias_hh_l0] if module.bias else [None, None]
    args = (x, h0, module.weight_ih_l0, module.weight_hh_l0, *biases)
    return args + ((kind == "rnn_relu",) if kind != "gru" else ())


def apply(kind, *args):
    return FUNCTIONS[kind][1].apply(*args)


@pytest.mark.parametrize("steps", [T, 1])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", sorted(FUNCTIONS))
def test_function_matches_pytorchs_module_and_its_gradients(kind, bias, steps):
    """Oracle: `nn.GRU` / `nn.RNN` and PyTorch's autograd through it.
    Outputs and the gradients w.r.t. the inputs, the initial state and every
    weight."""
    module = torch_module(kind, bias)
    rng = np.random.default_rng(4)
    x = torch.tensor(rng.standard_normal((B, steps, D)), dtype=torch.float32)
    h0 = torch.tensor(rng.standard_normal((B, U)), dtype=torch.float32)
    x.requires_grad_(True)
    h0.requires_grad_(True)
    w = torch.tensor(rng.standard_normal((B, steps, U)), dtype=torch.float32)
    wanted = [x, h0, *module.parameters()]
    expected, _ = module(x, h0[None])
    expected_grads = torch.autograd.grad((expected * w).sum(), wanted)
    got = apply(kind, *function_args(kind, module, x, h0))
    got_grads = torch.autograd.grad((got * w).sum(), wanted)
    np.testing.assert_allclose(to_np(got), to_np(expected), atol=1e-6)
    assert len(got_grads) == len(expected_grads) == (6 if bias else 4)
    for g, e in zip(got_grads, expected_grads):
        np.testing.assert_allclose(to_np(g), to_np(e), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", sorted(FUNCTIONS))
def test_function_gradients_of_weights_only_and_a_retained_graph(kind):
    """Inputs without gradients (a first layer over data) get none, the
    weights' still equal PyTorch's module's; a graph kept with
    `retain_graph=True` gives the same gradients on a second backward pass
    (the backward pass must not overwrite what the forward pass saved)."""
    module = torch_module(kind)
    rng = np.random.default_rng(7)
    x = torch.tensor(rng.standard_normal((B, T, D)), dtype=torch.float32)
    h0 = torch.zeros(B, U)
    w = torch.tensor(rng.standard_normal((B, T, U)), dtype=torch.float32)
    params = list(module.parameters())
    expected, _ = module(x, h0[None])
    expected_grads = torch.autograd.grad((expected * w).sum(), params)
    y = apply(kind, *function_args(kind, module, x, h0))
    loss = (y * w).sum()
    first = torch.autograd.grad(loss, params, retain_graph=True)
    second = torch.autograd.grad(loss, params)
    for g1, g2, e in zip(first, second, expected_grads):
        np.testing.assert_allclose(to_np(g1), to_np(e), atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(to_np(g2), to_np(g1))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", sorted(FUNCTIONS))
def test_function_passes_gradcheck_and_refuses_a_second_derivative(kind, bias):
    """Finite differences in float64 (`torch.autograd.gradcheck`); the
    backward pass is once-differentiable: asking for a second derivative
    raises instead of returning a wrong one."""
    module = torch_module(kind, bias, torch.float64)
    rng = np.random.default_rng(5)
    x = torch.tensor(rng.standard_normal((2, 4, D)), requires_grad=True)
    h0 = torch.tensor(rng.standard_normal((2, U)), requires_grad=True)
    args = function_args(kind, module, x, h0)
    assert torch.autograd.gradcheck(FUNCTIONS[kind][1].apply, args)
    y = apply(kind, *args)
    (grad_x,) = torch.autograd.grad(y.square().sum(), [x], create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad_x.sum().backward()


@pytest.mark.parametrize("kind", sorted(FUNCTIONS))
def test_masked_training_runs_the_function_with_initial_state_gradients(
    kind, monkeypatch
):
    """While gradients are recorded a masked GRU's / SimpleRNN's directions
    run its Function; the gradients w.r.t. the inputs, the initial states
    and every weight equal Keras' masked Bidirectional's; `kernel_info`
    names the Function while gradients are recorded only."""
    _, function, layer_kind = FUNCTIONS[kind]
    calls = []
    original = function.apply

    def spy(*args):
        calls.append(tuple(args[0].shape))
        return original(*args)

    monkeypatch.setattr(function, "apply", spy)
    ours, ref = pair(NATIVE[layer_kind], return_state=False)
    rng = np.random.default_rng(6)
    x = inputs(8)
    states = [rng.standard_normal((B, U)).astype("float32") for _ in range(2)]
    got, expected = [], []
    for layer, found in ((ours, got), (ref, expected)):
        xt = torch.tensor(x, requires_grad=True, device=DEVICE)
        st = [torch.tensor(s, requires_grad=True, device=DEVICE) for s in states]
        out = layer(xt, mask=MASK, initial_state=st)
        weight = torch.linspace(-1, 1, out.numel(), device=DEVICE).view(out.shape)
        loss = (out * weight).sum()
        variables = [v.value for v in layer.trainable_variables]
        found.extend(torch.autograd.grad(loss, [xt, *st, *variables]))
    native = native_here(ours)
    assert calls == ([(B, T, D)] * 2 if native else [])
    assert len(got) == len(expected) == 3 + len(ours.trainable_variables)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(
            to_np(g), to_np(e), atol=max(1e-5, GPU_GRAD_ATOL), rtol=1e-4
        )
    if native:
        assert function.__name__ in ours.kernel_info()["forward"]
        with torch.no_grad():
            info = ours.kernel_info()["forward"]
        assert function.__name__ not in info and "packed valid steps" in info


# ------------------------------------------------ refused up front, visibly


REFUSED = {
    "gru_reset_before": (
        lambda **kw: keras.layers.GRU(U, reset_after=False, **kw),
        "reset_after=False",
    ),
    "lstm_relu": (
        lambda **kw: keras.layers.LSTM(U, activation="relu", **kw),
        "activation must be tanh",
    ),
    "lstm_hard_sigmoid": (
        lambda **kw: keras.layers.LSTM(U, recurrent_activation="hard_sigmoid", **kw),
        "recurrent_activation sigmoid",
    ),
    "simple_elu": (
        lambda **kw: keras.layers.SimpleRNN(U, activation="elu", **kw),
        "not tanh or relu",
    ),
    "use_cudnn_false": (
        lambda **kw: keras.layers.LSTM(U, use_cudnn=False, **kw),
        "use_cudnn=False",
    ),
    "activity_regularizer": (
        lambda **kw: keras.layers.GRU(U, activity_regularizer="l2", **kw),
        "activity_regularizer",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_configurations_say_why_and_stay_exact(case, native_calls):
    make, reason = REFUSED[case]
    ours, ref = pair(make)
    info = ours.kernel_info()
    if DEVICE != "cpu":  # the device's reason may come first there
        reason = torch_backend.unavailable_reason(ours.forward_layer, DEVICE)
    for text in info.values():
        assert text.startswith("Keras "), text
        assert reason in text, text
    x = inputs(5)
    assert_close(ours(x, mask=MASK), ref(x, mask=MASK))
    assert native_calls == []


def test_mixed_precision_is_refused(native_calls):
    ours = MaskedBidirectional(
        keras.layers.LSTM(U, return_sequences=True, dtype="mixed_bfloat16")
    )
    ours.build((None, None, D))
    # On a CPU (on CUDA the one-call kernel runs mixed precision).
    on_cpu = torch.zeros((1, T, D), device="cpu")
    assert "mixed_bfloat16" in ours.kernel_info(on_cpu)["forward"]
    ours(inputs(), mask=MASK)
    assert native_calls == []


def test_reasons_for_devices_and_backends():
    layer = keras.layers.LSTM(U)
    layer.build((None, None, D))
    assert torch_backend.unavailable_reason(layer, torch.device("cpu")) is None
    assert "cuDNN" in torch_backend.unavailable_reason(layer, "cuda")
    # Keras infers shapes by calling layers on "meta" tensors.
    assert "meta" in torch_backend.unavailable_reason(layer, torch.device("meta"))
    cell_rnn = keras.layers.RNN(keras.layers.LSTMCell(U))
    assert "has no PyTorch kernel" in torch_backend.unavailable_reason(
        cell_rnn, "cpu"
    )


def test_kernel_info_needs_a_built_layer_and_follows_inputs_device():
    ours = MaskedBidirectional(keras.layers.GRU(U))
    with pytest.raises(ValueError, match="built layer"):
        ours.kernel_info()
    ours.build((None, None, D))
    on_meta = ours.kernel_info(torch.zeros((1, T, D), device="meta"))
    assert on_meta["forward"].startswith("Keras GRU, unmasked")
    generic = MaskedBidirectional(keras.layers.LSTM(U, recurrent_dropout=0.2))
    generic.build((None, None, D))
    assert "masked step loop" in generic.kernel_info()["backward"]
