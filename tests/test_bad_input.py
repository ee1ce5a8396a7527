"""Every bad input to MaskedBidirectional and what it gets (docs/errors.md).

One test per row of the table in docs/errors.md, in the same order. The rule:
bad input raises as early as it can be seen (construction, build, trace or
call), naming the argument and the fix; where a check can only run on values
inside compiled code (`tf.function`, XLA, `jax.jit`, `torch.compile`), the
affected rows must come out as an error or as NaN, never as silently wrong
numbers (NaN in every output and state of the affected rows).

Oracles: `keras.layers.Bidirectional(..., use_cudnn=False)` given the same
weights and mask (what a valid input must give, and how Keras itself treats
an edge case), and the eager result on the valid rows only (what a compiled
call must give on the rows that are not bad).
"""

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional
from tests.helpers import (
    BACKEND,
    assert_close,
    flat,
    loss_and_grads,
    masked_pair,
    to_np,
)

B, T, D, U = 4, 5, 2, 3
TF_ONLY = pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="None (run-time) batch/time sizes exist only in TensorFlow graphs; "
    "JAX and PyTorch trace with concrete shapes, so the static check applies",
)


def inputs(batch=B, time=T, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, time, D)).astype("float32")


def layer(kind="gru", **kw):
    kw.setdefault("return_sequences", True)
    kw.setdefault("return_state", True)
    wrapped = MaskedBidirectional(getattr(keras.layers, kind.upper())(U, **kw))
    wrapped.build((None, None, D))
    return wrapped


def pair(kind="gru", **kw):
    """(ours, Keras' masked Bidirectional) with the same weights."""
    return masked_pair(kind, U, D, **kw)


def assert_loud(run, bad_rows, expected_good, compiled):
    """Eager: `run()` raises ValueError. Compiled (no values to check): NaN
    fills every output and state of `bad_rows` while the other rows equal
    `expected_good` (eager results on those rows)."""
    if not compiled:
        with pytest.raises(ValueError, match="lengths"):
            run()
        return
    outs = flat(run())
    good = np.setdiff1d(np.arange(len(to_np(outs[0]))), bad_rows)
    for out, exp in zip(outs, flat(expected_good)):
        out = to_np(out)
        assert np.all(np.isnan(out[bad_rows])), "bad rows gave numbers silently"
        np.testing.assert_allclose(out[good], to_np(exp), atol=1e-5)


def lengths_model(jit_compile):
    x = keras.Input((None, D))
    lengths = keras.Input((), dtype="int32")
    outs = MaskedBidirectional(
        keras.layers.GRU(U, return_sequences=True, return_state=True)
    )(x, lengths=lengths)
    model = keras.Model([x, lengths], outs)
    model.compile(jit_compile=jit_compile)
    return model


def graph_fn(fn, *specs):
    """`fn` as a tf.function whose inputs have None batch and time."""
    import tensorflow as tf

    return tf.function(fn, input_signature=[tf.TensorSpec(*s) for s in specs])


# ------------------------------------------------------------------ lengths


@pytest.mark.parametrize(
    "lengths, message",
    [
        ([T + 1, 1, 1, 1], "value 6 longer than the time axis of inputs"),
        ([-1, 1, 1, 1], r"lengths must be >= 0; got min\(lengths\)=-1"),
    ],
    ids=["longer-than-time", "negative"],
)
def test_lengths_out_of_range_raise_eagerly(lengths, message):
    with pytest.raises(ValueError, match=message):
        layer()(inputs(), lengths=np.array(lengths, "int32"))


@pytest.mark.parametrize("dtype", ["float32", "bool"])
def test_lengths_of_non_integer_dtype_raise(dtype):
    with pytest.raises(ValueError, match="lengths must be integers.*ops.cast"):
        layer()(inputs(), lengths=np.ones((B,), dtype))
    # In a Functional model: by the first batch at the latest (today; when
    # the model is built once the next test passes).
    x = keras.Input((None, D))
    lengths = keras.Input((), dtype=dtype)
    with pytest.raises(ValueError, match="lengths must be integers"):
        model = keras.Model([x, lengths], layer()(x, lengths=lengths))
        model.predict([inputs(), np.ones((B,), dtype)], verbose=0)


def test_lengths_of_non_integer_dtype_raise_when_the_model_is_built():
    x = keras.Input((None, D))
    lengths = keras.Input((), dtype="float32")
    with pytest.raises(ValueError, match="lengths must be integers"):
        layer()(x, lengths=lengths)


def test_lengths_with_wrong_batch_size_raise_eagerly_and_at_trace_time():
    wrapped = layer()
    message = "lengths has 3 rows but inputs has 4"
    with pytest.raises(ValueError, match=message):
        wrapped(inputs(), lengths=np.array([1, 2, 3], "int32"))
    if BACKEND == "tensorflow":
        import tensorflow as tf

        # Static batch inside tf.function: caught while tracing.
        fn = tf.function(lambda x, n: wrapped(x, lengths=n))
        with pytest.raises(ValueError, match=message):
            fn(inputs(), np.array([1, 2, 3], "int32"))
    if BACKEND == "jax":
        import jax

        tv = [v.value for v in wrapped.trainable_variables]
        ntv = [v.value for v in wrapped.non_trainable_variables]
        fn = jax.jit(lambda x, n: wrapped.stateless_call(tv, ntv, x, lengths=n)[0])
        with pytest.raises(ValueError, match=message):
            fn(inputs(), np.array([1, 2, 3], "int32"))


@TF_ONLY
@pytest.mark.parametrize(
    "rows",
    [
        1,
        2,
        5,
    ],
)
def test_lengths_with_wrong_batch_size_unknown_until_run_time_raise(rows):
    import tensorflow as tf

    wrapped = layer()
    fn = graph_fn(
        lambda x, n: wrapped(x, lengths=n), ((None, None, D),), ((None,), "int32")
    )
    # The failing graph node names the argument.
    with pytest.raises(tf.errors.InvalidArgumentError, match="lengths_must_match"):
        fn(inputs(), np.ones((rows,), "int32"))


@pytest.mark.parametrize("shape", [(B, 2), (), (1, B)])
def test_lengths_of_wrong_rank_raise(shape):
    with pytest.raises(ValueError, match=r"lengths must have shape \(batch,\)"):
        layer()(inputs(), lengths=np.ones(shape, "int32"))


def test_lengths_of_shape_batch_by_one_are_accepted_as_batch():
    """`(batch, 1)` lengths (a Keras Input of shape `(1,)`) mean `(batch,)`."""
    wrapped = layer()
    n = np.array([5, 2, 0, 1], "int32")
    assert_close(wrapped(inputs(), lengths=n[:, None]), wrapped(inputs(), lengths=n))


# --------------------------------------------------------------------- mask


def test_numeric_masks_mean_nonzero_is_valid_like_keras():
    """Keras casts a numeric mask to bool (non-zero = valid); so do we."""
    ours, ref = pair()
    mask = np.array(
        [[1, 1, 0.5, 0, 0], [0, 0, 2, -1, 1], [0, 0, 0, 0, 0], [1, 0, 1, 0, 1]],
        "float32",
    )
    assert_close(ours(inputs(), mask=mask), ref(inputs(), mask=mask != 0))
    ints = mask.astype("int32")  # 0.5 -> 0: row 0 loses a step
    assert_close(ours(inputs(), mask=ints), ref(inputs(), mask=ints != 0))


def test_mask_of_non_numeric_dtype_raises():
    with pytest.raises((ValueError, TypeError)):
        layer()(inputs(), mask=np.full((B, T), "a"))


@pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="on JAX and PyTorch Keras converts call arguments before `call` and "
    "raises its own ValueError for a string array; only TF reaches our check",
)
def test_mask_of_non_numeric_dtype_error_names_the_mask():
    with pytest.raises(ValueError, match="mask must be boolean"):
        layer()(inputs(), mask=np.full((B, T), "a"))


@pytest.mark.parametrize("shape", [(B, T, 1), (B,), (B, T, D)])
def test_mask_of_wrong_rank_raises(shape):
    with pytest.raises(ValueError, match=r"mask must have shape \(batch, time\)"):
        layer()(inputs(), mask=np.ones(shape, bool))


@pytest.mark.parametrize(
    "shape, message",
    [
        ((B - 1, T), "mask has 3 along axis 0 but inputs has 4 \\(batch"),
        ((B, T + 1), "mask has 6 along axis 1 but inputs has 5 \\(time"),
    ],
)
def test_mask_of_wrong_size_raises(shape, message):
    with pytest.raises(ValueError, match=message):
        layer()(inputs(), mask=np.ones(shape, bool))


@TF_ONLY
@pytest.mark.parametrize(
    "shape",
    [
        (1, T),
        (B, T - 1),
        (B, T + 1),  # without the check: TF's GPU gather would read zeros
    ],
)
def test_mask_of_wrong_size_unknown_until_run_time_raises(shape):
    import tensorflow as tf

    wrapped = layer()
    fn = graph_fn(
        lambda x, m: wrapped(x, mask=m), ((None, None, D),), ((None, None), "bool")
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="mask_must_match"):
        fn(inputs(), np.ones(shape, bool))


def test_lengths_win_over_mask():
    """Given both, `lengths` is used and `mask` is ignored, also when the mask
    is a Keras mask attached by an upstream `Embedding(mask_zero=True)`."""
    ours, ref = pair()
    n = np.array([5, 2, 0, 1], "int32")
    right = np.arange(T)[None] < n[:, None]
    expected = ref(inputs(), mask=right)
    contradicting = np.ones((B, T), bool)
    assert_close(ours(inputs(), mask=contradicting, lengths=n), expected)

    ids = keras.Input((None,), dtype="int32")
    lengths = keras.Input((), dtype="int32")
    emb = keras.layers.Embedding(9, D, mask_zero=True)
    fwd_bwd = MaskedBidirectional(keras.layers.GRU(U, return_sequences=True))
    model = keras.Model([ids, lengths], fwd_bwd(emb(ids), lengths=lengths))
    ref_seq = keras.layers.Bidirectional(
        keras.layers.GRU(U, return_sequences=True, use_cudnn=False)
    )
    ref_model = keras.Model(ids, ref_seq(keras.layers.Embedding(9, D)(ids)))
    model.set_weights(ref_model.get_weights())
    tokens = np.array([[1, 2, 3, 4, 5], [0, 0, 3, 4, 5], [1] * 5, [1, 0, 2, 0, 3]])
    # Embedding's mask (zeros are padding) contradicts the lengths; lengths win.
    got = model([tokens, n])
    want = ref_seq(ref_model.layers[1](tokens), mask=right)
    assert_close(got, want)


# ------------------------------------------------------------------- inputs


@pytest.mark.parametrize("shape", [(B, T), (B, T, D, 1), (B,)])
def test_inputs_of_rank_other_than_3_raise(shape):
    with pytest.raises(ValueError, match=r"expects inputs of shape \(batch, time"):
        layer()(np.ones(shape, "float32"))
    # Symbolic inputs fail when the model is built, before any data.
    fresh = MaskedBidirectional(keras.layers.GRU(U))
    with pytest.raises(ValueError, match=r"expects inputs of shape \(batch, time"):
        fresh(keras.Input(shape[1:]))


def test_zero_size_time_axis_raises():
    with pytest.raises(ValueError, match="zero-size time axis.*at least one step"):
        layer()(inputs(time=0))


@TF_ONLY
def test_zero_size_time_axis_unknown_until_run_time_raises():
    """A None time axis that turns out to be 0 fails in the inner RNN (as in
    keras.layers.Bidirectional): loud, with TensorFlow's message."""
    import tensorflow as tf

    wrapped = layer()
    fn = graph_fn(
        lambda x, n: wrapped(x, lengths=n), ((None, None, D),), ((None,), "int32")
    )
    with pytest.raises(tf.errors.InvalidArgumentError):
        fn(inputs(time=0), np.zeros((B,), "int32"))


def _empty_batch_expected(kind):
    n_states = 4 if kind == "lstm" else 2
    return [np.zeros((0, T, 2 * U), "float32")] + [np.zeros((0, U), "float32")] * (
        n_states
    )


EMPTY_BATCH_CALLS = {
    "none": {},
    "mask": {"mask": np.zeros((0, T), bool)},
    "lengths": {"lengths": np.zeros((0,), "int32")},
}


@pytest.mark.parametrize("how", list(EMPTY_BATCH_CALLS))
@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_empty_batch_returns_empty_outputs_like_keras(kind, how):
    kwargs = EMPTY_BATCH_CALLS[how]
    ours, ref = pair(kind)
    x = inputs(batch=0)
    if BACKEND == "tensorflow" and kind == "lstm":
        # Keras itself fails here on TF eager (its `ops.add` takes the (0, 4U)
        # gate tensor for a bias); we return the empty outputs regardless.
        import tensorflow as tf

        with pytest.raises(tf.errors.InvalidArgumentError, match="Biases must"):
            ref(x, mask=kwargs.get("mask"))
        expected = _empty_batch_expected(kind)
    else:
        expected = ref(x, mask=kwargs.get("mask"))
        assert [tuple(e.shape) for e in expected] == [
            e.shape for e in _empty_batch_expected(kind)
        ]
    assert_close(ours(x, **kwargs), expected)


@TF_ONLY
def test_empty_batch_in_a_graph_returns_empty_outputs():
    wrapped = layer()
    fn = graph_fn(
        lambda x, n: wrapped(x, lengths=n), ((None, None, D),), ((None,), "int32")
    )
    assert_close(
        fn(inputs(batch=0), np.zeros((0,), "int32")), _empty_batch_expected("gru")
    )


def test_inputs_with_other_feature_size_than_built_raise_naming_inputs():
    wrapped = layer()
    with pytest.raises(ValueError, match="features"):
        wrapped(np.ones((B, T, D + 1), "float32"))


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_nan_in_padded_steps_gives_the_results_of_zero_padding(kind):
    """Not an error: padding may hold anything. Outputs equal Keras' and
    gradients are finite and equal Keras' with the padding zeroed: ours
    zeroes the padded steps before its RNN reads them. (Keras' own masked
    loop differentiates through the padded steps and gives NaN gradients
    here.) tests/test_masked_rnn.py covers inf and 3e38 too."""
    ours, ref = pair(kind)
    mask = np.ones((B, T), bool)
    mask[0, 3:] = False
    mask[1, :2] = False
    mask[3] = False
    x = inputs()
    clean = x.copy()
    clean[~mask] = 0.0
    x[~mask] = np.nan
    out = ours(x, mask=mask)
    assert all(np.all(np.isfinite(to_np(o))) for o in flat(out))
    assert_close(out, ref(x, mask=mask))
    if BACKEND == "jax":
        return  # gradients on JAX eager cost ~20 s; the rule is backend-neutral
    _, g_ours = loss_and_grads(ours, x, mask=mask)
    _, g_ref = loss_and_grads(ref, clean, mask=mask)
    for a, b in zip(g_ours, g_ref):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------ initial_state


def test_initial_state_with_wrong_count_raises():
    with pytest.raises(ValueError, match="initial_state has 2 tensors but this"):
        layer("lstm")(inputs(), initial_state=[np.zeros((B, U), "float32")] * 2)


@pytest.mark.parametrize("shape", [(B, U + 1), (B + 1, U)])
def test_initial_state_with_wrong_shape_raises_naming_it(shape):
    with pytest.raises(ValueError, match="initial_state"):
        layer("lstm")(inputs(), initial_state=[np.zeros(shape, "float32")] * 4)


# ------------------------------------------------------- the wrapped layer


@pytest.mark.parametrize(
    "inner",
    [
        lambda: keras.layers.Dense(3),
        lambda: keras.layers.Conv1D(3, 2),
        lambda: keras.layers.Bidirectional(keras.layers.GRU(3)),
        lambda: keras.layers.GRUCell(3),
    ],
    ids=["Dense", "Conv1D", "Bidirectional", "GRUCell"],
)
def test_inner_layer_that_is_not_an_rnn_is_refused_at_construction(inner):
    with pytest.raises(ValueError, match="keras.layers.RNN instance"):
        MaskedBidirectional(inner())


def test_conv_lstm_is_refused_at_construction():
    with pytest.raises(ValueError, match="layer"):
        MaskedBidirectional(keras.layers.ConvLSTM1D(2, 3))


def test_merge_mode_unknown_is_refused_at_construction():
    with pytest.raises(ValueError, match="Invalid merge_mode='max'"):
        MaskedBidirectional(keras.layers.GRU(U), merge_mode="max")


@pytest.mark.parametrize("merge_mode", ["sum", "mul", "ave"])
def test_merge_mode_needing_equal_sizes_refuses_unequal_layers(merge_mode):
    with pytest.raises(ValueError, match="merge_mode"):
        MaskedBidirectional(
            keras.layers.GRU(U),
            backward_layer=keras.layers.GRU(U + 2, go_backwards=True),
            merge_mode=merge_mode,
        )


def test_unequal_sizes_work_with_merge_mode_none():
    """(`"concat"` with unequal sizes: test_masked_bidirectional.py.)"""
    wrapped = MaskedBidirectional(
        keras.layers.GRU(U),
        backward_layer=keras.layers.GRU(U + 2, go_backwards=True),
        merge_mode=None,
    )
    fwd, bwd = wrapped(inputs(), lengths=np.array([5, 2, 0, 1], "int32"))
    assert (fwd.shape, bwd.shape) == ((B, U), (B, U + 2))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"layer": keras.layers.GRU(U, go_backwards=True)}, "go_backwards=False"),
        ({"layer": keras.layers.GRU(U, stateful=True)}, "stateful=True"),
        (
            {"layer": keras.layers.GRU(U), "backward_layer": keras.layers.GRU(U)},
            "backward_layer` must have go_backwards=True",
        ),
        (
            {
                "layer": keras.layers.GRU(U, return_sequences=True),
                "backward_layer": keras.layers.GRU(U, go_backwards=True),
            },
            "same return_sequences",
        ),
        (
            {
                "layer": keras.layers.GRU(U, return_state=True),
                "backward_layer": keras.layers.GRU(U, go_backwards=True),
            },
            "same return_state",
        ),
        (
            {"layer": keras.layers.GRU(U), "backward_layer": keras.layers.Dense(3)},
            "backward_layer` must be a keras.layers.RNN",
        ),
    ],
    ids=["go_backwards", "stateful", "bwd-direction", "rs", "state", "bwd-type"],
)
def test_inconsistent_layer_flags_are_refused_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MaskedBidirectional(**kwargs)


# ------------------------------------- out-of-range lengths in compiled code


# Tiny shapes: torch.compile (inductor) takes ~1 min per graph on 2 CPU cores.
T_C = 2
COMPILED_LENGTHS = np.array([2, T_C + 2, -1, 1], "int32")
BAD_ROWS = [1, 2]  # too long, negative


def _served(model, lengths, bad_rows, jit_compile):
    x = inputs(time=T_C)
    good = np.setdiff1d(np.arange(len(lengths)), bad_rows)
    assert_loud(
        lambda: model.predict([x, lengths], verbose=0),
        bad_rows,
        model([x[good], lengths[good]]),  # eager, valid rows only
        # Keras' predict is a tf.function on TF even without jit_compile, and
        # eager on JAX and PyTorch unless jit_compile=True.
        compiled=jit_compile or BACKEND == "tensorflow",
    )


@pytest.mark.parametrize(
    "jit_compile",
    [
        False,
        pytest.param(
            True,
            marks=[
                pytest.mark.slow,
                pytest.mark.skipif(
                    BACKEND == "torch",
                    reason="torch.compile: checked on the compiled model of "
                    "tests/test_execution_modes.py (one compilation for both)",
                ),
            ],
        ),
    ],
    ids=["predict", "predict-jit_compile"],
)
def test_out_of_range_lengths_in_a_served_model_are_loud(jit_compile):
    """`model.predict` runs `tf.function` on TF and eagerly on JAX and
    PyTorch (our ValueError); with `jit_compile=True` it runs XLA (TF),
    `jax.jit` (JAX), `torch.compile` (PyTorch). A too-long and a negative
    length must give NaN rows there (without the check: XLA and JAX clamp
    the index, inductor reads the next row, TF's GPU gather reads zeros, a
    negative length reads as an empty row)."""
    _served(lengths_model(jit_compile), COMPILED_LENGTHS, BAD_ROWS, jit_compile)


def test_negative_lengths_in_a_served_model_are_loud():
    """Alone: without the check it reads as an empty row (zeros, initial
    states) in every mode."""
    _served(lengths_model(False), np.array([2, -1, 1, 0], "int32"), [1], False)


def test_out_of_range_lengths_in_training_stop_a_fit_loudly():
    """In a compiled `fit` (TF's tf.function, JAX's jit) a bad row makes the
    loss NaN, `TerminateOnNaN` stops after that step, and the layer's own
    weights stay finite (no gradient reaches the NaN rows). Layers after it
    do get NaN weights (their gradients multiply the NaN activations), hence
    the advice in docs/errors.md. PyTorch's `fit` is eager: ValueError."""
    x = keras.Input((None, D))
    lengths = keras.Input((), dtype="int32")
    rnn = MaskedBidirectional(keras.layers.GRU(U))
    model = keras.Model([x, lengths], keras.layers.Dense(1)(rnn(x, lengths=lengths)))
    model.compile(optimizer="sgd", loss="mse")
    data = ([inputs(), np.array([5, T + 4, 2, 1], "int32")], np.ones((B, 1)))
    if BACKEND == "torch":
        with pytest.raises(ValueError, match="longer than the time axis"):
            model.fit(*data, verbose=0)
        return
    stop = keras.callbacks.TerminateOnNaN()
    history = model.fit(*data, epochs=3, batch_size=B, verbose=0, callbacks=[stop])
    assert len(history.history["loss"]) == 1
    assert np.isnan(history.history["loss"][0])
    for weight in rnn.weights:
        assert np.all(np.isfinite(to_np(weight)))
