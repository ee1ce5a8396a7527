"""The first-call figures: how long the first `fwd` and `fwd+bwd` take in a
fresh function, trace and compilation included.

What a user waits for before the first batch is done: on TensorFlow a new
`tf.function` is traced and its graph optimised, on JAX a new `jax.jit` is
traced and compiled by XLA, on torch the first eager call of new layers
runs. Each call gets new layers (built, with the run's weights, before the
clock starts) and a new compiled function, inside the harness'
`fresh_compilation()`, which clears what the backend would otherwise reuse
from the warm-up at the same shapes (JAX's in-memory caches; the
`tf.function`s maskedrnn's modules keep). Measured after the steady-state
timing, so the process' one-off start-up costs (imports, the first
compilation of anything) fall on no implementation in particular; each
repeat times every case once, in a new random order, and the figure is the
median of `--first-call-repeats` such calls.
"""

import time

import numpy as np


def measure(harness, cases, make_step, orders, checks, to_numpy, progress):
    """Times the first call of a fresh step of every case.

    Args:
        harness: The backend's `Harness`.
        cases: List of `(impl, mode)` pairs.
        make_step: `make_step(impl, mode, fresh=True)` returns a step on new
            layers.
        orders: One permutation of `range(len(cases))` per repeat.
        checks: `{(impl, mode): (outputs, gradients or None)}` of the warm
            steps, as numpy arrays.
        to_numpy: `to_numpy(harness, result, mode)` gives a step's result as
            `checks` holds it.
        progress: A `timing.Progress`, stepped once per call.

    Returns:
        `{(impl, mode): (times in ms, largest absolute difference of the
        fresh calls' outputs and gradients from the warm step's)}`.
    """
    times = {case: [] for case in cases}
    diffs = {case: 0.0 for case in cases}
    for permutation in orders:
        for i in permutation:
            name, mode = cases[i]
            with harness.fresh_compilation():
                step = make_step(name, mode, fresh=True)
                start = time.perf_counter()
                result = step()
                harness.block(result)
                times[name, mode].append((time.perf_counter() - start) * 1e3)
            out, grads = to_numpy(harness, result, mode)
            ref_out, ref_grads = checks[name, mode]
            pairs = [(out, ref_out)] + list(zip(grads or [], ref_grads or []))
            diff = max(float(np.max(np.abs(a - b))) for a, b in pairs)
            diffs[name, mode] = max(diffs[name, mode], diff)
            del result
            progress.step(f"first call {mode} {name}")
    return {case: (times[case], diffs[case]) for case in cases}


def add_to_rows(rows, measured):
    """Adds `first_call_ms` (median), `first_call_times_ms` and
    `first_call_max_abs_diff` to each row `measured` has."""
    for row in rows:
        case = (row["impl"], row["mode"])
        if case not in measured:
            continue
        ts, diff = measured[case]
        row["first_call_ms"] = float(np.median(ts))
        row["first_call_times_ms"] = [float(v) for v in ts]
        row["first_call_max_abs_diff"] = diff
