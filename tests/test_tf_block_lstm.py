"""The `"tf-block-lstm"` kernel: TensorFlow's fused LSTM kernel, `BlockLSTMV2`.

Oracle: Keras' own `LSTM` (`use_cudnn=False`, its generic masked loop) and
`Bidirectional`, handed the same mask explicitly, same weights: outputs,
final states, and the gradients w.r.t. the inputs, the initial states and
every weight, for every padding pattern (post, pre, holes, empty rows),
`lengths=`, both layers (every merge mode, `go_backwards`), forced and as
the default plan, eager and in `tf.function`. The plan's choices (what runs
where the op does not: XLA, float64, other activations, `portable()`) are
read from `kernel_info()` and `maskedrnn.backends.record()`.

TensorFlow only: the other backends have no such kernel (tests/test_plan.py
checks that forcing it there is declined).
"""

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional, MaskedRNN, backends
from tests.helpers import (
    BACKEND,
    assert_tf_matches,
    check_declined_contexts,
    check_stacked_bidirectional,
    edge_mask,
    fresh_graphs,
    lengths_to_mask,
    record_calls,
    sin_loss_step,
    tf_outputs_and_grads,
    tier_mask,
    to_np,
    traced_sin_loss_step,
)

pytestmark = pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="tf.raw_ops.BlockLSTMV2 is a TensorFlow op: only the TensorFlow "
    "backend offers the 'tf-block-lstm' kernel",
)

if BACKEND == "tensorflow":
    import tensorflow as tf

KERNEL = "tf-block-lstm"
B, T, D, U = 6, 7, 3, 4
LENGTHS = np.array([7, 3, 0, 1, 5, 6], "int32")
SHORT = np.array([3, 0, 1, 2, 3, 1], "int32")  # every row shorter than T
MERGE_MODES = ["concat", "sum", "ave", "mul", None]


def inputs(seed=0):
    return np.random.default_rng(seed).standard_normal((B, T, D)).astype("float32")


def states_for(layer, seed=5):
    n = 4 if isinstance(layer, MaskedBidirectional) else 2
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, U)).astype("float32") for _ in range(n)]


def pair(wrapper, merge_mode="concat", go_backwards=False, **kw):
    """(ours, Keras' masked oracle) with the same weights."""
    kw = dict(return_sequences=True, return_state=True, **kw)
    if wrapper == "bidirectional":
        ref = keras.layers.Bidirectional(
            keras.layers.LSTM(U, use_cudnn=False, **kw), merge_mode=merge_mode
        )
        ours = MaskedBidirectional(keras.layers.LSTM(U, **kw), merge_mode=merge_mode)
    else:
        kw["go_backwards"] = go_backwards
        ref = keras.layers.LSTM(U, use_cudnn=False, **kw)
        ours = MaskedRNN(keras.layers.LSTM(U, **kw))
    ref.build((None, None, D))
    ours.build((None, None, D))
    ours.set_weights(ref.get_weights())
    return ours, ref


def kernels_of(plans):
    return {d.kernel for p in plans for d in p.directions}


@pytest.fixture(params=["forced", "default"])
def how(request):
    """The kernel forced, or chosen by the default plan (checked to be it)."""
    if request.param == "forced":
        with backends.force(KERNEL):
            yield request.param
        return
    with backends.record() as plans:
        yield request.param
    assert kernels_of(plans) == {KERNEL}


@pytest.mark.parametrize("merge_mode", MERGE_MODES)
def test_bidirectional_matches_keras_with_every_mask_pattern(merge_mode, how):
    ours, ref = pair("bidirectional", merge_mode=merge_mode)
    assert_tf_matches(ours, ref, inputs(), mask=edge_mask())


@pytest.mark.parametrize("wrapper", ["bidirectional", "rnn"])
def test_initial_state_and_its_gradient(wrapper, how):
    ours, ref = pair(wrapper)
    init = states_for(ours)
    assert_tf_matches(ours, ref, inputs(1), initial_state=init, mask=edge_mask())


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("zero_output_for_mask", [False, True])
def test_masked_rnn_matches_keras(go_backwards, zero_output_for_mask, how):
    ours, ref = pair(
        "rnn", go_backwards=go_backwards, zero_output_for_mask=zero_output_for_mask
    )
    assert_tf_matches(ours, ref, inputs(2), mask=edge_mask())


@pytest.mark.parametrize("wrapper", ["bidirectional", "rnn"])
@pytest.mark.parametrize("lengths", [LENGTHS, SHORT, np.zeros(B, "int32")])
def test_lengths_equal_their_right_padded_mask(wrapper, lengths, how):
    """With every row shorter than the time axis the op runs fewer steps
    (`seq_len_max`); with every row empty it runs none."""
    ours, ref = pair(wrapper)
    got, got_grads = tf_outputs_and_grads(ours, inputs(3), lengths=lengths)
    want, want_grads = tf_outputs_and_grads(
        ref, inputs(3), mask=lengths_to_mask(lengths, T)
    )
    for a, e in zip(got + got_grads, want + want_grads):
        np.testing.assert_allclose(a, e, atol=1e-5, rtol=1e-4)


def test_without_states_and_last_output_only(how):
    ours = MaskedBidirectional(keras.layers.LSTM(U))
    ref = keras.layers.Bidirectional(keras.layers.LSTM(U, use_cudnn=False))
    ref.build((None, None, D))
    ours.build((None, None, D))
    ours.set_weights(ref.get_weights())
    assert_tf_matches(ours, ref, inputs(4), mask=edge_mask())


def test_no_bias_runs_with_a_zero_bias(how):
    ours, ref = pair("bidirectional", use_bias=False)
    assert_tf_matches(ours, ref, inputs(5), mask=edge_mask())


@pytest.mark.parametrize("jit_compile", [False, True])
def test_in_tf_function(jit_compile):
    """In `tf.function` the kernel runs; XLA has no kernel for the op, so with
    `jit_compile=True` the plan picks Keras' layer (recorded), same results."""
    ours, ref = pair("bidirectional")
    x, mask = inputs(6), edge_mask()

    @tf.function(jit_compile=jit_compile)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            outs = ours(x, mask=mask)
            loss = sum(tf.reduce_sum(o * o) for o in outs)
        return outs, tape.gradient(loss, [x] + ours.trainable_variables)

    with backends.record() as plans:
        outs, grads = step(tf.constant(x))
    assert kernels_of(plans) == ({"keras-masked"} if jit_compile else {KERNEL})
    with tf.GradientTape() as tape:
        xt = tf.constant(x)
        tape.watch(xt)
        want = ref(xt, mask=mask)
        loss = sum(tf.reduce_sum(o * o) for o in want)
    want_grads = tape.gradient(loss, [xt] + ref.trainable_variables)
    for a, e in zip(list(outs) + grads, list(want) + want_grads):
        np.testing.assert_allclose(to_np(a), to_np(e), atol=1e-4, rtol=1e-4)


def test_mixed_precision_matches_keras():
    """mixed_float16: both compute in float16 (the op's float16 kernel)."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        ours, ref = pair("bidirectional")
        with backends.record() as plans:
            assert_tf_matches(ours, ref, inputs(7), atol=5e-3, mask=edge_mask())
    finally:
        keras.config.set_dtype_policy(previous)
    assert kernels_of(plans) == {KERNEL}


def test_input_dropout_is_applied_before_the_op():
    """Training with input dropout: the op reads the dropped inputs (one
    mask for every step, applied by the core), as Keras' unmasked layer
    does given the same seed."""
    results, weights = [], pair("rnn")[0].get_weights()
    for kernel in (KERNEL, "keras-unmasked"):
        ours, _ = pair("rnn", dropout=0.5, seed=3)
        ours.set_weights(weights)
        with backends.force(kernel):
            results.append(to_np(ours(inputs(8), mask=edge_mask(), training=True)))
    for a, e in zip(*results):
        np.testing.assert_allclose(a, e, atol=1e-5)
    # The dropout did something: the outputs differ from inference.
    with backends.force(KERNEL):
        plain = to_np(ours(inputs(8), mask=edge_mask(), training=False))
    assert np.abs(plain[0] - results[0][0]).max() > 1e-2


def test_kernel_info_says_it_runs_and_why_not_elsewhere():
    ours, _ = pair("bidirectional")
    ours(inputs(), mask=edge_mask())
    for sentence in ours.kernel_info().values():
        assert sentence.startswith("TensorFlow's fused LSTM kernel")
        assert "tf.raw_ops.BlockLSTMV2" in sentence and "exact" in sentence
        assert "jit_compile=True) Keras' layer runs instead" in sentence
    cases = [
        (keras.layers.LSTM(U, activation="relu"), "tanh / sigmoid"),
        (keras.layers.LSTM(U, recurrent_dropout=0.1), "recurrent_dropout"),
        (keras.layers.LSTM(U, dtype="float64"), "float64 and BlockLSTMV2"),
        (keras.layers.LSTM(U, unroll=True), "unroll=True"),
        (keras.layers.LSTM(U, use_cudnn=False), "use_cudnn=False"),
        (keras.layers.GRU(U), "keras.layers.LSTM only"),
    ]
    for inner, reason in cases:
        layer = MaskedRNN(inner)
        layer.build((None, T, D))
        (sentence,) = layer.kernel_info().values()
        assert sentence.startswith("Keras "), sentence
        if isinstance(inner, keras.layers.LSTM):
            assert "BlockLSTMV2 does not run" in sentence and reason in sentence


def test_declined_cases_raise_when_forced_and_unroll_only_prefers():
    x, mask = inputs(), edge_mask()
    for inner, reason in [
        (keras.layers.LSTM(U, activation="relu"), "tanh / sigmoid"),
        (keras.layers.LSTM(U, dtype="float64"), "float64"),
        (keras.layers.GRU(U), "keras.layers.LSTM only"),
    ]:
        with backends.force(KERNEL):
            with pytest.raises(backends.Declined, match=reason):
                MaskedRNN(inner)(x.astype(inner.compute_dtype), mask=mask)
    # unroll=True: Keras' unrolled loop by default, the op when forced.
    ours, ref = pair("rnn", unroll=True)
    with backends.record() as plans:
        ours(x, mask=mask)
    assert KERNEL not in kernels_of(plans)
    with backends.force(KERNEL):
        assert_tf_matches(ours, ref, x, mask=mask)


@pytest.mark.parametrize("wrapper", ["bidirectional", "rnn"])
def test_bad_lengths_in_compiled_code_poison_their_rows(wrapper):
    """In `model.predict` (a `tf.function`, where lengths cannot be checked)
    a too-long and a negative length give NaN in every output and state of
    their rows; the other rows equal the eager results."""
    ours, _ = pair(wrapper)
    x_in, lengths_in = keras.Input((None, D)), keras.Input((), dtype="int32")
    model = keras.Model([x_in, lengths_in], ours(x_in, lengths=lengths_in))
    x = inputs(9)[:4]
    lengths = np.array([2, T + 3, 1, -1], "int32")
    with backends.record() as plans:
        outs = model.predict([x, lengths], verbose=0)
    assert kernels_of(plans) == {KERNEL}
    good = np.array([0, 2])
    expected = ours(x[good], lengths=lengths[good])
    for out, exp in zip(outs, expected):
        assert np.all(np.isnan(out[[1, 3]])), "bad rows gave numbers silently"
        np.testing.assert_allclose(out[good], to_np(exp), atol=1e-5)


def test_declined_under_xla_and_in_portable_block():
    ours, ref = pair("bidirectional")
    check_declined_contexts(ours, ref, KERNEL, inputs(), edge_mask())


def tier_sizes(monkeypatch):
    """The `x` of each `block_lstm` call: `(time, rows, features)`."""
    from maskedrnn.backends import tensorflow_block_lstm

    calls = record_calls(monkeypatch, tensorflow_block_lstm, "block_lstm")
    return lambda: [tuple(to_np(a).shape[:2]) for a in calls]


@pytest.mark.parametrize("wrapper", ["bidirectional", "rnn"])
@pytest.mark.parametrize("batch, tiers", [(32, 2), (55, 3), (100, 4)])
def test_rows_run_in_tiers_by_length(wrapper, batch, tiers, monkeypatch):
    """Rows sorted by length run in tiers of at least 16 rows (at most 4);
    each tier stops where the longest row outside it ends. Outputs, final
    states and every gradient equal Keras' masked layer's."""
    time = 9
    sizes = tier_sizes(monkeypatch)
    ours, ref = pair(wrapper)
    x = np.random.default_rng(batch).standard_normal((batch, time, D))
    mask = tier_mask(batch, time, seed=batch)
    rng = np.random.default_rng(1)
    n = 4 if wrapper == "bidirectional" else 2
    init = [rng.standard_normal((batch, U)).astype("float32") for _ in range(n)]
    with backends.force(KERNEL):
        assert_tf_matches(ours, ref, x.astype("float32"), initial_state=init, mask=mask)
    directions = 2 if wrapper == "bidirectional" else 1
    calls = sizes()
    assert len(calls) == tiers * directions
    # Each direction's tiers: fewer rows each, as many steps in all as the
    # longest row.
    for first in range(0, len(calls), tiers):
        rows = [r for _, r in calls[first : first + tiers]]
        assert rows == sorted(rows, reverse=True) and rows[-1] < batch
        assert sum(t for t, _ in calls[first : first + tiers]) == mask.sum(1).max()
    # Fewer steps computed than the batch's longest row times its rows.
    computed = sum(t * r for t, r in calls)
    assert computed < directions * batch * mask.sum(1).max()


@pytest.mark.parametrize("wrapper", ["bidirectional", "rnn"])
def test_zero_initial_states_known_when_traced(wrapper):
    """Initial states of zeros that the trace knows (constants, which the
    tiers leave unsorted) still give each row its own gradient, in a
    tf.function, against Keras' masked layer."""
    batch, time = 32, 9
    ours, ref = pair(wrapper)
    x = np.random.default_rng(4).standard_normal((batch, time, D)).astype("float32")
    mask = tier_mask(batch, time, seed=4)
    n = 4 if wrapper == "bidirectional" else 2
    weights = np.random.default_rng(12).standard_normal((batch, time, U * n // 2))

    def run(layer):
        @tf.function
        def step(x):
            init = [tf.zeros((batch, U)) for _ in range(n)]
            with tf.GradientTape() as tape:
                tape.watch([x] + init)
                y = layer(x, initial_state=init, mask=mask)[0]
                loss = tf.reduce_sum(y * tf.constant(weights, "float32"))
            return y, tape.gradient(loss, [x] + init)

        y, grads = step(tf.constant(x))
        return [to_np(y)] + [to_np(g) for g in grads]

    with backends.force(KERNEL):
        got = run(ours)
    for i, (a, e) in enumerate(zip(got, run(ref))):
        np.testing.assert_allclose(a, e, atol=1e-5, rtol=1e-4, err_msg=f"tensor {i}")


@pytest.mark.parametrize(
    "lengths", ["full", "empty", "one long row"], ids=lambda s: s.replace(" ", "-")
)
def test_tiers_with_steps_to_skip_or_none(lengths, monkeypatch):
    """Tiers that run no step (every row as long, every row empty, one row
    longer than the rest) pass their rows' states on unchanged."""
    batch = 48
    full = np.full(batch, T, "int32")
    lengths = {
        "full": full,
        "empty": np.zeros(batch, "int32"),
        "one long row": np.where(np.arange(batch) == 5, T, 2).astype("int32"),
    }[lengths]
    ours, ref = pair("rnn")
    sizes = tier_sizes(monkeypatch)
    x = np.random.default_rng(3).standard_normal((batch, T, D)).astype("float32")
    got, got_grads = tf_outputs_and_grads(ours, x, lengths=lengths)
    want, want_grads = tf_outputs_and_grads(ref, x, mask=lengths_to_mask(lengths, T))
    for a, e in zip(got + got_grads, want + want_grads):
        np.testing.assert_allclose(a, e, atol=1e-5, rtol=1e-4)
    assert len(sizes()) == 3 and sum(t for t, _ in sizes()) == lengths.max()


def test_tiers_with_an_unknown_batch_size(monkeypatch):
    """Traced with a `None` batch dimension the batch runs in the tiers of
    `tensorflow_tiers.ASSUMED_BATCH` rows (2), some of them empty for a
    small batch (an empty batch too: empty outputs, zero gradients). One
    trace serves every batch."""
    ours, ref = pair("bidirectional")
    from maskedrnn.backends import tensorflow_block_lstm

    calls = record_calls(monkeypatch, tensorflow_block_lstm, "block_lstm")
    time = 6

    step = traced_sin_loss_step(ours, None, D)

    for batch in [0, 1, 3, 40]:
        x = np.random.default_rng(batch).standard_normal((batch, time, D))
        x = tf.constant(x.astype("float32"))
        mask = tf.constant(tier_mask(max(batch, 4), time, seed=2)[:batch])
        with backends.force(KERNEL):
            outs, grads = step(x, mask)
        if batch == 0:  # Keras' LSTMCell raises on an empty batch.
            shapes = [(0, time, 2 * U)] + [(0, U)] * 4
            assert [tuple(o.shape) for o in outs] == shapes
            assert [tuple(g.shape) for g in grads[1:]] == [
                tuple(w.shape) for w in ours.trainable_variables
            ]
            assert not any(np.any(to_np(g)) for g in grads)
            continue
        want, want_grads = sin_loss_step(ref, x, mask)
        for a, e in zip(list(outs) + grads, list(want) + want_grads):
            np.testing.assert_allclose(
                to_np(a), to_np(e), atol=1e-5, rtol=1e-4, err_msg=f"batch {batch}"
            )
    assert step.experimental_get_tracing_count() == 1
    # Traced once: 2 tiers in each direction.
    assert len(calls) == 2 * 2


def test_mixed_precision_in_tiers():
    """float16 tiers (and the gradient sums over steps, done in float32)."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        ours, ref = pair("rnn")
        x = np.random.default_rng(4).standard_normal((32, T, D)).astype("float32")
        with backends.force(KERNEL):
            assert_tf_matches(ours, ref, x, atol=5e-3, mask=tier_mask(32, T, seed=4))
    finally:
        keras.config.set_dtype_policy(previous)


def test_eager_gradients_over_several_shapes():
    """Eagerly the gradient's step loop runs as a graph, traced once per
    sizes with the steps and rows unknown: every shape still gives Keras'
    gradients."""
    for batch, time, features, units in [(16, 5, 3, 4), (9, 8, 2, 3), (24, 3, 5, 2)]:
        ref = keras.layers.LSTM(
            units, use_cudnn=False, return_sequences=True, return_state=True
        )
        ours = MaskedRNN(
            keras.layers.LSTM(units, return_sequences=True, return_state=True)
        )
        ref.build((None, None, features))
        ours.build((None, None, features))
        ours.set_weights(ref.get_weights())
        x = np.random.default_rng(batch).standard_normal((batch, time, features))
        mask = tier_mask(batch, time, seed=1)
        with backends.force(KERNEL):
            assert_tf_matches(ours, ref, x.astype("float32"), mask=mask)


@pytest.mark.parametrize("batch, called", [(20, False), (37, True)])
def test_gradient_traced_once_per_sizes(batch, called, monkeypatch):
    """The gradient's step loop is one graph traced once per sizes (features,
    units) with the steps and rows unknown: every tier and direction calls
    that trace, tiers of unequal rows and steps alike, and a stacked layer
    of other sizes in the same function gets its own. Two directions of 1
    tier inline it, two of 2 tiers call it (`INLINED_CALLS`). Outputs and
    every gradient equal Keras' masked layers'."""
    from maskedrnn.backends import tensorflow_block_lstm

    names = ("_BACKWARD", "_BACKWARD_CALLED")
    graphs = fresh_graphs(monkeypatch, tensorflow_block_lstm, names)
    plans = check_stacked_bidirectional("lstm", batch, 9, D, [U, U + 3])
    assert kernels_of(plans) == {KERNEL}
    # 1 or 2 tiers in each of 4 directions, traced twice (once per layer).
    used, unused = names[::-1] if called else names
    assert graphs[used].experimental_get_tracing_count() == 2
    assert graphs[unused].experimental_get_tracing_count() == 0


@pytest.mark.parametrize("layer, batch, calls", [("rnn", 37, 2), ("bi", 37, 4)])
def test_gradient_calls_share_one_graph(layer, batch, calls, monkeypatch):
    """A layer call that runs the gradient's step loop at most twice (here
    2 tiers, one direction) inlines it; more calls (2 tiers in 2
    directions) call the one traced graph as it is: its definition in the
    step's graph is marked `_noinline` and `_nospecialize`, so TensorFlow's
    optimiser neither inlines it nor copies it per call (each copy would be
    optimised anew)."""
    import tensorflow as tf

    from maskedrnn.backends import tensorflow_block_lstm

    names = ("_BACKWARD", "_BACKWARD_CALLED")
    graphs = fresh_graphs(monkeypatch, tensorflow_block_lstm, names)
    inner = keras.layers.LSTM(U, return_sequences=True)
    ours = MaskedRNN(inner) if layer == "rnn" else MaskedBidirectional(inner)
    x = tf.constant(np.random.default_rng(0).standard_normal((batch, 9, D)), "float32")
    mask = tf.constant(tier_mask(batch, 9, seed=0))

    @tf.function
    def step(x, mask):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(ours(x, mask=mask))
        return tape.gradient(loss, [x] + ours.trainable_variables)

    with backends.record() as plans:
        graph = step.get_concrete_function(x, mask).graph.as_graph_def()
    assert kernels_of(plans) == {KERNEL}
    called = calls > tensorflow_block_lstm.INLINED_CALLS
    used = graphs["_BACKWARD_CALLED" if called else "_BACKWARD"]
    assert used.experimental_get_tracing_count() == 1
    names = [
        node.attr["f"].func.name
        for node in graph.node
        if node.op in ("PartitionedCall", "StatefulPartitionedCall")
        and "_backward" in node.attr["f"].func.name
    ]
    assert len(names) == calls and len(set(names)) == 1, names
    (definition,) = [f for f in graph.library.function if f.signature.name == names[0]]
    for attribute in ("_noinline", "_nospecialize"):
        assert definition.attr[attribute].b == called, attribute
