"""Running the benchmark: data, layers, checks, kernel records and timing."""

import re
import sys
import time

import keras
import numpy as np

from maskedrnn import backends
from maskedrnn.bench import config, first_call, kernels, report
from maskedrnn.bench.config import CEILINGS, IMPLS, REFERENCE, TORCH_ONLY
from maskedrnn.bench.layers import BenchLayers, states_into_sequence


def backend_module(backend):
    """The harness module of `backend` (tensorflow, jax or torch)."""
    if backend == "tensorflow":
        from maskedrnn.bench import harness_tensorflow as module
    elif backend == "jax":
        from maskedrnn.bench import harness_jax as module
    elif backend == "torch":
        from maskedrnn.bench import harness_torch as module
    else:
        raise SystemExit(
            f"maskedrnn.bench runs on the tensorflow, jax and torch backends; "
            f"KERAS_BACKEND is {backend!r}."
        )
    return module


def gpu_available(backend):
    """Whether `backend` sees a GPU (False for a backend the bench lacks)."""
    if backend not in ("tensorflow", "jax", "torch"):
        return False
    return backend_module(backend).gpu_available()


class Progress:
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


def max_abs_diff(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def run(args):
    """Runs the benchmark described by parsed `args`; returns the results."""
    backend = backends.name()
    module = backend_module(backend)
    restore = _threads_restorer(backend)
    # Thread pools are sized first: TensorFlow and JAX take it only before
    # they start (and asking JAX for its GPUs starts it).
    threads, threads_note = args.threads, None
    if threads is not None:
        if threads < 1:
            raise SystemExit(f"--threads must be >= 1; got {threads}.")
        threads_note = module.set_threads(threads)
    try:
        gpu_here = module.gpu_available()
        if args.device == "gpu" and not gpu_here:
            raise SystemExit(
                f"--device gpu: no GPU is visible to the {backend} backend. Use "
                "--device cpu or auto."
            )
        gpu = gpu_here and args.device != "cpu"
        if threads is None:
            threads_note = module.default_threads_note(gpu)
            if backend == "torch" and not gpu:
                threads, _ = module.auto_threads()
                module.set_threads(threads)
        results = _checked_run(args, backend, module, gpu)
    finally:
        restore()
    results["config"]["threads"] = threads
    results["config"]["threads_note"] = threads_note
    return results


def _threads_restorer(backend):
    """On torch, a function that puts back the intra-op thread count (the
    bench may run inside another program, e.g. the tests)."""
    if backend != "torch":
        return lambda: None
    import torch

    previous = torch.get_num_threads()
    return lambda: torch.set_num_threads(previous)


def _checked_run(args, backend, module, gpu):
    settings = config.settings_from(args, gpu)
    b, t = settings["batch"], settings["time"]
    try:
        lengths = config.parse_lengths(args.lengths, b, t, seed=args.seed)
    except ValueError as e:
        raise SystemExit(str(e)) from e
    padding = getattr(args, "padding", "post")
    available = [
        n
        for n in IMPLS
        if (backend == "torch" or n not in TORCH_ONLY)
        and (padding == "post" or n not in config.POST_ONLY)
    ]
    impls = list(args.impl) if args.impl else available
    wrong_backend = [n for n in impls if n in TORCH_ONLY and backend != "torch"]
    if wrong_backend:
        raise SystemExit(
            f"--impl {' '.join(wrong_backend)}: only on the torch backend "
            "(KERAS_BACKEND=torch)."
        )
    post_only = [n for n in impls if n not in available]
    if post_only:
        raise SystemExit(
            f"--impl {' '.join(post_only)}: lengths= describes right-padded "
            f"rows, so it needs --padding post; got --padding {padding}."
        )
    slow_repeats = getattr(args, "slow_repeats", None)
    if slow_repeats is not None and slow_repeats < 1:
        raise SystemExit(f"--slow-repeats must be >= 1; got {slow_repeats}.")
    if getattr(args, "first_call_repeats", 0) < 0:
        raise SystemExit(
            f"--first-call-repeats must be >= 0 (0: no first calls); got "
            f"{args.first_call_repeats}."
        )
    ours = [n for n in impls if n in config.OURS]
    for kernel in getattr(args, "kernels", None) or ():
        impls += [f"{n}{config.KERNEL_SEPARATOR}{kernel}" for n in ours]
    modes = list(config.MODES) if args.mode == "both" else [args.mode]
    if args.plot:
        report.import_pyplot()  # fail before the long part, not after
    return _run(args, backend, module, gpu, settings, lengths, padding, impls, modes)


def _run(args, backend, module, gpu, settings, lengths, padding, impls, modes):
    b, t, d, u = (settings[k] for k in ("batch", "time", "features", "units"))
    rng = np.random.default_rng(args.seed)
    mask_np = config.make_mask(lengths, t, padding, seed=args.seed + 1)
    x_np = rng.standard_normal((b, t, d)).astype("float32")
    x_np = np.where(mask_np[..., None], x_np, 0.0).astype("float32")
    kind = getattr(args, "layer", "bidirectional")
    directions = config.LAYERS[kind]["directions"]
    w_np = rng.standard_normal((b, t, directions * u)).astype("float32")
    order = None if padding == "post" else config.valid_first_permutation(mask_np)

    harness = module.Harness(gpu)
    # "cpu"/"gpu" without an index: on the torch backend (Keras 3.15)
    # keras.device("cpu:0") makes layers unbuildable (Variable.to("cpu:0")
    # drops the Parameter wrapper of the integer seed-generator state).
    with keras.device("gpu" if gpu else "cpu"):
        x = harness.tensor(x_np)
        w = harness.tensor(w_np)
        mask = harness.tensor(mask_np)
        lengths_t = harness.tensor(lengths)
        n = settings["layers"]

        layers = BenchLayers(args.cell, kind, u, d, n, args.return_state, rng=rng)
        with_states = None
        if args.return_state:

            def with_states(outputs):
                return states_into_sequence(*outputs, directions=directions)

        def make_step(name, mode, fresh=False):
            """The step of `name` in `mode`; `fresh`: on new layers (and,
            on torch, a new PyTorch module) with the same weights."""
            base, kernel = config.split_impl(name)
            if kernel is not None:
                step = make_step(base, mode, fresh)

                def forced_step():
                    with backends.force(kernel):
                        return step()

                return forced_step
            built = layers
            if fresh:
                built = BenchLayers(
                    args.cell, kind, u, d, n, args.return_state, layers.weights
                )
            ours_timed, keras_timed = built.ours_timed, built.keras_timed
            if name == "maskedrnn":
                return harness.keras_step(
                    ours_timed, mode, x, w, {"mask": mask}, with_states
                )
            if name == "maskedrnn_lengths":
                kwargs = {"lengths": lengths_t}
                return harness.keras_step(ours_timed, mode, x, w, kwargs, with_states)
            if name == "keras_masked":
                return harness.keras_step(
                    keras_timed, mode, x, w, {"mask": mask}, with_states
                )
            if name == "keras_unmasked":
                return harness.keras_step(keras_timed, mode, x, w, {}, with_states)
            torch_module = harness.torch_module(
                args.cell, built.keras_layers, u, bidirectional=directions == 2
            )
            packed = name == "torch_packed"
            return harness.torch_step(
                torch_module,
                packed,
                mode,
                x,
                w,
                lengths,
                args.return_state,
                order,
                directions,
            )

        declined = []
        rows = _time_all(harness, impls, modes, make_step, settings, args, declined)

    for row in rows:
        names = {k: str(v) for k, v in config.LAYERS[kind].items()}
        cell_names = config.CELLS[args.cell]
        names["keras"] = names["keras"].format(cell=cell_names["keras"])
        row["label"] = config.label(
            row["impl"], torch_cell=cell_names["torch"], **names
        )
    results = {
        "config": {
            "backend": backend,
            "cell": args.cell,
            "layer": kind,
            "batch": b,
            "time": t,
            "features": d,
            "units": u,
            "layers": settings["layers"],
            "lengths": args.lengths,
            "padding": padding,
            "mean_length": float(lengths.mean()),
            "padding_fraction": float(1 - mask_np.mean()),
            "modes": modes,
            "impls": impls,
            "repeats": settings["repeats"],
            "warmup": settings["warmup"],
            "preset": settings["preset"],
            "seed": args.seed,
            "order_seed": getattr(args, "order_seed", 0),
            "return_state": args.return_state,
            "profile": bool(getattr(args, "profile", False)),
            "kernels": list(getattr(args, "kernels", None) or ()),
            "slow_repeats": getattr(args, "slow_repeats", None),
            "first_call_repeats": getattr(args, "first_call_repeats", 0) or 0,
            "first_call_fresh": harness.fresh_description(),
        },
        "environment": report.environment(backend, harness),
        "rows": rows,
        "ratios": report.ratios(rows, modes),
    }
    if any("first_call_ms" in row for row in rows):
        results["first_call_ratios"] = report.ratios(rows, modes, "first_call_ms")
    if declined:
        results["declined"] = declined
    return results


def _profile(harness, step):
    """`harness.profile(step)`; a profiler that fails (e.g. no CUPTI on a GPU
    machine) must not lose the timings, so its error is recorded instead."""
    try:
        return harness.profile(step)
    except Exception as e:  # recorded in the results, not swallowed
        return {
            "tool": "failed",
            "cuda_kernels": [],
            "cuda_kernels_top": [],
            "cuda_kernels_total": 0,
            "host_events_total": 0,
            "rnn_ops": [],
            "note": f"the profiler failed: {type(e).__name__}: {e}",
        }


def _to_numpy(harness, result, mode):
    """(outputs, gradients or None) of one step as numpy arrays."""
    payload = harness.payload(result)
    if mode == "infer":
        return harness.numpy(payload), None
    y, grads = payload
    return harness.numpy(y), [harness.numpy(g) for g in grads]


def declined_reason(error):
    """The sentence of a `maskedrnn.backends.Declined` error, without the
    call's arguments that Keras' layer call adds around it."""
    lines = [
        re.sub(r"\x1b\[[0-9;]*m", "", line).strip()
        for line in str(error).splitlines()
    ]
    for line in lines:
        if "cannot run here" in line or " has no " in line:
            return line
    return " ".join(line for line in lines if line)


def _declined(error):
    """The `maskedrnn.backends.Declined` that `error` is or was raised
    from (its `__cause__` / `__context__` chain), else None."""
    while error is not None:
        if isinstance(error, backends.Declined):
            return error
        error = error.__cause__ or error.__context__
    return None


def case_orders(cases, repeats, seed=0):
    """The order the bench times its `cases` in, one permutation per repeat.

    Every case once per repeat, so slow drifts hit all cases alike, in a
    new random order each time, so that no case always follows the same
    one: a step timed right after a training step of another
    implementation finds the caches and the allocator in another state
    than one timed after a small inference step (a fixed rotation made the
    first inference case always follow the last training case). The same
    `seed` (`--order-seed`) gives the same orders; `maskedrnn.bench.runs`
    gives each of its rounds another.

    Args:
        cases: Int, how many cases are timed.
        repeats: Int, how many times each is timed.
        seed: Int, seed of the orders. Defaults to `0`.

    Returns:
        A list of `repeats` permutations of `range(cases)`.
    """
    rng = np.random.default_rng(seed)
    return [rng.permutation(cases) for _ in range(repeats)]


def _time_all(harness, impls, modes, make_step, settings, args, declined):
    """Checks, warms up, times (and profiles) every case; returns the rows.
    A forced kernel the backend declines in a mode is appended to `declined`
    (`{"impl", "mode", "reason"}`) and not timed."""
    repeats, warmup = settings["repeats"], settings["warmup"]
    slow_repeats = getattr(args, "slow_repeats", None)

    def warmups(name):
        return 1 if slow_repeats is not None and config.is_slow(name) else warmup

    def cap(name):
        if slow_repeats is not None and config.is_slow(name):
            return min(slow_repeats, repeats)
        return repeats

    cases = [(name, mode) for mode in modes for name in impls]
    ref_needed = [(REFERENCE, m) for m in modes if (REFERENCE, m) not in cases]
    torch_ref = "torch_packed" in impls
    profile = bool(getattr(args, "profile", False))
    first_repeats = getattr(args, "first_call_repeats", 0) or 0
    progress = Progress(
        len(ref_needed)
        + sum(warmups(name) + cap(name) + profile + first_repeats for name, _ in cases),
        not args.no_progress,
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
    checks, calls = {}, {}
    for name, mode in list(cases):
        for i in range(warmups(name)):
            if i == 0:
                try:
                    with kernels.KernelRecorder() as recorder:
                        result = steps[name, mode]()
                except Exception as error:
                    # Under tf.function a Declined of the trace comes back
                    # wrapped (a StagingError whose context is the Declined).
                    if _declined(error) is None or config.split_impl(name)[1] is None:
                        raise
                    declined.append(
                        {
                            "impl": name,
                            "mode": mode,
                            "reason": declined_reason(_declined(error)),
                        }
                    )
                    cases.remove((name, mode))
                    break
                calls[name, mode] = recorder.calls
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
    # Until the call returned, before waiting for the device: on a GPU the
    # host's share of a repeat (a median near `median_ms`: bound by the host).
    host = {case: [] for case in cases}
    for permutation in case_orders(
        len(cases), repeats, getattr(args, "order_seed", 0)
    ):
        for i in permutation:
            name, mode = cases[i]
            if len(times[name, mode]) >= cap(name):
                continue
            step = steps[name, mode]
            start = time.perf_counter()
            result = step()
            returned = time.perf_counter()
            harness.block(result)
            times[name, mode].append((time.perf_counter() - start) * 1e3)
            host[name, mode].append((returned - start) * 1e3)
            del result
            progress.step(f"{mode} {name}")

    # Profiles after the timing, so the profiler's overhead times nothing.
    profiles = {}
    if profile:
        for name, mode in cases:
            profiles[name, mode] = _profile(harness, steps[name, mode])
            progress.step(f"profile {mode} {name}")
    # First calls of fresh steps last (see maskedrnn.bench.first_call), in
    # their own random orders: on JAX they clear the caches of the warm
    # steps, which the profiles run again.
    first = {}
    if first_repeats:
        orders = case_orders(
            len(cases), first_repeats, getattr(args, "order_seed", 0) + 1
        )
        first = first_call.measure(
            harness, cases, make_step, orders, checks, _to_numpy, progress
        )
    progress.close()

    rows = []
    for name, mode in cases:
        ts = np.asarray(times[name, mode])
        out, grads = checks[name, mode]
        ref_out, ref_grads = reference[mode]
        p25, p75 = np.percentile(ts, 25), np.percentile(ts, 75)
        row = {
            "impl": name,
            "mode": mode,
            "median_ms": float(np.median(ts)),
            "p25_ms": float(p25),
            "p75_ms": float(p75),
            "iqr_ms": float(p75 - p25),
            "min_ms": float(ts.min()),
            "times_ms": [float(v) for v in ts],
            "host_median_ms": float(np.median(host[name, mode])),
            "reference": REFERENCE,
            "max_abs_diff": max_abs_diff(out, ref_out),
            "expected_to_match": name not in CEILINGS,
            "kernels": kernels.summarize(calls[name, mode]),
            "kernel_calls": calls[name, mode],
            "cudnn": kernels.cudnn_verdict(calls[name, mode]),
        }
        if profile:
            row["profile"] = profiles[name, mode]
        if grads is not None:
            # Weight gradients compare where the weight layout is Keras'.
            n = len(grads) if name not in TORCH_ONLY else 1
            row["max_abs_grad_diff"] = max(
                max_abs_diff(g, r) for g, r in zip(grads[:n], ref_grads[:n])
            )
            row["grad_diff_covers"] = "inputs" if n == 1 else "inputs+weights"
        if torch_ref and config.is_ours(name):
            row["max_abs_diff_torch_packed"] = max_abs_diff(out, packed_ref[mode][0])
            if grads is not None:
                row["max_abs_grad_diff_torch_packed"] = max_abs_diff(
                    grads[0], packed_ref[mode][1][0]
                )
        rows.append(row)
    first_call.add_to_rows(rows, first)
    return rows
