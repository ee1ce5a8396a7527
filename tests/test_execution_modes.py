"""MaskedBidirectional in every execution mode Keras offers.

Modes: eager (the other test files), `tf.function` with `None` batch and time
(no retracing per new length), TensorFlow XLA through
`model.compile(jit_compile=True)`, `jax.jit` of `stateless_call`, and
`torch.compile` through `model.compile(jit_compile=True)` on PyTorch. Each is
checked against an independent oracle: `keras.layers.Bidirectional(...,
use_cudnn=False)` fed the same mask (per-call results), or the same model run
eagerly (`run_eagerly=True`) for training losses and weights.
"""

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional
from tests.helpers import BACKEND, assert_close, masked_pair

D, U = 2, 3
ATOL = 1e-5


def only(backend):
    return pytest.mark.skipif(
        BACKEND != backend, reason=f"{backend}-specific execution mode"
    )


def make_pair(kind="lstm"):
    return masked_pair(kind, U, D)


def data(batch, time, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, time, D)).astype("float32")
    lengths = rng.integers(0, time + 1, batch).astype("int32")
    lengths[0] = time
    mask = np.arange(time)[None] < lengths[:, None]
    mask[-1] = mask[-1][::-1]  # one left-padded row
    return x, lengths, mask


def right_mask(lengths, time):
    return np.arange(time)[None] < lengths[:, None]


SHAPES = [(2, 5), (3, 7), (1, 1), (4, 3)]


# ------------------------------------------------------------ tf.function


@only("tensorflow")
@pytest.mark.parametrize("by", ["lengths", "mask"])
def test_tf_function_with_none_batch_and_time_traces_once(by):
    import tensorflow as tf

    ours, ref = make_pair()
    traces = []

    def call(x, m):
        traces.append(1)  # Python side effect: runs once per trace
        return ours(x, **{by: m})

    spec = tf.TensorSpec((None,), tf.int32)
    if by == "mask":
        spec = tf.TensorSpec((None, None), tf.bool)
    fn = tf.function(
        call, input_signature=[tf.TensorSpec((None, None, D), tf.float32), spec]
    )
    for batch, time in SHAPES:
        x, lengths, mask = data(batch, time, seed=batch * 10 + time)
        if by == "lengths":
            got, want = fn(x, lengths), ref(x, mask=right_mask(lengths, time))
        else:
            got, want = fn(x, mask), ref(x, mask=mask)
        assert_close(got, want)
    assert len(traces) == 1


@only("tensorflow")
def test_tf_function_reduce_retracing_relaxes_to_none_dims():
    """Without a signature, `reduce_retracing=True` traces the first shape,
    then one generic (None) graph that serves every later shape."""
    import tensorflow as tf

    ours, ref = make_pair("gru")
    traces = []

    def call(x, lengths):
        traces.append(1)
        return ours(x, lengths=lengths)

    fn = tf.function(call, reduce_retracing=True)
    for batch, time in SHAPES:
        x, lengths, _ = data(batch, time)
        assert_close(
            fn(tf.constant(x), tf.constant(lengths)),
            ref(x, mask=right_mask(lengths, time)),
        )
    assert len(traces) == 2


# -------------------------------------------------------------------- XLA


def _model(kind, by, states, jit_compile=False, run_eagerly=False):
    """Inputs (+ lengths) -> MaskedBidirectional -> Dense(1). With `states`,
    the final states (LSTM: h and the recomputed c) feed the head too."""
    cls = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}[kind]
    rnn = MaskedBidirectional(cls(U, return_sequences=not states, return_state=states))
    x = keras.Input((None, D))
    if by == "lengths":
        lengths = keras.Input((), dtype="int32")
        y = rnn(x, lengths=lengths)
        inputs = [x, lengths]
    else:
        y = rnn(keras.layers.Masking(0.0)(x))
        inputs = x
    if states:
        y = keras.layers.Concatenate()(list(y))
    model = keras.Model(inputs, keras.layers.Dense(1)(y))
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss="mse",
        jit_compile=jit_compile,
        run_eagerly=run_eagerly,
    )
    return model


def _fit_data(by, states, batch, time, seed):
    x, lengths, mask = data(batch, time, seed)
    rng = np.random.default_rng(seed + 1)
    y = rng.standard_normal((batch, 1) if states else (batch, time, 1))
    if by == "lengths":
        return [x, lengths], y.astype("float32")
    return x * mask[..., None], y.astype("float32")


def _assert_fit_and_predict_match_eager(kind, by, states, shapes):
    compiled = _model(kind, by, states, jit_compile=True)
    assert compiled.jit_compile
    eager = _model(kind, by, states, run_eagerly=True)
    eager.set_weights(compiled.get_weights())
    for seed, (batch, time) in enumerate(shapes):
        x, y = _fit_data(by, states, batch, time, seed)
        h_c = compiled.fit(x, y, epochs=2, batch_size=batch, shuffle=False, verbose=0)
        h_e = eager.fit(x, y, epochs=2, batch_size=batch, shuffle=False, verbose=0)
        np.testing.assert_allclose(h_c.history["loss"], h_e.history["loss"], rtol=1e-5)
        for a, b in zip(compiled.get_weights(), eager.get_weights()):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            compiled.predict(x, verbose=0), eager.predict(x, verbose=0), atol=ATOL
        )
    return compiled, eager


@only("tensorflow")
@pytest.mark.parametrize(
    "kind, by, states", [("lstm", "lengths", True), ("gru", "mask", False)]
)
def test_xla_fit_and_predict_match_eager(kind, by, states):
    """`model.compile(jit_compile=True)` on TF is XLA (on TF GPU Keras turns
    it off for cuDNN-eligible LSTM/GRU: cuDNN has no XLA kernel)."""
    _assert_fit_and_predict_match_eager(kind, by, states, [(4, 5)])


@only("tensorflow")
def test_xla_fit_with_a_new_time_length_per_batch():
    """Bucketed data: each batch has its own time length."""
    _assert_fit_and_predict_match_eager("lstm", "lengths", True, [(4, 5), (4, 7)])


# ---------------------------------------------------------------- jax.jit


@only("jax")
def test_jax_jit_stateless_call_matches_keras_and_compiles_per_shape_only():
    import jax

    ours, ref = make_pair()
    traces = []

    def call(tv, ntv, x, lengths):
        traces.append(1)
        outs, _ = ours.stateless_call(tv, ntv, x, lengths=lengths)
        return outs

    fn = jax.jit(call)
    tv = [v.value for v in ours.trainable_variables]
    ntv = [v.value for v in ours.non_trainable_variables]
    x, lengths, _ = data(3, 4)
    for n in (lengths, np.array([0, 4, 1], "int32")):  # new values: no retrace
        assert_close(fn(tv, ntv, x, n), ref(x, mask=right_mask(n, 4)))
    assert len(traces) == 1
    fn(tv, ntv, np.concatenate([x, x]), np.concatenate([lengths, lengths]))
    assert len(traces) == 2  # a new batch size is a new shape


# ---------------------------------------------------------- torch.compile


@only("torch")
@pytest.mark.slow
def test_torch_compile_fit_and_predict_match_eager():
    """Keras runs `torch.compile` (inductor) for `jit_compile=True` on
    PyTorch; it works on CPU here (~1-2 min of compilation per graph on 2
    busy cores). The compiled `predict` then serves the out-of-range
    lengths check of a served model (tests/test_bad_input.py, whose own
    torch.compile case would compile a graph of its own): a too-long and a
    negative length give NaN rows (inductor would read the next row, and a
    negative length would read as an empty row), the other rows their
    eager values."""
    compiled, eager = _assert_fit_and_predict_match_eager(
        "gru", "lengths", False, [(3, 2)]
    )
    x, _, _ = data(3, 2)
    lengths = np.array([2, 2 + 2, -1], "int32")
    got = keras.ops.convert_to_numpy(compiled.predict([x, lengths], verbose=0))
    assert np.all(np.isnan(got[1:])), "bad rows gave numbers silently"
    want = eager.predict([x[:1], lengths[:1]], verbose=0)
    np.testing.assert_allclose(got[:1], want, atol=ATOL)
