"""`maskedrnn.backends.jax_tiers`: the JAX backend's length tiers.

The oracle is Keras' own layer with `use_cudnn=False` handed the same mask
(its masked step loop): outputs at every valid step, final states, and the
gradients w.r.t. the inputs, every weight and the initial states, on every
padding pattern of `tests.helpers.edge_mask` and on batches whose
rows end at many different steps (so that every tier boundary is crossed).
"""

import contextlib

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional, MaskedRNN, backends
from tests.helpers import (
    BACKEND,
    assert_close,
    edge_mask,
    loss_and_grads,
    oracle_pair,
    run_python,
)

pytestmark = pytest.mark.skipif(
    BACKEND != "jax", reason="jax_tiers is the JAX backend's kernel"
)

if BACKEND == "jax":
    import jax
    import jax.numpy as jnp

    from maskedrnn.backends import jax_tiers

D, U = 3, 4
MASK = edge_mask()
# Rows ending at every step, 0 and full included, in no order.
LENGTHS = np.array([9, 0, 3, 5, 1, 9, 2, 7, 4, 6, 8], "int32")


def _layer(kind, dtype=None, **kw):
    make = {
        "lstm": lambda: keras.layers.LSTM(U, use_cudnn=False, dtype=dtype, **kw),
        "lstm_no_bias": lambda: keras.layers.LSTM(
            U, use_cudnn=False, use_bias=False, dtype=dtype, **kw
        ),
        "gru": lambda: keras.layers.GRU(U, use_cudnn=False, dtype=dtype, **kw),
        "gru_reset_before": lambda: keras.layers.GRU(
            U, use_cudnn=False, reset_after=False, dtype=dtype, **kw
        ),
        "simple": lambda: keras.layers.SimpleRNN(U, dtype=dtype, **kw),
    }[kind]
    layer = make()
    layer.return_sequences = layer.return_state = True
    layer.build((None, None, D))
    rng = np.random.default_rng(7)
    for v in layer.trainable_variables:
        v.assign(rng.uniform(-0.7, 0.7, v.shape).astype(v.dtype))
    return layer


def _case(lengths, seed=0, dtype="float32"):
    rng = np.random.default_rng(seed)
    batch, time = len(lengths), int(max(lengths.max(), 1))
    valid = np.arange(time)[None] < lengths[:, None]
    x = np.where(valid[..., None], rng.standard_normal((batch, time, D)), 0)
    wy = rng.standard_normal((batch, time, U)) * valid[..., None]
    return x.astype(dtype), valid, wy.astype(dtype)


def _losses(layer, lengths, valid, wy):
    """(Keras' masked loss, ours) as functions of (weights, x, initial)."""
    nontrainable = [v.value for v in layer.non_trainable_variables]

    def total(y, states):
        extra = sum(jnp.sum(s * (i + 2.0) * jnp.cos(s)) for i, s in enumerate(states))
        return jnp.sum(y * wy) + extra, (y * valid[..., None], states)

    def keras_loss(weights, x, initial):
        (y, *states), _ = layer.stateless_call(
            weights, nontrainable, x, mask=valid, initial_state=list(initial)
        )
        return total(y, states)

    def our_loss(weights, x, initial, groups):
        mapping = list(zip(layer.trainable_variables, weights))
        with keras.StatelessScope(state_mapping=mapping):
            y, states = jax_tiers.run(
                layer, x, lengths, list(initial), groups=groups
            )
        return total(y, states)

    return keras_loss, our_loss


def _check_run(kind, lengths, groups, dtype="float32", atol=1e-5):
    layer = _layer(kind, dtype=None if dtype == "float32" else dtype)
    x, valid, wy = _case(lengths, dtype=dtype)
    rng = np.random.default_rng(3)
    initial = [
        rng.standard_normal((len(lengths), U)).astype(dtype)
        for _ in (range(2) if kind.startswith("lstm") else range(1))
    ]
    weights = [v.value for v in layer.trainable_variables]
    keras_loss, our_loss = _losses(layer, lengths, valid, wy)
    grad = jax.value_and_grad(keras_loss, argnums=(0, 1, 2), has_aux=True)
    (want, want_out), want_grads = grad(weights, x, initial)
    ours = jax.jit(
        jax.value_and_grad(our_loss, argnums=(0, 1, 2), has_aux=True),
        static_argnums=3,
    )
    (got, got_out), got_grads = ours(weights, x, initial, groups)
    assert_close(got_out, want_out, atol=atol)
    assert_close(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), atol=atol)
    for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
        assert g.dtype == w.dtype
    # Not vacuous: every gradient is non-zero somewhere.
    assert all(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(got_grads))


@pytest.mark.parametrize(
    "kind", ["lstm", "lstm_no_bias", "gru", "gru_reset_before", "simple"]
)
@pytest.mark.parametrize("groups", [1, 3, 4, 11])
def test_run_matches_keras_masked_loop(kind, groups):
    """Outputs at valid steps, final states and every gradient (inputs,
    weights, initial states) equal Keras' masked loop's, under jit, with
    one row group, 3 groups of 4 rows or 4 of 3 (the 11 rows padded by one
    row of length 0), and one group per row."""
    _check_run(kind, LENGTHS, groups)


@pytest.mark.parametrize("kind", ["lstm", "gru", "simple"])
def test_run_on_edge_mask_lengths(kind):
    """The lengths of `edge_mask`'s rows (0 and full among them)."""
    _check_run(kind, MASK.sum(axis=1).astype("int32"), jax_tiers.GROUPS)


_ORACLE_KINDS = ["lstm", "gru", "simple"]


def _tiers(kind):
    """The tiers' block: the default plan for an LSTM or GRU on a JAX CPU,
    forced for a SimpleRNN (which runs Keras' masked loop there)."""
    if kind == "simple":
        return backends.force("jax-tiers")
    return contextlib.nullcontext()


@pytest.mark.parametrize("merge_mode", ["concat", "sum", "mul", "ave", None])
@pytest.mark.parametrize("kind", _ORACLE_KINDS)
def test_bidirectional_every_merge_mode(kind, merge_mode):
    """`MaskedBidirectional` on the tiers (the default on a JAX CPU for an
    LSTM or GRU; forced for a SimpleRNN) equals Keras' masked
    `Bidirectional` on every pattern of `edge_mask`: outputs, states and
    gradients."""
    if merge_mode is not None and kind != "lstm":
        pytest.skip("merge modes: checked on the LSTM")
    ours, ref = oracle_pair(
        kind, U, D, return_sequences=True, return_state=True, merge_mode=merge_mode
    )
    x = np.random.default_rng(0).standard_normal((6, 7, D)).astype("float32")
    with _tiers(kind), backends.record() as plans:
        got = ours(x, mask=MASK)
        grads = loss_and_grads(ours, x, mask=MASK)[1]
    assert [d.kernel for d in plans[0].directions] == ["jax-tiers"] * 2
    assert plans[0].strategy == "one_call"
    assert_close(got, ref(x, mask=MASK))
    assert_close(grads, loss_and_grads(ref, x, mask=MASK)[1])


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("kind", _ORACLE_KINDS)
def test_rnn_go_backwards_initial_state(kind, go_backwards):
    """`MaskedRNN` with `go_backwards`, `return_state` and `initial_state`
    equals Keras' masked layer, gradients w.r.t. the initial states too."""
    ours, ref = oracle_pair(
        kind,
        U,
        D,
        wrapper="rnn",
        return_sequences=True,
        return_state=True,
        go_backwards=go_backwards,
    )
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 7, D)).astype("float32")
    states = [
        rng.standard_normal((6, U)).astype("float32")
        for _ in range(2 if kind == "lstm" else 1)
    ]
    want = ref(x, mask=MASK, initial_state=states)
    # Keras' JAX loop outputs the initial h before a row's first valid step
    # in its reading order; ours outputs zeros there (as its other
    # backends), so outputs are compared where a valid step was read.
    read = MASK[:, ::-1] if go_backwards else MASK
    started = np.cumsum(read, axis=1) > 0
    with _tiers(kind), backends.record() as plans:
        got = ours(x, mask=MASK, initial_state=states)
    assert plans[0].kernel() == "jax-tiers"
    assert_close(got[0] * started[..., None], want[0] * started[..., None])
    assert_close(got[1:], want[1:])

    def loss(layer, x, states):
        out, _ = layer.stateless_call(
            [v.value for v in layer.trainable_variables],
            [v.value for v in layer.non_trainable_variables],
            x,
            mask=MASK,
            initial_state=list(states),
        )
        y, *final = out
        return jnp.sum(y * started[..., None] * 0.3) + sum(
            jnp.sum(jnp.sin(s) * (i + 1)) for i, s in enumerate(final)
        )

    with _tiers(kind):
        got = jax.grad(lambda x, s: loss(ours, x, s), argnums=(0, 1))(x, states)
    want = jax.grad(lambda x, s: loss(ref, x, s), argnums=(0, 1))(x, states)
    assert_close(jax.tree.leaves(got), jax.tree.leaves(want))


@pytest.mark.parametrize(
    "policy, atol", [("mixed_float16", 2e-2), ("mixed_bfloat16", 8e-2)]
)
@pytest.mark.parametrize("kind", _ORACLE_KINDS)
def test_mixed_precision(kind, policy, atol):
    """Under a mixed policy the tiers compute in the compute dtype, with
    float32 variables, close to Keras' masked layer under the same policy."""
    keras.config.set_dtype_policy(policy)
    try:
        ours, ref = oracle_pair(kind, U, D, return_sequences=True, return_state=True)
    finally:
        keras.config.set_dtype_policy("float32")
    x = np.random.default_rng(0).standard_normal((6, 7, D)).astype("float32")
    with _tiers(kind), backends.record() as plans:
        got = ours(x, mask=MASK)
        got_grads = loss_and_grads(ours, x, mask=MASK)[1]
    assert plans[0].kernel() == "jax-tiers"
    want = ref(x, mask=MASK)
    assert str(got[0].dtype) == policy.split("_")[1]
    assert_close(
        [np.asarray(g, "float32") for g in got],
        [np.asarray(w, "float32") for w in want],
        atol=atol,
        rtol=atol,
    )
    want_grads = loss_and_grads(ref, x, mask=MASK)[1]
    for g, w in zip(got_grads, want_grads):
        scale = max(1.0, float(np.max(np.abs(w))))
        np.testing.assert_allclose(g, w, atol=atol * scale * 2, rtol=0)


_X64 = """
import jax, jax.numpy as jnp, numpy as np, keras
from maskedrnn import MaskedRNN, backends
from tests.helpers import edge_mask
mask = edge_mask()
x = np.random.default_rng(0).standard_normal((6, 7, 3))
sig = lambda v: 1 / (1 + jnp.exp(-v))

def reference(kind, weights, x):
    # Keras' equations, a plain loop holding the state at masked steps.
    k, r, b = weights
    h = jnp.zeros((6, 4)); c = h; ys = []
    for t in range(7):
        xt, m = x[:, t], mask[:, t, None]
        if kind == "LSTM":
            i, f, g, o = jnp.split(xt @ k + h @ r + b, 4, axis=-1)
            cn = sig(f) * c + sig(i) * jnp.tanh(g)
            hn = sig(o) * jnp.tanh(cn)
            c = jnp.where(m, cn, c)
        elif kind == "GRU":
            xz = jnp.split(xt @ k + b[0], 3, axis=-1)
            hz = jnp.split(h @ r + b[1], 3, axis=-1)
            z, rr = sig(xz[0] + hz[0]), sig(xz[1] + hz[1])
            hn = z * h + (1 - z) * jnp.tanh(xz[2] + rr * hz[2])
        else:
            hn = jnp.tanh(xt @ k + b + h @ r)
        h = jnp.where(m, hn, h)
        ys.append(jnp.where(m, h, 0))
    return [jnp.stack(ys, 1), h] + ([c] if kind == "LSTM" else [])

def loss(outs):
    return sum(jnp.sum(jnp.sin(o) * (i + 1)) for i, o in enumerate(outs))

for kind in ("LSTM", "GRU", "SimpleRNN"):
    make = getattr(keras.layers, kind)
    ours = MaskedRNN(make(4, return_sequences=True, return_state=True,
                          dtype="float64", zero_output_for_mask=True),
                     dtype="float64")
    ours.build((None, None, 3))
    fixed = [v.value for v in ours.non_trainable_variables]
    def our_loss(w, x):
        out, _ = ours.stateless_call(w, fixed, x, mask=mask)
        return loss(out), out
    w = [v.value for v in ours.trainable_variables]
    with backends.force("jax-tiers"), backends.record() as plans:
        (lo, out), g = jax.value_and_grad(our_loss, (0, 1), has_aux=True)(w, x)
    assert plans[0].kernel() == "jax-tiers", plans[0].info()
    want = reference(kind, w, x)
    gw = jax.grad(lambda w, x: loss(reference(kind, w, x)), (0, 1))(w, x)
    for a, b in zip(list(out) + jax.tree.leaves(g), want + jax.tree.leaves(gw)):
        assert a.dtype == np.float64, a.dtype
        np.testing.assert_allclose(a, b, atol=1e-12, rtol=1e-10)
print("ok")
"""


@pytest.mark.slow
def test_float64_under_x64():
    """Under `jax_enable_x64` the tiers compute float64: outputs, states and
    gradients to float64 rounding of a plain float64 loop of Keras'
    equations (Keras' own float64 layers on JAX are float32-accurate only,
    so they are not the oracle here)."""
    out = run_python(["-c", _X64], "jax", JAX_ENABLE_X64="1")
    assert out.strip().endswith("ok")


def test_fit_step_matches_keras_masked_loop():
    """One `fit` step (Keras' JAX trainer, stateless) with the tiers moves
    the weights as the same model forced to Keras' masked loop does."""

    def model():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((7, D))
        lengths = keras.Input((), dtype="int32")
        y = MaskedBidirectional(keras.layers.GRU(U, return_sequences=True))(
            inputs, lengths=lengths
        )
        y = MaskedRNN(keras.layers.LSTM(U))(y, lengths=lengths)
        m = keras.Model([inputs, lengths], keras.layers.Dense(1)(y))
        m.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
        return m

    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 7, D)).astype("float32")
    lengths = MASK.sum(axis=1).astype("int32")
    target = rng.standard_normal((6, 1)).astype("float32")
    ours = model()
    with backends.record() as plans:
        ours.fit([x, lengths], target, epochs=2, batch_size=6, verbose=0)
    assert {d.kernel for p in plans for d in p.directions} == {"jax-tiers"}
    ref = model()
    with backends.force("keras-masked"):
        ref.fit([x, lengths], target, epochs=2, batch_size=6, verbose=0)
    assert_close(ours.get_weights(), ref.get_weights(), atol=1e-5)


def test_vmap_matches_each_call():
    """Under `jax.vmap` over a stack of batches, values and gradients equal
    those of each batch called alone in Keras' masked loop."""
    ours, _ = oracle_pair("lstm", U, D, wrapper="rnn", return_sequences=True)
    rng = np.random.default_rng(2)
    xs = rng.standard_normal((3, 5, 6, D)).astype("float32")
    lengths = rng.integers(0, 7, (3, 5)).astype("int32")
    weights = [v.value for v in ours.trainable_variables]
    fixed = [v.value for v in ours.non_trainable_variables]

    def loss(w, x, n):
        y, _ = ours.stateless_call(w, fixed, x, lengths=n)
        return jnp.sum(jnp.tanh(y) * 0.7)

    grad = jax.value_and_grad(loss)
    got = jax.vmap(grad, in_axes=(None, 0, 0))(weights, xs, lengths)
    with backends.force("keras-masked"):
        want = [grad(weights, xs[i], lengths[i]) for i in range(3)]
    for i in range(3):
        assert_close(
            jax.tree.leaves(jax.tree.map(lambda a: a[i], got)), jax.tree.leaves(want[i])
        )


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: keras.layers.LSTM(4, activation="relu"), "tanh"),
        (lambda: keras.layers.GRU(4, recurrent_activation="hard_sigmoid"), "sigmoid"),
        (lambda: keras.layers.SimpleRNN(4, activation="relu"), "tanh"),
        (lambda: keras.layers.GRU(4, recurrent_dropout=0.1), "recurrent_dropout"),
        (lambda: keras.layers.LSTM(4, unroll=True), "unroll=True"),
        (lambda: keras.layers.RNN(keras.layers.LSTMCell(4)), "not LSTM, GRU"),
        (lambda: keras.layers.LSTM(4, activity_regularizer="l2"), "activity_reg"),
    ],
)
def test_declined_layers_say_why(make, reason):
    """What the tiers do not compute exactly runs Keras' layer, and the
    plan's reason says why; forcing the kernel raises `Declined`."""
    layer = MaskedRNN(make())
    x = np.zeros((2, 3, D), "float32")
    layer(x, lengths=np.array([3, 1]))
    with backends.record() as plans:
        layer(x, lengths=np.array([3, 1]))
    assert plans[0].kernel() != "jax-tiers"
    options = dict(plans[0].directions[0].options)
    assert reason in str(options["jax-tiers"]) and options["jax-tiers"].blocking
    with pytest.raises(backends.Declined, match=reason):
        with backends.force("jax-tiers"):
            layer(x, lengths=np.array([3, 1]))


def test_symbolic_batch_declines_the_tiers_and_exports():
    """Under `jax.export`'s shape polymorphism (what Keras' exporter traces
    for a dynamic batch) the tiers' static row groups cannot be cut: the
    plan says so and runs Keras' layer, and the exported function matches
    Keras' masked layer on a batch of any size."""
    from jax import export

    ours, ref = oracle_pair("gru", U, D, return_sequences=True)
    lengths = np.array([5, 0, 2], "int32")
    x, valid, _ = _case(lengths)

    def f(x, lengths):
        return ours(x, lengths=lengths)

    b, t, d = export.symbolic_shape(f"b, {x.shape[1]}, {D}")
    spec_x = jax.ShapeDtypeStruct((b, t, d), x.dtype)
    spec_n = jax.ShapeDtypeStruct((b,), "int32")
    with backends.record() as plans:
        exported = export.export(jax.jit(f))(spec_x, spec_n)
    assert plans and all(p.kernel() != "jax-tiers" for p in plans)
    reason = dict(plans[0].directions[0].options)["jax-tiers"]
    assert reason.blocking and "symbolic" in str(reason)
    assert_close(exported.call(x, lengths), ref(x, mask=valid))
    assert_close(exported.call(x[:2], lengths[:2]), ref(x[:2], mask=valid[:2]))


def test_gpu_plan(monkeypatch):
    """On a CUDA GPU (its tests here made true) an LSTM runs cuDNN's
    one-call LSTM, a GRU Keras' unmasked layer (with its reason), a
    SimpleRNN the tiers; `use_cudnn=True` asks for Keras' cuDNN layer."""
    from maskedrnn.backends import jax as jax_backend
    from maskedrnn.backends import jax_fused

    monkeypatch.setattr(jax_fused, "cudnn_present", lambda: True)
    monkeypatch.setattr(jax_backend, "has_fused_rnn_kernel", lambda: True)
    for make, kernel in [
        (lambda: keras.layers.LSTM(U), "jax-fused"),
        (lambda: keras.layers.GRU(U), "keras-unmasked"),
        (lambda: keras.layers.SimpleRNN(U), "jax-tiers"),
        (lambda: keras.layers.GRU(U, use_cudnn=True), "keras-unmasked"),
    ]:
        layer = MaskedBidirectional(make())
        layer.build((None, None, D))
        plan = backends.plan(
            {"forward": layer.forward_layer, "backward": layer.backward_layer},
            None,
            False,
        )
        assert plan.kernel() == kernel, plan.info()
        inner = layer.forward_layer
        if type(inner) is keras.layers.GRU and inner.use_cudnn == "auto":
            reason = dict(plan.directions[0].options)["jax-tiers"]
            assert not reason.blocking and "faster than the tiers" in str(reason)


def test_row_groups_on_a_cpu_and_one_elsewhere(monkeypatch):
    """On a CPU `GROUPS` row groups, fewer where a group would have under
    `GROUP_ROWS` rows; on a GPU (made true here) one group, since a step's
    time there hardly depends on its rows; `kernel_info()` says which."""
    layer = _layer("gru")
    assert (jax_tiers.GROUPS, jax_tiers.GROUP_ROWS) == (4, 8)
    counts = {b: jax_tiers.default_groups(b) for b in (1, 7, 14, 16, 24, 32, 999)}
    assert counts == {1: 1, 7: 1, 14: 1, 16: 2, 24: 3, 32: 4, 999: 4}
    assert "up to 4 row groups of at least 8 rows" in jax_tiers.describe(layer)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert jax_tiers.default_groups(32) == 1
    assert "in 1 row group that" in jax_tiers.describe(layer)


@pytest.mark.parametrize("batch", [14, 32])
def test_a_call_runs_the_default_groups_of_its_batch(monkeypatch, batch):
    """Without `groups`, a call sorts its rows into `default_groups` of its
    static batch size."""
    made = []

    class Recorded(jax_tiers.SortedRows):
        def __init__(self, spans, groups, carry=()):
            super().__init__(spans, groups, carry)
            made.append(self.groups)

    monkeypatch.setattr(jax_tiers, "SortedRows", Recorded)
    layer = _layer("lstm")
    x = np.zeros((batch, 5, D), "float32")
    jax.make_jaxpr(
        lambda x: jax_tiers.run_in_place([layer], x, None, [None], "last")
    )(x)
    assert made == [jax_tiers.default_groups(batch)]


def test_no_host_sync_and_static_shapes():
    """The lengths may be traced (jit): the program has no callback and its
    output shapes do not depend on them."""
    layer = _layer("gru")
    x, _, _ = _case(LENGTHS)
    initial = [np.zeros((len(LENGTHS), U), "float32")]

    def f(x, n):
        return jax_tiers.run(layer, x, n, initial)

    text = jax.jit(f).lower(x, LENGTHS).as_text()
    assert "callback" not in text and "host" not in text
    y, (h,) = jax.jit(f)(x, LENGTHS)
    assert y.shape == (len(LENGTHS), x.shape[1], U) and h.shape == (len(LENGTHS), U)


@pytest.mark.parametrize("place", ["zeros", "last"])
def test_gradient_moves_rows_by_gathers(place):
    """Rows move into the tiers' order and back by gathers, and so do
    their gradients: the gradient w.r.t. the inputs and the initial states
    (through the outputs and the final states) holds no scatter, three more
    kernels for XLA to compile on every first call."""
    layer = _layer("lstm")
    x, valid, _ = _case(LENGTHS)
    rng = np.random.default_rng(5)
    initial = [rng.standard_normal((len(LENGTHS), U)).astype("float32")] * 2

    def loss(x, initial):
        y, [(h, c)] = jax_tiers.run_in_place(
            [layer], x, valid, [initial], place, groups=4
        )
        return jnp.sum(y) + jnp.sum(h * h) + jnp.sum(c)

    text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, initial))
    assert "gather" in text and "scatter" not in text


def test_simple_rnn_on_a_cpu_runs_keras_masked_loop():
    """A SimpleRNN on a JAX CPU runs Keras' masked loop (its step is too
    small for the tiers to gain there); the tiers stay forceable."""
    layer = MaskedRNN(keras.layers.SimpleRNN(U, return_sequences=True))
    layer.build((None, None, D))
    plan = backends.plan({"layer": layer.layer}, None, False)
    assert plan.kernel() == "keras-masked"
    reason = dict(plan.directions[0].options)["jax-tiers"]
    assert not reason.blocking and "SimpleRNN's step" in str(reason)
