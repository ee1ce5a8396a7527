"""Which RNN kernels each implementation ran: spies and profiler reports.

`KernelRecorder` (spies, every backend, always on): on the first call of
each case it wraps the functions Keras' RNN layers call, so the report
tells apart

- a masked layer sent to Keras' step loop (`backend.lstm declined, with a
  mask`, then `backend.rnn computed`);
- Keras' fused bidirectional call (`backend.bidirectional_lstm/gru`,
  which declines off CUDA/GPU and computes one fused cuDNN call on it);
- on the torch backend, Keras' cuDNN call (`_cudnn_lstm/_cudnn_gru` in
  `keras/src/backend/torch/rnn.py`) from its Python fallback
  (`_fallback_lstm/_fallback_gru`): Keras swallows a cuDNN failure with
  `except Exception: pass` and falls back, which the spy sees as
  "`_cudnn_lstm` raised ..., then `_fallback_lstm` computed";
- on the JAX backend, `jax.experimental.rnn.lstm` (JAX's cuDNN LSTM, the
  only cuDNN RNN JAX has; Keras calls it on a GPU only);
- PyTorch's native kernels called by `maskedrnn.backends.torch.run_native`
  (over valid-first data) and `run_direction` (a whole direction from the
  caller's order), labelled "torch native kernel"; a GRU or SimpleRNN with
  gradients recorded runs `torch_kernels.GRUFunction` / `SimpleRNNFunction` there
  (PyTorch's equations in torch ops), under the same label;
- the one-call kernel (`maskedrnn.backends.torch_fused.run`: every direction
  in one `torch._VF` call), labelled "torch one-call kernel (torch._VF)",
  a cuDNN call when its input is on CUDA.
- on the TensorFlow backend, TensorFlow's fused LSTM kernel run by
  `maskedrnn.backends.tensorflow_block_lstm.run` (the `"tf-block-lstm"`
  kernel), labelled "tf BlockLSTMV2 kernel".

Each call becomes a record `{"function", "outcome", "mask", "cudnn"}`;
`cudnn_verdict` reduces them to `"computed"`, `"failed, fell back"` or
`"not called"`.

`profile_torch` / `profile_jax` (`--profile`): run one step under the
backend's profiler and list the RNN kernels it executed, by name (on CUDA,
the cuDNN kernels; on a CPU, the host ops, and a note that there are no CUDA
kernels).
"""

import collections
import glob
import importlib
import inspect
import os
import re
import tempfile

from maskedrnn import backends
from maskedrnn._keras_private import keras_backend_rnn

# Names of RNN work in profiler traces: cuDNN's RNN kernels
# ("RNN_blockPersist_fp_LSTM", "LSTM_elementWise_fp", "elemWiseRNNcell", ...),
# ATen's ops ("aten::lstm", "aten::_cudnn_rnn", "aten::mkldnn_rnn_layer") and
# XLA's ("cudnn$rnn" custom calls).
RNN_KERNEL = re.compile(r"rnn|lstm|gru", re.IGNORECASE)
# cuDNN's own RNN kernels by name: its persistent kernels
# ("RNN_blockPersist_fp_LSTM", "RNN_blockPersist_bp_GRU"), its element-wise
# cell kernels ("LSTM_elementWise_fp", "GRU_elementWise_bp1",
# "elemWiseRNNcell") and any kernel in a cuDNN namespace naming an RNN.
# Matched positively (`cudnn_rnn_kernels`): cuBLAS's and XLA's kernel names
# (gemms, fusions) never match it.
CUDNN_RNN_KERNEL = re.compile(
    r"RNN_blockPersist|(?:LSTM|GRU|RNN)_elementWise|elemWiseRNN"
    r"|cudnn\w*::\w*(?:rnn|lstm|gru)",
    re.IGNORECASE,
)

NOT_CALLED = "not called"
COMPUTED = "computed"
FELL_BACK = "failed, fell back"


def _targets():
    """(module, attribute, label, is_cudnn, has_mask) for this backend;
    `is_cudnn` a bool, or a function of the call's arguments."""
    from maskedrnn._keras_private import keras_src_backend as keras_backend

    backend = backends.name()
    fused_is_cudnn = backend in ("torch", "jax")
    targets = [
        (keras_backend, "lstm", "backend.lstm", False, True),
        (keras_backend, "gru", "backend.gru", False, True),
        (keras_backend, "rnn", "backend.rnn", False, True),
    ]
    for name in ("bidirectional_lstm", "bidirectional_gru"):
        if hasattr(keras_backend, name):
            # On torch and JAX these compute only as one fused cuDNN call.
            targets.append(
                (keras_backend, name, f"backend.{name}", fused_is_cudnn, True)
            )
    if backend == "torch":
        from maskedrnn.backends import torch as torch_backend

        # (`keras.src.backend.torch.rnn` the module; the package re-exports
        # a function of the same name.)
        torch_rnn = keras_backend_rnn("torch")

        for name in ("_cudnn_lstm", "_cudnn_gru"):
            targets.append((torch_rnn, name, f"torch cuDNN {name}", True, False))
        for name in ("_fallback_lstm", "_fallback_gru"):
            label = f"torch Python loop {name}"
            targets.append((torch_rnn, name, label, False, False))
        # Both call PyTorch's kernels; one label for both.
        for name in ("run_native", "run_direction"):
            targets.append((torch_backend, name, "torch native kernel", False, False))
        from maskedrnn.backends import torch_fused

        # The one-call kernel: torch._VF.lstm/gru, cuDNN on CUDA tensors.
        label = "torch one-call kernel (torch._VF)"
        targets.append((torch_fused, "run", label, _on_cudnn, False))
    if backend == "tensorflow":
        from maskedrnn.backends import tensorflow_block_lstm

        label = "tf BlockLSTMV2 kernel"
        targets.append((tensorflow_block_lstm, "run", label, False, False))
    if backend == "jax":
        jax_rnn = importlib.import_module("jax.experimental.rnn")

        # Keras imports it inside its functions, so the module attribute is
        # what it calls.
        label = "jax.experimental.rnn.lstm (cuDNN)"
        targets.append((jax_rnn, "lstm", label, True, False))
    return targets


def _on_cudnn(inners, x, *args, **kwargs):
    """Whether `torch_fused.run(inners, x, ...)` reaches cuDNN: `x` on
    CUDA with cuDNN enabled (`torch._VF` dispatches there)."""
    import torch

    from maskedrnn.backends.torch_kernels import as_tensor

    return as_tensor(x).device.type == "cuda" and torch.backends.cudnn.enabled


class KernelRecorder:
    """Records the RNN kernel calls made while it is active (a `with` block).

    Each call appends a record `{"function": label, "outcome": "computed" |
    "declined" | "raised <Error>: <message>", "mask": bool or None,
    "cudnn": bool}`; a call that raises re-raises after it is recorded, so
    Keras' own fallbacks still run.
    """

    def __init__(self):
        self.calls = []
        self._saved = []

    def _wrap(self, original, label, is_cudnn, has_mask):
        signature = inspect.signature(original) if has_mask else None

        def recorder(*args, **kwargs):
            cudnn = is_cudnn(*args, **kwargs) if callable(is_cudnn) else is_cudnn
            record = {"function": label, "mask": None, "cudnn": cudnn}
            if signature is not None:
                bound = signature.bind_partial(*args, **kwargs).arguments
                record["mask"] = bound.get("mask") is not None
            self.calls.append(record)
            try:
                out = original(*args, **kwargs)
            except NotImplementedError as e:
                record["outcome"] = "declined"
                if str(e):
                    record["outcome"] += f" ({e})"
                raise
            except Exception as e:  # recorded, then re-raised unchanged
                record["outcome"] = f"raised {type(e).__name__}: {e}"
                raise
            record["outcome"] = COMPUTED
            return out

        recorder.__wrapped__ = original
        return recorder

    def __enter__(self):
        for module, name, label, is_cudnn, has_mask in _targets():
            original = getattr(module, name)
            self._saved.append((module, name, original))
            setattr(module, name, self._wrap(original, label, is_cudnn, has_mask))
        return self

    def __exit__(self, *exc):
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved = []
        return False

    def summary(self):
        return summarize(self.calls)


def describe(record):
    """"backend.lstm computed, no mask" for one record."""
    text = f"{record['function']} {record.get('outcome', 'did not return')}"
    if record["mask"] is not None:
        text += ", with a mask" if record["mask"] else ", no mask"
    return text


def summarize(calls):
    """"backend.lstm computed, no mask x2; ..." in order of first call."""
    counts = collections.Counter(describe(c) for c in calls)
    if not counts:
        return "no Keras RNN function or native kernel called"
    return "; ".join(f"{call} x{n}" for call, n in counts.items())


def cudnn_verdict(calls):
    """Did cuDNN compute? `"computed"` when a cuDNN function returned,
    `"failed, fell back"` when one raised (or declined saying it failed)
    and none returned, `"not called"` otherwise (including the fused
    bidirectional functions declining off a GPU, as they do by design)."""
    cudnn = [c for c in calls if c["cudnn"]]
    if any(c.get("outcome") == COMPUTED for c in cudnn):
        return COMPUTED
    failed = [
        c
        for c in cudnn
        if c.get("outcome", "").startswith("raised")
        or "failed" in c.get("outcome", "")
    ]
    return FELL_BACK if failed else NOT_CALLED


# ---------------------------------------------------------------- profiling


def _rnn_names(counter):
    return [
        {"name": name, "count": n}
        for name, n in sorted(counter.items())
        if RNN_KERNEL.search(name)
    ]


def cudnn_rnn_kernels(profile):
    """The names of cuDNN's RNN kernels (`CUDNN_RNN_KERNEL`) among the CUDA
    kernels of a profile entry (`profile_torch` / `profile_jax`)."""
    names = {k["name"] for k in profile["cuda_kernels"] + profile["cuda_kernels_top"]}
    return sorted(n for n in names if CUDNN_RNN_KERNEL.search(n))


def _top(counter, n=25):
    """The `n` most frequent names (all kernels, not only RNN ones): what a
    GPU run needs to explain where the time went."""
    return [{"name": name, "count": c} for name, c in counter.most_common(n)]


def no_profiler(backend):
    return {
        "tool": None,
        "cuda_kernels": [],
        "cuda_kernels_top": [],
        "cuda_kernels_total": 0,
        "host_events_total": 0,
        "rnn_ops": [],
        "note": f"--profile lists kernels on the torch and JAX backends only, "
        f"not on {backend}.",
    }


def _cpu_note(tool):
    return (
        f"no CUDA device: this ran on the CPU, so {tool} saw no CUDA kernels "
        "(cuda_kernels is empty); rnn_ops lists the RNN ops run on the host."
    )


def _report(tool, host, device, gpu, gpu_note):
    """The profile entry of the JSON from the event counts of one profiled
    call: `host` and `device` map event names to counts."""
    return {
        "tool": tool,
        "cuda_kernels": _rnn_names(device) if gpu else [],
        "cuda_kernels_top": _top(device),
        "cuda_kernels_total": sum(device.values()),
        "host_events_total": sum(host.values()),
        "rnn_ops": _rnn_names(host),
        "note": gpu_note if gpu else _cpu_note(tool),
    }


def profile_torch(step, block, gpu):
    """One call of `step` under `torch.profiler`: RNN host ops and, on CUDA,
    the RNN CUDA kernels (cuDNN's by name), with their counts."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if gpu:
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        block(step())
    host, device = collections.Counter(), collections.Counter()
    for event in prof.events():
        kind = str(getattr(event, "device_type", "")).rsplit(".", 1)[-1]
        (device if kind == "CUDA" else host)[event.name] += 1
    return _report(
        "torch.profiler",
        host,
        device,
        gpu,
        "RNN CUDA kernels by name (cuDNN's RNN kernels mean cuDNN computed)",
    )


def profile_jax(step, block, gpu):
    """One call of `step` under `jax.profiler.trace`: the RNN events of the
    device planes (on a GPU, the CUDA kernels) and of the host plane."""
    import jax
    from jax.profiler import ProfileData

    with tempfile.TemporaryDirectory() as directory:
        with jax.profiler.trace(directory):
            block(step())
        paths = glob.glob(
            os.path.join(directory, "**", "*.xplane.pb"), recursive=True
        )
        if not paths:
            raise RuntimeError(
                f"jax.profiler.trace wrote no *.xplane.pb file under {directory}."
            )
        data = ProfileData.from_file(paths[0])
    host, device = collections.Counter(), collections.Counter()
    for plane in data.planes:
        target = device if plane.name.startswith("/device:GPU") else host
        for line in plane.lines:
            for event in line.events:
                target[event.name] += 1
    return _report(
        "jax.profiler",
        host,
        device,
        gpu,
        "RNN kernels of the GPU planes by name (cuDNN's RNN kernels mean "
        "cuDNN computed)",
    )
