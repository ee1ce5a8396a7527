"""Benchmark `MaskedBidirectional` against Keras' and PyTorch's bidirectional RNNs.

Run as `python -m maskedrnn.bench` (`--help` lists the options). The backend is
Keras' (`KERAS_BACKEND=tensorflow|jax|torch`). One process times, side by
side and in round-robin order (so machine noise hits all alike):

- `maskedrnn`: `MaskedBidirectional(LSTM/GRU)` called with `mask=`;
- `maskedrnn_lengths`: the same layer called with `lengths=` instead;
- `keras_masked`: `keras.layers.Bidirectional` with the same mask;
- `keras_unmasked`: `keras.layers.Bidirectional` with no mask: the speed
  ceiling (it runs over the padding, so its results on padded rows are wrong);
- `torch_packed` (torch backend only): `torch.nn.LSTM/GRU(bidirectional=True)`
  on a `PackedSequence`, packing and unpacking included;
- `torch_unpacked` (torch backend only): the same module on the padded
  tensor (wrong results: its ceiling).

All share one set of weights. What is timed is the layer alone, on inputs
put on the device once before timing: `"infer"` is the forward pass,
`"train"` the forward pass plus the gradients of a scalar loss
`sum(outputs * w)` (fixed random `w`) with respect to the inputs and all the
weights. Each implementation is compiled the same way per backend:

- TensorFlow: a `tf.function` (no XLA) around the step. It also returns a
  scalar that depends on every output (sum of the outputs, or of the loss and
  every gradient); reading that scalar with `.numpy()` waits for the device,
  so only 4 bytes cross to the host.
- JAX: `jax.jit` of `layer.stateless_call` (and of `jax.value_and_grad` of
  it); timing waits with `jax.block_until_ready` on all results.
- PyTorch: eager (forward under `torch.no_grad()` for `"infer"`); timing
  waits with `torch.cuda.synchronize()` on CUDA (CPU ops are synchronous).

Before timing, each implementation's outputs (and in `"train"` mode its
input gradient, plus its weight gradients when it has Keras' weight layout)
are compared with `keras_masked` on the same data; the largest absolute
differences go in the table and the JSON (`max_abs_diff`,
`max_abs_grad_diff`, and on torch `max_abs_diff_torch_packed`). The two
ceilings are expected to differ wherever rows are padded.

Which code computed each implementation is recorded too, on its first call
(which is the trace under `tf.function` / `jax.jit`): the calls it made to
Keras' backend RNN functions (`keras.src.backend.lstm`, `gru`, `rnn`), each
with whether it got a mask and whether it computed or declined (a declined
fused kernel raises NotImplementedError and the layer falls back to `rnn`),
and to PyTorch's native kernels (`maskedrnn._torch_kernels.run`). The table
ends with one line per implementation (`kernels` in the JSON rows): on a GPU
this is how a run shows that ours reached the cuDNN kernel without a mask
while Keras' masked layer fell back to its step loop.

Example:

```
KERAS_BACKEND=torch python -m maskedrnn.bench --preset gpu --mode both \\
    --json bench.json --plot bench.png
```
"""

import argparse
import inspect
import json
import math
import os
import platform
import sys
import time

import keras
import numpy as np

from maskedrnn.layers import MaskedBidirectional

IMPLS = {
    "maskedrnn": "MaskedBidirectional, mask=",
    "maskedrnn_lengths": "MaskedBidirectional, lengths=",
    "keras_masked": "keras Bidirectional, mask=",
    "keras_unmasked": "keras Bidirectional, no mask (ceiling)",
    "torch_packed": "torch nn.{cell} bidirectional, PackedSequence",
    "torch_unpacked": "torch nn.{cell} bidirectional, padded (ceiling)",
}
OURS = ("maskedrnn", "maskedrnn_lengths")
BASELINES = ("keras_masked", "keras_unmasked", "torch_packed", "torch_unpacked")
TORCH_ONLY = ("torch_packed", "torch_unpacked")
# Compute the unmasked recurrence over the padding: expected to differ.
CEILINGS = ("keras_unmasked", "torch_unpacked")
REFERENCE = "keras_masked"
MODES = ("train", "infer")

PRESETS = {
    # Finishes in about a minute per backend on a 2-core CPU.
    "cpu": {
        "batch": 16,
        "time": 50,
        "features": 32,
        "units": 32,
        "repeats": 10,
        "warmup": 2,
    },
    # The reference size of the H100 figures in the project brief.
    "gpu": {
        "batch": 64,
        "time": 100,
        "features": 512,
        "units": 512,
        "repeats": 50,
        "warmup": 5,
    },
}


# ---------------------------------------------------------------- arguments


def parse_lengths(spec, batch, time, seed=0):
    """Per-row valid lengths from a distribution spec.

    Args:
        spec: `"uniform:F"` (integers uniform in `[ceil(F * time), time]`,
            `0 < F <= 1`), `"full"` (every row `time` long) or `"fixed:N"`
            (every row `N` long, `1 <= N <= time`).
        batch: Int, number of rows.
        time: Int, length of the padded time axis.
        seed: Int, seed of the random draw. Defaults to `0`.

    Returns:
        int32 numpy array of shape `(batch,)`, every entry in `[1, time]`.

    Example:

    >>> parse_lengths("fixed:3", batch=2, time=5)
    array([3, 3], dtype=int32)
    """
    kind, _, value = str(spec).partition(":")
    if kind == "full" and not value:
        return np.full((batch,), time, dtype="int32")
    try:
        number = float(value)
    except ValueError:
        number = None
    if kind == "uniform" and number is not None and 0 < number <= 1:
        low = max(1, math.ceil(number * time))
        rng = np.random.default_rng(seed)
        return rng.integers(low, time + 1, size=batch).astype("int32")
    if kind == "fixed" and number is not None and number == int(number):
        if 1 <= number <= time:
            return np.full((batch,), int(number), dtype="int32")
        raise ValueError(
            f"--lengths {spec!r}: N must be in [1, --time={time}] (PyTorch "
            "cannot pack empty rows)."
        )
    raise ValueError(
        f"Invalid --lengths {spec!r}: use 'uniform:F' with 0 < F <= 1 "
        "(lengths uniform in [ceil(F*T), T]), 'full', or 'fixed:N'."
    )


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m maskedrnn.bench",
        description=(
            "Time MaskedBidirectional against keras.layers.Bidirectional "
            "(with and without a mask) and, on the torch backend, "
            "torch.nn.LSTM/GRU(bidirectional=True). The Keras backend comes "
            "from KERAS_BACKEND."
        ),
    )
    parser.add_argument("--cell", choices=("lstm", "gru"), default="lstm")
    parser.add_argument(
        "--preset",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="default sizes, repeats and warm-up: 'cpu' (B=16 T=50 D=32 U=32) "
        "or 'gpu' (B=64 T=100 D=512 U=512, the H100 reference); 'auto' picks "
        "by device. Explicit options win.",
    )
    for name, what in (
        ("batch", "rows per batch"),
        ("time", "padded time steps"),
        ("features", "input features"),
        ("units", "units per direction"),
    ):
        parser.add_argument(f"--{name}", type=int, help=what)
    parser.add_argument(
        "--lengths",
        default="uniform:0.2",
        help="length distribution: 'uniform:F' (uniform in [ceil(F*T), T], "
        "default uniform:0.2), 'full' or 'fixed:N'",
    )
    parser.add_argument("--mode", choices=("train", "infer", "both"), default="both")
    parser.add_argument(
        "--return-state",
        action="store_true",
        help="the layers also return their final states, which enter the "
        "timed output (and so the loss and the checks): adds ours' exact "
        "LSTM cell-state work",
    )
    parser.add_argument("--repeats", type=int, help="timed runs per case")
    parser.add_argument("--warmup", type=int, help="untimed runs first (>= 1)")
    parser.add_argument(
        "--impl",
        nargs="+",
        choices=tuple(IMPLS),
        help="implementations to time (default: all this backend has)",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    parser.add_argument(
        "--threads",
        type=int,
        help="CPU threads for the backend's ops (torch.set_num_threads; TF "
        "intra/inter-op pools; JAX: 1 only). Default: the backend's own.",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="write results as JSON")
    parser.add_argument(
        "--plot", metavar="FILE.png", help="bar chart of the medians (matplotlib)"
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar on stderr"
    )
    return parser


def _import_pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit(
            "--plot needs matplotlib, which is not installed: "
            "pip install matplotlib (or drop --plot)."
        ) from e
    return plt


# ------------------------------------------------------- backend harnesses


def _gpu_available(backend):
    if backend == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.list_physical_devices("GPU"))
    if backend == "jax":
        import jax

        try:
            return bool(jax.devices("gpu"))
        except RuntimeError:
            return False
    if backend == "torch":
        import torch

        return torch.cuda.is_available()
    return False


class _TensorFlowHarness:
    """tf.function per step; syncs by reading a scalar that depends on all."""

    def __init__(self, gpu):
        import tensorflow as tf

        self.tf = tf
        self.gpu = gpu

    def tensor(self, array):
        # tf.identity copies onto the device of the enclosing keras.device.
        return self.tf.identity(self.tf.constant(array))

    def keras_step(self, layer, mode, x, w, kwargs):
        tf = self.tf
        if mode == "infer":

            @tf.function
            def step(x, kwargs):
                y = layer(x, training=False, **kwargs)
                return y, tf.reduce_sum(y)

        else:

            @tf.function
            def step(x, kwargs):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = layer(x, training=True, **kwargs)
                    loss = tf.reduce_sum(y * w)
                grads = tape.gradient(loss, [x] + layer.trainable_variables)
                token = tf.add_n([loss] + [tf.reduce_sum(g) for g in grads])
                return (y, grads), token

        return lambda: step(x, kwargs)

    def block(self, result):
        result[1].numpy()

    def payload(self, result):
        return result[0]

    def numpy(self, tensor):
        return np.asarray(tensor)

    def describe_device(self):
        if not self.gpu:
            return "cpu"
        details = self.tf.config.experimental.get_device_details(
            self.tf.config.list_physical_devices("GPU")[0]
        )
        return f"gpu: {details.get('device_name', 'unknown')}"


def _set_threads(backend, threads):
    """Sizes the backend's CPU thread pools, before it runs anything."""
    if backend == "torch":
        import torch

        torch.set_num_threads(threads)
    elif backend == "tensorflow":
        import tensorflow as tf

        # Raises RuntimeError if TensorFlow already ran an op.
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    else:
        _jax_single_thread(threads)


def _jax_single_thread(threads):
    """Makes XLA's CPU backend single-threaded (the only count it can take
    from Python), which must happen before JAX starts its backends."""
    from jax._src import xla_bridge

    if threads != 1:
        raise SystemExit(
            f"--threads {threads}: on the JAX backend only --threads 1 is "
            "supported (XLA sizes its CPU thread pool itself)."
        )
    if xla_bridge.backends_are_initialized():
        raise SystemExit(
            "--threads 1 on JAX must be set before JAX starts; run the bench "
            "in a fresh process, or set XLA_FLAGS='--xla_cpu_multi_thread_eigen"
            "=false intra_op_parallelism_threads=1' yourself."
        )
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (
        f"{flags} --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    ).strip()


class _JaxHarness:
    """jax.jit of stateless_call (and of its value_and_grad)."""

    def __init__(self, gpu):
        import jax

        self.jax = jax
        self.gpu = gpu
        self.device = jax.devices("gpu" if gpu else "cpu")[0]

    def tensor(self, array):
        return self.jax.device_put(array, self.device)

    def keras_step(self, layer, mode, x, w, kwargs):
        jax = self.jax
        import jax.numpy as jnp

        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]
        training = mode == "train"

        def forward(trainable, x, kwargs):
            y, _ = layer.stateless_call(
                trainable, non_trainable, x, training=training, **kwargs
            )
            return y

        if mode == "infer":
            step = jax.jit(forward)
            return lambda: step(trainable, x, kwargs)

        def loss_fn(x, trainable, kwargs):
            y = forward(trainable, x, kwargs)
            return jnp.sum(y * w), y

        grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)

        @jax.jit
        def step(x, trainable, kwargs):
            (_, y), (gx, gw) = grad_fn(x, trainable, kwargs)
            return y, [gx] + list(gw)

        return lambda: step(x, trainable, kwargs)

    def block(self, result):
        self.jax.block_until_ready(result)

    def payload(self, result):
        return result

    def numpy(self, tensor):
        return np.asarray(tensor)

    def describe_device(self):
        if self.device.platform == "cpu":
            return "cpu"
        return f"{self.device.platform}: {self.device.device_kind}"


class _TorchHarness:
    """Eager PyTorch; syncs with torch.cuda.synchronize() on CUDA."""

    def __init__(self, gpu):
        import torch

        self.torch = torch
        self.gpu = gpu
        self.device = torch.device("cuda" if gpu else "cpu")

    def tensor(self, array):
        return self.torch.as_tensor(array, device=self.device)

    def _step(self, forward, params, mode, x, w):
        torch = self.torch
        if mode == "infer":

            def step():
                with torch.no_grad():
                    return forward(x)

            return step

        def step():
            x_leaf = x.detach().requires_grad_(True)
            y = forward(x_leaf)
            loss = (y * w).sum()
            grads = torch.autograd.grad(loss, [x_leaf] + params)
            return y, list(grads)

        return step

    def keras_step(self, layer, mode, x, w, kwargs):
        params = [v.value for v in layer.trainable_variables]
        training = mode == "train"
        return self._step(
            lambda x: layer(x, training=training, **kwargs), params, mode, x, w
        )

    def torch_module(self, cell, keras_layer, units):
        """nn.LSTM/GRU(bidirectional) with `keras_layer`'s weights."""
        from maskedrnn.convert import keras_to_torch_state_dict

        torch = self.torch
        features = keras_layer.forward_layer.cell.kernel.shape[0]
        cls = torch.nn.LSTM if cell == "lstm" else torch.nn.GRU
        module = cls(features, units, batch_first=True, bidirectional=True)
        state = keras_to_torch_state_dict([keras_layer.get_weights()])
        module.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        return module.to(self.device)

    def torch_step(self, module, packed, mode, x, w, lengths, return_state=False):
        torch = self.torch
        pack = torch.nn.utils.rnn.pack_padded_sequence
        unpack = torch.nn.utils.rnn.pad_packed_sequence
        # pack_padded_sequence wants the lengths on the CPU (it copies them
        # there otherwise): made once, outside the timed region.
        lengths_cpu = torch.as_tensor(lengths, dtype=torch.int64)
        total = x.shape[1]

        def forward(x):
            if not packed:
                y, hidden = module(x)
            else:
                seq = pack(x, lengths_cpu, batch_first=True, enforce_sorted=False)
                y, hidden = module(seq)
                y, _ = unpack(y, batch_first=True, total_length=total)
            if not return_state:
                return y
            # PyTorch's states are (2, batch, units) per kind (h, and c for
            # an LSTM): direction 0 forward, 1 backward, as ours' order.
            hidden = hidden if isinstance(hidden, tuple) else (hidden,)
            return _states_into_sequence(
                y, *[h[0] for h in hidden], *[h[1] for h in hidden]
            )

        return self._step(forward, list(module.parameters()), mode, x, w)

    def block(self, result):
        if self.gpu:
            self.torch.cuda.synchronize()

    def payload(self, result):
        return result

    def numpy(self, tensor):
        return tensor.detach().cpu().numpy()

    def describe_device(self):
        if not self.gpu:
            return "cpu"
        return f"cuda: {self.torch.cuda.get_device_name(0)}"


_HARNESSES = {
    "tensorflow": _TensorFlowHarness,
    "jax": _JaxHarness,
    "torch": _TorchHarness,
}


# ------------------------------------------------------------------ running


class _Progress:
    """A text progress bar on stderr (no dependency).

    Redrawn in place on a terminal; when stderr is a file or pipe, one line
    per tenth of the work, so that logs stay short.
    """

    def __init__(self, total, enabled, width=30):
        self.total, self.enabled, self.width, self.done = total, enabled, width, 0
        self.tty = enabled and sys.stderr.isatty()
        self.shown = -1

    def step(self, label):
        self.done += 1
        if not self.enabled:
            return
        tenth = 10 * self.done // max(self.total, 1)
        if not self.tty and tenth == self.shown:
            return
        self.shown = tenth
        filled = int(self.width * self.done / max(self.total, 1))
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"[{bar}] {self.done}/{self.total} {label:<30}"
        sys.stderr.write(f"\r{line}" if self.tty else f"{line}\n")
        sys.stderr.flush()

    def close(self):
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _max_abs_diff(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def _make_cell(cell, units, return_state=False):
    cls = keras.layers.LSTM if cell == "lstm" else keras.layers.GRU
    return cls(units, return_sequences=True, return_state=return_state)


class _StatesIntoSequence(keras.layers.Layer):
    """`--return-state`: wraps a bidirectional layer that returns
    `[sequence, forward states..., backward states...]` and returns one
    `(batch, time, 2 * units)` tensor, the sequence plus, broadcast over
    time, each state kind with its two directions concatenated. So the
    timed output, the loss and the checks all depend on the final states.
    """

    def __init__(self, layer, **kwargs):
        super().__init__(**kwargs)
        self.layer = layer
        self.supports_masking = True  # `mask=` goes on to `layer`

    def build(self, input_shape):
        if not self.layer.built:
            self.layer.build(input_shape)

    def call(self, x, **kwargs):
        return _states_into_sequence(*self.layer(x, **kwargs))


def _states_into_sequence(sequence, *states):
    """`sequence + [fwd_k, bwd_k]` for each state kind k, over all steps."""
    half = len(states) // 2
    for forward, backward in zip(states[:half], states[half:]):
        both = keras.ops.concatenate([forward, backward], axis=-1)
        sequence = sequence + keras.ops.expand_dims(both, 1)
    return sequence


def _settings(args, gpu):
    preset = args.preset
    if preset == "auto":
        preset = "gpu" if gpu else "cpu"
    settings = dict(PRESETS[preset])
    for key in ("batch", "time", "features", "units", "repeats", "warmup"):
        value = getattr(args, key)
        if value is not None:
            settings[key] = value
    for key in ("batch", "time", "features", "units", "repeats"):
        if settings[key] < 1:
            raise SystemExit(f"--{key} must be >= 1; got {settings[key]}.")
    if settings["warmup"] < 1:
        raise SystemExit(
            f"--warmup must be >= 1 (the first call compiles and is checked); "
            f"got {settings['warmup']}."
        )
    settings["preset"] = preset
    return settings


def run(args):
    """Runs the benchmark described by parsed `args`; returns the results."""
    backend = keras.backend.backend()
    if backend not in _HARNESSES:
        raise SystemExit(
            f"maskedrnn.bench runs on the tensorflow, jax and torch backends; "
            f"KERAS_BACKEND is {backend!r}."
        )
    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit(f"--threads must be >= 1; got {args.threads}.")
        _set_threads(backend, args.threads)
    gpu_here = _gpu_available(backend)
    if args.device == "gpu" and not gpu_here:
        raise SystemExit(
            f"--device gpu: no GPU is visible to the {backend} backend. Use "
            "--device cpu or auto."
        )
    gpu = gpu_here and args.device != "cpu"
    settings = _settings(args, gpu)
    b, t, d, u = (settings[k] for k in ("batch", "time", "features", "units"))
    try:
        lengths = parse_lengths(args.lengths, b, t, seed=args.seed)
    except ValueError as e:
        raise SystemExit(str(e)) from e
    available = [n for n in IMPLS if backend == "torch" or n not in TORCH_ONLY]
    impls = list(args.impl) if args.impl else available
    missing = [n for n in impls if n not in available]
    if missing:
        raise SystemExit(
            f"--impl {' '.join(missing)}: only on the torch backend "
            "(KERAS_BACKEND=torch)."
        )
    modes = list(MODES) if args.mode == "both" else [args.mode]
    if args.plot:
        _import_pyplot()  # fail before the long part, not after

    rng = np.random.default_rng(args.seed)
    mask_np = np.arange(t)[None, :] < lengths[:, None]
    x_np = rng.standard_normal((b, t, d)).astype("float32")
    x_np = np.where(mask_np[..., None], x_np, 0.0).astype("float32")
    w_np = rng.standard_normal((b, t, 2 * u)).astype("float32")

    harness = _HARNESSES[backend](gpu)
    # "cpu"/"gpu" without an index: on the torch backend (Keras 3.15)
    # keras.device("cpu:0") makes layers unbuildable (Variable.to("cpu:0")
    # drops the Parameter wrapper of the integer seed-generator state).
    with keras.device("gpu" if gpu else "cpu"):
        x = harness.tensor(x_np)
        w = harness.tensor(w_np)
        mask = harness.tensor(mask_np)
        lengths_t = harness.tensor(lengths)
        keras_layer = keras.layers.Bidirectional(
            _make_cell(args.cell, u, args.return_state)
        )
        ours = MaskedBidirectional(_make_cell(args.cell, u, args.return_state))
        keras_layer.build((None, None, d))
        ours.build((None, None, d))
        ours_timed, keras_timed = ours, keras_layer
        if args.return_state:
            ours_timed = _StatesIntoSequence(ours, name="ours_with_states")
            keras_timed = _StatesIntoSequence(keras_layer, name="keras_with_states")
            ours_timed.build((None, None, d))
            keras_timed.build((None, None, d))
        # Weights from --seed, the same on every backend, different in each
        # direction, uniform in +-1/sqrt(units) (PyTorch's RNN init).
        bound = 1 / math.sqrt(u)
        weights = [
            rng.uniform(-bound, bound, tuple(v.shape)).astype("float32")
            for v in keras_layer.weights
        ]
        keras_layer.set_weights(weights)
        ours.set_weights(weights)

        def make_step(name, mode):
            if name == "maskedrnn":
                return harness.keras_step(ours_timed, mode, x, w, {"mask": mask})
            if name == "maskedrnn_lengths":
                kwargs = {"lengths": lengths_t}
                return harness.keras_step(ours_timed, mode, x, w, kwargs)
            if name == "keras_masked":
                return harness.keras_step(keras_timed, mode, x, w, {"mask": mask})
            if name == "keras_unmasked":
                return harness.keras_step(keras_timed, mode, x, w, {})
            module = harness.torch_module(args.cell, keras_layer, u)
            packed = name == "torch_packed"
            return harness.torch_step(
                module, packed, mode, x, w, lengths, args.return_state
            )

        rows = _time_all(harness, impls, modes, make_step, settings, args)

    for row in rows:
        row["label"] = IMPLS[row["impl"]].format(cell=args.cell.upper())
    ratios = _ratios(rows, modes)
    results = {
        "config": {
            "backend": backend,
            "cell": args.cell,
            "batch": b,
            "time": t,
            "features": d,
            "units": u,
            "lengths": args.lengths,
            "mean_length": float(lengths.mean()),
            "padding_fraction": float(1 - mask_np.mean()),
            "modes": modes,
            "impls": impls,
            "repeats": settings["repeats"],
            "warmup": settings["warmup"],
            "preset": settings["preset"],
            "seed": args.seed,
            "threads": args.threads,
            "return_state": args.return_state,
        },
        "environment": _environment(backend, harness),
        "rows": rows,
        "ratios": ratios,
    }
    return results


def _time_all(harness, impls, modes, make_step, settings, args):
    repeats, warmup = settings["repeats"], settings["warmup"]
    cases = [(name, mode) for mode in modes for name in impls]
    ref_needed = [(REFERENCE, m) for m in modes if (REFERENCE, m) not in cases]
    torch_ref = "torch_packed" in impls
    progress = _Progress(
        len(ref_needed) + len(cases) * (warmup + repeats), not args.no_progress
    )

    # References first (also when not timed): Keras' masked outputs/gradients.
    steps, reference, packed_ref = {}, {}, {}
    for name, mode in ref_needed + cases:
        if (name, mode) not in steps:
            steps[name, mode] = make_step(name, mode)
    for name, mode in ref_needed:
        reference[mode] = _to_numpy(harness, steps[name, mode](), mode)
        progress.step(f"check {mode} {name}")

    # Warm-up; the first call of each case is the correctness check and
    # records which kernels ran (a trace, under tf.function / jax.jit).
    checks, kernels = {}, {}
    for name, mode in cases:
        for i in range(warmup):
            if i == 0:
                with _KernelRecorder() as recorder:
                    result = steps[name, mode]()
                kernels[name, mode] = recorder.summary()
            else:
                result = steps[name, mode]()
            harness.block(result)
            if i == 0:
                checks[name, mode] = _to_numpy(harness, result, mode)
                if name == REFERENCE:
                    reference[mode] = checks[name, mode]
                if name == "torch_packed":
                    packed_ref[mode] = checks[name, mode]
            progress.step(f"warm-up {mode} {name}")

    times = {case: [] for case in cases}
    for r in range(repeats):
        # Round-robin, rotated each repeat, so slow drifts hit all cases alike.
        shift = r % len(cases)
        for name, mode in cases[shift:] + cases[:shift]:
            step = steps[name, mode]
            start = time.perf_counter()
            result = step()
            harness.block(result)
            times[name, mode].append((time.perf_counter() - start) * 1e3)
            del result
            progress.step(f"{mode} {name}")
    progress.close()

    rows = []
    for name, mode in cases:
        ts = np.asarray(times[name, mode])
        out, grads = checks[name, mode]
        ref_out, ref_grads = reference[mode]
        row = {
            "impl": name,
            "mode": mode,
            "median_ms": float(np.median(ts)),
            "p25_ms": float(np.percentile(ts, 25)),
            "p75_ms": float(np.percentile(ts, 75)),
            "min_ms": float(ts.min()),
            "times_ms": [float(v) for v in ts],
            "reference": REFERENCE,
            "max_abs_diff": _max_abs_diff(out, ref_out),
            "expected_to_match": name not in CEILINGS,
            "kernels": kernels[name, mode],
        }
        if grads is not None:
            # Weight gradients compare where the weight layout is Keras'.
            n = len(grads) if name not in TORCH_ONLY else 1
            row["max_abs_grad_diff"] = max(
                _max_abs_diff(g, r) for g, r in zip(grads[:n], ref_grads[:n])
            )
            row["grad_diff_covers"] = "inputs" if n == 1 else "inputs+weights"
        if torch_ref and name in OURS:
            row["max_abs_diff_torch_packed"] = _max_abs_diff(out, packed_ref[mode][0])
            if grads is not None:
                row["max_abs_grad_diff_torch_packed"] = _max_abs_diff(
                    grads[0], packed_ref[mode][1][0]
                )
        rows.append(row)
    return rows


class _KernelRecorder:
    """Records the RNN kernel calls made while it is active (a `with` block).

    Wraps `keras.src.backend.lstm`, `gru` and `rnn` (the module attributes
    Keras' LSTM/GRU/RNN layers look up at call time) and, on the torch
    backend, `maskedrnn._torch_kernels.run`; each call appends a short
    description such as "backend.lstm computed, no mask".
    """

    _KERAS = ("lstm", "gru", "rnn")

    def __init__(self):
        from keras.src import backend as keras_backend

        self.calls = []
        self._targets = [(keras_backend, name) for name in self._KERAS]
        if keras.backend.backend() == "torch":
            from maskedrnn import _torch_kernels

            self._targets.append((_torch_kernels, "run"))
        self._saved = []

    def _wrap(self, name, original):
        label = "torch native kernel" if name == "run" else f"backend.{name}"
        signature = inspect.signature(original)

        def recorder(*args, **kwargs):
            mask = signature.bind(*args, **kwargs).arguments.get("mask")
            masked = "no mask" if mask is None else "with a mask"
            try:
                out = original(*args, **kwargs)
            except NotImplementedError:
                self.calls.append(f"{label} declined, {masked}")
                raise
            self.calls.append(f"{label} computed, {masked}")
            return out

        return recorder

    def __enter__(self):
        for module, name in self._targets:
            original = getattr(module, name)
            self._saved.append((module, name, original))
            setattr(module, name, self._wrap(name, original))
        return self

    def __exit__(self, *exc):
        for module, name, original in self._saved:
            setattr(module, name, original)
        self._saved = []
        return False

    def summary(self):
        """"backend.lstm computed, no mask x2; ..." in order of first call."""
        counts = {}
        for call in self.calls:
            counts[call] = counts.get(call, 0) + 1
        if not counts:
            return "no Keras RNN function or native kernel called"
        return "; ".join(f"{call} x{n}" for call, n in counts.items())


def _to_numpy(harness, result, mode):
    """(outputs, gradients or None) of one step as numpy arrays."""
    payload = harness.payload(result)
    if mode == "infer":
        return harness.numpy(payload), None
    y, grads = payload
    return harness.numpy(y), [harness.numpy(g) for g in grads]


def _ratios(rows, modes):
    median = {(r["impl"], r["mode"]): r["median_ms"] for r in rows}
    ratios = {}
    for mode in modes:
        ratios[mode] = {}
        for ours in OURS:
            for base in BASELINES:
                if (ours, mode) in median and (base, mode) in median:
                    value = median[ours, mode] / median[base, mode]
                    ratios[mode][f"{ours}/{base}"] = value
    return ratios


def _environment(backend, harness):
    env = {
        "python": platform.python_version(),
        "keras": keras.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "device": harness.describe_device(),
        # Other work on the machine skews timings; worth knowing afterwards.
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    module = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}[backend]
    env[module] = sys.modules[module].__version__
    if backend != "torch" and "torch" in sys.modules:
        env["torch"] = sys.modules["torch"].__version__
    return env


# ------------------------------------------------------------------- output


def format_table(results):
    """The results as a text table (one line per implementation and mode)."""
    c = results["config"]
    lines = [
        f"backend {c['backend']} on {results['environment']['device']}, "
        f"{c['cell'].upper()}, B={c['batch']} T={c['time']} D={c['features']} "
        f"U={c['units']}, lengths {c['lengths']} (mean {c['mean_length']:.1f}, "
        f"{100 * c['padding_fraction']:.0f}% padding)"
        f"{', with final states' if c.get('return_state') else ''}, median of "
        f"{c['repeats']} after {c['warmup']} warm-up",
        "",
    ]
    header = (
        f"{'mode':<6} {'implementation':<19} {'median ms':>10} {'IQR ms':>15} "
        f"{'ours/this':>9} {'max|d out|':>10} {'max|d grad|':>11}"
    )
    lines += [header, "-" * len(header)]
    median = {(r["impl"], r["mode"]): r["median_ms"] for r in results["rows"]}
    for r in results["rows"]:
        ours = median.get(("maskedrnn", r["mode"]))
        ratio = f"{ours / r['median_ms']:.2f}" if ours is not None else "-"
        grad = r.get("max_abs_grad_diff")
        flag = "" if r["expected_to_match"] else " *"
        lines.append(
            f"{r['mode']:<6} {r['impl']:<19} {r['median_ms']:>10.2f} "
            f"{r['p25_ms']:>7.2f}-{r['p75_ms']:<7.2f} {ratio:>9} "
            f"{r['max_abs_diff']:>10.1e} "
            f"{'-' if grad is None else f'{grad:.1e}':>11}{flag}"
        )
    lines.append("")
    lines.append(
        f"max|d|: largest difference from {REFERENCE} on this data (outputs; "
        "input and, for Keras layouts, weight gradients)."
    )
    lines.append("* ceiling: runs over the padding, so its results are wrong.")
    lines.append("kernels (first call of each; Keras' backend RNN functions, torch's):")
    for r in results["rows"]:
        if "kernels" in r:
            lines.append(f"  {r['mode']:<6} {r['impl']:<19} {r['kernels']}")
    for mode, ratios in results["ratios"].items():
        if ratios:
            parts = ", ".join(f"{k} = {v:.2f}" for k, v in ratios.items())
            lines.append(f"ratios ({mode}): {parts}")
    return "\n".join(lines)


def plot(results, path):
    """Writes a bar chart of the medians (one panel per mode) to `path`."""
    plt = _import_pyplot()
    c = results["config"]
    modes = c["modes"]
    fig, axes = plt.subplots(
        1,
        len(modes),
        figsize=(5.5 * len(modes), 0.5 * len(c["impls"]) + 1.6),
        squeeze=False,
    )
    for ax, mode in zip(axes[0], modes):
        rows = [r for r in results["rows"] if r["mode"] == mode][::-1]
        values = [r["median_ms"] for r in rows]
        colors = [
            "tab:green"
            if r["impl"] in OURS
            else "tab:gray"
            if r["impl"] in CEILINGS
            else "tab:blue"
            for r in rows
        ]
        bars = ax.barh([r["impl"] for r in rows], values, color=colors)
        errors = [
            [r["median_ms"] - r["p25_ms"] for r in rows],
            [r["p75_ms"] - r["median_ms"] for r in rows],
        ]
        ax.errorbar(values, range(len(rows)), xerr=errors, fmt="none", color="k")
        for bar, row in zip(bars, rows):
            y = bar.get_y() + bar.get_height() / 2
            ax.text(row["p75_ms"], y, f"  {row['median_ms']:.1f}", va="center")
        title = "forward + backward" if mode == "train" else "forward"
        ax.set_title(f"{title} (median ms, IQR)", fontsize=10)
        ax.set_xlim(0, max(r["p75_ms"] for r in rows) * 1.3)
    fig.suptitle(
        f"{c['backend']} ({results['environment']['device']}), "
        f"{c['cell'].upper()} B={c['batch']} T={c['time']} D={c['features']} "
        f"U={c['units']}, lengths {c['lengths']}  (gray: ceiling, wrong results)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    """Command-line entry point; returns the results dict."""
    args = build_parser().parse_args(argv)
    results = run(args)
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)
    return results


if __name__ == "__main__":
    main()
