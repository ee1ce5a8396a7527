"""The `"tf-tiers"` kernel: Keras' GRU and SimpleRNN in length tiers on TensorFlow.

Oracle: Keras' own `GRU` (`use_cudnn=False`, its generic masked loop) or
`SimpleRNN`, and `Bidirectional`, handed the same mask explicitly, same
weights: outputs, final states, and the gradients w.r.t. the inputs, the
initial states and every weight, for every padding pattern (post, pre,
holes, empty rows), `lengths=`, both layers (every merge mode,
`go_backwards`), `reset_after` True and False, with and without bias,
float32, float64 and mixed precision, forced and as the default plan, eagerly
and in `tf.function` with unknown batch and time sizes. The plan's choices
(what runs where the tiers do not: XLA, other activations, recurrent
dropout, `portable()`) are read from `kernel_info()` and
`maskedrnn.backends.record()`.

TensorFlow only: the other backends have no such kernel (forcing it there is
declined, as every kernel a backend lacks).
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
    sin_loss_step,
    tf_outputs_and_grads,
    tier_mask,
    to_np,
    traced_sin_loss_step,
)

pytestmark = pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="the length tiers are TensorFlow code: only the TensorFlow "
    "backend offers the 'tf-tiers' kernel",
)

if BACKEND == "tensorflow":
    import tensorflow as tf

KERNEL = "tf-tiers"
B, T, D, U = 6, 7, 3, 4
MERGE_MODES = ["concat", "sum", "ave", "mul", None]
CELLS = {
    "gru": (keras.layers.GRU, {}),
    "gru-reset-before": (keras.layers.GRU, {"reset_after": False}),
    "simple-rnn": (keras.layers.SimpleRNN, {}),
}


@pytest.fixture(params=sorted(CELLS))
def cell(request):
    return request.param


def inner(cell, oracle=False, **kw):
    kind, defaults = CELLS[cell]
    kw = {**defaults, **kw}
    if oracle and kind is keras.layers.GRU:
        kw["use_cudnn"] = False
    return kind(U, **kw)


def inputs(seed=0, batch=B, time=T, dtype="float32"):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, time, D)).astype(dtype)


def pair(cell, wrapper, merge_mode="concat", go_backwards=False, dtype=None, **kw):
    """(ours, Keras' masked oracle) with the same weights."""
    kw = dict(return_sequences=True, return_state=True, **kw)
    layer_kw = {} if dtype is None else {"dtype": dtype}
    kw.update(layer_kw)
    if wrapper == "bidirectional":
        ref = keras.layers.Bidirectional(
            inner(cell, True, **kw), merge_mode=merge_mode, **layer_kw
        )
        ours = MaskedBidirectional(inner(cell, **kw), merge_mode=merge_mode, **layer_kw)
    else:
        kw["go_backwards"] = go_backwards
        ref = inner(cell, True, **kw)
        ours = MaskedRNN(inner(cell, **kw), **layer_kw)
    ref.build((None, None, D))
    ours.build((None, None, D))
    ours.set_weights(ref.get_weights())
    return ours, ref


def assert_same_in_tf_function(ours, ref, x, mask):
    """A training step of `ours` in a `tf.function` (the tiers running, as
    `backends.record()` reads) gives the outputs and gradients w.r.t. `x`
    and every weight of `ref`'s, run eagerly (the gradients, sums over
    every row and step, to 1e-4)."""
    x, mask = tf.constant(x), tf.constant(mask)

    with backends.record() as plans:
        got, got_grads = tf.function(sin_loss_step)(ours, x, mask)
    assert kernels_of(plans) == {KERNEL}
    want, want_grads = sin_loss_step(ref, x, mask)
    for i, (a, e) in enumerate(zip(got, want)):
        np.testing.assert_allclose(
            to_np(a), to_np(e), atol=1e-5, rtol=1e-4, err_msg=f"output {i}"
        )
    for i, (a, e) in enumerate(zip(got_grads, want_grads)):
        np.testing.assert_allclose(
            to_np(a), to_np(e), atol=1e-4, rtol=1e-4, err_msg=f"gradient {i}"
        )


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
def test_bidirectional_matches_keras_with_every_mask_pattern(cell, merge_mode, how):
    ours, ref = pair(cell, "bidirectional", merge_mode=merge_mode)
    assert_tf_matches(ours, ref, inputs(), mask=edge_mask())


@pytest.mark.parametrize("wrapper", ["bidirectional", "rnn"])
def test_initial_state_and_its_gradient(cell, wrapper, how):
    ours, ref = pair(cell, wrapper)
    n = 2 if wrapper == "bidirectional" else 1
    rng = np.random.default_rng(5)
    init = [rng.standard_normal((B, U)).astype("float32") for _ in range(n)]
    assert_tf_matches(ours, ref, inputs(1), initial_state=init, mask=edge_mask())


@pytest.mark.parametrize("batch", [24, 64])
def test_gradient_of_constant_zero_initial_states(cell, batch):
    """Initial states that the trace knows are zeros (a `tf.zeros` passed
    in a `tf.function`) are not moved with the sorted rows; their gradient,
    taken in the function, still comes back in the caller's row order."""
    ours, ref = pair(cell, "rnn")
    x = tf.constant(inputs(8, batch=batch))
    mask = tf.constant(tier_mask(batch, T, seed=8))
    weights = tf.constant(
        np.random.default_rng(8).standard_normal((batch, T, U)).astype("float32")
    )

    def grads(layer):
        h0 = tf.zeros((batch, U))
        with tf.GradientTape() as tape:
            tape.watch(h0)
            y = layer(x, mask=mask, initial_state=[h0])[0]
            loss = tf.reduce_sum(y * weights)
        return tape.gradient(loss, h0)

    with backends.record() as plans:
        got = tf.function(grads)(ours)
    assert kernels_of(plans) == {KERNEL}
    want = grads(ref)
    assert np.abs(to_np(want)).max() > 0.1
    np.testing.assert_allclose(to_np(got), to_np(want), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("zero_output_for_mask", [False, True])
def test_masked_rnn_matches_keras(cell, go_backwards, zero_output_for_mask, how):
    ours, ref = pair(
        cell,
        "rnn",
        go_backwards=go_backwards,
        zero_output_for_mask=zero_output_for_mask,
    )
    assert_tf_matches(ours, ref, inputs(2), mask=edge_mask())


@pytest.mark.parametrize("wrapper", ["bidirectional", "rnn"])
@pytest.mark.parametrize("lengths", [[7, 3, 0, 1, 5, 6], [3, 0, 1, 2, 3, 1], [0] * B])
def test_lengths_equal_their_right_padded_mask(cell, wrapper, lengths, how):
    """Every row shorter than the time axis: fewer steps run; every row
    empty: none."""
    lengths = np.array(lengths, "int32")
    ours, ref = pair(cell, wrapper)
    got, got_grads = tf_outputs_and_grads(ours, inputs(3), lengths=lengths)
    want, want_grads = tf_outputs_and_grads(
        ref, inputs(3), mask=lengths_to_mask(lengths, T)
    )
    for a, e in zip(got + got_grads, want + want_grads):
        np.testing.assert_allclose(a, e, atol=1e-5, rtol=1e-4)


def test_no_bias_and_last_output_only(cell, how):
    ours, ref = pair(cell, "bidirectional", use_bias=False)
    assert_tf_matches(ours, ref, inputs(5), mask=edge_mask())
    ours = MaskedBidirectional(inner(cell))
    ref = keras.layers.Bidirectional(inner(cell, True))
    ref.build((None, None, D))
    ours.build((None, None, D))
    ours.set_weights(ref.get_weights())
    assert_tf_matches(ours, ref, inputs(4), mask=edge_mask())


# One loop over every row, and rows leaving the loop as they end.
BATCHES = [24, 64]


@pytest.mark.parametrize("batch", BATCHES)
def test_float64_matches_keras(cell, batch, how):
    """float64 throughout (weights, steps, gradient sums): agreement to
    float64 rounding, far below float32's."""
    ours, ref = pair(cell, "bidirectional", dtype="float64")
    x = inputs(6, batch=batch, dtype="float64")
    mask = tier_mask(batch, T, seed=6)
    assert_tf_matches(ours, ref, x, atol=1e-12, mask=mask)


@pytest.mark.parametrize("batch", BATCHES)
def test_mixed_precision_matches_keras(cell, batch):
    """mixed_float16: both compute in float16 (the weights float32); the
    gradient sums over steps run in float32."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        ours, ref = pair(cell, "rnn")
        x = inputs(7, batch=batch)
        mask = tier_mask(batch, T, seed=4)
        with backends.record() as plans:
            # Keras adds the steps' weight gradients one by one in float16,
            # ours sums them at once: they differ by float16's rounding.
            assert_tf_matches(ours, ref, x, atol=5e-3, grad_rtol=1e-2, mask=mask)
        assert ours.layer.cell.compute_dtype == "float16"
        assert ours.layer.cell.kernel.dtype == "float32"
    finally:
        keras.config.set_dtype_policy(previous)
    assert kernels_of(plans) == {KERNEL}


@pytest.mark.parametrize("jit_compile", [False, True])
def test_in_tf_function_with_unknown_batch_and_time(cell, jit_compile):
    """Traced once with `None` batch and time sizes the tiers serve every
    batch (empty, small, large: one loop over every row, as for any batch
    of unknown size); with `jit_compile=True` the plan picks Keras' layer
    (recorded), same results."""
    ours, ref = pair(cell, "bidirectional")
    time = 6

    step = traced_sin_loss_step(ours, None, D, jit_compile=jit_compile)

    batches = [1, 3, 40] if jit_compile else [0, 1, 3, 40]
    for batch in batches:
        x = tf.constant(inputs(batch, batch=batch, time=time))
        mask = tf.constant(tier_mask(max(batch, 4), time, seed=2)[:batch])
        with backends.record() as plans:
            outs, grads = step(x, mask)
        if plans:  # traced on the first call only
            assert (KERNEL in kernels_of(plans)) == (not jit_compile)
        if batch == 0:
            assert [tuple(o.shape) for o in outs] == [(0, time, 2 * U), (0, U), (0, U)]
            assert not any(np.any(to_np(g)) for g in grads)
            continue
        want, want_grads = sin_loss_step(ref, x, mask)
        for a, e in zip(list(outs) + grads, list(want) + want_grads):
            np.testing.assert_allclose(
                to_np(a), to_np(e), atol=1e-5, rtol=1e-4, err_msg=f"batch {batch}"
            )
    assert step.experimental_get_tracing_count() == 1


def test_rows_leave_the_loop_with_time_unknown_to_the_trace(cell):
    """A batch of 64 rows whose time size the trace does not know: rows
    leave the loop as they end over every time size (one under a block,
    a block and a half, an odd one), from one trace, with Keras' results."""
    ours, ref = pair(cell, "rnn")
    batch = 64

    step = traced_sin_loss_step(ours, batch, D)

    for time in [1, 3, 6, 9]:
        x = tf.constant(inputs(time, batch=batch, time=time))
        mask = tf.constant(tier_mask(batch, time, seed=time))
        with backends.record() as plans:
            outs, grads = step(x, mask)
        if plans:  # traced on the first call only
            assert kernels_of(plans) == {KERNEL}
        want, want_grads = sin_loss_step(ref, x, mask)
        for a, e in zip(list(outs) + grads, list(want) + want_grads):
            np.testing.assert_allclose(
                to_np(a), to_np(e), atol=1e-4, rtol=1e-4, err_msg=f"time {time}"
            )
    assert step.experimental_get_tracing_count() == 1


def test_input_dropout_is_applied_before_the_tiers(cell):
    """Training with input dropout: the tiers read the inputs times the
    cell's dropout mask (one mask for every step, applied by the core), as
    Keras' masked layer given the dropped inputs and no dropout."""
    ours, _ = pair(cell, "rnn", dropout=0.5, seed=3)
    _, ref = pair(cell, "rnn")
    ref.set_weights(ours.get_weights())
    keep = (np.random.default_rng(9).random((B, D)) < 0.5) * 2.0
    keep = keep.astype("float32")
    ours.layer.cell.get_dropout_mask = lambda x: tf.constant(keep)
    x, mask = inputs(8), edge_mask()
    with backends.record() as plans:
        got = ours(x, mask=mask, training=True)
    assert kernels_of(plans) == {KERNEL}
    want = ref(x * keep[:, None, :], mask=mask)
    for a, e in zip(got, want):
        np.testing.assert_allclose(to_np(a), to_np(e), atol=1e-5)
    plain = ours(x, mask=mask, training=False)
    assert np.abs(to_np(plain[0]) - to_np(got[0])).max() > 1e-2


def test_kernel_info_says_it_runs_and_why_not_elsewhere(cell):
    ours, _ = pair(cell, "bidirectional")
    ours(inputs(), mask=edge_mask())
    name = CELLS[cell][0].__name__
    for sentence in ours.kernel_info().values():
        assert sentence.startswith(f"Keras {name}'s equations in length tiers")
        assert "exact" in sentence and "jit_compile=True) Keras' layer" in sentence
    cases = [
        (inner(cell, activation="relu"), "tanh"),
        (inner(cell, recurrent_dropout=0.1), "recurrent_dropout"),
        (inner(cell, unroll=True), "unroll=True"),
    ]
    if cell != "simple-rnn":
        cases += [
            (inner(cell, recurrent_activation="hard_sigmoid"), "tanh / sigmoid"),
            (inner(cell, use_cudnn=False), "use_cudnn=False"),
        ]
    for layer_inner, reason in cases:
        layer = MaskedRNN(layer_inner)
        layer.build((None, T, D))
        (sentence,) = layer.kernel_info().values()
        assert sentence.startswith("Keras "), sentence
        assert "the length tiers do not run" in sentence and reason in sentence


def test_declined_cases_raise_when_forced(cell):
    x, mask = inputs(), edge_mask()
    layers = [
        (inner(cell, activation="relu"), "tanh"),
        (keras.layers.LSTM(U), "GRU and keras.layers.SimpleRNN only"),
        (keras.layers.RNN(keras.layers.GRUCell(U)), "SimpleRNN only"),
    ]
    layers.append(
        (inner(cell, dtype="mixed_bfloat16"), "bfloat16; the tiers compute float16")
    )
    for layer_inner, reason in layers:
        with backends.force(KERNEL):
            with pytest.raises(backends.Declined, match=reason):
                MaskedRNN(layer_inner)(x, mask=mask)
    # Recurrent dropout: declined while training and at inference alike
    # (the plan does not depend on `training`).
    with backends.force(KERNEL):
        with pytest.raises(backends.Declined, match="recurrent_dropout"):
            MaskedRNN(inner(cell, recurrent_dropout=0.2))(x, mask=mask, training=True)
    # unroll=True: Keras' unrolled loop by default, the tiers when forced.
    ours, ref = pair(cell, "rnn", unroll=True)
    with backends.record() as plans:
        ours(x, mask=mask)
    assert KERNEL not in kernels_of(plans)
    with backends.force(KERNEL):
        assert_tf_matches(ours, ref, x, mask=mask)


def test_declined_under_xla_and_in_portable_block(cell):
    ours, ref = pair(cell, "bidirectional")
    check_declined_contexts(ours, ref, KERNEL, inputs(), edge_mask())


def loop_calls(monkeypatch):
    """The step loops the layer calls run, in call order: `("tier",
    (steps, rows))` for one loop over every row, `("shrinking", rows)` for
    one whose rows leave as they end (`rows`: each block's, then a 0).
    Eager calls only (the rows are read)."""
    from maskedrnn.backends import tensorflow_cells

    calls = []
    original = tensorflow_cells._call

    def recording(function, sequences, *args):
        name = function.python_function.__name__
        if not tf.executing_eagerly():
            pass
        elif name == "_tier_forward":
            calls.append(("tier", tuple(sequences[0].shape[:2])))
        elif name == "_shrinking_forward":
            calls.append(("shrinking", list(to_np(sequences[2]))))
        return original(function, sequences, *args)

    monkeypatch.setattr(tensorflow_cells, "_call", recording)
    return calls


def block_of(cell):
    """The steps per loop iteration of `cell`'s step loops."""
    from maskedrnn.backends import tensorflow_cells

    kind = CELLS[cell][0]
    if kind is keras.layers.GRU:
        return tensorflow_cells.GRU_BLOCK
    return tensorflow_cells.RNN_BLOCK


def whole_blocks(cell, steps):
    """`steps` rounded up to whole loop iterations of `cell`'s step loops:
    the steps one loop over every row runs."""
    block = block_of(cell)
    return -(-steps // block) * block


def expected_block_rows(cell, lengths, time):
    """The rows with a step in each block of the padded time axis, then a 0."""
    block = block_of(cell)
    starts = np.arange(0, whole_blocks(cell, time) + 1, block)
    return [int((np.asarray(lengths) > s).sum()) for s in starts]


@pytest.mark.parametrize("wrapper", ["bidirectional", "rnn"])
@pytest.mark.parametrize("batch", [64, 111, 300])
def test_rows_leave_the_loop_as_they_end(cell, wrapper, batch, monkeypatch):
    """From 64 rows, the rows sorted by length run in one loop per
    direction that each block of steps runs over the rows with a step in
    it. Outputs, final states and every gradient equal Keras' masked
    layer's, eagerly and in a `tf.function`."""
    time = 9
    calls = loop_calls(monkeypatch)
    ours, ref = pair(cell, wrapper)
    x = tf.constant(inputs(batch, batch=batch, time=time))
    mask = tier_mask(batch, time, seed=batch)
    rng = np.random.default_rng(1)
    n = 2 if wrapper == "bidirectional" else 1
    init = [rng.standard_normal((batch, U)).astype("float32") for _ in range(n)]
    with backends.force(KERNEL):
        assert_tf_matches(ours, ref, x, initial_state=init, mask=mask)
    rows = expected_block_rows(cell, mask.sum(1), time)
    assert calls == [("shrinking", rows)] * n
    # The last block with rows (the full rows') has fewer than the first.
    assert rows[0] > rows[-2] > 0
    assert_same_in_tf_function(ours, ref, x, mask)


@pytest.mark.parametrize("wrapper", ["bidirectional", "rnn"])
def test_rows_leaving_the_loop_never_read_what_padding_holds(cell, wrapper):
    """From 64 rows, padding holding 3e38, inf or NaN gives the outputs and
    gradients of zero padding, all finite: a row of odd length reads one
    padded step in its last loop iteration (two steps each), zeroed before
    the rows are sorted."""
    batch, time = 64, 9
    ours, ref = pair(cell, wrapper)
    mask = tier_mask(batch, time, seed=5)
    clean = inputs(5, batch=batch, time=time)
    clean[~mask] = 0.0
    x = clean.copy()
    pads = np.array([3e38, np.inf, -np.inf, np.nan], "float32")
    x[~mask] = np.resize(pads, (~mask).sum())[:, None]
    with backends.force(KERNEL):
        assert_tf_matches(ours, ref, x, ref_x=clean, mask=mask)


@pytest.mark.parametrize("wrapper", ["bidirectional", "rnn"])
@pytest.mark.parametrize("time, longest", [(8, 5), (9, 5), (9, 9), (9, 0)])
def test_one_loop_stops_at_the_longest_row(cell, wrapper, time, longest, monkeypatch):
    """Under 64 rows, one loop runs every row for the fewest whole loop
    iterations holding the longest row, the time axis padded when they pass
    its end. Outputs, final states and every gradient equal Keras' masked
    layer's, eagerly and in a `tf.function` of known sizes, with every row
    empty too."""
    batch = 20
    calls = loop_calls(monkeypatch)
    ours, ref = pair(cell, wrapper)
    x = tf.constant(inputs(4, batch=batch, time=time))
    mask = np.zeros((batch, time), bool)
    mask[:, :longest] = tier_mask(batch, longest, seed=3)
    with backends.force(KERNEL):
        assert_tf_matches(ours, ref, x, mask=mask)
    runs = [("tier", (whole_blocks(cell, longest), batch))]
    assert calls == runs * (2 if wrapper == "bidirectional" else 1)
    assert_same_in_tf_function(ours, ref, x, mask)


@pytest.mark.parametrize(
    "lengths", ["full", "empty", "one long row"], ids=lambda s: s.replace(" ", "-")
)
def test_shrinking_rows_with_steps_to_skip_or_none(cell, lengths, monkeypatch):
    """Rows leaving the loop when every row is as long, every row is empty
    (no block runs: zeros out, the initial states' gradient zero), or one
    row is longer than the rest (it runs alone after the others' end)."""
    batch = 96
    lengths = {
        "full": np.full(batch, T, "int32"),
        "empty": np.zeros(batch, "int32"),
        "one long row": np.where(np.arange(batch) == 5, T, 2).astype("int32"),
    }[lengths]
    ours, ref = pair(cell, "rnn")
    calls = loop_calls(monkeypatch)
    x = inputs(3, batch=batch)
    init = [np.random.default_rng(2).standard_normal((batch, U)).astype("float32")]
    got, got_grads = tf_outputs_and_grads(ours, x, initial_state=init, lengths=lengths)
    want, want_grads = tf_outputs_and_grads(
        ref, x, initial_state=init, mask=lengths_to_mask(lengths, T)
    )
    for a, e in zip(got + got_grads, want + want_grads):
        np.testing.assert_allclose(a, e, atol=1e-5, rtol=1e-4)
    assert calls == [("shrinking", expected_block_rows(cell, lengths, T))]


def test_eager_gradients_over_several_shapes(cell):
    """Eagerly the step loops run as graphs traced once with the rows and
    steps unknown: every shape still gives Keras' gradients."""
    for batch, time in [(16, 5), (9, 8), (24, 3)]:
        ours, ref = pair(cell, "rnn")
        x = inputs(batch, batch=batch, time=time)
        with backends.force(KERNEL):
            assert_tf_matches(ours, ref, x, mask=tier_mask(batch, time, seed=1))


def step_loops(monkeypatch, cell_name):
    """Fresh copies of the forward and backward step loops of `cell_name`
    ("gru" or "simple-rnn"), put in the module's place (`fresh_graphs`)."""
    from maskedrnn.backends import tensorflow_cells

    kinds, directions = ("TIER", "SHRINKING"), ("FORWARD", "BACKWARD")
    names = [f"_{k}_{d}" for k in kinds for d in directions]
    return fresh_graphs(monkeypatch, tensorflow_cells, names)


@pytest.mark.parametrize("batch, kind", [(20, "TIER"), (70, "SHRINKING")])
@pytest.mark.parametrize("cell_name", ["gru", "simple-rnn"])
def test_step_loops_traced_once_per_sizes(cell_name, batch, kind, monkeypatch):
    """The forward and the backward step loops are graphs traced once per
    sizes and dtype with the steps unknown: both directions of a layer call
    that trace (in a `tf.function` their copies are inlined), and a stacked
    layer of other units gets its own. Outputs and every gradient equal
    Keras' masked layers'."""
    loops = step_loops(monkeypatch, cell_name)
    cell_kind = "gru" if cell_name == "gru" else "simple"
    plans = check_stacked_bidirectional(cell_kind, batch, 9, D, [U, U + 3])
    assert kernels_of(plans) == {KERNEL}
    # One loop in each of 4 directions, each traced twice (once per layer's
    # units); the other kind of loop never.
    for name, loop in loops.items():
        want = 2 if name.startswith(f"_{kind}_") else 0
        assert loop.experimental_get_tracing_count() == want, name


@pytest.mark.parametrize("batch", [20, 70])
@pytest.mark.parametrize("cell_name", ["gru", "simple-rnn"])
def test_step_loops_run_once_are_traced_in_place(cell_name, batch, monkeypatch):
    """A one-direction layer runs each step loop once: in a `tf.function`
    its ops are traced in place, the shared graphs never traced. Outputs
    and every gradient equal Keras' masked layer's."""
    loops = step_loops(monkeypatch, cell_name)
    ours, ref = pair(cell_name, "rnn")
    time = 9
    x = tf.constant(inputs(7, batch=batch, time=time))
    mask = tf.constant(tier_mask(batch, time, seed=5))

    assert_same_in_tf_function(ours, ref, x, mask)
    for name, loop in loops.items():
        assert loop.experimental_get_tracing_count() == 0, name
