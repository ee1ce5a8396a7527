"""MaskedRNN, specified against the wrapped Keras layer fed the same mask.

Oracles: the bare Keras layer (`LSTM`/`GRU` with `use_cudnn=False`, i.e.
Keras' generic masked step loop; `SimpleRNN`; `RNN(cell)`) given the same
weights and mask, on every backend; and PyTorch's `nn.LSTM`/`nn.GRU` on a
`PackedSequence` for outputs and `h_n`/`c_n`.
"""

import keras
import numpy as np
import pytest
from keras import ops

import maskedrnn
from maskedrnn import MaskedBidirectional, MaskedRNN, backends, convert
from maskedrnn._keras_private import get_keras_mask
from tests.helpers import (
    BACKEND,
    assert_close,
    edge_mask,
    flat,
    lengths_to_mask,
    loss_and_grads,
    make_rnn,
    oracle_pair,
    run_layer_test,
    run_python,
    save_and_load,
    spy_native_kernels,
    to_np,
)

B, T, D, U = 6, 7, 3, 4
KINDS = ["lstm", "gru", "simple", "rnn_cell"]
LENGTHS = np.array([7, 3, 0, 1, 5, 7], "int32")


def make_inputs(seed=0):
    return np.random.default_rng(seed).standard_normal((B, T, D)).astype("float32")


def pair(kind, **kw):
    return oracle_pair(kind, U, D, wrapper="rnn", **kw)


# ------------------------------------------------------------------ parity

OPTIONS = [
    dict(return_sequences=rs, go_backwards=gb, zero_output_for_mask=zo)
    for rs in (True, False)
    for gb in (False, True)
    for zo in (False, True)
]
OPTION_IDS = [
    f"seq{int(o['return_sequences'])}-back{int(o['go_backwards'])}"
    f"-zero{int(o['zero_output_for_mask'])}"
    for o in OPTIONS
]


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("kind", KINDS)
def test_matches_keras_layer_with_mask_lengths_and_no_mask(
    kind, options, grad_mode, kernel
):
    """Outputs and states equal the wrapped layer's with the same mask (every
    pattern in one batch); `lengths` equal its right-padded mask and win over
    a mask; no mask equals the unmasked layer."""
    ours, ref = pair(kind, return_state=True, **options)
    x, mask = make_inputs(), edge_mask()
    assert_close(ours(x, mask=mask), ref(x, mask=mask))
    expected = ref(x, mask=lengths_to_mask(LENGTHS, T))
    assert_close(ours(x, lengths=LENGTHS), expected)
    assert_close(ours(x, mask=np.ones((B, T), bool), lengths=LENGTHS), expected)
    assert_close(ours(x), ref(x))


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_gradients_match_keras(kind, go_backwards, kernel):
    """Gradients w.r.t. the inputs and every weight, through outputs and
    states."""
    ours, ref = pair(
        kind, return_sequences=True, return_state=True, go_backwards=go_backwards
    )
    x, mask = make_inputs(1), edge_mask()
    loss_o, grads_o = loss_and_grads(ours, x, mask=mask)
    loss_r, grads_r = loss_and_grads(ref, x, mask=mask)
    assert np.isclose(loss_o, loss_r, atol=1e-4)
    assert len(grads_o) == len(grads_r) == 1 + len(ref.trainable_weights)
    for g_o, g_r in zip(grads_o, grads_r):
        assert np.all(np.isfinite(g_o))
        np.testing.assert_allclose(g_o, g_r, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gradients_match_keras_last_output_with_lengths(kind, kernel):
    ours, ref = pair(kind, return_sequences=False, zero_output_for_mask=True)
    x = make_inputs(2)
    _, grads_o = loss_and_grads(ours, x, lengths=LENGTHS)
    _, grads_r = loss_and_grads(ref, x, mask=lengths_to_mask(LENGTHS, T))
    for g_o, g_r in zip(grads_o, grads_r):
        np.testing.assert_allclose(g_o, g_r, atol=1e-5, rtol=1e-4)


def _before_first_valid_step(mask, go_backwards):
    read = mask[:, ::-1] if go_backwards else mask
    return np.cumsum(read, axis=1) == 0


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("kind", ["lstm", "gru", "simple"])
def test_initial_state_matches_keras(kind, go_backwards, grad_mode, kernel):
    """States start from `initial_state`; an all-padding row returns it. On
    TensorFlow and torch, Keras outputs zeros before a row's first valid step
    whatever the initial state, as ours does; Keras' JAX backend repeats the
    initial `h` there instead (proven below), the one place ours follows the
    other two backends."""
    ours, ref = pair(
        kind, return_sequences=True, return_state=True, go_backwards=go_backwards
    )
    n = 2 if kind == "lstm" else 1
    rng = np.random.default_rng(5)
    init = [rng.standard_normal((B, U)).astype("float32") for _ in range(n)]
    x, mask = make_inputs(3), edge_mask()
    got = flat(ours(x, mask=mask, initial_state=init))
    expected = [to_np(t) for t in flat(ref(x, mask=mask, initial_state=init))]
    np.testing.assert_allclose(to_np(got[-n])[3], init[0][3])  # all padding
    before = _before_first_valid_step(mask, go_backwards)
    assert before.any()
    if BACKEND == "jax":
        np.testing.assert_allclose(
            expected[0][before], np.broadcast_to(init[0][:, None], (B, T, U))[before]
        )
        expected[0][before] = 0.0
    assert np.all(to_np(got[0])[before] == 0.0)
    assert_close(got, expected)


@pytest.mark.parametrize("kind", ["lstm", "gru", "simple"])
def test_input_dropout_matches_keras(kind, grad_mode):
    """Training with input dropout: freeze the dropout mask on both layers and
    compare outputs and states (the LSTM cell state is recomputed from the
    dropped inputs)."""
    fixed = (np.random.default_rng(0).random((B, D)) > 0.5).astype("float32") * 2
    ours, ref = pair(kind, return_sequences=True, return_state=True, dropout=0.5)
    for cell in (ours.layer.cell, ref.cell):
        cell.get_dropout_mask = lambda step_input: ops.convert_to_tensor(fixed)
    x, mask = make_inputs(8), edge_mask()
    assert_close(ours(x, mask=mask, training=True), ref(x, mask=mask, training=True))


def test_recurrent_dropout_runs_keras_masked_loop_exactly():
    """`recurrent_dropout > 0` has no fused kernel: the wrapped RNN runs
    Keras' masked loop on the caller's mask as it is (spied), and results
    equal Keras' with frozen dropout masks."""
    rng = np.random.default_rng(1)
    fixed_x = (rng.random((B, D)) > 0.5).astype("float32") * 2
    fixed_h = (rng.random((B, U)) > 0.5).astype("float32") * 2
    ours, ref = pair(
        "lstm",
        return_sequences=True,
        return_state=True,
        dropout=0.5,
        recurrent_dropout=0.5,
    )
    assert not ours.uses_fast_path
    assert "masked step loop" in ours.kernel_info()["layer"]
    for cell in (ours.layer.cell, ref.cell):
        cell.get_dropout_mask = lambda step_input: ops.convert_to_tensor(fixed_x)
        cell.get_recurrent_dropout_mask = lambda s: ops.convert_to_tensor(fixed_h)
    seen = _spy_masks(ours)
    x, mask = make_inputs(4), edge_mask()
    assert_close(ours(x, mask=mask, training=True), ref(x, mask=mask, training=True))
    assert len(seen) == 1
    np.testing.assert_array_equal(to_np(seen[0]), mask)


def test_worked_example_held_outputs_and_go_backwards():
    """A cumulative sum RNN makes Keras' conventions visible: a masked step
    repeats the last valid output, zeros come before the first valid step,
    go_backwards reads right to left and returns that order."""

    def layer(**kw):
        return MaskedRNN(
            keras.layers.SimpleRNN(
                1,
                activation=None,
                use_bias=False,
                kernel_initializer="ones",
                recurrent_initializer="ones",
                return_sequences=True,
                **kw,
            )
        )

    x = np.array([[1, 2, 0, 3, 0], [0, 0, 1, 2, 3]], "float32")[..., None]
    mask = x[..., 0] != 0
    np.testing.assert_allclose(
        to_np(layer()(x, mask=mask))[..., 0], [[1, 3, 3, 6, 6], [0, 0, 1, 3, 6]]
    )
    np.testing.assert_allclose(
        to_np(layer(go_backwards=True)(x, mask=mask))[..., 0],
        [[0, 3, 3, 5, 6], [3, 5, 6, 6, 6]],
    )
    np.testing.assert_allclose(
        to_np(layer(zero_output_for_mask=True)(x, mask=mask))[..., 0],
        [[1, 3, 0, 6, 0], [0, 0, 1, 3, 6]],
    )


# ------------------------------------------------- second oracle: PyTorch


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_matches_pytorch_packed_sequence(kind, grad_mode):
    """`torch.nn.LSTM/GRU` on a `PackedSequence` (weights moved with
    `maskedrnn.convert`, which its own tests check against PyTorch): outputs
    (zeros at padding with `zero_output_for_mask=True`, as PyTorch pads) and
    `h_n`/`c_n`. Runs on every Keras backend."""
    torch = pytest.importorskip("torch")
    ours = MaskedRNN(
        make_rnn(
            kind, U, return_sequences=True, return_state=True, zero_output_for_mask=True
        )
    )
    ours.build((None, None, D))
    lengths = np.array([7, 4, 1, 2, 3, 6], "int32")  # packing needs >= 1
    x = make_inputs(4)
    out, *got_states = ours(x, lengths=lengths)
    module = (torch.nn.LSTM if kind == "lstm" else torch.nn.GRU)(D, U, batch_first=True)
    to_torch = {"lstm": convert.lstm_to_torch_lstm, "gru": convert.gru_to_torch_gru}
    names = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
    with torch.no_grad():
        for name, w in zip(names, to_torch[kind](ours.get_weights())):
            getattr(module, name).copy_(torch.tensor(w))
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            torch.tensor(x),
            torch.tensor(lengths),
            batch_first=True,
            enforce_sorted=False,
        )
        y, hidden = module(packed)
        y, _ = torch.nn.utils.rnn.pad_packed_sequence(
            y, batch_first=True, total_length=T
        )
    hidden = hidden if kind == "lstm" else (hidden,)
    assert_close([out] + got_states, [y] + [h[0] for h in hidden])


# ------------------------------------------------------ no mask reaches it


def _spy_masks(layer):
    """Records the `mask` each call of the wrapped RNN receives, and fails if
    its input tensor carries a Keras mask (Keras would fill `mask` from it)."""
    seen = []
    original = layer.layer.call

    def spy(*args, **kwargs):
        assert get_keras_mask(args[0]) is None
        seen.append(kwargs.get("mask"))
        return original(*args, **kwargs)

    layer.layer.call = spy
    return seen


@pytest.mark.parametrize("kind", ["lstm", "gru", "simple"])
@backends.force("keras-unmasked")
def test_wrapped_rnn_never_receives_a_mask(kind):
    """Through Embedding(mask_zero=True), with lengths, and go_backwards.
    (Keras' unmasked layer forced: on torch CPU the default is PyTorch's
    native kernel, which calls no Keras layer, proven separately below; a
    JAX CPU runs Keras' masked loop by default.)"""
    for go_backwards in (False, True):
        layer = MaskedRNN(
            make_rnn(kind, U, return_sequences=True, go_backwards=go_backwards)
        )
        assert layer.uses_fast_path
        seen = _spy_masks(layer)
        ids = keras.Input((None,), dtype="int32")
        emb = keras.layers.Embedding(10, D, mask_zero=True)(ids)
        batch = np.array([[1, 2, 3, 0, 0], [0, 0, 4, 5, 6]], "int32")
        keras.Model(ids, layer(emb)).predict(batch, verbose=0)
        lengths = keras.Input((), dtype="int32")
        model = keras.Model([ids, lengths], layer(emb, lengths=lengths))
        model.predict([batch, np.array([3, 5], "int32")], verbose=0)
        assert seen and all(m is None for m in seen)


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's kernels: torch only")
@pytest.mark.parametrize("kind", ["lstm", "gru", "simple"])
def test_torch_cpu_runs_pytorch_native_kernel_without_keras_layer(kind, monkeypatch):
    calls = spy_native_kernels(monkeypatch)
    ours, ref = pair(kind, return_sequences=True, return_state=True)
    seen = _spy_masks(ours)
    x, mask = make_inputs(), edge_mask()
    assert_close(ours(x, mask=mask), ref(x, mask=mask))
    assert calls == [ours.layer] and seen == []
    assert "PyTorch's native" in ours.kernel_info()["layer"]


# ------------------------------------------------- weights and serialization


@pytest.mark.parametrize("kind", KINDS)
def test_weights_are_the_wrapped_layers_in_its_order(kind):
    ours, ref = pair(kind, return_sequences=True)
    assert [tuple(w.shape) for w in ours.weights] == [
        tuple(w.shape) for w in ref.weights
    ]
    assert [w.path.split("/")[-1] for w in ours.weights] == [
        w.path.split("/")[-1] for w in ref.weights
    ]
    rng = np.random.default_rng(1)
    new = [rng.standard_normal(w.shape).astype("float32") for w in ours.get_weights()]
    ours.set_weights(new)
    ref.set_weights(ours.get_weights())
    for a, b in zip(ref.get_weights(), new):
        np.testing.assert_array_equal(a, b)
    x, mask = make_inputs(), edge_mask()
    assert_close(ours(x, mask=mask), ref(x, mask=mask))


@pytest.mark.parametrize("kind", ["lstm", "gru", "simple"])
def test_run_layer_test(kind):
    run_layer_test(
        lambda: MaskedRNN(make_rnn(kind, U, return_sequences=True)),
        make_inputs(),
        call_kwargs={"mask": edge_mask()},
        expected_output_shape=(B, T, U),
    )


def test_config_round_trip_keeps_every_option():
    layer = MaskedRNN(
        keras.layers.GRU(
            U,
            return_sequences=True,
            return_state=True,
            go_backwards=True,
            zero_output_for_mask=True,
            name="enc",
        ),
        name="masked_enc",
    )
    clone = MaskedRNN.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    assert (clone.go_backwards, clone.zero_output_for_mask) == (True, True)
    assert clone.layer.name == "enc" and clone.name == "masked_enc"


def test_save_and_load_keras_file_without_custom_objects():
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(10, D, mask_zero=True)(ids)
    x = MaskedRNN(keras.layers.LSTM(U, return_sequences=True))(x)
    x = MaskedRNN(keras.layers.GRU(U, go_backwards=True))(x)
    model = keras.Model(ids, keras.layers.Dense(2)(x))
    batch = np.array([[1, 2, 3, 0, 0], [0, 0, 4, 5, 6], [0, 0, 0, 0, 0]], "int32")
    loaded = save_and_load(model)
    assert isinstance(loaded.layers[2], MaskedRNN)
    assert_close(loaded.predict(batch, verbose=0), model.predict(batch, verbose=0))


def test_output_mask_is_the_input_mask_when_returning_sequences():
    mask = ops.convert_to_tensor(edge_mask())
    x = make_inputs()
    seq = MaskedRNN(keras.layers.LSTM(U, return_sequences=True, return_state=True))
    out_mask = seq.compute_mask(x, mask)
    assert len(out_mask) == len(flat(seq(x, mask=mask))) == 3
    np.testing.assert_array_equal(to_np(out_mask[0]), edge_mask())
    assert out_mask[1:] == (None, None)
    assert MaskedRNN(keras.layers.GRU(U)).compute_mask(x, mask) is None
    # In a model, the next layer sees the mask.
    ids = keras.Input((None,), dtype="int32")
    emb = keras.layers.Embedding(10, D, mask_zero=True)(ids)
    y = MaskedRNN(keras.layers.GRU(U, return_sequences=True))(emb)
    assert get_keras_mask(y) is not None


# ------------------------------------------------------------ kernel_info


def test_kernel_info_says_which_code_runs():
    simple = MaskedRNN(keras.layers.SimpleRNN(U))
    cell = MaskedRNN(keras.layers.RNN(keras.layers.GRUCell(U)))
    with pytest.raises(ValueError, match="built layer"):
        simple.kernel_info()
    for layer in (simple, cell):
        layer.build((None, None, D))
    assert "masked step loop" in cell.kernel_info()["layer"]
    assert not cell.uses_fast_path
    # Keras' unmasked SimpleRNN's sentence (forced on JAX, whose CPU default
    # is Keras' masked loop, and on TensorFlow, whose CPU default is the
    # length tiers; tests/test_kernels.py).
    unmasked = BACKEND in ("jax", "tensorflow")
    with backends.force("keras-unmasked" if unmasked else None):
        info = simple.kernel_info()["layer"]
    if BACKEND == "torch":
        assert "PyTorch's native SimpleRNN" in info
    else:
        assert "no backend has a fused SimpleRNN kernel" in info
        assert "cuDNN" not in info


# ------------------------------------------------------------ bad arguments


@pytest.mark.parametrize(
    "layer, message",
    [
        (lambda: keras.layers.Dense(3), "keras.layers.RNN instance.*got layer="),
        (lambda: keras.layers.ConvLSTM1D(2, 3), "ConvLSTM"),
        (lambda: keras.layers.GRU(3, stateful=True), "stateful=True"),
    ],
    ids=["dense", "conv_lstm", "stateful"],
)
def test_refused_layers_say_why(layer, message):
    with pytest.raises(ValueError, match=message):
        MaskedRNN(layer())


def test_initial_state_errors_name_each_tensor_in_order():
    layer = MaskedRNN(keras.layers.LSTM(U))
    with pytest.raises(
        ValueError,
        match=r"has 1 tensors but this layer needs 2, in this order: the LSTM's h "
        r"\(batch, 4\), the LSTM's c \(batch, 4\); got shapes \[\(6, 4\)\]",
    ):
        layer(make_inputs(), initial_state=[np.zeros((B, U), "float32")])
    with pytest.raises(ValueError, match=r"initial_state\[1\] is the LSTM's c"):
        layer(
            make_inputs(),
            initial_state=[np.zeros((B, U), "float32"), np.zeros((B, 5), "float32")],
        )


def test_lengths_and_mask_are_checked_like_maskedbidirectional():
    layer = MaskedRNN(keras.layers.GRU(U))
    x = make_inputs()
    with pytest.raises(ValueError, match="lengths has 3 rows but inputs has 6"):
        layer(x, lengths=np.ones((3,), "int32"))
    with pytest.raises(ValueError, match="longer than the time axis"):
        layer(x, lengths=np.full((B,), T + 1, "int32"))
    with pytest.raises(ValueError, match="mask has 5 along axis 1"):
        layer(x, mask=np.ones((B, 5), bool))
    with pytest.raises(ValueError, match=r"MaskedRNN expects inputs of shape"):
        layer(np.ones((B, T), "float32"))


def test_empty_batch_returns_empty_outputs():
    layer = MaskedRNN(keras.layers.LSTM(U, return_sequences=True, return_state=True))
    out = layer(np.zeros((0, T, D), "float32"), lengths=np.zeros((0,), "int32"))
    assert [tuple(o.shape) for o in out] == [(0, T, U), (0, U), (0, U)]


# -------------------------------------- padding never matters; float64 exact


@pytest.mark.slow  # ~1-2 s on TF and torch; 7-23 s on a loaded JAX eager run
@pytest.mark.parametrize("wrapper", ["rnn", "bidirectional"])
@pytest.mark.parametrize("kind", ["lstm", "gru", "simple"])
def test_inf_and_huge_values_in_padding_never_matter(kind, wrapper):
    """Padding holding 3e38, inf or NaN (relu activations, where Keras' own
    masked loop gives NaN weight gradients on some backends) gives exactly
    the outputs and gradients of zero padding, all finite: the padded steps
    of the valid-first input are zeroed before the RNN reads them."""
    ours, ref = oracle_pair(
        kind,
        U,
        D,
        wrapper=wrapper,
        return_sequences=True,
        return_state=True,
        activation="relu",
    )
    mask = edge_mask()
    clean = make_inputs(6)
    clean[~mask] = 0.0
    x = clean.copy()
    pads = np.resize(
        np.array([3e38, np.inf, -np.inf, np.nan], "float32"), (~mask).sum()
    )
    x[~mask] = pads[:, None]
    assert_close(ours(x, mask=mask), ref(clean, mask=mask))
    _, g_clean = loss_and_grads(ref, clean, mask=mask)
    _, grads = loss_and_grads(ours, x, mask=mask)
    for g, g_ref in zip(grads, g_clean):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, g_ref, atol=1e-5, rtol=1e-4)


def test_masked_inputs_of_keras_loop_are_zeroed_exactly():
    """The zeroing before Keras' masked loop (`direction.zero_masked_inputs`,
    written in time-major order so that XLA fuses it into the loop's own
    transpose) gives numpy's `where(mask, x, 0)` bit for bit, shape and
    order kept, with inf, NaN and 3e38 at the masked steps."""
    from maskedrnn.layers import direction

    mask = edge_mask()
    x = make_inputs(7)
    pads = np.resize(
        np.array([3e38, np.inf, -np.inf, np.nan], "float32"), (~mask).sum()
    )
    x[~mask] = pads[:, None]
    got = to_np(direction.zero_masked_inputs(x, mask))
    assert got.shape == (B, T, D)
    np.testing.assert_array_equal(got, np.where(mask[..., None], x, 0.0))


def numpy_lstm_states(x, mask, kernel, recurrent_kernel, bias):
    """Oracle: Keras' LSTM equations in float64 numpy, stepping over the
    valid steps of each row; returns the final `(h, c)`."""
    units = recurrent_kernel.shape[0]
    h = np.zeros((len(x), units))
    c = np.zeros((len(x), units))
    for row in range(len(x)):
        for t in np.flatnonzero(mask[row]):
            z = x[row, t] @ kernel + h[row] @ recurrent_kernel + bias
            i, f, g, o = np.split(z, 4)
            c[row] = sigmoid(f) * c[row] + sigmoid(i) * np.tanh(g)
            h[row] = sigmoid(o) * np.tanh(c[row])
    return h, c


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


@pytest.mark.skipif(
    BACKEND == "jax", reason="float64 on JAX needs x64 (a process of its own)"
)
@pytest.mark.parametrize("wrapper", ["rnn", "bidirectional"])
def test_float64_lstm_states_and_gradients_are_float64_exact(wrapper):
    """The LSTM cell-state recomputation runs in float64 for a float64 layer:
    the final `h` and `c` equal a float64 numpy LSTM to 1e-12 (float32
    arithmetic there is off by ~1e-7, and by up to 7e-4 relative in weight
    gradients with inputs scaled by 1e3). Weight gradients match Keras to
    1e-9 on TensorFlow; on torch, Keras' own float64 LSTM is float32-accurate
    only (its `ops.matmul` of two float64 tensors computes in float32), so
    there the gradient check is 1e-6."""
    keras.utils.set_random_seed(0)
    kw = dict(return_sequences=False, return_state=True, dtype="float64")
    if wrapper == "rnn":
        ours, ref = oracle_pair("lstm", U, D, wrapper=wrapper, **kw)
        forward = ours.layer
    else:
        ours = MaskedBidirectional(make_rnn("lstm", U, **kw), dtype="float64")
        ref = keras.layers.Bidirectional(
            make_rnn("lstm", U, oracle=True, **kw), dtype="float64"
        )
        ref.build((None, None, D))
        ours.build((None, None, D))
        ours.set_weights(ref.get_weights())
        forward = ours.forward_layer
    x = make_inputs(9).astype("float64") * 3
    mask = edge_mask()
    out = flat(ours(x, mask=mask))
    assert {keras.backend.standardize_dtype(o.dtype) for o in out} == {"float64"}
    h, c = numpy_lstm_states(x, mask, *forward.get_weights())
    assert_close(out[1:3], [h, c], atol=1e-12, rtol=1e-12)
    _, g_ours = loss_and_grads(ours, x, mask=mask)
    _, g_ref = loss_and_grads(ref, x, mask=mask)
    tol = 1e-9 if BACKEND == "tensorflow" else 1e-6
    for a, b in zip(g_ours, g_ref):
        np.testing.assert_allclose(a, b, atol=tol, rtol=tol)


X64_SCRIPT = """
import keras, numpy as np
from maskedrnn import MaskedBidirectional, MaskedRNN
x = np.random.default_rng(0).standard_normal((3, 5, 2))
mask = np.array([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0]], bool)
for wrap, oracle in ((MaskedRNN, lambda l, dtype: l),
                     (MaskedBidirectional, keras.layers.Bidirectional)):
    kw = dict(dtype="float64", return_sequences=True, return_state=True)
    ours = wrap(keras.layers.SimpleRNN(4, **kw), dtype="float64")
    ref = oracle(keras.layers.SimpleRNN(4, **kw), dtype="float64")
    ours.build((None, None, 2)); ref.build((None, None, 2))
    ours.set_weights(ref.get_weights())
    assert "float64 SimpleRNN on JAX" in list(ours.kernel_info().values())[0]
    for a, b in zip(ours(x, mask=mask), ref(x, mask=mask)):
        assert str(a.dtype) == "float64", a.dtype
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-12)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "jax", reason="a JAX x64 bug of Keras")
def test_jax_x64_float64_simple_rnn_works_through_keras_masked_loop():
    """Keras' unmasked SimpleRNN fails on JAX with x64 in float64 ("scan body
    function carry input and carry output must have equal types"); its
    masked loop works, so both wrappers take it there, exactly."""
    out = run_python(["-c", X64_SCRIPT], "jax", JAX_ENABLE_X64="1")
    assert out.strip().endswith("ok")


def test_exported_from_the_package():
    assert maskedrnn.MaskedRNN is MaskedRNN
    assert maskedrnn.layers.MaskedRNN is MaskedRNN
    assert "MaskedRNN" in maskedrnn.__all__


def test_building_imports_the_backends_code():
    """Building a layer imports this package's code for the Keras backend in
    use, so a first call's trace does not pay for the import."""
    script = (
        "import sys, keras\n"
        "from maskedrnn import MaskedBidirectional, MaskedRNN\n"
        "name = 'maskedrnn.backends.' + keras.backend.backend()\n"
        "for wrap in (MaskedRNN, MaskedBidirectional):\n"
        "    for m in [m for m in sys.modules if m.startswith(name)]:\n"
        "        del sys.modules[m]\n"
        "    import maskedrnn.backends as b; b._MODULES.clear()\n"
        "    layer = wrap(keras.layers.GRU(2))\n"
        "    before = name in sys.modules\n"
        "    layer.build((None, 3, 1))\n"
        "    print(wrap.__name__, before, name in sys.modules)\n"
    )
    out = run_python(["-c", script], BACKEND)
    assert out.split("\n")[:2] == [
        "MaskedRNN False True",
        "MaskedBidirectional False True",
    ]
