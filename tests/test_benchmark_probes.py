"""The GPU probes of `benchmarks/`, run on a CPU at tiny sizes.

`benchmarks/cuda_saturated_lstm.py` (torch) and
`benchmarks/jax_cudnn_seq_lengths.py` (JAX) measure a candidate GPU path
on a GPU machine, by hand; here each must run and be exact on the CPU.
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

pytestmark = pytest.mark.slow


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
def test_the_saturated_lstm_probe_runs_and_is_exact_on_a_cpu():
    """`benchmarks/cuda_saturated_lstm.py` works (here on the CPU, tiny
    sizes): the saturated call and the layer match PyTorch's packed LSTM,
    and every case is timed."""
    result = run_probe("cuda_saturated_lstm.py", "--quick", "--device", "cpu")
    diffs = re.findall(r"saturated (\S+), maskedrnn (\S+)", result.stdout)
    assert len(diffs) == 4, result.stdout  # 1 and 2 directions, TF32 off and on
    assert all(float(d) < 1e-5 for pair in diffs for d in pair), result.stdout
    for case in ("keras_unmasked", "maskedrnn", "saturated", "torch_packed"):
        assert len(re.findall(rf"^ +{case} ", result.stdout, re.M)) == 4, result.stdout


@pytest.mark.skipif(BACKEND != "jax", reason="the probe is JAX-only")
def test_the_jax_seq_lengths_probe_runs_and_is_exact_on_a_cpu():
    """`benchmarks/jax_cudnn_seq_lengths.py` works here with `--ref` (JAX's
    reference for the cuDNN call, tiny sizes): one call with per-row
    `seq_lengths` matches Keras' masked layer, bidirectional and one
    direction, and every case is timed."""
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
