"""MaskedBidirectional, specified against keras.layers.Bidirectional fed the same mask.

The oracle throughout is Keras' own `Bidirectional` around the same inner layer
with `use_cudnn=False` (its generic masked step loop), given the same weights
and mask.
"""

import keras
import numpy as np
import pytest
from keras import ops

import maskedrnn
from maskedrnn import MaskedBidirectional, backends
from tests.helpers import (
    GPU_GRAD_ATOL,
    assert_close,
    edge_mask,
    flat,
    loss_and_grads,
    oracle_pair,
    run_layer_test,
    save_and_load,
    spy_masks,
    to_np,
)

B, T, D, U = 6, 7, 3, 4
ATOL = 1e-5
MERGE_MODES = ["concat", "sum", "mul", "ave", None]


def make_inputs(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, T, D)).astype("float32")
    return x


def make_cell_layer(kind, **kw):
    """The inner layer to wrap; `oracle=True` for Keras' reference version."""
    oracle = kw.pop("oracle", False)
    if kind == "lstm":
        return keras.layers.LSTM(U, use_cudnn=False if oracle else "auto", **kw)
    if kind == "gru":
        return keras.layers.GRU(U, use_cudnn=False if oracle else "auto", **kw)
    if kind == "simple":
        return keras.layers.SimpleRNN(U, **kw)
    if kind == "rnn_cell":
        return keras.layers.RNN(keras.layers.LSTMCell(U), **kw)
    raise ValueError(kind)


def pair(kind, merge_mode="concat", **kw):
    """(ours, oracle) with identical weights, both built on (None, None, D)."""
    return oracle_pair(kind, U, D, merge_mode=merge_mode, **kw)


def assert_all_close(actual, expected, atol=ATOL):
    assert_close(actual, expected, atol=atol, rtol=1e-5)


# ------------------------------------------------------------------ parity


# Merge modes are independent of the output flags: every merge mode with
# sequences and states, and every flag combination with "concat" and None.
OUTPUT_CASES = [(m, True, True) for m in MERGE_MODES] + [
    (m, rs, st)
    for m in ("concat", None)
    for rs, st in ((True, False), (False, True), (False, False))
]


@pytest.mark.parametrize("kind", ["lstm", "gru", "simple", "rnn_cell"])
@pytest.mark.parametrize("merge_mode, return_sequences, return_state", OUTPUT_CASES)
def test_matches_keras_bidirectional_with_mask(
    kind, merge_mode, return_sequences, return_state, grad_mode, kernel
):
    ours, ref = pair(
        kind,
        merge_mode,
        return_sequences=return_sequences,
        return_state=return_state,
    )
    x, mask = make_inputs(), edge_mask()
    assert_all_close(ours(x, mask=mask), ref(x, mask=mask))


@pytest.mark.parametrize("kind", ["lstm", "gru", "simple", "rnn_cell"])
def test_gradients_match_keras(kind, kernel):
    ours, ref = pair(kind, return_sequences=True, return_state=True)
    x, mask = make_inputs(1), edge_mask()
    loss_o, grads_o = loss_and_grads(ours, x, mask=mask)
    loss_r, grads_r = loss_and_grads(ref, x, mask=mask)
    assert np.isclose(loss_o, loss_r, atol=1e-4)
    assert len(grads_o) == len(grads_r)
    for g_o, g_r in zip(grads_o, grads_r):
        assert np.all(np.isfinite(g_o))
        np.testing.assert_allclose(g_o, g_r, atol=max(ATOL, GPU_GRAD_ATOL), rtol=1e-4)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gradients_match_keras_last_output(kind, kernel):
    ours, ref = pair(kind, return_sequences=False)
    x, mask = make_inputs(2), edge_mask()
    _, grads_o = loss_and_grads(ours, x, mask=mask)
    _, grads_r = loss_and_grads(ref, x, mask=mask)
    for g_o, g_r in zip(grads_o, grads_r):
        np.testing.assert_allclose(g_o, g_r, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_lengths_equal_right_padded_mask(kind, grad_mode, kernel):
    ours, ref = pair(kind, return_sequences=True, return_state=True)
    x = make_inputs(3)
    lengths = np.array([7, 3, 0, 1, 5, 7], "int32")
    mask = np.arange(T)[None, :] < lengths[:, None]
    expected = ref(x, mask=mask)
    assert_all_close(ours(x, lengths=lengths), expected)
    # lengths win over a (contradicting) mask.
    assert_all_close(ours(x, mask=np.ones((B, T), bool), lengths=lengths), expected)


def test_no_mask_equals_unmasked_bidirectional(kernel):
    ours, ref = pair("lstm", return_sequences=True, return_state=True)
    x = make_inputs(4)
    assert_all_close(ours(x), ref(x))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_initial_state(kind, grad_mode, kernel):
    ours, ref = pair(kind, return_sequences=True, return_state=True)
    x, mask = make_inputs(5), edge_mask()
    n = 4 if kind == "lstm" else 2
    rng = np.random.default_rng(7)
    states = [rng.standard_normal((B, U)).astype("float32") for _ in range(n)]
    got = ours(x, mask=mask, initial_state=states)
    assert_all_close(got, ref(x, mask=mask, initial_state=states))
    # The zero-length row (3) keeps its initial states.
    for s_in, s_out in zip(states, flat(got)[1:]):
        np.testing.assert_allclose(to_np(s_out)[3], s_in[3], atol=1e-6)


def test_custom_backward_layer():
    fwd = keras.layers.LSTM(U, return_sequences=True)
    bwd = keras.layers.LSTM(U + 2, return_sequences=True, go_backwards=True)
    ours = MaskedBidirectional(fwd, backward_layer=bwd)
    ref = keras.layers.Bidirectional(
        keras.layers.LSTM(U, return_sequences=True, use_cudnn=False),
        backward_layer=keras.layers.LSTM(
            U + 2, return_sequences=True, go_backwards=True, use_cudnn=False
        ),
    )
    x, mask = make_inputs(6), edge_mask()
    ref(x, mask=mask)
    ours(x, mask=mask)
    ours.set_weights(ref.get_weights())
    out = ours(x, mask=mask)
    assert out.shape == (B, T, 2 * U + 2)
    assert_all_close(out, ref(x, mask=mask))


def test_padded_steps_are_zero_and_mask_propagates():
    ours, _ = pair("gru", return_sequences=True)
    x, mask = make_inputs(), edge_mask()
    y = to_np(ours(x, mask=mask))
    assert np.all(y[~mask] == 0)
    assert np.all(np.abs(y[mask]).sum(-1) > 0)
    out_mask = ours.compute_mask(x, ops.convert_to_tensor(mask))
    np.testing.assert_array_equal(to_np(out_mask), mask)
    assert ours.compute_mask(x, None) is None


# ------------------------------------------------- the backward direction


def test_backward_direction_reads_valid_steps_only():
    """The README's picture: `1 2 3 0 0` must be read backward as `3 2 1`.

    A backward SimpleRNN with identity weights sums its inputs, so its output
    at step t is the sum of valid inputs from t to the end of the row.
    """
    layer = MaskedBidirectional(
        keras.layers.SimpleRNN(
            1,
            activation=None,
            use_bias=False,
            kernel_initializer="ones",
            recurrent_initializer="ones",
            return_sequences=True,
        ),
        merge_mode=None,
    )
    x = np.array([[1, 2, 3, 0, 0], [0, 0, 1, 2, 3]], "float32")[..., None]
    fwd, bwd = layer(x, mask=x[..., 0] != 0)
    np.testing.assert_allclose(to_np(fwd)[..., 0], [[1, 3, 6, 0, 0], [0, 0, 1, 3, 6]])
    np.testing.assert_allclose(to_np(bwd)[..., 0], [[6, 5, 3, 0, 0], [0, 0, 6, 5, 3]])


# ----------------------------------------------------------- fast path spy


def _spy_masks(layer):
    return spy_masks((layer.forward_layer, layer.backward_layer))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@backends.force("keras-unmasked")
def test_inner_rnns_never_receive_a_mask(kind):
    """Keras fills `mask` from a mask attached to a tensor: prove it stays None
    on the fast path, through Embedding(mask_zero=True) and with lengths.
    (Keras' unmasked inner layers forced: PyTorch's native kernels, the
    torch default on CPU, do not call them at all, tests/test_backends.py
    covers those; a JAX CPU runs Keras' masked loop by default.)"""
    assert MaskedBidirectional(make_cell_layer(kind)).uses_fast_path
    layer = MaskedBidirectional(make_cell_layer(kind, return_sequences=True))
    seen = _spy_masks(layer)
    ids = keras.Input((None,), dtype="int32")
    emb = keras.layers.Embedding(10, D, mask_zero=True)(ids)
    model = keras.Model(ids, layer(emb))
    batch = np.array([[1, 2, 3, 0, 0], [0, 0, 4, 5, 6]], "int32")
    model.predict(batch, verbose=0)
    lengths = keras.Input((), dtype="int32")
    model2 = keras.Model([ids, lengths], layer(emb, lengths=lengths))
    model2.predict([batch, np.array([3, 5], "int32")], verbose=0)
    assert seen and all(m is None for m in seen)


def test_generic_cells_loop_over_the_callers_mask():
    """No fused kernel to keep: each direction runs Keras' masked loop on
    the mask as given (the backward one flipped, as Keras' Bidirectional);
    with lengths=, the same with the right-padded mask of the lengths."""
    layer = MaskedBidirectional(keras.layers.RNN(keras.layers.GRUCell(U)))
    assert not layer.uses_fast_path
    assert not MaskedBidirectional(
        keras.layers.LSTM(U, recurrent_dropout=0.1)
    ).uses_fast_path
    seen = _spy_masks(layer)
    mask = edge_mask()
    layer(make_inputs(), mask=mask)
    assert len(seen) == 2
    np.testing.assert_array_equal(to_np(seen[0]), mask)
    np.testing.assert_array_equal(to_np(seen[1]), mask[:, ::-1])
    lengths = mask.sum(1)
    layer(make_inputs(), lengths=lengths)
    assert len(seen) == 4
    right_padded = np.arange(T) < lengths[:, None]
    np.testing.assert_array_equal(to_np(seen[2]), right_padded)
    np.testing.assert_array_equal(to_np(seen[3]), right_padded[:, ::-1])


def test_lstm_input_dropout_keeps_exact_cell_state():
    """With input dropout in training, the recomputed cell state must use the
    same dropped inputs: freeze the dropout mask and compare with Keras."""
    rng = np.random.default_rng(0)
    fixed = (rng.random((B, D)) > 0.5).astype("float32") * 2.0
    ours, ref = pair("lstm", return_sequences=True, return_state=True, dropout=0.5)
    for cell in (
        ours.forward_layer.cell,
        ours.backward_layer.cell,
        ref.forward_layer.cell,
        ref.backward_layer.cell,
    ):
        cell.get_dropout_mask = lambda step_input: ops.convert_to_tensor(fixed)
    x, mask = make_inputs(8), edge_mask()
    assert_all_close(
        ours(x, mask=mask, training=True), ref(x, mask=mask, training=True)
    )


# ------------------------------------------------- weights and serialization


def test_weights_interchange_with_bidirectional():
    ours, ref = pair("lstm", return_sequences=True)
    assert [tuple(w.shape) for w in ours.weights] == [
        tuple(w.shape) for w in ref.weights
    ]
    rng = np.random.default_rng(1)
    new = [rng.standard_normal(w.shape).astype("float32") for w in ours.get_weights()]
    ours.set_weights(new)
    ref.set_weights(ours.get_weights())
    for a, b in zip(ref.get_weights(), new):
        np.testing.assert_array_equal(a, b)
    x, mask = make_inputs(), edge_mask()
    assert_all_close(ours(x, mask=mask), ref(x, mask=mask))
    # The `weights` constructor argument, as in Bidirectional.
    third = MaskedBidirectional(
        keras.layers.LSTM(U, return_sequences=True), weights=new
    )
    assert_all_close(third(x, mask=mask), ref(x, mask=mask))


def test_config_round_trip_and_registration():
    layer = MaskedBidirectional(
        keras.layers.GRU(U, return_sequences=True, return_state=True, dropout=0.1),
        merge_mode="ave",
        name="bi",
    )
    config = layer.get_config()
    assert config["merge_mode"] == "ave"
    assert config["layer"]["config"]["return_state"] is True
    assert config["backward_layer"]["config"]["go_backwards"] is True
    clone = MaskedBidirectional.from_config(config)
    assert clone.get_config() == config
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(layer)
    )
    assert isinstance(restored, MaskedBidirectional)
    assert restored.get_config() == config


@pytest.mark.parametrize("kind", ["lstm", "gru", "simple"])
def test_run_layer_test(kind):
    run_layer_test(
        lambda: MaskedBidirectional(make_cell_layer(kind, return_sequences=True)),
        make_inputs(),
        {"mask": edge_mask()},
        expected_output_shape=(B, T, 2 * U),
    )
    run_layer_test(
        lambda: MaskedBidirectional(
            make_cell_layer(kind, return_state=True), merge_mode="sum"
        ),
        make_inputs(),
        {"mask": edge_mask()},
        expected_output_shape=(B, U),
    )


def _tagger(layer_cls, **kw):
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(20, D, mask_zero=True)(ids)
    x = layer_cls(keras.layers.LSTM(U, return_sequences=True, **kw))(x)
    return keras.Model(ids, keras.layers.Dense(3)(x))


def _ids():
    rng = np.random.default_rng(3)
    ids = rng.integers(1, 20, size=(B, T)).astype("int32")
    ids[~edge_mask()] = 0
    return ids


def test_functional_model_matches_and_survives_save_load():
    ref = _tagger(keras.layers.Bidirectional, use_cudnn=False)
    ours = _tagger(MaskedBidirectional)
    ours.set_weights(ref.get_weights())
    ids = _ids()
    expected = ref.predict(ids, verbose=0)
    np.testing.assert_allclose(ours.predict(ids, verbose=0), expected, atol=ATOL)
    loaded = save_and_load(ours)  # no custom_objects: registered on import
    assert isinstance(loaded.layers[2], MaskedBidirectional)
    np.testing.assert_allclose(loaded.predict(ids, verbose=0), expected, atol=ATOL)


def test_sequential_model():
    ref = keras.Sequential(
        [
            keras.Input((None, D)),
            keras.layers.Masking(0.0),
            keras.layers.Bidirectional(keras.layers.GRU(U, use_cudnn=False)),
        ]
    )
    ours = keras.Sequential(
        [
            keras.Input((None, D)),
            keras.layers.Masking(0.0),
            MaskedBidirectional(keras.layers.GRU(U)),
        ]
    )
    ours.set_weights(ref.get_weights())
    x = make_inputs() * edge_mask()[..., None]
    np.testing.assert_allclose(
        ours.predict(x, verbose=0), ref.predict(x, verbose=0), atol=ATOL
    )
    loaded = save_and_load(ours)
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), ref.predict(x, verbose=0), atol=ATOL
    )


class _Subclassed(keras.Model):
    def __init__(self, wrapper, **kw):
        super().__init__(**kw)
        self.embed = keras.layers.Embedding(20, D, mask_zero=True)
        self.rnn = wrapper(keras.layers.LSTM(U, return_sequences=True))
        self.out = keras.layers.Dense(2)

    def call(self, ids):
        return self.out(self.rnn(self.embed(ids)))


def test_subclassed_model():
    ours = _Subclassed(MaskedBidirectional)
    ref = _Subclassed(
        lambda layer: keras.layers.Bidirectional(
            keras.layers.LSTM(U, return_sequences=True, use_cudnn=False)
        )
    )
    ids = _ids()
    ours(ids)
    ref(ids)
    ours.set_weights(ref.get_weights())
    np.testing.assert_allclose(to_np(ours(ids)), to_np(ref(ids)), atol=ATOL)


def test_none_batch_and_time_dimensions():
    inp = keras.Input((None, D))
    lengths = keras.Input((), dtype="int32")
    out = MaskedBidirectional(keras.layers.LSTM(U, return_sequences=True))(
        inp, lengths=lengths
    )
    assert tuple(out.shape) == (None, None, 2 * U)
    model = keras.Model([inp, lengths], out)
    for b, t in [(2, 5), (3, 9)]:
        x = np.random.default_rng(b).standard_normal((b, t, D)).astype("float32")
        y = model.predict([x, np.full((b,), t - 1, "int32")], verbose=0)
        assert y.shape == (b, t, 2 * U)
        assert np.all(y[:, -1] == 0)


def test_explicit_lengths_model_trains_like_masked_model():
    """One fit step of `inputs, lengths -> MaskedBidirectional` equals the
    masked Keras model (same loss value, same weights after the step)."""
    ids = _ids()
    lengths_np = edge_mask().sum(1).astype("int32")
    right = np.zeros_like(ids)
    for i, n in enumerate(lengths_np):
        right[i, :n] = ids[i][edge_mask()[i]]
    target = np.random.default_rng(0).standard_normal((B, 2 * U)).astype("float32")

    ref_in = keras.Input((None,), dtype="int32")
    ref_x = keras.layers.Embedding(20, D, mask_zero=True)(ref_in)
    ref_out = keras.layers.Bidirectional(keras.layers.LSTM(U, use_cudnn=False))(ref_x)
    ref = keras.Model(ref_in, ref_out)

    ids_in = keras.Input((None,), dtype="int32")
    len_in = keras.Input((), dtype="int32")
    x = keras.layers.Embedding(20, D)(ids_in)
    ours_out = MaskedBidirectional(keras.layers.LSTM(U))(x, lengths=len_in)
    ours = keras.Model([ids_in, len_in], ours_out)
    ours.set_weights(ref.get_weights())

    for m in (ref, ours):
        m.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    h_ref = ref.fit(right, target, epochs=2, batch_size=B, verbose=0, shuffle=False)
    h_ours = ours.fit(
        [right, lengths_np], target, epochs=2, batch_size=B, verbose=0, shuffle=False
    )
    np.testing.assert_allclose(h_ours.history["loss"], h_ref.history["loss"], rtol=1e-5)
    for a, b in zip(ours.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------ bad arguments


def test_constructor_rejects_bad_arguments():
    with pytest.raises(ValueError, match="keras.layers.RNN"):
        MaskedBidirectional(keras.layers.Dense(3))
    with pytest.raises(ValueError, match="merge_mode"):
        MaskedBidirectional(keras.layers.LSTM(3), merge_mode="max")
    with pytest.raises(ValueError, match="stateful"):
        MaskedBidirectional(keras.layers.LSTM(3, stateful=True))
    with pytest.raises(ValueError, match="go_backwards"):
        MaskedBidirectional(keras.layers.LSTM(3, go_backwards=True))
    with pytest.raises(ValueError, match="backward_layer"):
        MaskedBidirectional(keras.layers.LSTM(3), backward_layer=keras.layers.LSTM(3))
    with pytest.raises(ValueError, match="return_sequences"):
        MaskedBidirectional(
            keras.layers.LSTM(3, return_sequences=True),
            backward_layer=keras.layers.LSTM(3, go_backwards=True),
        )


@pytest.mark.parametrize(
    "lengths, message",
    [
        (np.array([8, 1, 1, 1, 1, 1], "int32"), "longer than the time axis"),
        (np.array([-1, 1, 1, 1, 1, 1], "int32"), ">= 0"),
        (np.array([1.0, 1, 1, 1, 1, 1], "float32"), "integers"),
        (np.array([1, 1, 1], "int32"), "lengths has 3 rows but inputs has 6"),
        (np.ones((6, 2), "int32"), r"shape \(batch,\)"),
    ],
)
def test_bad_lengths_raise(lengths, message):
    layer = MaskedBidirectional(keras.layers.GRU(U))
    with pytest.raises(ValueError, match=message):
        layer(make_inputs(), lengths=lengths)


def test_bad_inputs_raise():
    layer = MaskedBidirectional(keras.layers.GRU(U))
    with pytest.raises(ValueError, match=r"\(batch, time, features\)"):
        layer(np.zeros((2, 3), "float32"))
    with pytest.raises(ValueError, match="mask has 5 along axis 1"):
        layer(make_inputs(), mask=np.ones((B, 5), bool))


def test_package_exports():
    assert maskedrnn.MaskedBidirectional is MaskedBidirectional


def _lstm_forward_gru_backward(**kw):
    return MaskedBidirectional(
        keras.layers.LSTM(U, return_state=True, **kw),
        backward_layer=keras.layers.GRU(
            U + 1, return_state=True, go_backwards=True, **kw
        ),
    )


def test_compute_mask_returns_one_mask_per_output_with_mixed_directions():
    """Forward LSTM ([h, c]) + backward GRU ([h]): 1 + 2 + 1 outputs, so 4
    masks (it counted the forward layer's states twice: 5)."""
    layer = _lstm_forward_gru_backward(return_sequences=True)
    x, mask = make_inputs(), edge_mask()
    outputs = flat(layer(x, mask=mask))
    masks = layer.compute_mask(x, ops.convert_to_tensor(mask))
    assert len(outputs) == len(masks) == 4
    np.testing.assert_array_equal(to_np(masks[0]), mask)
    assert masks[1:] == (None, None, None)


def test_initial_state_of_mixed_directions_is_three_tensors_named_in_errors():
    """Forward LSTM + backward GRU take 3 state tensors (it asked for 4):
    h and c of the forward LSTM, then h of the backward GRU; errors say which
    tensors, in which order, with their sizes. An all-padding row returns
    its initial states."""
    layer = _lstm_forward_gru_backward()
    rng = np.random.default_rng(2)
    states = [
        rng.standard_normal((B, size)).astype("float32") for size in (U, U, U + 1)
    ]
    x, mask = make_inputs(), edge_mask()
    _, h_f, c_f, h_b = layer(x, mask=mask, initial_state=states)
    for got, want in zip((h_f, c_f, h_b), states):
        np.testing.assert_allclose(to_np(got)[3], want[3])  # all-padding row
    with pytest.raises(
        ValueError,
        match=r"has 4 tensors but this layer needs 3, in this order: the forward "
        r"LSTM's h \(batch, 4\), the forward LSTM's c \(batch, 4\), the backward "
        r"GRU's h \(batch, 5\); got shapes",
    ):
        layer(x, initial_state=states + [states[0]])
    with pytest.raises(
        ValueError, match=r"initial_state\[2\] is the backward GRU's h .*got shape"
    ):
        layer(x, initial_state=states[:2] + [states[0]])


def test_kernel_info_promises_no_fused_simple_rnn_kernel():
    layer = MaskedBidirectional(keras.layers.SimpleRNN(U))
    layer.build((None, None, D))
    # Keras' unmasked SimpleRNN's sentence (forced on JAX, whose CPU default
    # is Keras' masked loop, tests/test_kernels.py, and on TensorFlow, whose
    # CPU default is the length tiers, tests/test_tf_tiers.py).
    kernel = "keras-unmasked" if keras.backend.backend() != "torch" else None
    with backends.force(kernel):
        info = layer.kernel_info()
    for sentence in info.values():
        if keras.backend.backend() == "torch":
            assert "PyTorch's native SimpleRNN" in sentence
        else:
            assert "no backend has a fused SimpleRNN kernel" in sentence
            assert "cuDNN" not in sentence
