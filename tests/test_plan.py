"""`maskedrnn.backends`: one plan per call, forced plans, and the layout.

- The plan a call runs is the one `kernel_info()` and `uses_fast_path`
  report: spies on the code each kernel calls (the inner Keras layer and the
  mask it gets, PyTorch's kernels) agree with the sentence, for the default
  plan and for every forced kernel.
- `force(kernel)` runs that kernel, and a kernel the backend cannot run for a layer
  here raises `Declined` with the reason; forcing outside `KERNELS` is an
  error.
- Reason sentences are built only when asked for (`kernel_info()`): a call
  builds none.
- The package layout: no module outside `maskedrnn/backends/` asks for the
  backend's name or imports a backend framework (with the exceptions below,
  each a framework API used on purpose). Oracle: the source of every
  module, read with `ast`. (The 600-line limit: tests/test_results.py.)
"""

import ast
import pathlib

import keras
import numpy as np
import pytest

import maskedrnn
from maskedrnn import MaskedBidirectional, MaskedRNN, backends
from tests.helpers import (
    BACKEND,
    assert_close,
    loss_and_grads,
    oracle_pair,
    record_calls,
    spy_masks,
)

B, T, D, U = 4, 5, 3, 4
PACKAGE = pathlib.Path(maskedrnn.__file__).resolve().parent


def _inputs():
    x = np.random.default_rng(0).standard_normal((B, T, D)).astype("float32")
    mask = np.ones((B, T), bool)
    mask[0, 3:] = False
    mask[1, :2] = False
    mask[2] = False
    return x, mask


def _inners(layer):
    """The inner RNNs of ours or of Keras' `Bidirectional`; a Keras RNN
    itself."""
    if isinstance(layer, MaskedRNN):
        return [layer.layer]
    if isinstance(layer, (MaskedBidirectional, keras.layers.Bidirectional)):
        return [layer.forward_layer, layer.backward_layer]
    return [layer]


def _spy_native(monkeypatch):
    """Inner layers handed to PyTorch's kernels (torch only)."""
    if BACKEND != "torch":
        return []
    from tests.helpers import spy_native_kernels

    return spy_native_kernels(monkeypatch)


def _spy_fused(monkeypatch):
    """Lists of inner layers handed to a one-call kernel (torch, JAX)."""
    if BACKEND not in ("torch", "jax"):
        return []
    from tests.helpers import spy_fused_kernels

    return spy_fused_kernels(monkeypatch)


def _spy_block_lstm(monkeypatch):
    """Inner layers run by TensorFlow's `BlockLSTMV2` (tensorflow only)."""
    if BACKEND != "tensorflow":
        return []
    from maskedrnn.backends import tensorflow_block_lstm

    return record_calls(monkeypatch, tensorflow_block_lstm, "run")


def _spy_tiers(monkeypatch):
    """Inner layers run in TensorFlow's GRU / SimpleRNN length tiers
    (tensorflow only)."""
    if BACKEND != "tensorflow":
        return []
    from maskedrnn.backends import tensorflow_cells

    return record_calls(monkeypatch, tensorflow_cells, "run")


@pytest.mark.parametrize("wrapper", ["rnn", "bidirectional"])
@pytest.mark.parametrize("kind", ["lstm", "gru", "simple", "rnn_cell"])
@pytest.mark.parametrize("return_state", [False, True])
def test_kernel_info_says_what_ran(
    wrapper, kind, return_state, grad_mode, kernel, monkeypatch
):
    """Whatever the plan (the default one, or a forced kernel), the sentence of
    each direction names the code that the spies see run, the layer matches
    Keras' masked layer, and `uses_fast_path` says whether a mask reached
    an inner layer."""
    ours, ref = oracle_pair(
        kind, U, D, wrapper=wrapper, return_sequences=True, return_state=return_state
    )
    seen = spy_masks(_inners(ours))
    native = _spy_native(monkeypatch)
    fused = _spy_fused(monkeypatch)
    block = _spy_block_lstm(monkeypatch)
    tiers = _spy_tiers(monkeypatch)
    x, mask = _inputs()
    assert_close(ours(x, mask=mask), ref(x, mask=mask))
    info = ours.kernel_info()
    sentences = list(info.values())
    assert len(sentences) == len(_inners(ours))
    if all("PyTorch's native" in s for s in sentences):
        assert seen == [] and native == _inners(ours) and fused == []
        assert ours.uses_fast_path
    elif all(
        "PyTorch's fused" in s or "one jax.experimental.rnn.lstm call" in s
        for s in sentences
    ):
        # Every direction in one kernel call.
        assert seen == [] and native == [] and fused == [_inners(ours)]
        assert ours.uses_fast_path
    elif all("jax.custom_vjp" in s for s in sentences):
        # JAX's length tiers: every direction in one tiered recurrence.
        assert seen == [] and native == [] and fused == [_inners(ours)]
        assert ours.uses_fast_path
    elif all("TensorFlow's fused LSTM kernel" in s for s in sentences):
        assert seen == [] and native == [] and block == _inners(ours)
        assert ours.uses_fast_path
    elif all("equations in length tiers" in s for s in sentences):
        assert seen == [] and native == [] and tiers == _inners(ours)
        assert block == [] and ours.uses_fast_path
    elif all("masked step loop" in s for s in sentences):
        assert native == [] and fused == [] and block == [] and tiers == []
        assert len(seen) == len(sentences)
        assert all(m is not None for m in seen)
        assert not ours.uses_fast_path
    else:
        assert all("unmasked" in s for s in sentences), sentences
        assert native == [] and fused == [] and block == [] and tiers == []
        assert seen == [None] * len(sentences)
        assert ours.uses_fast_path
    if kernel != "default":
        forced = f"forced by maskedrnn.backends.force('{kernel}')"
        assert all(s.startswith(forced) for s in sentences)


def test_force_rejects_unknown_kernels_and_declines_with_the_reason():
    with pytest.raises(ValueError, match="kernel must be one of"):
        with backends.force("cudnn"):
            pass
    layer = MaskedRNN(keras.layers.RNN(keras.layers.GRUCell(U)))
    x, mask = _inputs()
    with backends.force("keras-unmasked"):
        with pytest.raises(backends.Declined, match="not LSTM, GRU or SimpleRNN"):
            layer(x, mask=mask)
    if BACKEND != "torch":
        with backends.force("torch-unpacked"):
            with pytest.raises(backends.Declined, match="has no 'torch-unpacked'"):
                MaskedRNN(keras.layers.GRU(U))(x, mask=mask)
    # Outside the block the default plan runs again.
    layer(x, mask=mask)
    assert backends.forced() is None


def test_former_names_warn_and_still_work():
    """The spellings before 0.3.0 (`WAYS`, `FUSED_WAYS`, `ROUTES`,
    `force(way=...)`, `Plan.way()`, `Plan.route`, `Direction.way`) answer as
    the new names do, each with a DeprecationWarning."""
    with pytest.warns(DeprecationWarning, match="use KERNELS"):
        assert backends.WAYS == backends.KERNELS
    with pytest.warns(DeprecationWarning, match="use ONE_CALL_KERNELS"):
        assert backends.FUSED_WAYS == backends.current().ONE_CALL_KERNELS
    with pytest.warns(DeprecationWarning, match="use STRATEGIES"):
        assert backends.ROUTES == ("torch", "masked_loop", "fused", "valid_first")
    with pytest.raises(AttributeError):
        backends.NO_SUCH_NAME  # noqa: B018
    layer = MaskedBidirectional(keras.layers.GRU(U, return_sequences=True))
    x, mask = _inputs()
    with pytest.warns(DeprecationWarning, match="force"):
        with backends.force(way="keras-masked"):
            with backends.record() as plans:
                layer(x, mask=mask)
    (made,) = plans
    assert made.kernel(1) == "keras-masked" and made.strategy == "masked_loop"
    with pytest.warns(DeprecationWarning, match="Plan.way"):
        assert made.way(1) == "keras-masked"
    with pytest.warns(DeprecationWarning, match="Direction.way"):
        assert made.directions[0].way == "keras-masked"
    with pytest.warns(DeprecationWarning, match="Plan.route"):
        assert made.route == "masked_loop"
    former = {"caller_order": "torch", "one_call": "fused"}
    with backends.record() as plans:
        layer(x, mask=mask)
    with pytest.warns(DeprecationWarning):
        assert plans[0].route == former.get(plans[0].strategy, plans[0].strategy)


def test_bench_former_way_option_is_kernel(capsys):
    from maskedrnn import bench

    args = bench.build_parser().parse_args(["--way", "keras-masked"])
    assert args.kernels == ["keras-masked"]
    assert "--way is deprecated; use --kernel" in capsys.readouterr().err


@pytest.mark.skipif(
    BACKEND not in ("torch", "jax"), reason="the one-call kernels: torch and JAX"
)
def test_unroll_declines_the_one_call_kernel_on_every_backend_with_it():
    """One rule where a backend has a one-call kernel: `unroll=True` asks for
    Keras' unrolled loop, so that kernel is declined (forcing it raises
    `Declined` saying so) and `kernel_info()` names the reason; the layer
    runs Keras' unmasked layer, equal to Keras' masked one (rolled: Keras'
    unrolled loop with a mask fails on some backends)."""
    _, ref = oracle_pair("lstm", U, D, return_sequences=True)
    ours = MaskedBidirectional(keras.layers.LSTM(U, return_sequences=True, unroll=True))
    ours.build((None, None, D))
    ours.set_weights(ref.get_weights())
    x, mask = _inputs()
    kernels = backends.current().ONE_CALL_KERNELS
    assert kernels
    for kernel in kernels:
        with backends.force(kernel):
            with pytest.raises(backends.Declined, match="unroll=True asks for Keras"):
                ours(x, mask=mask)
        options = backends.plan({"forward": ours.forward_layer}, None, False)
        reason = dict(options.directions[0].options)[kernel]
        assert reason.blocking and "unroll=True" in str(reason)
    with backends.record() as plans:
        got = ours(x, mask=mask)
    assert not {d.kernel for d in plans[0].directions} & set(kernels)
    assert_close(got, ref(x, mask=mask))


def test_a_call_builds_no_reason_sentence(monkeypatch):
    """Sentences are built only for `kernel_info()`: a call that passes
    over kernels (a generic cell declines the unmasked ones) builds none."""
    built = []
    original = backends.Reason.__str__
    monkeypatch.setattr(
        backends.Reason, "__str__", lambda self: built.append(1) or original(self)
    )
    layer = MaskedBidirectional(keras.layers.RNN(keras.layers.LSTMCell(U)))
    x, mask = _inputs()
    layer(x, mask=mask)
    layer(x, lengths=mask.sum(1))
    assert built == []
    assert "not LSTM, GRU or SimpleRNN" in layer.kernel_info()["forward"]
    assert built


def test_every_backend_module_answers_the_same_questions():
    """As Keras' `backend/<name>/rnn.py`: the same functions in each module
    (imported here by name only: a module imports its framework)."""
    names = {
        "options",
        "describe",
        "run",
        "layout",
        "run_direction",
        "is_concrete",
        "invert_permutation",
        "gather_time",
        "gather_or_zero",
        "has_fused_rnn_kernel",
        "IN_PLACE_KERNELS",
        "run_one_call_in_place",
    }
    for backend in ("tensorflow", "jax", "torch"):
        tree = ast.parse((PACKAGE / "backends" / f"{backend}.py").read_text())
        defined = set()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                defined.add(node.name)
            elif isinstance(node, ast.Assign):
                defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.ImportFrom):  # shared with one of its kernels
                defined.update(alias.asname or alias.name for alias in node.names)
        assert names <= defined, (backend, names - defined)
    assert set(backends.current().KERNELS) <= set(backends.KERNELS)
    assert backends.current().KERNELS[-1] == "keras-masked"


def test_gather_or_zero_reads_only_what_it_keeps():
    """`backends.current().gather_or_zero`, the reordering of every plan:
    `y[b, index[b, t]]` where `keep`, zeros elsewhere (numpy oracle), with
    NaN and inf in `y` and an index of -1 or `time` where not kept (as
    ranks before a row's first step are): nothing of that reaches the
    result or the gradient of `y` (which is the oracle's scatter of the
    output gradient)."""
    from keras import ops

    rng = np.random.default_rng(3)
    y = rng.standard_normal((3, 4, 2)).astype("float32")
    index = np.array([[2, 0, -1, 3], [1, 1, 3, 0], [3, 2, 4, 0]], "int32")
    keep = np.array([[1, 1, 0, 1], [1, 1, 0, 0], [1, 1, 0, 1]], bool)
    bad = y.copy()
    bad[1, 3] = np.nan  # pointed at where not kept only
    bad[1, 0] = np.inf  # the same
    read = np.take_along_axis(y, np.clip(index, 0, 3)[..., None], 1)
    want = np.where(keep[..., None], read, 0)
    index_t, keep_t = ops.convert_to_tensor(index), ops.convert_to_tensor(keep)
    got = backends.current().gather_or_zero(ops.convert_to_tensor(bad), index_t, keep_t)
    np.testing.assert_array_equal(ops.convert_to_numpy(got), want)
    # Gradient of sum(w * out) w.r.t. y: w scattered back to the kept reads.
    w = rng.standard_normal(want.shape).astype("float32")
    expected = np.zeros_like(y)
    for b_, t_ in zip(*np.nonzero(keep)):
        expected[b_, index[b_, t_]] += w[b_, t_]
    grad = _grad_of_weighted_sum(
        lambda t: backends.current().gather_or_zero(t, index_t, keep_t), bad, w
    )
    np.testing.assert_allclose(grad, expected, rtol=0, atol=1e-6)


def _grad_of_weighted_sum(fn, x, w):
    """d sum(w * fn(x)) / dx, on the backend."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        xt = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            total = tf.reduce_sum(w * fn(xt))
        return tape.gradient(total, xt).numpy()
    if BACKEND == "jax":
        import jax

        return np.asarray(jax.grad(lambda t: (w * fn(t)).sum())(x))
    import torch

    xt = torch.tensor(x, requires_grad=True)
    (torch.as_tensor(w) * fn(xt)).sum().backward()
    return xt.grad.numpy()


# ------------------------------------------------------------------ layout

FRAMEWORKS = ("tensorflow", "jax", "jaxlib", "torch")

# Framework APIs used on purpose outside backends/: the benchmark harness
# times each framework's own modules and profilers; LiteRT conversion is
# TensorFlow's (export.py), and `to_tf_dataset` builds a tf.data pipeline
# (bucketing.py).
ALLOWED_IMPORTS = {
    "export.py": {"tensorflow"},
    "bucketing.py": {"tensorflow"},
    # Loads TensorFlow with stderr silenced, for the demo command only.
    "_quiet_demo.py": {"tensorflow"},
}


def _modules():
    return sorted(PACKAGE.rglob("*.py"))


def _framework_imports(tree):
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        found.update(n.split(".")[0] for n in names if n.split(".")[0] in FRAMEWORKS)
    return found


def _asks_backend_name(tree):
    """Line numbers of `keras.backend.backend()` calls."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) == "keras.backend.backend"
    ]


def test_only_backends_ask_for_the_backend_or_import_its_framework():
    offenders = {}
    for path in _modules():
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("backends/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        asks = _asks_backend_name(tree)
        imports = _framework_imports(tree)
        if not relative.startswith("bench/"):
            imports -= ALLOWED_IMPORTS.get(relative, set())
        else:
            imports = set()
        if asks or imports:
            offenders[relative] = (asks, sorted(imports))
    assert offenders == {}, (
        "ask maskedrnn.backends (backends.current(), backends.name()) instead"
    )


def test_the_finders_see_what_they_look_for():
    tree = ast.parse(
        "import keras\nimport torch.nn\nfrom jax import numpy\n"
        "def f():\n    import tensorflow as tf\n    return keras.backend.backend()\n"
    )
    assert _framework_imports(tree) == {"torch", "jax", "tensorflow"}
    assert _asks_backend_name(tree) == [6]


def test_plan_of_a_forced_kernel_is_what_kernel_info_reports():
    layer = MaskedRNN(keras.layers.GRU(U, return_sequences=True))
    layer.build((None, None, D))
    with backends.force("keras-masked"):
        info = layer.kernel_info()["layer"]
        assert not layer.uses_fast_path
    assert "masked step loop" in info and "forced" in info


def test_record_collects_the_plan_each_call_ran(kernel):
    """`record()` holds one plan per call, in order, nested blocks each
    their own; each plan is the one that ran: Keras' masked loop (the
    `"keras-masked"` kernel of every direction) exactly when the inner layers
    were handed a mask (spied; PyTorch's kernels and the GRU's length tiers
    call no Keras layer), and its
    sentences those of `kernel_info()`. Calls outside are not recorded."""
    layer = MaskedBidirectional(keras.layers.GRU(U, return_sequences=True))
    seen = spy_masks(_inners(layer))
    x, mask = _inputs()
    handed = []
    with backends.record() as outer:
        layer(x, mask=mask)
        handed.append([m is not None for m in seen])
        seen.clear()
        with backends.record() as inner:
            layer(x, lengths=mask.sum(1))
        handed.append([m is not None for m in seen])
    layer(x, mask=mask)
    assert len(outer) == 2 and len(inner) == 1 and inner[0] is outer[1]
    for plan, masks in zip(outer, handed):
        kernels = [d.kernel for d in plan.directions]
        if all(
            w.startswith("torch") or w in ("tf-tiers", "jax-tiers") for w in kernels
        ):
            # No Keras layer called (PyTorch's kernels, the length tiers).
            assert masks in ([], [False] * len(kernels))
        else:
            assert masks == [w == "keras-masked" for w in kernels]
        assert (plan.strategy == "masked_loop") == all(
            w == "keras-masked" for w in kernels
        )
    assert outer[0].info() == layer.kernel_info()
    if kernel != "default":
        assert all(d.kernel == kernel for plan in outer for d in plan.directions)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_input_dropout_keeps_the_strategy_where_it_can(kind):
    """While training with input dropout, one direction keeps the strategy
    it has without (its inputs dropped before the kernel reads them), and
    so do two directions on a kernel of `IN_PLACE_KERNELS` (handed each
    direction's mask); other kernels that two directions would share (one
    call, or one read of the caller's order) run valid-first instead, each
    direction on its own dropped inputs. The outputs, and the gradients
    w.r.t. the inputs and every weight, equal Keras' own layers' under the
    same frozen dropout masks, another for each direction."""
    make = keras.layers.LSTM if kind == "lstm" else keras.layers.GRU
    rng = np.random.default_rng(2)
    fixed = [(rng.random((B, D)) > 0.5).astype("float32") * 2 for _ in range(2)]
    x, mask = _inputs()
    for layer in (
        MaskedRNN(make(U, return_sequences=True, dropout=0.5)),
        MaskedBidirectional(make(U, return_sequences=True, dropout=0.5)),
    ):
        with backends.record() as plans:
            layer(x, mask=mask, training=False)
            layer(x, mask=mask, training=True)
        inference, training = (p.strategy for p in plans)
        shared = inference in ("one_call", "caller_order")
        placed = plans[0].kernel(0) in backends.current().IN_PLACE_KERNELS
        if isinstance(layer, MaskedRNN) or placed or not shared:
            assert training == inference
        else:
            assert training == "valid_first"
        # Keras' own layer (its masked loop) with the same frozen masks.
        keras_layer = make(U, return_sequences=True, dropout=0.5, use_cudnn=False)
        if isinstance(layer, MaskedBidirectional):
            keras_layer = keras.layers.Bidirectional(keras_layer)
        keras_layer.build(x.shape)
        keras_layer.set_weights(layer.get_weights())
        pairs = zip(_inners(layer), _inners(keras_layer), fixed)
        for ours_inner, keras_inner, frozen in pairs:
            frozen = keras.ops.convert_to_tensor(frozen)
            for inner in (ours_inner, keras_inner):
                inner.cell.get_dropout_mask = lambda step_input, m=frozen: m
        assert_close(
            layer(x, mask=mask, training=True),
            keras_layer(x, mask=mask, training=True),
        )
        ours_loss, ours_grads = loss_and_grads(layer, x, mask=mask, training=True)
        keras_loss, keras_grads = loss_and_grads(
            keras_layer, x, mask=mask, training=True
        )
        np.testing.assert_allclose(ours_loss, keras_loss, rtol=1e-5)
        assert_close(ours_grads, keras_grads)



def test_a_plan_made_without_dropout_refuses_two_dropped_directions():
    """Two directions sharing one kernel call (or one read of the caller's
    order) cannot share one input under dropout: run with `training=True`,
    a plan made for `training=False` raises instead of dropping both
    directions' inputs by one mask."""
    from maskedrnn.layers import direction
    from maskedrnn.steps import Steps

    lstm = keras.layers.LSTM(U, return_sequences=True, dropout=0.5)
    layer = MaskedBidirectional(lstm)
    x, mask = _inputs()
    layer(x, mask=mask)
    x = keras.ops.convert_to_tensor(x)
    steps = Steps.from_call(x, keras.ops.convert_to_tensor(mask), None)
    plan = layer._plan(x, steps.masked, training=False)
    shared = plan.strategy in ("one_call", "caller_order")
    if not shared or plan.kernel(0) in backends.current().IN_PLACE_KERNELS:
        pytest.skip(f"{plan.strategy!r} with {plan.kernel(0)!r} shares no input")
    with pytest.raises(ValueError, match="make the plan with the call's `training`"):
        direction.run_plan(plan, x, steps, [None, None], True, False, "zeros")
