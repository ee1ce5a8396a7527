"""The test section of `scripts/gpu_check.py`: a smoke subset of the suite.

It runs in a subprocess under pytest (pytest-timeout where installed),
its output into the check's log, within the check's budget.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The smoke subset: what a GPU changes (devices, cuDNN, profiles, saving on
# the GPU and loading on a CPU) without the long parametrized grids.
SMOKE = [
    "tests/test_bench_kernels.py",
    "tests/test_gpu_to_cpu.py",
    "tests/test_final_state.py",
    "tests/test_backends.py",
    "tests/test_precision.py",
    "tests/test_masked_bidirectional.py::test_gradients_match_keras",
    "tests/test_masked_bidirectional.py::test_lengths_equal_right_padded_mask",
]
SMOKE_TORCH = ["tests/test_torch_kernels.py"]
# JAX compiles each test's functions anew, for 10 s or more each on a GPU:
# its subset leaves out what does not depend on the device (precision
# policies and right-padded parity run in every CPU job).
SMOKE_JAX_LEAVES_OUT = [
    "tests/test_precision.py",
    "tests/test_masked_bidirectional.py::test_lengths_equal_right_padded_mask",
]
# First: the one-call kernel's tests. On torch they are device-agnostic, so
# on a GPU they check cuDNN itself against Keras' masked layer and
# PyTorch's packed module (TF32 off, tests/conftest.py): every padding,
# initial states, float16 and bfloat16, go_backwards,
# return_sequences=False, every merge mode, the input width, no host sync.
# On JAX: cuDNN's LSTM against JAX's reference on both of its paths (the
# padding flag, per-row lengths), and the held tail against per-row lengths.
SMOKE_FUSED = {
    "torch": ["tests/test_torch_fused.py"],
    "jax": [
        "tests/test_jax_fused.py::test_cudnn_matches_reference",
        "tests/test_jax_fused.py::test_a_held_tail_equals_per_row_lengths",
    ],
}
# --quick: short tests show the section runs pytest and records it (on
# torch, one of the one-call kernel's tests too).
SMOKE_QUICK = [
    "tests/test_bench_kernels.py::test_conftest_turns_tf32_off_for_every_test",
]
SMOKE_QUICK_FUSED = {
    "torch": ["tests/test_torch_fused.py::test_merge_modes_without_states"],
}


def smoke_selection(backend, quick):
    """The pytest arguments of the smoke subset, in the order they run."""
    if quick:
        return SMOKE_QUICK_FUSED.get(backend, []) + SMOKE_QUICK
    torch_only = SMOKE_TORCH if backend == "torch" else []
    common = SMOKE
    if backend == "jax":
        common = [t for t in SMOKE if t not in SMOKE_JAX_LEAVES_OUT]
    return SMOKE_FUSED.get(backend, []) + common + torch_only


def smoke_tests(check, backend, device, tests_s):
    """Runs the smoke subset in a subprocess, its output into the log, for
    at most `tests_s` seconds."""
    quick = check.args.quick
    selection = smoke_selection(backend, quick)
    left = check.budget.left() - 2
    limit = min(tests_s, left)
    record = check.results["tests"] = {"selection": selection}
    if limit < 10:
        record["skipped"] = f"no time left ({max(left, 0):.0f} s)"
        check.log(f"[tests] skipped: {record['skipped']}")
        return
    # -v: a test per line, so that a run stopped at its limit still says
    # which tests passed.
    argv = [sys.executable, "-m", "pytest", "-q" if quick else "-v"]
    argv += ["-p", "no:cacheprovider", "-rfEs"]
    argv += ["--durations=10"]
    if importlib.util.find_spec("xdist") is not None:
        argv += ["-n", "0"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        argv += ["--timeout", str(int(max(limit / 2, 5)))]
    argv += selection
    env = dict(os.environ, KERAS_BACKEND=backend)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    if device == "cpu":
        env.update(CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    record.update(argv=argv[1:], limit_s=round(limit, 1))
    check.log(f"[tests] {' '.join(argv[1:])} (limit {limit:.0f} s)")
    offset = check.log_path.stat().st_size
    started = time.monotonic()
    with open(check.log_path, "a") as log:
        try:
            done = subprocess.run(
                argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                timeout=limit,
            )
            record["returncode"] = done.returncode
        except subprocess.TimeoutExpired:
            record["returncode"] = None
            record["skipped"] = f"stopped at the {limit:.0f} s limit"
    record["seconds"] = round(time.monotonic() - started, 1)
    with open(check.log_path) as f:
        f.seek(offset)
        output = f.read()
    record["summary"] = [
        line for line in output.splitlines()
        if " passed" in line or " failed" in line or " error" in line
    ][-1:]
    record["output_tail"] = output[-4000:]
    if record["returncode"] is None:
        # Stopped at its limit: not a pass, whatever ran before it.
        lines = output.splitlines()
        passed = sum(1 for line in lines if " PASSED" in line)
        failed = sum(1 for line in lines if " FAILED" in line or " ERROR" in line)
        record["counts"] = {"passed": passed, "failed": failed}
        check.failures.append(
            f"tests: stopped at the {limit:.0f} s limit ({passed} passed, "
            f"{failed} failed before it)"
        )
    elif record["returncode"] != 0:
        check.failures.append(f"tests: pytest exit {record['returncode']}")
    check.log(f"[tests] exit {record['returncode']} in {record['seconds']} s")
