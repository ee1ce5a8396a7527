"""Property and edge-case tests of MaskedBidirectional against Keras.

Oracle: `keras.layers.Bidirectional(..., use_cudnn=False)` with the same
weights, mask and initial state (Keras' generic masked step loop): outputs,
final states and gradients (w.r.t. inputs and every weight) must agree for
any padding pattern.

Hypothesis draws the batch size, time length, each row's padding (right,
left, holes, empty, full), the cell (LSTM, GRU), the merge mode, the output
flags and the initial state. Examples are derandomized (the same examples on
every run: no flaky CI) and few (JAX compiles each new shape). On JAX the
shapes, merge mode and flags are fixed per cell so that one compiled
`jax.jit(value_and_grad)` per cell serves every example; the padding
patterns and initial states are still drawn.
"""


import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maskedrnn import MaskedBidirectional
from tests.helpers import BACKEND, flat, loss_and_grads, script, to_np

D, U = 2, 3
ATOL = 1e-5
MERGE_MODES = ["concat", "sum", "mul", "ave", None]
JAX_B, JAX_T = 4, 5  # the one shape compiled on JAX

settings.register_profile(
    "maskedrnn",
    max_examples=25 if BACKEND == "jax" else 15,  # JAX examples are ~free once compiled
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = settings.get_profile("maskedrnn")


def make_pair(kind, merge_mode, return_sequences):
    """(ours, Keras' masked Bidirectional) with identical weights."""
    cls = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}[kind]
    kw = dict(return_sequences=return_sequences, return_state=True)
    ref = keras.layers.Bidirectional(
        cls(U, use_cudnn=False, **kw), merge_mode=merge_mode
    )
    ref.build((None, None, D))
    ours = MaskedBidirectional(cls(U, **kw), merge_mode=merge_mode)
    ours.build((None, None, D))
    ours.set_weights(ref.get_weights())
    return ours, ref


@st.composite
def masks(draw, batch, time):
    """A (batch, time) mask whose rows are right-padded, left-padded, holed,
    empty or full."""
    rows = []
    for _ in range(batch):
        pattern = draw(st.sampled_from(["right", "left", "holes", "empty", "full"]))
        n = draw(st.integers(0, time))
        steps = np.arange(time)
        if pattern == "right":
            row = steps < n
        elif pattern == "left":
            row = steps >= time - n
        elif pattern == "holes":
            row = np.array(draw(st.lists(st.booleans(), min_size=time, max_size=time)))
        elif pattern == "empty":
            row = np.zeros(time, bool)
        else:
            row = np.ones(time, bool)
        rows.append(row)
    return np.stack(rows)


@st.composite
def cases(draw):
    kind = draw(st.sampled_from(["lstm", "gru"]))
    if BACKEND == "jax":
        batch, time, merge_mode, return_sequences = JAX_B, JAX_T, "concat", True
    else:
        batch = draw(st.integers(1, 5))
        time = draw(st.integers(1, 6))
        merge_mode = draw(st.sampled_from(MERGE_MODES))
        return_sequences = draw(st.booleans())
    mask = draw(masks(batch, time))
    seed = draw(st.integers(0, 2**16))
    with_state = draw(st.booleans())
    return kind, merge_mode, return_sequences, mask, seed, with_state


def make_data(kind, mask, seed, with_state):
    rng = np.random.default_rng(seed)
    batch, time = mask.shape
    x = rng.standard_normal((batch, time, D)).astype("float32")
    n_states = 4 if kind == "lstm" else 2
    if with_state:
        states = [
            rng.standard_normal((batch, U)).astype("float32") for _ in range(n_states)
        ]
    elif BACKEND == "jax":  # explicit zeros: the same compiled function
        states = [np.zeros((batch, U), "float32") for _ in range(n_states)]
    else:
        states = None  # the layer's own default
    return x, states


# ------------------------------------------------------- JAX: compile once

_JAX_CACHE = {}


def _jax_outputs_and_grads(layer, x, mask, states):
    """Outputs and gradients (inputs, then weights) of the same weighted-sum
    loss as tests.helpers.loss_and_grads, under one cached jax.jit."""
    import jax

    key = id(layer)
    if key not in _JAX_CACHE:
        rng = np.random.default_rng(123)

        def loss(tv, ntv, xv, mv, sv):
            outs, _ = layer.stateless_call(tv, ntv, xv, mask=mv, initial_state=sv)
            total = 0.0
            for o in flat(outs):
                w = rng.standard_normal(tuple(o.shape)).astype("float32")
                total = total + jax.numpy.sum(o * w)
            return total, outs

        grad = jax.value_and_grad(loss, argnums=(0, 2), has_aux=True)
        _JAX_CACHE[key] = jax.jit(grad)
    tv = [v.value for v in layer.trainable_variables]
    ntv = [v.value for v in layer.non_trainable_variables]
    (_, outs), (g_w, g_x) = _JAX_CACHE[key](tv, ntv, x, mask, states)
    return flat(outs), [np.asarray(g_x)] + [np.asarray(g) for g in g_w]


_JAX_PAIRS = {}


def pair_for(kind, merge_mode, return_sequences):
    if BACKEND != "jax":
        return make_pair(kind, merge_mode, return_sequences)
    key = (kind, merge_mode, return_sequences)
    if key not in _JAX_PAIRS:
        _JAX_PAIRS[key] = make_pair(kind, merge_mode, return_sequences)
    return _JAX_PAIRS[key]


def outputs_and_grads(layer, x, mask, states):
    if BACKEND == "jax":
        return _jax_outputs_and_grads(layer, x, mask, states)
    outs = flat(layer(x, mask=mask, initial_state=states))
    _, grads = loss_and_grads(layer, x, mask=mask, initial_state=states)
    return outs, grads


def assert_same(ours, ref, x, mask, states):
    outs_o, grads_o = outputs_and_grads(ours, x, mask, states)
    outs_r, grads_r = outputs_and_grads(ref, x, mask, states)
    assert len(outs_o) == len(outs_r)
    for a, b in zip(outs_o, outs_r):
        np.testing.assert_allclose(to_np(a), to_np(b), atol=ATOL, rtol=1e-5)
    assert len(grads_o) == len(grads_r)
    for a, b in zip(grads_o, grads_r):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=ATOL, rtol=1e-4)
    return outs_o, grads_o


# ------------------------------------------------------------- properties


@PROFILE
@given(cases())
def test_random_padding_matches_keras(case):
    kind, merge_mode, return_sequences, mask, seed, with_state = case
    ours, ref = pair_for(kind, merge_mode, return_sequences)
    x, states = make_data(kind, mask, seed, with_state)
    assert_same(ours, ref, x, mask, states)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_zero_length_rows_output_zeros_and_keep_initial_states(kind):
    """Rows with no valid step: zero outputs at every step, the initial
    states returned unchanged, no NaN/Inf anywhere (outputs and gradients),
    and Keras' values. Holds in a batch that is all empty rows, too."""
    time = JAX_T
    ours, ref = pair_for(kind, "concat", True)
    rng = np.random.default_rng(5)
    for mask in (
        np.array([[0] * time, [1] * time, [0] * time, [1, 0, 1, 0, 0]], bool),
        np.zeros((JAX_B, time), bool),
    ):
        x = rng.standard_normal((JAX_B, time, D)).astype("float32")
        _, states = make_data(kind, mask, 7, True)
        outs, grads = assert_same(ours, ref, x, mask, states)
        empty = ~mask.any(1)
        seq, *finals = [to_np(o) for o in outs]
        assert np.all(seq[empty] == 0)
        for got, initial in zip(finals, states):
            np.testing.assert_array_equal(got[empty], initial[empty])
        for t in [seq, *finals, *grads]:
            assert np.all(np.isfinite(t))
        # No gradient reaches the inputs of an empty row (all padding).
        assert np.all(grads[0][empty] == 0)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_single_time_step(kind):
    """T=1: every row is either one valid step or empty."""
    if BACKEND == "jax" and kind == "gru":
        pytest.skip(
            "JAX compiles per shape (~15 s); LSTM covers T=1 on JAX (it adds "
            "the cell-state recomputation to GRU's path), GRU runs on TF/torch"
        )
    ours, ref = make_pair(kind, "concat", True)
    mask = np.array([[True], [False], [True]])
    x, states = make_data(kind, mask, 3, True)
    outs, _ = assert_same(ours, ref, x, mask, states)
    assert tuple(outs[0].shape) == (3, 1, 2 * U)


# --------------------------------------------------------- long sequences

LONG_T = 2000


@pytest.mark.slow
def test_long_sequence_matches_keras():
    """T=2000: the unmasked LSTM with exact final states (tree-reduced cell
    state over 2000 steps) stays within float32 round-off of Keras' masked
    step loop."""
    ours, ref = make_pair("lstm", "concat", True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, LONG_T, D)).astype("float32")
    mask = np.ones((2, LONG_T), bool)
    mask[1, :700] = False  # left-padded
    mask[1, 1500:1510] = False  # and a hole
    run_ours, run_ref = ours, ref
    if BACKEND == "tensorflow":  # eager TF runs 2000 loop steps op by op
        import tensorflow as tf

        run_ours, run_ref = tf.function(ours), tf.function(ref)
    got, want = flat(run_ours(x, mask=mask)), flat(run_ref(x, mask=mask))
    for a, b in zip(got, want):
        np.testing.assert_allclose(to_np(a), to_np(b), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="memory is measured on TF CPU, in subprocesses (once, not per backend)",
)
def test_long_sequence_memory_is_bounded_by_keras_unmasked():
    """Forward + backward at T=2000 (batch 2, 4 units) in one tf.function
    traced with None dims on a T=8 warm-up: growth of peak RSS (ru_maxrss)
    of ours, with lengths and with a left-padded mask, against
    keras.layers.Bidirectional without a mask (the inner RNN's own needs: TF
    keeps every step for the gradient), with and without `return_state`.
    The probe is scripts/memory_probe.py's, which writes the figures in
    docs/errors.md; an O(T^2) tensor (2 x 2000 x 2000 x 4 units, float32)
    would add 128 MB per copy. The bound is generous on purpose (RSS is
    coarse): 2 x Keras + 32 MB."""
    peak_memory_mb = script("memory_probe").peak_memory_mb
    keras_mb = peak_memory_mb("keras", LONG_T)
    for which in ("ours-lengths", "ours-mask"):
        ours_mb = peak_memory_mb(which, LONG_T)
        assert ours_mb <= 2 * keras_mb + 32, (which, ours_mb, keras_mb)
    keras_mb = peak_memory_mb("keras", LONG_T, state=True)
    ours_mb = peak_memory_mb("ours-mask", LONG_T, state=True)
    assert ours_mb <= 2 * keras_mb + 32, ("ours-mask, state", ours_mb, keras_mb)
