"""Train and save where the suite runs (with a CUDA GPU: on the GPU, through
cuDNN), then load and predict on a CPU, in a fresh process that sees no GPU.

The saved predictions are checked first against the oracle, Keras'
`Bidirectional` with the same weights fed the same (left-padded) mask; the
CPU process must then predict the same. On a CPU-only machine both sides
would be the CPU, and the test would only check the save -> fresh process
-> load path, which tests/test_deploy.py covers on CPUs already (across backends):
so without a GPU this test is skipped, to keep CI short; scripts/gpu_check.py
runs it where a GPU is. This module is also the worker of that process:
`python -m tests.test_gpu_to_cpu WORKDIR`.
"""

import sys

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional, bench
from tests.helpers import run_module_on_backend, to_np

BACKEND = keras.backend.backend()
V, B, T, U = 10, 6, 8, 5


def build(oracle=False):
    wrapper = keras.layers.Bidirectional if oracle else MaskedBidirectional
    inputs = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(V, 4, mask_zero=True)(inputs)
    x = wrapper(keras.layers.LSTM(U, return_sequences=True))(x)
    x = wrapper(keras.layers.GRU(U, return_sequences=True))(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    return keras.Model(inputs, outputs)


def batch(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, size=B)
    ids = rng.integers(1, V, size=(B, T))
    ids[np.arange(T)[None, :] < T - lengths[:, None]] = 0  # left-padded
    return ids.astype("int32")


@pytest.mark.skipif(
    not bench.gpu_available(BACKEND),
    reason="GPU -> CPU: needs a GPU (CPU save/load: tests/test_deploy.py)",
)
def test_saved_on_this_device_loads_and_predicts_on_a_cpu(tmp_path):
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    ids = batch(1)
    labels = np.random.default_rng(2).integers(0, 3, size=(B, T))
    model.fit(ids, labels, epochs=1, batch_size=3, verbose=0)
    expected = to_np(model.predict(ids, verbose=0))
    oracle = build(oracle=True)
    oracle.set_weights(model.get_weights())
    np.testing.assert_allclose(
        to_np(oracle.predict(ids, verbose=0)), expected, atol=1e-5
    )
    model.save(tmp_path / "model.keras")
    np.save(tmp_path / "ids.npy", ids)

    run_module_on_backend("tests.test_gpu_to_cpu", tmp_path, BACKEND)
    got = np.load(tmp_path / "cpu_predictions.npy")
    np.testing.assert_allclose(got, expected, atol=1e-5)


def _worker(workdir):
    """In the fresh CPU-only process: load the file, predict, save."""
    import pathlib

    workdir = pathlib.Path(workdir)
    model = keras.models.load_model(workdir / "model.keras")
    ids = np.load(workdir / "ids.npy")
    np.save(workdir / "cpu_predictions.npy", to_np(model.predict(ids, verbose=0)))


if __name__ == "__main__":
    _worker(sys.argv[1])
