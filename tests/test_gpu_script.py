"""`scripts/test_gpu.sh --dry-run`: the GPU check selects real tests.

The script runs on a GPU machine that CI does not have, so CI checks what
can be checked without one: on this backend, its test selection collects
(every file imports, and the count is not zero), a selection that collects
nothing makes it fail instead of passing silently, and its bench commands'
options parse.
"""

import os
import pathlib
import re
import subprocess
import sys

import keras
import pytest

BACKEND = keras.backend.backend()
ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "test_gpu.sh"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        BACKEND not in ("torch", "jax"),
        reason="the GPU machine has torch and JAX, no TensorFlow",
    ),
]


def dry_run(tmp_path, *options, **env):
    full_env = dict(os.environ, BACKENDS=BACKEND, PYTHON=sys.executable, **env)
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *options, str(tmp_path / "out")],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def full_dry_run(tmp_path_factory):
    """The dry run of every part, once for the tests that read it, and the
    folder it was given."""
    folder = tmp_path_factory.mktemp("dry_run")
    return dry_run(folder), folder


def test_dry_run_collects_the_gpu_tests_and_parses_the_bench_commands(full_dry_run):
    result, _ = full_dry_run
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    pattern = rf"KERAS_BACKEND={BACKEND}: (\d+) tests selected"
    selected = re.search(pattern, result.stdout)
    assert selected and int(selected.group(1)) > 50, result.stdout
    commands = [
        line for line in result.stdout.splitlines() if "-m maskedrnn.bench" in line
    ]
    # LSTM and GRU, with and without --return-state; then MaskedRNN (LSTM,
    # GRU) and two stacked bidirectional LSTMs.
    assert len(commands) == 7
    assert "7 bench commands parse" in result.stdout
    assert all("--padding pre" in c for c in commands)
    assert sum("--preset gpu --padding pre --cell" in c for c in commands) == 4
    assert sum("--return-state" in c for c in commands) == 2
    assert sum("--cell gru" in c for c in commands) == 3
    assert sum("--layer rnn" in c for c in commands) == 2
    assert sum("--preset stacked" in c for c in commands) == 1
    assert all(f"gpu-{BACKEND}-" in c and "--profile" in c for c in commands)
    assert not (full_dry_run[1] / "out" / "test_gpu.log").exists()  # ran nothing


def test_dry_run_fails_when_the_selection_is_empty(tmp_path):
    nothing = "tests/test_gpu_to_cpu.py -k no_such_test"
    result = dry_run(tmp_path, "--part", "tests", GPU_TESTS=nothing)
    assert result.returncode == 1
    assert f"KERAS_BACKEND={BACKEND}: 0 tests selected" in result.stdout



def run_probe(script, *options):
    """Runs `benchmarks/<script>` on this backend; returns the finished process
    (asserting it succeeded)."""
    result = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *options],
        cwd=ROOT,
        # Python puts scripts/ first on the path: import this checkout's
        # package, not whichever copy is installed.
        env=dict(os.environ, KERAS_BACKEND=BACKEND, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.skipif(BACKEND != "torch", reason="the probe is torch-only")
def test_the_saturated_lstm_probe_runs_and_is_exact_on_a_cpu(full_dry_run):
    """`benchmarks/cuda_saturated_lstm.py`, which `--part probes` runs on the GPU,
    works (here on the CPU, tiny sizes): the saturated call and the layer
    match PyTorch's packed LSTM, and every case is timed. The dry run
    names it."""
    result = run_probe("cuda_saturated_lstm.py", "--quick", "--device", "cpu")
    diffs = re.findall(r"saturated (\S+), maskedrnn (\S+)", result.stdout)
    assert len(diffs) == 4, result.stdout  # 1 and 2 directions, TF32 off and on
    assert all(float(d) < 1e-5 for pair in diffs for d in pair), result.stdout
    for case in ("keras_unmasked", "maskedrnn", "saturated", "torch_packed"):
        assert len(re.findall(rf"^ +{case} ", result.stdout, re.M)) == 4, result.stdout
    assert "benchmarks/cuda_saturated_lstm.py" in full_dry_run[0].stdout


@pytest.mark.skipif(BACKEND != "jax", reason="the probe is JAX-only")
def test_the_jax_seq_lengths_probe_runs_and_is_exact_on_a_cpu(full_dry_run):
    """`benchmarks/jax_cudnn_seq_lengths.py`, which `--part probes` runs on the
    GPU, works here with `--ref` (JAX's reference for the cuDNN call, tiny
    sizes): one call with per-row `seq_lengths` matches Keras' masked layer,
    bidirectional and one direction, and every case is timed. The dry run
    names it."""
    result = run_probe("jax_cudnn_seq_lengths.py", "--quick", "--ref")
    found = re.findall(
        r"^  (\w+) +[\d.]+ +[\d.]+ +(\d\.\de[-+]\d+)", result.stdout, re.M
    )
    diffs = {}
    for case, diff in found:
        diffs.setdefault(case, []).append(float(diff))
    assert sorted(diffs) == sorted(
        ["keras_unmasked", "maskedrnn", "cudnn_seq_lengths", "keras_masked"]
    ), result.stdout
    assert all(len(d) == 2 for d in diffs.values()), result.stdout  # bi, one
    for case in ("maskedrnn", "cudnn_seq_lengths", "keras_masked"):
        assert max(diffs[case]) < 1e-5, result.stdout
    assert min(diffs["keras_unmasked"]) > 1e-2, result.stdout  # padding read
    assert "benchmarks/jax_cudnn_seq_lengths.py" in full_dry_run[0].stdout
