"""`maskedrnn.backends`: which kernel computes a direction, and why.

What is specified here is the choice; each runner's numbers are checked
against Keras' masked layer in tests/test_masked_rnn.py,
tests/test_masked_bidirectional.py, tests/test_torch_kernels.py and
tests/test_final_state.py (the unmasked path with recomputed states).

- An LSTM whose final states are wanted, on TensorFlow or JAX without a GPU
  (Keras has no fused LSTM kernel there), runs Keras' masked loop (on
  TensorFlow where its `BlockLSTMV2` does not run: checked here inside
  `maskedrnn.backends.portable()`; that op is tests/test_tf_block_lstm.py's):
  given
  `mask=`, on the caller's data with exactly the caller's mask (no
  reordering; the backward direction reads both flipped), given `lengths=`,
  on the right-padded data with the right-padded mask of the lengths; where
  Keras could run cuDNN (a GPU, faked here), it runs unmasked.
- Without `return_state`, and for GRU/SimpleRNN, nothing changes: no mask
  (on JAX with Keras' unmasked layer forced, `maskedrnn.backends.force`).
- On a JAX CPU an LSTM, GRU or SimpleRNN runs the length tiers
  (`"jax-tiers"`, tests/test_jax_tiers.py); what they decline runs Keras'
  masked loop as above (JAX has no fused kernel there), with states or
  without, unless the wrapped layer says `use_cudnn=True` or Keras sees a
  GPU (faked here). Keras' masked loop is forced to check it.
- On torch on CPU, PyTorch's kernel runs on the packed valid steps only.
"""

import contextlib

import keras
import numpy as np
import pytest

import maskedrnn
from maskedrnn import MaskedBidirectional, MaskedRNN, backends
from maskedrnn._keras_private import keras_backend_rnn
from tests.helpers import (
    BACKEND,
    assert_close,
    flat,
    lengths_to_mask,
    loss_and_grads,
    oracle_pair,
    spy_masks,
    to_np,
)

B, T, D, U = 5, 6, 3, 4
LENGTHS = np.array([6, 2, 0, 4, 1], "int32")

tf_or_jax = pytest.mark.skipif(
    BACKEND not in ("tensorflow", "jax"), reason="Keras' LSTM on TF or JAX"
)


def keras_has_gpu():
    return bool(
        keras_backend_rnn(BACKEND)._is_gpu_available()
    )


@pytest.fixture
def fake_gpu(monkeypatch):
    """Keras' backend believes it has a GPU (only the choice is asked)."""
    module = keras_backend_rnn(BACKEND)
    monkeypatch.setattr(module, "_is_gpu_available", lambda: True)


def left_padded_mask():
    return np.arange(T)[None, :] >= (T - LENGTHS)[:, None]


@tf_or_jax
@pytest.mark.parametrize("wrapper", ["rnn", "bidirectional"])
@pytest.mark.parametrize("how", ["mask", "lengths"])
def test_lstm_states_without_gpu_use_keras_masked_loop(wrapper, how):
    if keras_has_gpu():
        pytest.skip("a GPU is visible: the LSTM runs unmasked there")
    with backends.portable():
        _lstm_states_use_keras_masked_loop(wrapper, how)


def _lstm_states_use_keras_masked_loop(wrapper, how):
    # On JAX an LSTM the length tiers decline (another activation).
    kw = {"activation": "relu"} if BACKEND == "jax" else {}
    ours, ref = oracle_pair(
        "lstm", U, D, wrapper=wrapper, return_sequences=True, return_state=True,
        **kw,
    )
    inner = [ours.layer] if wrapper == "rnn" else [
        ours.forward_layer, ours.backward_layer
    ]
    seen = spy_masks(inner)
    x = np.random.default_rng(0).standard_normal((B, T, D)).astype("float32")
    if how == "mask":
        mask = left_padded_mask()
        assert_close(ours(x, mask=mask), ref(x, mask=mask))
        # The caller's mask as it is; the backward direction reads it flipped.
        expected = [mask, mask[:, ::-1]][: len(inner)]
    else:
        mask = lengths_to_mask(LENGTHS, T)
        assert_close(ours(x, lengths=LENGTHS), ref(x, mask=mask))
        # The mask of the lengths, read as any mask: the backward direction
        # reads it flipped (no per-row reversal).
        expected = [mask, mask[:, ::-1]][: len(inner)]
    assert len(seen) == len(inner)
    for m, want in zip(seen, expected):
        np.testing.assert_array_equal(to_np(m), want)
    for sentence in ours.kernel_info().values():
        assert "final [h, c] are wanted" in sentence
        assert "masked step loop" in sentence


@tf_or_jax
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_without_states_or_for_gru_no_mask_reaches_the_inner_layer(kind):
    for return_state in (False, True):
        if kind == "lstm" and return_state:
            continue  # the case above
        ours = MaskedRNN(
            keras.layers.LSTM(U, return_sequences=True, return_state=return_state)
            if kind == "lstm"
            else keras.layers.GRU(U, return_sequences=True, return_state=return_state)
        )
        ours.build((None, None, D))
        seen = spy_masks([ours.layer])
        x = np.random.default_rng(1).standard_normal((B, T, D)).astype("float32")
        # On a JAX CPU the length tiers run by default (no inner layer
        # called), and on a TensorFlow CPU an LSTM runs `BlockLSTMV2`, a GRU
        # the length tiers: the unmasked kernel is forced there.
        force = BACKEND in ("jax", "tensorflow")
        with backends.force("keras-unmasked" if force else None):
            ours(x, mask=left_padded_mask())
        assert seen == [None]


@tf_or_jax
def test_with_a_gpu_the_lstm_runs_unmasked_even_for_states(fake_gpu):
    for layer in (
        MaskedRNN(keras.layers.LSTM(U, return_state=True)),
        MaskedBidirectional(keras.layers.LSTM(U, return_state=True)),
    ):
        layer.build((None, None, D))
        for sentence in layer.kernel_info().values():
            assert "unmasked" in sentence and "masked step loop" not in sentence
        inner = layer.layer if isinstance(layer, MaskedRNN) else layer.forward_layer
        plan = backends.plan({"layer": inner}, inner.cell.kernel, want_states=True)
        assert plan.kernel() == "keras-unmasked"


@tf_or_jax
def test_use_cudnn_false_counts_as_no_fused_kernel(fake_gpu):
    layer = MaskedRNN(keras.layers.LSTM(U, return_state=True, use_cudnn=False))
    layer.build((None, None, D))
    plan = backends.plan({"layer": layer.layer}, layer.layer.cell.kernel, True)
    if BACKEND == "jax":
        # No cuDNN: the length tiers, which carry the exact states.
        assert plan.kernel() == "jax-tiers"
        return
    assert plan.kernel() == "keras-masked"
    assert "use_cudnn=False" in plan.info()["layer"]


# ------------------------------------------------------- JAX CPU: masked loop

jax_only = pytest.mark.skipif(BACKEND != "jax", reason="the JAX CPU rule: JAX only")


def holes_mask():
    """Valid steps anywhere, one all-padding row (row 2)."""
    rng = np.random.default_rng(7)
    mask = rng.random((B, T)) < 0.6
    mask[0] = True
    mask[2] = False
    return mask


@jax_only
@pytest.mark.parametrize("kind", ["lstm", "gru", "simple"])
@pytest.mark.parametrize("wrapper", ["rnn", "bidirectional"])
@pytest.mark.parametrize("how", ["left", "holes", "lengths"])
def test_jax_cpu_runs_keras_masked_loop_for_every_rnn(
    kind, wrapper, how, monkeypatch
):
    with backends.force("keras-masked"):
        _keras_masked_loop_on_jax_cpu(kind, wrapper, how, monkeypatch)


def _keras_masked_loop_on_jax_cpu(kind, wrapper, how, monkeypatch):
    """Keras' masked loop on a JAX CPU (what runs what the length tiers
    decline; forced here for every RNN): outputs, states and gradients
    (inputs and every weight) equal Keras'
    masked layer; the inner RNNs get exactly the caller's mask or, with
    `lengths=`, the right-padded mask of the lengths (flipped for the
    backward direction, as Keras' `Bidirectional` flips it), on the data as
    it is: no valid-first gather or per-row reversal (`ops.gather_time`
    never runs); `kernel_info` says why."""
    if keras_has_gpu():
        pytest.skip("a GPU is visible: the RNNs run unmasked there")
    ours, ref = oracle_pair(
        kind, U, D, wrapper=wrapper, return_sequences=True, return_state=True
    )
    inner = [ours.layer] if wrapper == "rnn" else [
        ours.forward_layer, ours.backward_layer
    ]
    seen = spy_masks(inner)
    x = np.random.default_rng(2).standard_normal((B, T, D)).astype("float32")
    if how == "lengths":
        mask = lengths_to_mask(LENGTHS, T)
        ours_kwargs = {"lengths": LENGTHS}
    else:
        mask = left_padded_mask() if how == "left" else holes_mask()
        ours_kwargs = {"mask": mask}
    expected = [mask, mask[:, ::-1]][: len(inner)]
    gathers = []
    gather_time = maskedrnn.ops.gather_time
    monkeypatch.setattr(
        maskedrnn.ops,
        "gather_time",
        lambda *a, **k: gathers.append(1) or gather_time(*a, **k),
    )
    assert_close(ours(x, **ours_kwargs), ref(x, mask=mask))
    assert gathers == []
    assert len(seen) == len(inner)
    for m, want in zip(seen, expected):
        np.testing.assert_array_equal(to_np(m), want)
    loss, grads = loss_and_grads(ours, x, **ours_kwargs)
    ref_loss, ref_grads = loss_and_grads(ref, x, mask=mask)
    # The loss is a signed sum (fixed pattern, unseeded weights) that can sit
    # near 0, and the two losses differ by float32 rounding (up to 1e-6 over
    # 40 weight draws of holes-bidirectional-gru, |loss| down to 0.12), so
    # rtol alone can fail (the likely cause of one failure never reproduced):
    # an absolute tolerance, as every other loss check.
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-4)
    for g, want in zip(grads, ref_grads):
        np.testing.assert_allclose(g, want, atol=1e-5, rtol=1e-5)
    # An LSTM returning states gives the older reason (`keras_kernels.states_why`).
    reason = "final [h, c] are wanted" if kind == "lstm" else "JAX has no fused RNN"
    for sentence in ours.kernel_info().values():
        assert "masked step loop" in sentence and reason in sentence


@tf_or_jax
@pytest.mark.parametrize("wrapper", ["rnn", "bidirectional"])
def test_bad_lengths_in_compiled_code_poison_their_rows_in_the_masked_loop(
    wrapper,
):
    """`lengths=` on Keras' masked loop (an LSTM returning states, on
    TensorFlow or JAX without a GPU): in compiled code (`tf.function`,
    `jax.jit`), where lengths cannot be checked, a too-long and a negative
    length give NaN in every output and state of their rows, and the other
    rows equal the eager results (as on every other path,
    tests/test_bad_input.py)."""
    if keras_has_gpu():
        pytest.skip("a GPU is visible: the LSTM runs unmasked there")
    # On TensorFlow the masked loop runs where `BlockLSTMV2` does not: in
    # `portable()` (the op's own check: tests/test_tf_block_lstm.py); on
    # JAX where the length tiers do not (forced here).
    masked = backends.force("keras-masked") if BACKEND == "jax" else None
    with backends.portable(), masked or contextlib.nullcontext():
        _bad_lengths_poison_their_rows(wrapper)


def _bad_lengths_poison_their_rows(wrapper):
    lstm = keras.layers.LSTM(U, return_sequences=True, return_state=True)
    layer = MaskedRNN(lstm) if wrapper == "rnn" else MaskedBidirectional(lstm)
    x_in, lengths_in = keras.Input((None, D)), keras.Input((), dtype="int32")
    model = keras.Model([x_in, lengths_in], layer(x_in, lengths=lengths_in))
    # Compiled: tf.function on TensorFlow; jax.jit on JAX (jit_compile).
    model.compile(jit_compile=BACKEND == "jax")
    for sentence in layer.kernel_info().values():
        assert "masked step loop" in sentence
    x = np.random.default_rng(3).standard_normal((4, T, D)).astype("float32")
    lengths = np.array([2, T + 3, 1, -1], "int32")
    outs = model.predict([x, lengths], verbose=0)
    good = np.array([0, 2])
    expected = layer(x[good], lengths=lengths[good])
    for out, exp in zip(flat(outs), flat(expected)):
        out = to_np(out)
        assert np.all(np.isnan(out[[1, 3]])), "bad rows gave numbers silently"
        np.testing.assert_allclose(out[good], to_np(exp), atol=1e-5)


@jax_only
def test_jax_cpu_rule_keeps_use_cudnn_true_and_a_gpu_unmasked(monkeypatch):
    gru = MaskedRNN(keras.layers.GRU(U, return_sequences=True, use_cudnn=True))
    gru.build((None, None, D))
    jax_backend = backends.current()
    assert jax_backend.cpu_reason(gru.layer) is None
    plan = backends.plan({"layer": gru.layer}, gru.layer.cell.kernel, False)
    assert plan.kernel() == "keras-unmasked"
    auto = MaskedRNN(keras.layers.GRU(U, return_sequences=True))
    auto.build((None, None, D))
    assert jax_backend.cpu_reason(auto.layer) is not None
    module = keras_backend_rnn("jax")
    monkeypatch.setattr(module, "_is_gpu_available", lambda: True)
    assert jax_backend.cpu_reason(auto.layer) is None
    plan = backends.plan({"layer": auto.layer}, auto.layer.cell.kernel, False)
    # JAX has no cuDNN GRU: on a GPU Keras' unmasked layer, whose scan
    # beats the length tiers there (which stay its second choice).
    assert plan.kernel() == "keras-unmasked"
    reason = dict(plan.directions[0].options)["jax-tiers"]
    assert not reason.blocking and "faster than the tiers" in str(reason)


def test_jax_cpu_rule_is_jax_only():
    layer = MaskedRNN(keras.layers.LSTM(U, return_sequences=True))
    layer.build((None, None, D))
    plan = backends.plan({"layer": layer.layer}, layer.layer.cell.kernel, False)
    sentence = plan.info()["layer"]
    on_jax_cpu = BACKEND == "jax" and not keras_has_gpu()
    assert ("in length tiers" in sentence) == on_jax_cpu
    assert (plan.kernel() == "jax-tiers") == on_jax_cpu


# ------------------------------------------------------------ torch, packed


def _spy_torch_kernels(monkeypatch):
    """Records each call of `torch.lstm/gru/rnn_tanh` as `(input shape,
    batch_sizes or None)` and each `GRUFunction` / `SimpleRNNFunction` as
    `(name, input shape)`."""
    import torch

    from maskedrnn.backends import torch_kernels as _torch_kernels

    seen, functions = [], []
    for name in ("lstm", "gru", "rnn_tanh"):
        original = getattr(torch, name)

        def spy(data, second, *args, _original=original):
            packed = isinstance(second, torch.Tensor) and second.dtype == torch.int64
            seen.append((tuple(data.shape), second.tolist() if packed else None))
            return _original(data, second, *args)

        monkeypatch.setattr(torch, name, spy)
    for function in (_torch_kernels.GRUFunction, _torch_kernels.SimpleRNNFunction):

        def apply_spy(x, *args, _function=function, _original=function.apply):
            functions.append((_function.__name__, tuple(x.shape)))
            return _original(x, *args)

        monkeypatch.setattr(function, "apply", apply_spy)
    return seen, functions


def _nan_padded(x, mask):
    import torch

    return torch.tensor(np.where(mask[..., None], x, np.nan).astype("float32"))


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's kernels: torch only")
@pytest.mark.parametrize("kind", ["gru", "simple"])
def test_torch_inference_runs_only_the_valid_steps(kind, monkeypatch):
    """A GRU or SimpleRNN with no gradient recorded: PyTorch's packed kernel
    is handed exactly sum(lengths) steps (t-major, `batch_sizes[t]` = rows
    longer than t), and NaN in the padding changes nothing. While gradients
    are recorded `GRUFunction` / `SimpleRNNFunction` run (the same equations
    as the unpacked kernel, a cheaper backward) over zeroed padding."""
    import torch

    seen, functions = _spy_torch_kernels(monkeypatch)
    ours, ref = oracle_pair(
        kind, U, D, wrapper="rnn", return_sequences=True, return_state=True
    )
    x = np.random.default_rng(2).standard_normal((B, T, D)).astype("float32")
    mask = left_padded_mask()
    x_nan = _nan_padded(x, mask)
    with torch.no_grad():
        out = ours(x_nan, mask=mask)
        assert "packed valid steps" in ours.kernel_info()["layer"]
    assert_close(out, ref(x, mask=mask))
    expected_sizes = [int((LENGTHS > t).sum()) for t in range(LENGTHS.max())]
    assert seen == [((int(LENGTHS.sum()), D), expected_sizes)]

    seen.clear()
    assert "zero-padded valid-first" in ours.kernel_info()["layer"]
    xt = x_nan.clone().requires_grad_(True)
    out = ours(xt, mask=mask)
    assert_close(out, ref(x, mask=mask))
    name = {"gru": "GRUFunction", "simple": "SimpleRNNFunction"}[kind]
    assert seen == [] and functions == [(name, (B, T, D))]
    sum(o.sum() for o in out).backward()
    grad = xt.grad.numpy()
    assert np.all(np.isfinite(grad)) and np.all(grad[~mask] == 0)


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's kernels: torch only")
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_torch_lstm_states_come_from_its_unpacked_kernel(grad, monkeypatch):
    """An LSTM whose final states are wanted runs PyTorch's unpacked (fused
    oneDNN) kernel, in inference and training: one call over all `B x T`
    steps, with one input feature more (the padding flag,
    `torch_kernels.saturated_lstm`), and the final `[h, c]` equal Keras'
    masked LSTM's, also for the all-padding row (its initial state) and
    with an initial state. NaN in the padding reaches neither the results
    nor the gradients, and the padding's gradient is exactly zero."""
    import torch

    seen, functions = _spy_torch_kernels(monkeypatch)
    ours, ref = oracle_pair(
        "lstm", U, D, wrapper="rnn", return_sequences=True, return_state=True
    )
    rng = np.random.default_rng(2)
    x = rng.standard_normal((B, T, D)).astype("float32")
    state = [rng.standard_normal((B, U)).astype("float32") for _ in range(2)]
    mask = left_padded_mask()
    assert LENGTHS.min() == 0  # the all-padding row keeps its initial state
    with torch.set_grad_enabled(grad):
        info = ours.kernel_info()["layer"]
        assert "zero-padded valid-first" in info and "final c is exact" in info
        xt = _nan_padded(x, mask).requires_grad_(grad)
        out = ours(xt, mask=mask, initial_state=state)
    want = ref(x, mask=mask, initial_state=state)
    assert_close(out, want)
    np.testing.assert_array_equal(to_np(out[2])[LENGTHS == 0], state[1][LENGTHS == 0])
    assert seen == [((B, T, D + 1), None)] and functions == []
    if grad:
        sum(o.sum() for o in out).backward()
        grad_x = xt.grad.numpy()
        assert np.all(np.isfinite(grad_x)) and np.all(grad_x[~mask] == 0)


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's kernels: torch only")
def test_torch_lstm_inference_keeps_the_unpacked_kernel():
    """An unpacked LSTM runs PyTorch's fused oneDNN kernel, faster than the
    packed one: it stays unpacked in inference too, with or without
    states (GRU and SimpleRNN go packed)."""
    import torch

    for make, packed in (
        (lambda **kw: keras.layers.LSTM(U, **kw), False),
        (lambda **kw: keras.layers.GRU(U, **kw), True),
        (lambda **kw: keras.layers.SimpleRNN(U, **kw), True),
    ):
        for return_state in (False, True):
            layer = MaskedRNN(make(return_sequences=True, return_state=return_state))
            layer.build((None, None, D))
            with torch.no_grad():
                sentence = layer.kernel_info()["layer"]
            assert ("packed valid steps" in sentence) == packed, sentence
            assert ("zero-padded valid-first" in sentence) == (not packed), sentence
