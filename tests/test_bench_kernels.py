"""`maskedrnn.bench.kernels`: the spies and profiles that say which kernels ran.

The spies must tell Keras' cuDNN call from its Python fallback (Keras
swallows a cuDNN failure with `except Exception: pass` on torch), see the
fused bidirectional path, and see `jax.experimental.rnn.lstm`. Those
branches run only on CUDA/GPU, so on a CPU these tests reach them through
Keras' real dispatch code with the device faked:

- torch: a `torch.Tensor` subclass whose `.device` says `cuda` (every op
  keeps the subclass, so Keras' `inputs.device.type == "cuda"` checks pass)
  and `_is_cuda_cudnn_available` patched to True. Keras' real `_cudnn_lstm`
  then fails (no CUDA in this build) and falls back: the spy must say so.
  With the weight transfer to "cuda" kept on the CPU, the same
  `torch._VF.lstm/gru` call that cuDNN serves on a GPU computes: the spy
  must say cuDNN computed, and no fallback ran.
- JAX: `_is_gpu_available` patched to True and `jax.experimental.rnn.lstm`
  replaced by a stand-in with its signature built on `lstm_ref` (JAX's CPU
  reference of the same computation), or by one that raises.

In every case the outputs are checked against the same layer run on the
CPU path (Keras' generic loop): the faked path computes the same function,
so the spy sits on the call that really computed the result.
On a real GPU these fakes are not needed (tests/test_bench.py checks the
verdicts device-aware); they are skipped there.
"""

import importlib

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional, backends, bench
from maskedrnn._keras_private import keras_backend_rnn
from maskedrnn.bench import kernels
from tests.helpers import to_np

BACKEND = keras.backend.backend()
GPU = bench.gpu_available(BACKEND)
B, T, D, U = 3, 5, 3, 4
TINY = ["--batch", "3", "--time", "5", "--features", "3", "--units", "4"]
# No first calls: each is a fresh compilation of every implementation.
QUICK = ["--repeats", "1", "--warmup", "1", "--no-progress", "--mode", "infer"]
QUICK += ["--first-call-repeats", "0"]


def inputs(seed=0):
    return np.random.default_rng(seed).standard_normal((B, T, D)).astype("float32")


def twins(make):
    """(layer, the same layer with use_cudnn=False) with the same weights."""
    layer, generic = make(), make(use_cudnn=False)
    for one in (layer, generic):
        one.build((None, None, D))
    generic.set_weights(layer.get_weights())
    return layer, generic


def calls_of(fn):
    with kernels.KernelRecorder() as recorder:
        out = fn()
    return out, recorder.calls


def functions(calls):
    return [(c["function"], c["outcome"]) for c in calls]


def test_recorder_restores_everything_and_summarizes():
    from maskedrnn._keras_private import keras_src_backend as keras_backend

    before = {n: getattr(keras_backend, n) for n in ("lstm", "gru", "rnn")}
    layer = keras.layers.Bidirectional(keras.layers.GRU(U, return_sequences=True))
    layer.build((None, None, D))
    mask = np.arange(T)[None, :] < np.array([5, 2, 1])[:, None]
    _, calls = calls_of(lambda: layer(inputs(), mask=mask))
    assert {n: getattr(keras_backend, n) for n in before} == before
    assert ("backend.gru", "declined") in functions(calls)
    assert ("backend.rnn", "computed") in functions(calls)
    assert all(c["mask"] for c in calls if c["function"].startswith("backend."))
    summary = kernels.summarize(calls)
    assert "backend.gru declined, with a mask x2" in summary
    assert kernels.cudnn_verdict(calls) == "not called"
    assert kernels.summarize([]).startswith("no Keras RNN function")


def test_cudnn_verdict_rules():
    def call(outcome, cudnn=True):
        return {"function": "f", "outcome": outcome, "mask": None, "cudnn": cudnn}

    assert kernels.cudnn_verdict([call("computed")]) == "computed"
    failed = [call("raised RuntimeError: x"), call("computed", cudnn=False)]
    assert kernels.cudnn_verdict(failed) == "failed, fell back"
    assert kernels.cudnn_verdict([call("declined (cuDNN LSTM failed: x)")]) == (
        "failed, fell back"
    )
    # A fused kernel declining off a GPU is by design, not a failure.
    assert kernels.cudnn_verdict([call("declined")]) == "not called"
    assert kernels.cudnn_verdict([call("computed", cudnn=False)]) == "not called"


# ---------------------------------------------------------------- torch, faked


needs_torch_cpu = pytest.mark.skipif(
    BACKEND != "torch" or GPU, reason="fakes CUDA on the torch backend on a CPU"
)


@pytest.fixture
def fake_cuda(monkeypatch):
    """Returns `to_fake(array)`: a CPU tensor that says it is on CUDA."""
    import torch

    torch_rnn = keras_backend_rnn("torch")

    class FakeCuda(torch.Tensor):
        @property
        def device(self):
            return torch.device("cuda")

    monkeypatch.setattr(torch_rnn, "_is_cuda_cudnn_available", lambda: True)
    return lambda array: torch.as_tensor(array).as_subclass(FakeCuda)


@pytest.fixture
def cudnn_weights_stay_on_cpu(monkeypatch):
    """Keras moves the weights to the input's device ("cuda") before
    `torch._VF.lstm/gru`; keep them on the CPU so that call computes."""
    torch_rnn = keras_backend_rnn("torch")
    for name in ("prepare_lstm_params", "prepare_gru_params"):
        original = getattr(torch_rnn, name)
        monkeypatch.setattr(
            torch_rnn,
            name,
            lambda k, r, b, device, original=original: original(k, r, b, "cpu"),
        )


@needs_torch_cpu
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_torch_spy_sees_keras_swallow_a_cudnn_failure(kind, fake_cuda):
    """This torch build has no CUDA, so Keras' real `_cudnn_*` raises on the
    fake CUDA input; Keras catches it and runs its Python loop."""
    cls = getattr(keras.layers, kind)
    layer, generic = twins(lambda **kw: cls(U, return_sequences=True, **kw))
    x = inputs(1)
    out, calls = calls_of(lambda: layer(fake_cuda(x)))
    name = kind.lower()
    assert functions(calls)[0] == (f"backend.{name}", "computed")
    failed = calls[1]
    assert failed["function"] == f"torch cuDNN _cudnn_{name}"
    assert failed["outcome"].startswith("raised "), failed
    assert functions(calls)[2:] == [(f"torch Python loop _fallback_{name}", "computed")]
    assert kernels.cudnn_verdict(calls) == "failed, fell back"
    assert f"_cudnn_{name} raised" in kernels.summarize(calls)
    np.testing.assert_allclose(to_np(out), to_np(generic(x)), atol=1e-6)


@needs_torch_cpu
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_torch_spy_sees_cudnn_compute(kind, fake_cuda, cudnn_weights_stay_on_cpu):
    cls = getattr(keras.layers, kind)
    layer, generic = twins(lambda **kw: cls(U, return_sequences=True, **kw))
    x = inputs(2)
    out, calls = calls_of(lambda: layer(fake_cuda(x)))
    name = kind.lower()
    assert functions(calls) == [
        (f"backend.{name}", "computed"),
        (f"torch cuDNN _cudnn_{name}", "computed"),
    ]
    assert kernels.cudnn_verdict(calls) == "computed"
    np.testing.assert_allclose(to_np(out), to_np(generic(x)), atol=1e-5)


@needs_torch_cpu
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_torch_spy_sees_the_fused_bidirectional_call(
    kind, fake_cuda, cudnn_weights_stay_on_cpu
):
    """Keras' unmasked Bidirectional makes one fused call on CUDA (and no
    per-direction call); with a mask it never tries it."""
    cls = getattr(keras.layers, kind)
    fused = keras.layers.Bidirectional(cls(U, return_sequences=True))
    generic = keras.layers.Bidirectional(cls(U, return_sequences=True, use_cudnn=False))
    for layer in (fused, generic):
        layer.build((None, None, D))
    generic.set_weights(fused.get_weights())
    x = inputs(3)
    out, calls = calls_of(lambda: fused(fake_cuda(x)))
    name = kind.lower()
    assert functions(calls) == [(f"backend.bidirectional_{name}", "computed")]
    assert kernels.cudnn_verdict(calls) == "computed"
    np.testing.assert_allclose(to_np(out), to_np(generic(x)), atol=1e-5)

    mask = np.arange(T)[None, :] < np.array([5, 3, 1])[:, None]
    _, calls = calls_of(lambda: fused(fake_cuda(x), mask=fake_cuda(mask)))
    assert f"backend.bidirectional_{name}" not in [c["function"] for c in calls]
    assert (f"backend.{name}", "declined") in functions(calls)
    assert kernels.cudnn_verdict(calls) == "not called"


def _lstm_pair_on_a_pre_padded_batch():
    """Ours and Keras' masked `Bidirectional(LSTM)` (`use_cudnn=False`) with
    the same weights, and a pre-padded batch with its mask."""
    ours = MaskedBidirectional(keras.layers.LSTM(U, return_sequences=True))
    ref = keras.layers.Bidirectional(
        keras.layers.LSTM(U, return_sequences=True, use_cudnn=False)
    )
    for layer in (ours, ref):
        layer.build((None, None, D))
    ref.set_weights(ours.get_weights())
    x = inputs(4)
    mask = np.arange(T)[None, :] >= T - np.array([5, 3, 1])[:, None]  # pre-padded
    return ours, ref, x, mask


@needs_torch_cpu
def test_torch_spy_sees_ours_reach_cudnn_in_one_call(fake_cuda):
    """On CUDA ours runs both directions in one call of the one-call kernel
    (`torch._VF.lstm`, cuDNN there): one record, cuDNN computed, no Keras
    RNN function and no mask anywhere."""
    ours, ref, x, mask = _lstm_pair_on_a_pre_padded_batch()
    out, calls = calls_of(lambda: ours(fake_cuda(x), mask=fake_cuda(mask)))
    assert functions(calls) == [("torch one-call kernel (torch._VF)", "computed")]
    assert kernels.cudnn_verdict(calls) == "computed"
    np.testing.assert_allclose(to_np(out), to_np(ref(x, mask=mask)), atol=1e-5)


@needs_torch_cpu
def test_torch_spy_sees_ours_unmasked_reach_cudnn_without_a_mask(
    fake_cuda, cudnn_weights_stay_on_cpu
):
    """Forced to Keras' unmasked layer on CUDA, ours leaves each direction
    to Keras' unmasked LSTM, which calls cuDNN: two `_cudnn_lstm` calls, no
    mask anywhere, no fallback."""
    ours, ref, x, mask = _lstm_pair_on_a_pre_padded_batch()
    with backends.force("keras-unmasked"):
        out, calls = calls_of(lambda: ours(fake_cuda(x), mask=fake_cuda(mask)))
    assert ("torch cuDNN _cudnn_lstm", "computed") in functions(calls)
    assert [c["function"] for c in calls].count("torch cuDNN _cudnn_lstm") == 2
    assert not any("fallback" in c["function"] for c in calls)
    assert not any(c["mask"] for c in calls)
    assert kernels.cudnn_verdict(calls) == "computed"
    np.testing.assert_allclose(to_np(out), to_np(ref(x, mask=mask)), atol=1e-5)


# ------------------------------------------------------------------ JAX, faked


needs_jax_cpu = pytest.mark.skipif(
    BACKEND != "jax" or GPU, reason="fakes a GPU on the JAX backend on a CPU"
)


@pytest.fixture
def fake_gpu(monkeypatch):
    """Keras' JAX backend believes it has a GPU; returns `use(stand_in)`,
    which installs a stand-in for `jax.experimental.rnn.lstm`."""
    jax_rnn = importlib.import_module("jax.experimental.rnn")
    keras_jax_rnn = keras_backend_rnn("jax")
    monkeypatch.setattr(keras_jax_rnn, "_is_gpu_available", lambda: True)
    return lambda stand_in: monkeypatch.setattr(jax_rnn, "lstm", stand_in)


def reference_lstm(x, h_0, c_0, weights, seq_lengths, input_size, hidden_size,
                   num_layers, dropout, bidirectional, precision=None):
    """`jax.experimental.rnn.lstm`'s signature, computed by `lstm_ref`."""
    from jax.experimental import rnn

    unpacked = rnn.unpack_lstm_weights(
        weights, input_size, hidden_size, num_layers, bidirectional
    )
    return rnn.lstm_ref(
        x, h_0, c_0, *unpacked, seq_lengths, input_size, hidden_size,
        num_layers, dropout, bidirectional,
    )


@needs_jax_cpu
def test_jax_spy_sees_jax_experimental_rnn_lstm(fake_gpu):
    fake_gpu(reference_lstm)
    layer, generic = twins(lambda **kw: keras.layers.LSTM(U, **kw))
    x = inputs(5)
    out, calls = calls_of(lambda: layer(x))
    assert functions(calls) == [
        ("backend.lstm", "computed"),
        ("jax.experimental.rnn.lstm (cuDNN)", "computed"),
    ]
    assert kernels.cudnn_verdict(calls) == "computed"
    np.testing.assert_allclose(to_np(out), to_np(generic(x)), atol=1e-5)

    fused = keras.layers.Bidirectional(keras.layers.LSTM(U, return_sequences=True))
    fused.build((None, None, D))
    _, calls = calls_of(lambda: fused(x))
    assert functions(calls) == [
        ("backend.bidirectional_lstm", "computed"),
        ("jax.experimental.rnn.lstm (cuDNN)", "computed"),
    ]


@needs_jax_cpu
def test_jax_spy_sees_a_cudnn_failure_fall_back(fake_gpu):
    def failing(*args, **kwargs):
        raise RuntimeError("fake cuDNN failure")

    fake_gpu(failing)
    layer, generic = twins(lambda **kw: keras.layers.LSTM(U, **kw))
    x = inputs(6)
    out, calls = calls_of(lambda: layer(x))
    assert calls[0]["function"] == "backend.lstm"
    assert calls[0]["outcome"].startswith("declined (cuDNN LSTM failed")
    assert calls[1]["outcome"] == "raised RuntimeError: fake cuDNN failure"
    assert functions(calls)[2] == ("backend.rnn", "computed")
    assert kernels.cudnn_verdict(calls) == "failed, fell back"
    np.testing.assert_allclose(to_np(out), to_np(generic(x)), atol=1e-6)


# ------------------------------------------------------------------- --profile


def test_profile_runs_and_says_what_it_saw():
    """`--profile` on this machine: on a CPU it must run and say plainly
    that there are no CUDA kernels; on a GPU it must list cuDNN's RNN
    kernels for the implementations that reach cuDNN."""
    impls = ["maskedrnn", "keras_masked", "keras_unmasked"]
    if BACKEND == "torch":
        impls.append("torch_unpacked")
    results = bench.main(TINY + QUICK + ["--profile", "--impl", *impls])
    assert results["config"]["profile"] is True
    rows = {r["impl"]: r for r in results["rows"]}
    table = bench.format_table(results)
    for row in rows.values():
        profile = row["profile"]
        assert set(profile) >= {"tool", "cuda_kernels", "rnn_ops", "note"}
        if not GPU:
            assert profile["cuda_kernels"] == profile["cuda_kernels_top"] == []
            assert profile["cuda_kernels_total"] == 0
    note = rows["maskedrnn"]["profile"]["note"]
    assert note in table
    if BACKEND == "tensorflow":
        assert rows["maskedrnn"]["profile"]["tool"] is None
        assert "torch and JAX backends only" in note
        return
    tool = {"torch": "torch.profiler", "jax": "jax.profiler"}[BACKEND]
    assert rows["maskedrnn"]["profile"]["tool"] == tool
    assert rows["maskedrnn"]["profile"]["host_events_total"] > 0  # it traced
    if not GPU:
        assert note.startswith("no CUDA device")
        assert "no CUDA kernels" in note
    else:
        # cuDNN's RNN kernels by name where cuDNN computes (ours' default
        # LSTM and Keras' unmasked one; PyTorch's module), none for Keras'
        # masked loop (its gemms and element-wise kernels are not cuDNN's).
        fused = ["maskedrnn", "keras_unmasked"]
        fused += ["torch_unpacked"] if BACKEND == "torch" else []
        for name in fused:
            profile = rows[name]["profile"]
            assert kernels.cudnn_rnn_kernels(profile), (
                name,
                [k["name"] for k in profile["cuda_kernels_top"]],
            )
        assert kernels.cudnn_rnn_kernels(rows["keras_masked"]["profile"]) == []
    if BACKEND == "torch" and not GPU:
        # Ours runs PyTorch's native LSTM per direction on a CPU, Keras'
        # masked layer its Python loop: the profile sees the difference.
        ops = [op["name"] for op in rows["maskedrnn"]["profile"]["rnn_ops"]]
        assert "aten::lstm" in ops
        assert rows["keras_masked"]["profile"]["rnn_ops"] == []
        ops = [op["name"] for op in rows["torch_unpacked"]["profile"]["rnn_ops"]]
        assert "aten::lstm" in ops


def test_cudnn_kernel_names_are_matched_positively():
    """What `--profile` on a GPU calls cuDNN's RNN kernels: their names, not
    any name with "rnn", "lstm" or "gru" in it (an XLA fusion, a cuBLAS gemm
    or PyTorch's element-wise sigmoid are not cuDNN's)."""
    names = [
        "RNN_blockPersist_fp_LSTM<float, float, float, 128, 1, 2, 1, 0>",
        "void LSTM_elementWise_fp<float, float, float>(int, int, int)",
        "GRU_elementWise_bp1",
        "elemWiseRNNcell<float>",
        "void cudnn::rnn::lstm_fwd_kernel",
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32",
        "loop_fusion_lstm_3",
        "void at::native::vectorized_elementwise_kernel<4, sigmoid_kernel_cuda>",
        "cudnn::gemm::kernel",
    ]
    profile = {
        "cuda_kernels": [{"name": n, "count": 1} for n in names[:3] + names[6:7]],
        "cuda_kernels_top": [{"name": n, "count": 2} for n in names],
    }
    assert kernels.cudnn_rnn_kernels(profile) == sorted(names[:5])


# ------------------------------------------------------------ tests/conftest.py


def test_conftest_turns_tf32_off_for_every_test():
    if BACKEND == "torch":
        import torch

        assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.cudnn.allow_tf32 is False
    elif BACKEND == "jax":
        import jax

        assert jax.config.jax_default_matmul_precision == "highest"
    else:
        pytest.skip("TensorFlow: no GPU in the GPU test run (no TF32 setting here)")


def test_a_failing_profiler_keeps_the_timings(monkeypatch):
    """With a GPU the profiler may be unusable (no CUPTI): the run
    must still finish and say why there is no profile."""
    from maskedrnn.bench import timing

    def broken(step):
        raise RuntimeError("no CUPTI here")

    real = timing.backend_module(BACKEND).Harness
    monkeypatch.setattr(real, "profile", lambda self, step: broken(step))
    results = bench.main(TINY + QUICK + ["--profile", "--impl", "maskedrnn"])
    row = results["rows"][0]
    assert row["median_ms"] > 0
    assert row["profile"]["tool"] == "failed"
    assert row["profile"]["note"] == "the profiler failed: RuntimeError: no CUPTI here"
    assert row["profile"]["note"] in bench.format_table(results)
