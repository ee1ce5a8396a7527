"""Shared test helpers: backend-neutral gradients and a Keras-style layer test."""

import importlib.util
import os
import pathlib
import subprocess
import sys
import tempfile

import keras
import numpy as np
import pytest
from keras import ops

from maskedrnn import MaskedBidirectional, MaskedRNN

BACKEND = keras.backend.backend()


def gpu_here():
    """Whether the backend computes on a GPU here (Keras places tensors there)."""
    from maskedrnn.bench import gpu_available

    return gpu_available(BACKEND)


# cuDNN's float32 RNN kernels (TF32 off, tests/conftest.py) add up in another
# order than Keras' step loop and than each other: on a GPU float32 outputs
# agree to a few 1e-6 and gradients, sums over the batch and time, to a few
# 1e-5. Float32 comparisons of a cuDNN result allow that on a GPU
# (`GPU_FLOAT32_ATOL` for outputs, `GPU_GRAD_ATOL` for gradients); on a CPU
# and in float64 the tests' own tolerances hold.
GPU = gpu_here()
GPU_FLOAT32_ATOL = 5e-6 if GPU else 0.0
GPU_GRAD_ATOL = 1e-4 if GPU else 0.0


def to_np(x):
    if isinstance(x, (list, tuple)):
        return [to_np(t) for t in x]
    return np.asarray(ops.convert_to_numpy(x))


def flat(outputs):
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def lengths_to_mask(lengths, time):
    """The right-padded boolean `(batch, time)` mask of `lengths` (numpy)."""
    return np.arange(time)[None, :] < np.asarray(lengths)[:, None]


class AttachMask(keras.layers.Layer):
    """Returns its input with the `mask` it is called with attached, so that
    the layers and the loss after it see that mask (an oracle's explicit
    mask: Keras 3.16 no longer passes masks past its RNN layers)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs, mask=None):
        return inputs

    def compute_mask(self, inputs, mask=None):
        return mask


def assert_close(actual, expected, atol=1e-5, rtol=1e-5):
    """Every tensor of `actual` (a tensor or a list/tuple) equals the one of
    `expected` at the same position, to `atol` + `rtol`."""
    actual, expected = flat(actual), flat(expected)
    assert len(actual) == len(expected), (len(actual), len(expected))
    for i, (a, e) in enumerate(zip(actual, expected)):
        np.testing.assert_allclose(
            to_np(a), to_np(e), atol=atol, rtol=rtol, err_msg=f"output {i}"
        )


def make_rnn(kind, units, oracle=False, **kw):
    """A Keras RNN layer: `kind` is "lstm", "gru", "simple" (SimpleRNN) or
    "rnn_cell" (`keras.layers.RNN(LSTMCell)`, a layer with no fused kernel).
    `oracle=True` asks LSTM/GRU for Keras' generic masked loop
    (`use_cudnn=False`)."""
    if kind in ("lstm", "gru"):
        cls = getattr(keras.layers, kind.upper())
        return cls(units, use_cudnn=False if oracle else "auto", **kw)
    if kind == "simple":
        return keras.layers.SimpleRNN(units, **kw)
    if kind == "rnn_cell":
        return keras.layers.RNN(keras.layers.LSTMCell(units), **kw)
    raise ValueError(kind)


def oracle_pair(kind, units, features, wrapper="bidirectional", **kw):
    """(ours, Keras' masked oracle) around the same `kind` layer (see
    `make_rnn`), built on `(None, None, features)`, with the same weights.

    `wrapper="bidirectional"`: `MaskedBidirectional` and
    `keras.layers.Bidirectional`; `wrapper="rnn"`: `MaskedRNN` and the bare
    Keras layer. The oracle's layers use Keras' generic masked loop
    (`use_cudnn=False`). `kw` goes to the RNN layers (`merge_mode` to the
    bidirectional wrappers).
    """
    merge = {"merge_mode": kw.pop("merge_mode")} if "merge_mode" in kw else {}
    if wrapper == "bidirectional":
        ref = keras.layers.Bidirectional(
            make_rnn(kind, units, oracle=True, **kw), **merge
        )
        ours = MaskedBidirectional(make_rnn(kind, units, **kw), **merge)
    elif wrapper == "rnn":
        ref = make_rnn(kind, units, oracle=True, **kw)
        ours = MaskedRNN(make_rnn(kind, units, **kw))
    else:
        raise ValueError(wrapper)
    ref.build((None, None, features))
    ours.build((None, None, features))
    ours.set_weights(ref.get_weights())
    return ours, ref


def masked_pair(kind, units, features, **kw):
    """(MaskedBidirectional, Keras' masked Bidirectional oracle) around the same
    `kind` ("lstm" or "gru") layer, built on `(None, None, features)` with the
    same weights (`oracle_pair`). `return_sequences` and `return_state`
    default to True.
    """
    kw.setdefault("return_sequences", True)
    kw.setdefault("return_state", True)
    return oracle_pair(kind, units, features, **kw)


def loss_and_grads(layer, x, **call_kwargs):
    """A scalar loss (sum of squares of every output, weighted by a fixed
    random pattern) and its gradients w.r.t. `x` and the layer's trainable
    weights, on whichever backend runs."""
    rng = np.random.default_rng(123)

    def loss_of(outs):
        total = 0.0
        for i, o in enumerate(flat(outs)):
            w = rng.standard_normal(tuple(o.shape)).astype("float32")
            w = ops.convert_to_tensor(w)
            total = total + ops.sum(ops.cast(o, "float32") * w)
        return total

    if BACKEND == "tensorflow":
        import tensorflow as tf

        xt = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            loss = loss_of(layer(xt, **call_kwargs))
        grads = tape.gradient(loss, [xt] + layer.trainable_variables)
        return float(loss), [np.asarray(g) for g in grads]
    if BACKEND == "torch":
        import torch

        xt = torch.tensor(x, requires_grad=True)
        loss = loss_of(layer(xt, **call_kwargs))
        params = [v.value for v in layer.trainable_variables]
        grads = torch.autograd.grad(loss, [xt] + params)
        return float(loss.detach()), [g.detach().cpu().numpy() for g in grads]
    if BACKEND == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]

        def f(xv, tv):
            outs, _ = layer.stateless_call(tv, non_trainable, xv, **call_kwargs)
            return loss_of(outs)

        loss, (gx, gw) = jax.value_and_grad(f, argnums=(0, 1))(x, trainable)
        return float(loss), [np.asarray(gx)] + [np.asarray(g) for g in gw]
    raise NotImplementedError(BACKEND)


def run_layer_test(layer_fn, x, call_kwargs=None, expected_output_shape=None):
    """Keras-style smoke test of a layer, like keras' `run_layer_test`:

    1. `get_config` -> `from_config` round trip gives an equal config;
    2. a symbolic call with None batch and time gives the expected shape;
    3. a real call agrees with the symbolic shape, and with a copy made from
       the config and given the same weights;
    4. one training step in a Functional model runs and changes the weights.
    """
    call_kwargs = call_kwargs or {}
    layer = layer_fn()
    config = layer.get_config()
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config

    sym = keras.Input((None, x.shape[-1]))
    sym_out = flat(layer(sym))
    y = flat(layer(x, **call_kwargs))
    assert len(sym_out) == len(y)
    for s, v in zip(sym_out, y):
        assert len(s.shape) == len(v.shape)
        assert all(a is None or a == b for a, b in zip(s.shape, v.shape))
    if expected_output_shape is not None:
        assert tuple(y[0].shape) == tuple(expected_output_shape)

    clone = layer.__class__.from_config(layer.get_config())
    clone(x, **call_kwargs)
    clone.set_weights(layer.get_weights())
    for a, b in zip(y, flat(clone(x, **call_kwargs))):
        np.testing.assert_allclose(to_np(a), to_np(b), atol=1e-6)

    inp = keras.Input((None, x.shape[-1]))
    out = flat(layer_fn()(inp))[0]
    out = keras.layers.Dense(1)(out)
    model = keras.Model(inp, out)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [w.copy() for w in model.get_weights()]
    target = np.ones(tuple(x.shape[:-1]) + (1,), "float32")
    if len(out.shape) == 2:
        target = np.ones((x.shape[0], 1), "float32")
    model.fit(x, target, epochs=1, verbose=0, batch_size=len(x))
    after = model.get_weights()
    assert any(not np.allclose(a, b) for a, b in zip(before, after))
    return layer


def spy_masks(inner_layers):
    """Records the `mask` argument of every call of each Keras layer in
    `inner_layers` (the inner RNNs of a masked wrapper); returns the list."""
    seen = []
    for inner in inner_layers:
        original = inner.call

        def spy(*args, _original=original, **kwargs):
            seen.append(kwargs.get("mask"))
            return _original(*args, **kwargs)

        inner.call = spy
    return seen


def spy_native_kernels(monkeypatch):
    """Records the inner layer of every call of PyTorch's native kernels
    (`maskedrnn.backends.torch.run_native`, over valid-first data, and
    `run_direction`, a whole direction from the caller's order); returns the
    list (torch backend only)."""
    from maskedrnn.backends import torch as torch_backend

    calls = []
    for name in ("run_native", "run_direction"):
        original = getattr(torch_backend, name)

        def spy(kernel, inner, *args, _original=original, **kwargs):
            calls.append(inner)
            return _original(kernel, inner, *args, **kwargs)

        monkeypatch.setattr(torch_backend, name, spy)
    return calls


def record_calls(monkeypatch, module, name, position=0, calls=None):
    """Replaces `module.name` by a function that records its positional
    argument `position` (a list or tuple recorded as a list) and calls the
    original; returns the list of what it recorded, in call order (`calls`,
    when given, is that list)."""
    calls = [] if calls is None else calls
    original = getattr(module, name)

    def spy(*args, **kwargs):
        seen = args[position]
        calls.append(list(seen) if isinstance(seen, (list, tuple)) else seen)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


def fresh_graphs(monkeypatch, module, names):
    """New copies of `module`'s module-level `tf.function`s `names`, with
    all of their options, put in their place: no trace made by another test
    is reused. Returns `{name: copy}`, whose tracing counts start at 0."""
    copies = {}
    for name in names:
        copies[name] = getattr(module, name)._clone(None)
        monkeypatch.setattr(module, name, copies[name])
    return copies


def sin_loss_step(layer, x, mask):
    """`layer`'s outputs on `x` with `mask`, and the gradients of the sum of
    `o * sin(o)` over every output `o` w.r.t. `x` and the layer's trainable
    weights: a training step to run eagerly or trace in a `tf.function`.
    TensorFlow only."""
    import tensorflow as tf

    with tf.GradientTape() as tape:
        tape.watch(x)
        outs = layer(x, mask=mask)
        loss = sum(tf.reduce_sum(o * tf.sin(o)) for o in outs)
    return outs, tape.gradient(loss, [x] + layer.trainable_variables)


def traced_sin_loss_step(layer, batch, features, jit_compile=None):
    """`sin_loss_step` of `layer` in one `tf.function` over inputs of
    `batch` rows (None: unknown to the trace), any number of steps and
    `features` features, and their bool mask. TensorFlow only."""
    import tensorflow as tf

    @tf.function(
        jit_compile=jit_compile,
        input_signature=[
            tf.TensorSpec((batch, None, features)),
            tf.TensorSpec((batch, None), tf.bool),
        ],
    )
    def step(x, mask):
        return sin_loss_step(layer, x, mask)

    return step


def tf_outputs_and_grads(layer, x, initial_state=None, **call_kwargs):
    """`layer`'s outputs on `x`, and the gradients of a fixed random
    weighting of all of them (in float64) w.r.t. `x`, the initial states and
    every trainable weight. TensorFlow only."""
    import tensorflow as tf

    rng = np.random.default_rng(11)
    x = tf.constant(x)
    init = None if initial_state is None else [tf.constant(s) for s in initial_state]
    with tf.GradientTape() as tape:
        tape.watch(x)
        if init is not None:
            tape.watch(init)
        outs = layer(x, initial_state=init, **call_kwargs)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        loss = 0.0
        for o in outs:
            weight = rng.standard_normal(tuple(o.shape))
            loss += tf.reduce_sum(tf.cast(o, "float64") * weight)
    sources = [x] + (init or []) + list(layer.trainable_variables)
    grads = tape.gradient(loss, sources)
    return to_np(outs), [to_np(g) for g in grads]


def assert_tf_matches(ours, ref, x, atol=1e-5, grad_rtol=1e-4, ref_x=None, **kw):
    """Asserts `ours` on `x` and its oracle `ref` on `ref_x` (None: `x`),
    both called with `kw`, agree: outputs of the same dtype, and finite
    gradients of the same weighted loss (`tf_outputs_and_grads`).
    TensorFlow only."""
    got, got_grads = tf_outputs_and_grads(ours, x, **kw)
    want, want_grads = tf_outputs_and_grads(ref, x if ref_x is None else ref_x, **kw)
    assert len(got) == len(want) and len(got_grads) == len(want_grads)
    for i, (a, e) in enumerate(zip(got, want)):
        assert a.dtype == e.dtype, f"output {i}"
        np.testing.assert_allclose(a, e, atol=atol, rtol=1e-5, err_msg=f"output {i}")
    for i, (a, e) in enumerate(zip(got_grads, want_grads)):
        assert a is not None and np.all(np.isfinite(a)), f"gradient {i}"
        np.testing.assert_allclose(
            a, e, atol=10 * atol, rtol=grad_rtol, err_msg=f"gradient {i}"
        )


def check_stacked_bidirectional(kind, batch, time, features, units):
    """Two stacked `MaskedBidirectional(kind)` layers of `units[0]` and
    `units[1]` units, run in one `tf.function` with a fixed weighting of
    their outputs as loss, against Keras' masked `Bidirectional` pair of
    the same weights (`oracle_pair`) run eagerly, on `tier_mask` rows:
    asserts the outputs and the gradients w.r.t. the inputs and every weight
    agree. TensorFlow only. Returns the plans ours made."""
    import tensorflow as tf

    from maskedrnn import backends

    widths = [features, 2 * units[0]]
    pairs = [
        oracle_pair(kind, u, w, return_sequences=True) for u, w in zip(units, widths)
    ]
    x = np.random.default_rng(2).standard_normal((batch, time, features))
    x = tf.constant(x.astype("float32"))
    mask = tf.constant(tier_mask(batch, time, seed=3))
    weight = tf.constant(
        np.random.default_rng(4).standard_normal((batch, time, 2 * units[1])),
        "float32",
    )

    def step(layers):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layers[1](layers[0](x, mask=mask), mask=mask)
            loss = tf.reduce_sum(y * weight)
        variables = [v for layer in layers for v in layer.trainable_variables]
        return y, tape.gradient(loss, [x] + variables)

    with backends.record() as plans:
        got, got_grads = tf.function(step)([ours for ours, _ in pairs])
    want, want_grads = step([ref for _, ref in pairs])
    for i, (a, e) in enumerate(zip([got] + got_grads, [want] + want_grads)):
        np.testing.assert_allclose(
            to_np(a), to_np(e), atol=1e-4, rtol=1e-4, err_msg=f"tensor {i}"
        )
    return plans


def tier_mask(batch, time, seed):
    """Every padding pattern over `batch` rows, for the length tiers' tests:
    random lengths, full and empty rows, pre-padding and holes."""
    rng = np.random.default_rng(seed)
    m = np.arange(time)[None] < rng.integers(0, time + 1, batch)[:, None]
    m[0] = True  # full
    m[1] = False  # empty
    m[2] = m[2][::-1]  # pre-padded
    m[3, ::2] = False  # holes
    return m


def check_declined_contexts(ours, ref, kernel, x, mask):
    """A TensorFlow kernel that declines two contexts: traced for XLA
    (`jit_compile=True`), forcing `kernel` raises `Declined` naming XLA; inside
    `maskedrnn.backends.portable()` the default plan runs Keras' layers, not
    `kernel` (forcing it raises `Declined` naming `portable()`), and `ours`
    gives `ref`'s outputs (Keras' masked layer, same weights)."""
    import tensorflow as tf

    from maskedrnn import backends

    @tf.function(jit_compile=True)
    def call(x):
        return ours(x, mask=mask)

    # tf.function re-raises the `Declined` of its tracing as a StagingError.
    with backends.force(kernel):
        with pytest.raises(Exception, match=f"'{kernel}' cannot run here.*XLA"):
            call(tf.constant(x))
    with backends.portable():
        assert backends.portable_only()
        with backends.record() as plans:
            got = ours(x, mask=mask)
        assert kernel not in {d.kernel for p in plans for d in p.directions}
        with backends.force(kernel):
            with pytest.raises(backends.Declined, match="portable"):
                ours(x, mask=mask)
    assert not backends.portable_only()
    for a, e in zip(got, ref(x, mask=mask)):
        np.testing.assert_allclose(to_np(a), to_np(e), atol=1e-5)


def spy_fused_kernels(monkeypatch):
    """Records the list of inner layers of every one-call kernel call
    (torch: `maskedrnn.backends.torch_fused.run`, every direction of a call
    in one `torch._VF` call; JAX: `maskedrnn.backends.jax.run_one_call` and
    `run_one_call_in_place`, one `jax_fused.lstm` call or one tiered
    recurrence); returns the list of those lists (torch and JAX only)."""
    if BACKEND == "jax":
        from maskedrnn.backends import jax as jax_backend

        calls = record_calls(monkeypatch, jax_backend, "run_one_call", position=1)
        name = "run_one_call_in_place"
        return record_calls(monkeypatch, jax_backend, name, position=1, calls=calls)
    from maskedrnn.backends import torch_fused

    return record_calls(monkeypatch, torch_fused, "run")


def save_and_load(model):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.keras")
        model.save(path)
        return keras.models.load_model(path)


ROOT = pathlib.Path(__file__).resolve().parents[1]


def script(name):
    """The module of `scripts/<name>.py` (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The JAX compilation cache of a test process (tests/conftest.py), as the
# environment names its settings; None stands for the directory.
JAX_CACHE_SETTINGS = {
    "JAX_COMPILATION_CACHE_DIR": None,
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": 0,
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": 0,
}


def jax_cache_env():
    """The environment that hands this test process's JAX compilation
    cache to a child process the test waits for (never to two at once:
    JAX writes its entries without a lock), so that the child's programs
    that the tests compiled already are not compiled again. Empty where
    there is no such cache (other backends, or a cache of the user's)."""
    if BACKEND != "jax" or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return {}
    import jax

    path = jax.config.jax_compilation_cache_dir
    if not path:
        return {}
    return {
        name: path if value is None else str(value)
        for name, value in JAX_CACHE_SETTINGS.items()
    }


def run_python(argv, backend, **env):
    """Runs `python *argv` with `KERAS_BACKEND=backend` on the CPU, from the
    project root (each Keras backend needs a process of its own), plus any
    `env` variables; fails the test with its stderr if it exits non-zero.
    Returns its stdout."""
    full_env = dict(
        os.environ,
        KERAS_BACKEND=backend,
        JAX_PLATFORMS="cpu",
        CUDA_VISIBLE_DEVICES="",
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    if backend == BACKEND:
        full_env.update(jax_cache_env())
    full_env.update(env)
    result = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def run_module_on_backend(module, argument, backend):
    """`python -m module argument` under `backend` (see `run_python`)."""
    run_python(["-m", module, str(argument)], backend)


class JaxCompiles:
    """Counts XLA compilations (JAX's backend-compile events) inside a
    `with` block: `with JaxCompiles() as c: ...; c.count`."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __enter__(self):
        import jax.monitoring

        self.count = 0

        def listener(event, duration, **kwargs):
            if event == self.EVENT:
                self.count += 1

        self._listener = listener
        jax.monitoring.register_event_duration_secs_listener(listener)
        return self

    def __exit__(self, *exc):
        import jax.monitoring

        jax.monitoring.unregister_event_duration_listener(self._listener)
        return False


def edge_mask():
    """A 6 x 7 mask holding every padding pattern a masked layer must get
    right, one per row.

    Row 0 is right-padded (4 steps), row 1 left-padded (4 steps, the
    `keras.utils.pad_sequences` default), row 2 has holes, row 3 is all
    padding, row 4 is full and row 5 has one step.

    Returns:
        bool numpy array of shape `(6, 7)`.
    """
    mask = np.ones((6, 7), bool)
    mask[0, 4:] = False
    mask[1, :3] = False
    mask[2, [1, 3, 4]] = False
    mask[3, :] = False
    mask[5, 1:] = False
    return mask
