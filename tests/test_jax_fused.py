"""`maskedrnn.backends.jax_fused`: the JAX backend's one-call masked LSTM.

Run here with `use_cudnn=False` (`jax.experimental.rnn.lstm_ref`, JAX's
reference of the cuDNN call; no GPU needed) and JAX's `highest` matmul
precision (tests/conftest.py). Oracles:

- Keras' `LSTM(use_cudnn=False)` handed the mask explicitly: the forward
  direction as it is, the backward direction as `go_backwards=True` (its
  outputs flipped back to the caller's positions), outputs, final `[h, c]`
  and the gradients w.r.t. the inputs, every weight and the initial states;
- a numpy float64 LSTM stepping each row over its own valid steps, its
  gradients by central differences.

Rows: full, post-padded, of length 1 and of length 0, in one batch.
"""

import keras
import numpy as np
import pytest

from tests.helpers import lengths_to_mask

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="jax_fused is the JAX backend's kernel (jax.experimental.rnn)",
)

if keras.backend.backend() == "jax":
    import jax
    import jax.numpy as jnp
    from jax.experimental import rnn as jax_rnn

    from maskedrnn.backends import jax_fused


def _cudnn():
    return jax_fused.cudnn_present()


B, T, D, U = 5, 7, 3, 4
LENGTHS = np.array([7, 3, 0, 1, 5], "int32")


def _data(seed, batch, time, features, lengths, dtype="float32"):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, time, features))
    return (x * lengths_to_mask(lengths, time)[..., None]).astype(dtype)


def _keras_layers(directions, features, units, seed=0, dtype=None):
    """Keras' masked LSTMs (forward, then go_backwards), random biases."""
    rng = np.random.default_rng(seed)
    layers = []
    for d in range(directions):
        layer = keras.layers.LSTM(
            units,
            return_sequences=True,
            return_state=True,
            use_cudnn=False,
            go_backwards=d == 1,
            dtype=dtype,
        )
        layer.build((None, None, features))
        layer.cell.bias.assign(rng.standard_normal(4 * units).astype("float32"))
        layers.append(layer)
    return layers


def _initial(directions, batch, units, seed=1):
    rng = np.random.default_rng(seed)
    return [
        [rng.standard_normal((batch, units)).astype("float32") for _ in range(2)]
        for _ in range(directions)
    ]


def _cotangents(directions, batch, time, units, seed=2):
    """Fixed random weights of the outputs and of each final state."""
    rng = np.random.default_rng(seed)
    wy = rng.standard_normal((batch, time, directions * units))
    ws = rng.standard_normal((directions, 2, batch, units))
    return wy.astype("float32"), ws.astype("float32")


def _loss(y, states, wy, ws):
    total = jnp.sum(y.astype(jnp.float32) * wy)
    for d, pair in enumerate(states):
        for k, s in enumerate(pair):
            total = total + jnp.sum(s.astype(jnp.float32) * ws[d, k])
    return total


def _ours(x, params, initial, lengths, wy, ws):
    """The loss of `jax_fused.lstm` and its results; `params` is each
    direction's kernel, recurrent kernel and bias; `initial` None or a
    list per direction of `[h, c]`."""
    weights = [tuple(params[3 * d : 3 * d + 3]) for d in range(len(params) // 3)]
    y, states = jax_fused.lstm(
        x, lengths, weights, initial, use_cudnn=False, precision="highest"
    )
    return _loss(y, states, wy, ws), (y, states)


def _keras(layers):
    """The same function of Keras' masked layers: the backward layer's
    outputs flipped back to the caller's positions, padding zeroed."""
    frozen = [[v.value for v in layer.non_trainable_variables] for layer in layers]

    def fn(x, params, initial, lengths, wy, ws):
        valid = jnp.arange(x.shape[1])[None, :] < lengths[:, None]
        ys, states = [], []
        for d, layer in enumerate(layers):
            kwargs = {} if initial is None else {"initial_state": initial[d]}
            (y, h, c), _ = layer.stateless_call(
                params[3 * d : 3 * d + 3], frozen[d], x, mask=valid, **kwargs
            )
            if d == 1:
                y = jnp.flip(y, axis=1)
            ys.append(jnp.where(valid[..., None], y, 0.0))
            states.append([h, c])
        y = jnp.concatenate(ys, axis=-1)
        return _loss(y, states, wy, ws), (y, states)

    return fn


def _params(layers):
    return [v.value for layer in layers for v in layer.trainable_variables]


_STEPS = {}


def _grads(fn, x, params, initial, lengths, wy, ws):
    """`(y, states, (dx, dparams, dinitial))` of `fn`, jitted once per `fn`
    (the compiled steps are shared by the tests of the same shapes)."""
    step = _STEPS.get(fn)
    if step is None:
        step = jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2), has_aux=True))
        _STEPS[fn] = step
    lengths = jnp.asarray(lengths)
    (_, (y, states)), grads = step(x, params, initial, lengths, wy, ws)
    return y, states, grads


def _assert_trees_close(actual, expected, atol, rtol=1e-5):
    actual = jax.tree_util.tree_leaves(actual)
    expected = jax.tree_util.tree_leaves(expected)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape, (i, a.shape, e.shape)
        np.testing.assert_allclose(
            np.asarray(a, "float64"),
            np.asarray(e, "float64"),
            atol=atol,
            rtol=rtol,
            err_msg=f"leaf {i}",
        )


@pytest.mark.parametrize(
    "directions, with_initial",
    [(2, True), (2, False), (1, True)],
    ids=["bidirectional-initial", "bidirectional-zeros", "forward-initial"],
)
def test_matches_keras_masked_lstm(directions, with_initial):
    """Outputs, final [h, c] and every gradient equal Keras' masked LSTMs',
    jitted, over full, post-padded, length-1 and empty rows."""
    layers = _keras_layers(directions, D, U)
    x = _data(0, B, T, D, LENGTHS)
    initial = _initial(directions, B, U)
    wy, ws = _cotangents(directions, B, T, U)
    params = _params(layers)
    given = initial if with_initial else None
    got = _grads(_ours, x, params, given, LENGTHS, wy, ws)
    want = _grads(_keras(layers), x, params, given, LENGTHS, wy, ws)
    _assert_trees_close(got, want, atol=2e-5)
    y, states, (dx, dparams, dinitial) = got
    assert y.shape == (B, T, directions * U) and y.dtype == jnp.float32
    empty = LENGTHS == 0
    # The empty row: zero outputs, its initial state, which its gradient
    # passes through unchanged (the step cuDNN is made to run is cut off).
    assert not np.any(np.asarray(y)[empty])
    assert not np.any(np.asarray(dx)[empty])
    for d in range(directions):
        for k in range(2):
            start = initial[d][k] if with_initial else np.zeros((B, U))
            np.testing.assert_array_equal(np.asarray(states[d][k])[empty], start[empty])
            if with_initial:
                np.testing.assert_allclose(
                    np.asarray(dinitial[d][k])[empty], ws[d, k][empty], rtol=1e-6
                )
    # Not vacuous: the initial state reaches the other rows' outputs.
    if with_initial:
        assert np.all(np.abs(np.asarray(dinitial[0][0])[~empty]) > 0)


# --- numpy float64 oracle --------------------------------------------------


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def np_lstm(x, lengths, weights, initial):
    """float64 LSTM, each direction over each row's own valid steps (the
    backward one from the row's last valid step); outputs at their steps,
    zeros at padding; final states (the initial state for an empty row)."""
    batch, time, _ = x.shape
    ys, states = [], []
    for d, (kernel, recurrent, bias) in enumerate(weights):
        units = recurrent.shape[0]
        y = np.zeros((batch, time, units))
        hs, cs = np.array(initial[d][0]), np.array(initial[d][1])
        for b in range(batch):
            h, c = hs[b], cs[b]
            order = range(lengths[b])
            for t in reversed(order) if d == 1 else order:
                z = x[b, t] @ kernel + h @ recurrent + bias
                i, f, g, o = np.split(z, 4)
                c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
                h = _sigmoid(o) * np.tanh(c)
                y[b, t] = h
            hs[b], cs[b] = h, c
        ys.append(y)
        states.append([hs, cs])
    return np.concatenate(ys, axis=-1), states


def _np_grads(x, lengths, weights, initial, wy, ws, eps=1e-6):
    """Central differences of the float64 loss w.r.t. every input."""
    leaves = [x] + [w for ws_ in weights for w in ws_] + [s for p in initial for s in p]

    def loss():
        y, states = np_lstm(x, lengths, weights, initial)
        total = np.sum(y * wy)
        for d, pair in enumerate(states):
            total += sum(np.sum(s * ws[d, k]) for k, s in enumerate(pair))
        return total

    grads = []
    for leaf in leaves:
        grad = np.zeros_like(leaf)
        for index in np.ndindex(leaf.shape):
            keep = leaf[index]
            leaf[index] = keep + eps
            up = loss()
            leaf[index] = keep - eps
            down = loss()
            leaf[index] = keep
            grad[index] = (up - down) / (2 * eps)
        grads.append(grad)
    return grads


@pytest.mark.parametrize(
    "lengths",
    [np.array([4, 2, 0], "int32"), np.array([0, 0, 0], "int32")],
    ids=["ragged", "all-empty"],
)
def test_matches_numpy_float64(lengths):
    """Bidirectional with an initial state vs a float64 numpy LSTM:
    outputs, final [h, c], and gradients by central differences."""
    batch, time, features, units = 3, 4, 2, 3
    rng = np.random.default_rng(5)
    x64 = _data(3, batch, time, features, lengths, "float64")
    weights64 = [
        (
            rng.standard_normal((features, 4 * units)) * 0.5,
            rng.standard_normal((units, 4 * units)) * 0.5,
            rng.standard_normal(4 * units) * 0.5,
        )
        for _ in range(2)
    ]
    initial64 = [
        [rng.standard_normal((batch, units)) for _ in range(2)] for _ in range(2)
    ]
    wy, ws = _cotangents(2, batch, time, units, seed=4)
    y64, states64 = np_lstm(x64, lengths, weights64, initial64)
    grads64 = _np_grads(x64, lengths, weights64, initial64, wy.astype("float64"), ws)
    f32 = lambda tree: jax.tree_util.tree_map(lambda a: jnp.asarray(a, "float32"), tree)  # noqa: E731
    params = f32([w for triple in weights64 for w in triple])
    y, states, (dx, dparams, dinitial) = _grads(
        _ours, f32(x64), params, f32(initial64), lengths, wy, ws
    )
    _assert_trees_close([y, states], [y64, states64], atol=1e-5)
    _assert_trees_close([dx] + list(dparams) + dinitial, grads64, atol=5e-5, rtol=1e-4)
    if not lengths.any():
        # Not vacuous: the rows' gradients are the cotangents themselves.
        np.testing.assert_allclose(np.asarray(dinitial[1][1]), ws[1, 1], rtol=1e-6)


# --- dtypes, shapes, bad values ---------------------------------------------


@pytest.mark.parametrize(
    "policy, atol", [("mixed_float16", 1e-2), ("mixed_bfloat16", 6e-2)]
)
def test_mixed_precision(policy, atol):
    """float16 / bfloat16 inputs are computed in float32 and cast back: equal
    to the float32 computation rounded, close to Keras' own masked LSTM
    under the same policy, results and input gradients in the input's
    dtype."""
    layers = _keras_layers(2, D, U, dtype=policy)
    dtype = layers[0].compute_dtype
    x = jnp.asarray(_data(0, B, T, D, LENGTHS), dtype)
    wy, ws = _cotangents(2, B, T, U)
    initial = jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype), _initial(2, B, U))
    params = _params(layers)
    y, states, (dx, _, _) = _grads(_ours, x, params, initial, LENGTHS, wy, ws)
    assert y.dtype == dtype and dx.dtype == dtype
    assert all(s.dtype == dtype for pair in states for s in pair)
    as32 = jax.tree_util.tree_map(lambda a: a.astype("float32"), (x, initial))
    y32, states32, (dx32, _, _) = _grads(
        _ours, as32[0], params, as32[1], LENGTHS, wy, ws
    )
    rounded = jax.tree_util.tree_map(lambda a: a.astype(dtype), (y32, states32))
    _assert_trees_close((y, states), rounded, atol=0, rtol=0)
    np.testing.assert_allclose(
        np.asarray(dx, "float32"), np.asarray(dx32), atol=atol / 5, rtol=1e-2
    )
    keras_forward = jax.jit(_keras(layers))
    _, want = keras_forward(x, params, initial, jnp.asarray(LENGTHS), wy, ws)
    _assert_trees_close((y, states), want, atol=atol, rtol=0)


def test_padding_is_never_read():
    """inf and NaN in the padded tail reach neither outputs, states nor
    gradients, which equal those of the zero-padded batch."""
    layers = _keras_layers(2, D, U)
    x = _data(0, B, T, D, LENGTHS)
    bad = x.copy()
    pad = ~lengths_to_mask(LENGTHS, T)
    bad[pad] = np.nan
    bad[pad.nonzero()[0][:1], pad.nonzero()[1][:1]] = np.inf
    wy, ws = _cotangents(2, B, T, U)
    initial, params = _initial(2, B, U), _params(layers)
    got = _grads(_ours, bad, params, initial, LENGTHS, wy, ws)
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree_util.tree_leaves(got))
    want = _grads(_ours, x, params, initial, LENGTHS, wy, ws)
    _assert_trees_close(got, want, atol=0, rtol=0)


def test_empty_batch_and_time():
    """No rows, or no steps: zero-size outputs, the initial states."""
    layers = _keras_layers(2, D, U)
    weights = [tuple(layer.trainable_variables) for layer in layers]
    y, states = jax_fused.lstm(
        jnp.zeros((0, T, D)), jnp.zeros((0,), "int32"), weights, use_cudnn=False
    )
    assert y.shape == (0, T, 2 * U) and states[1][1].shape == (0, U)
    initial = _initial(2, 2, U)
    y, states = jax_fused.lstm(
        jnp.zeros((2, 0, D)),
        jnp.zeros((2,), "int32"),
        weights,
        initial,
        use_cudnn=False,
    )
    assert y.shape == (2, 0, 2 * U)
    _assert_trees_close(states, initial, atol=0, rtol=0)


def test_pack_weights_layout():
    """The flat vector unpacks (JAX's `unpack_lstm_weights`, the layout the
    cuDNN call reads) into Keras' kernels transposed, Keras' bias as b_ih,
    zeros as b_hh, forward then backward."""
    layers = _keras_layers(2, D, U)
    weights = [tuple(v.value for v in layer.trainable_variables) for layer in layers]
    flat = jax_fused.pack_weights(weights)
    assert flat.shape == (jax_rnn.get_num_params_in_lstm(D, U, 1, True),)
    assert flat.dtype == jnp.float32
    w_ih, w_hh, b_ih, b_hh = jax_rnn.unpack_lstm_weights(flat, D, U, 1, True)
    for d, (kernel, recurrent, bias) in enumerate(weights):
        np.testing.assert_array_equal(w_ih[d], np.asarray(kernel).T)
        np.testing.assert_array_equal(w_hh[d], np.asarray(recurrent).T)
        np.testing.assert_array_equal(b_ih[d], bias)
        np.testing.assert_array_equal(b_hh[d], np.zeros(4 * U))
    one = jax_fused.pack_weights(weights[:1])
    np.testing.assert_array_equal(
        jax_rnn.unpack_lstm_weights(one, D, U, 1, False)[0][0],
        np.asarray(weights[0][0]).T,
    )
    # A missing bias packs as zeros.
    no_bias = jax_fused.pack_weights([(weights[0][0], weights[0][1], None)])
    assert not np.any(
        np.asarray(jax_rnn.unpack_lstm_weights(no_bias, D, U, 1, False)[2][0])
    )


def test_bad_arguments_raise():
    layers = _keras_layers(2, D, U)
    weights = [tuple(layer.trainable_variables) for layer in layers]
    x, lengths = jnp.zeros((B, T, D)), jnp.asarray(LENGTHS)
    with pytest.raises(ValueError, match="one .forward. or two"):
        jax_fused.pack_weights(weights * 2)
    with pytest.raises(ValueError, match="recurrent_kernel"):
        jax_fused.pack_weights([(weights[0][1], weights[0][0], None)])
    with pytest.raises(ValueError, match="float64 through Keras' masked loop"):
        jax_fused.lstm(np.zeros((B, T, D)), lengths, weights, use_cudnn=False)
    with pytest.raises(ValueError, match="initial_state must hold 2"):
        jax_fused.lstm(x, lengths, weights, _initial(1, B, U), use_cudnn=False)
    with pytest.raises(ValueError, match="precision DEFAULT"):
        jax_fused.lstm(x, lengths, weights, use_cudnn=False, precision="default")
    with pytest.raises(ValueError, match="precision must be"):
        jax_fused.lstm(x, lengths, weights, use_cudnn=False, precision="fast")
    with pytest.raises(ValueError, match="use_cudnn=True needs a CUDA GPU"):
        jax_fused.lstm(x, lengths, weights, use_cudnn=True)


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: keras.layers.LSTM(4), None),
        (lambda: keras.layers.LSTM(4, dropout=0.5), None),
        (lambda: keras.layers.LSTM(4, dtype="mixed_bfloat16"), None),
        (lambda: keras.layers.GRU(4), "a GRU runs Keras' layer"),
        (lambda: keras.layers.SimpleRNN(4), "not an LSTM"),
        (lambda: keras.layers.RNN(keras.layers.LSTMCell(4)), "not an LSTM"),
        (lambda: keras.layers.LSTM(4, use_cudnn=False), "use_cudnn=False"),
        (lambda: keras.layers.LSTM(4, activation="relu"), "tanh"),
        (lambda: keras.layers.LSTM(4, recurrent_activation="hard_sigmoid"), "sigmoid"),
        (lambda: keras.layers.LSTM(4, use_bias=False), "use_bias=False"),
        (lambda: keras.layers.LSTM(4, recurrent_dropout=0.1), "recurrent_dropout"),
        (lambda: keras.layers.LSTM(4, unroll=True), "unroll=True"),
        (
            lambda: keras.layers.LSTM(4, activity_regularizer="l2"),
            "activity_regularizer",
        ),
        (lambda: keras.layers.LSTM(4, dtype="float64"), "compute dtype float64"),
    ],
)
def test_equations_why(make, reason):
    """Which layers the kernel computes; on this CPU none runs cuDNN."""
    inner = make()
    got = jax_fused.equations_reason(inner)
    if reason is None:
        assert got is None
        assert jax_fused.decline_reason(inner) == (
            "no CUDA GPU: jax.experimental.rnn.lstm runs cuDNN only"
        )
    else:
        assert reason in got and jax_fused.decline_reason(inner) == got
    assert not jax_fused.available(inner)
    assert not jax_fused.cudnn_present()


def test_cudnn_call(monkeypatch):
    """The `use_cudnn=True` branch calls `jax.experimental.rnn.lstm` as its
    signature says, with float32 valid-first inputs (padding zeroed), every
    row's length at least 1 (cuDNN fails on 0), the packed weights and the
    precision; a stand-in computing the call with `lstm_ref` then gives the
    reference branch's results."""
    import inspect

    real = jax_rnn.lstm
    calls = []

    def stand_in(*args, **kwargs):
        bound = inspect.signature(real).bind(*args, **kwargs)
        calls.append(bound.arguments)
        a = bound.arguments
        w = jax_rnn.unpack_lstm_weights(
            a["weights"], a["input_size"], a["hidden_size"], 1, a["bidirectional"]
        )
        return jax_rnn.lstm_ref(
            a["x"], a["h_0"], a["c_0"], *w, a["seq_lengths"],
            a["input_size"], a["hidden_size"], a["num_layers"], a["dropout"],
            a["bidirectional"],
        )  # fmt: skip

    monkeypatch.setattr(jax_rnn, "lstm", stand_in)
    monkeypatch.setattr(jax_fused, "cudnn_present", lambda: True)
    layers = _keras_layers(2, D, U)
    weights = [tuple(v.value for v in layer.trainable_variables) for layer in layers]
    bad = _data(0, B, T, D, LENGTHS)
    bad[~lengths_to_mask(LENGTHS, T)] = np.nan
    initial = _initial(2, B, U)
    got = jax_fused.lstm(bad, LENGTHS, weights, initial, precision="highest")
    (call,) = calls
    np.testing.assert_array_equal(call["seq_lengths"], np.maximum(LENGTHS, 1))
    assert call["seq_lengths"].dtype == jnp.int32 and call["x"].dtype == jnp.float32
    assert np.all(np.isfinite(call["x"]))
    assert call["bidirectional"] is True
    assert (call["input_size"], call["hidden_size"], call["num_layers"]) == (D, U, 1)
    np.testing.assert_array_equal(call["weights"], jax_fused.pack_weights(weights))
    assert call["precision"] == jax.lax.Precision.HIGHEST
    want = jax_fused.lstm(
        bad, LENGTHS, weights, initial, use_cudnn=False, precision="float32"
    )
    _assert_trees_close(got, want, atol=0, rtol=0)


class _Fused(keras.layers.Layer):
    """A minimal layer running its LSTM through `jax_fused.lstm`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = keras.layers.LSTM(U)

    def build(self, input_shape):
        self.inner.build(input_shape)

    def call(self, x, lengths):
        weights = [jax_fused.cell_weights(self.inner)]
        y, [[h, c]] = jax_fused.lstm(
            x, lengths, weights, use_cudnn=False, precision="highest"
        )
        return y, h, c


def test_gradients_reach_keras_variables():
    """Called on a layer's own variables (`cell_weights`), the kernel's
    gradients w.r.t. them, through `stateless_call`, are those of the same
    call on their values."""
    layer = _Fused()
    layer.build((None, None, D))
    layer.inner.cell.bias.assign(np.linspace(-1, 1, 4 * U).astype("float32"))
    x = _data(0, B, T, D, LENGTHS)
    wy, ws = _cotangents(1, B, T, U)
    lengths = jnp.asarray(LENGTHS)

    frozen = [v.value for v in layer.non_trainable_variables]

    def fn(x, params):
        (y, h, c), _ = layer.stateless_call(params, frozen, x, lengths=lengths)
        return _loss(y, [[h, c]], wy, ws)

    params = _params([layer])
    dx, dparams = jax.jit(jax.grad(fn, argnums=(0, 1)))(x, params)
    _, _, (want_dx, want_dparams, _) = _grads(_ours, x, params, None, LENGTHS, wy, ws)
    _assert_trees_close((dx, dparams), (want_dx, want_dparams), atol=1e-6)
    assert all(np.any(np.asarray(g) != 0) for g in dparams)


@pytest.mark.skipif(
    keras.backend.backend() != "jax" or not _cudnn(),
    reason="needs a CUDA GPU (jax.experimental.rnn.lstm runs cuDNN only)",
)
@pytest.mark.parametrize("directions", [2, 1], ids=["bidirectional", "forward"])
@pytest.mark.parametrize("with_initial", [True, False])
def test_cudnn_matches_reference(directions, with_initial):
    """On a CUDA GPU: cuDNN's results and gradients equal JAX's reference's
    (`highest` precision), rows of length 0 included, on both of cuDNN's
    paths: every step with the padding flag, and per-row lengths (a
    backward direction given an initial state)."""
    layers = _keras_layers(directions, D, U)
    x = _data(0, B, T, D, LENGTHS)
    initial = _initial(directions, B, U) if with_initial else None
    wy, ws = _cotangents(directions, B, T, U)
    params = _params(layers)

    def cudnn(x, params, initial, lengths, wy, ws):
        weights = [tuple(params[3 * d : 3 * d + 3]) for d in range(directions)]
        y, states = jax_fused.lstm(
            x, lengths, weights, initial, use_cudnn=True, precision="highest"
        )
        return _loss(y, states, wy, ws), (y, states)

    got = _grads(cudnn, x, params, initial, LENGTHS, wy, ws)
    want = _grads(_ours, x, params, initial, LENGTHS, wy, ws)
    _assert_trees_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_a_held_tail_equals_per_row_lengths(monkeypatch, scale):
    """Without a backward initial state the call runs every row over every
    step (`seq_lengths` all `time`, the flag column then zero columns up to
    a multiple of 8 wide, the flag 1 exactly at padding), as Keras' unmasked
    call does; its outputs, final states and gradients equal those of cuDNN's
    per-row lengths (the path a backward initial state takes, run here with
    a zero one), also with weights large enough for gate pre-activations in
    the hundreds."""
    import inspect

    real = jax_rnn.lstm_ref
    calls = []

    def spy(*args, **kwargs):
        calls.append(inspect.signature(real).bind(*args, **kwargs).arguments)
        return real(*args, **kwargs)

    monkeypatch.setattr(jax_rnn, "lstm_ref", spy)
    layers = _keras_layers(2, D, U)
    params = [p * scale for p in _params(layers)]
    x = _data(0, B, T, D, LENGTHS)
    wy, ws = _cotangents(2, B, T, U)
    zeros = [[np.zeros((B, U), "float32")] * 2 for _ in range(2)]
    for initial in (None, zeros):  # eagerly: the spy sees the values
        _ours(x, params, initial, LENGTHS, wy, ws)
    held_call, per_row_call = calls
    monkeypatch.setattr(jax_rnn, "lstm_ref", real)
    held = _grads(_ours, x, params, None, LENGTHS, wy, ws)
    per_row = _grads(_ours, x, params, zeros, LENGTHS, wy, ws)
    np.testing.assert_array_equal(held_call["seq_lengths"], np.full(B, T))
    np.testing.assert_array_equal(per_row_call["seq_lengths"], np.maximum(LENGTHS, 1))
    width = held_call["x"].shape[2]
    assert width % 8 == 0 and width >= D + 1
    np.testing.assert_array_equal(
        held_call["x"][..., D], ~lengths_to_mask(LENGTHS, T)
    )
    assert not np.any(held_call["x"][..., D + 1 :])
    # The initial-state gradients exist on the per-row path only.
    held, per_row = held[:2] + held[2][:2], per_row[:2] + per_row[2][:2]
    _assert_trees_close(held, per_row, atol=1e-5 * scale)
