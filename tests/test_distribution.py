"""Data-parallel training of MaskedBidirectional matches single-device training.

Oracle: the same model, same initial weights, same global batches, trained on
one device in the same process. Two CPU devices are made before the backend
starts, so each case runs in a subprocess (device setup must precede any op
and would break the other tests):

- TensorFlow: `tf.distribute.MirroredStrategy` over two logical CPUs
  (`tf.config.set_logical_device_configuration`);
- JAX: `keras.distribution.DataParallel` over two host devices
  (`XLA_FLAGS=--xla_force_host_platform_device_count=2`).

Each replica gets half of every global batch of 64, and the rows differ in
length (0 to T, one left-padded row through a mask), so per-replica batches
hold different padding. On TensorFlow the 32 rows of a replica run an LSTM
direction in 2 length tiers, so the replicas' threads trace and share the
LSTM's called gradient graph. Losses and final weights must agree (rtol
1e-5).
"""

import json
import os

import numpy as np
import pytest

from tests.helpers import BACKEND, run_python

COMMON = r"""
import json
import numpy as np
import keras
from maskedrnn import MaskedBidirectional

B, T, D, U = 64, 5, 3, 4


def build():
    x = keras.Input((None, D))
    lengths = keras.Input((), dtype="int32")
    seq = MaskedBidirectional(keras.layers.LSTM(U, return_sequences=True))(
        x, lengths=lengths
    )
    masked = MaskedBidirectional(keras.layers.GRU(U))(keras.layers.Masking()(x))
    pooled = keras.layers.GlobalAveragePooling1D()(seq)
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([pooled, masked]))
    model = keras.Model([x, lengths], out)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2 * B, T, D)).astype("float32")
    lengths = rng.integers(0, T + 1, 2 * B).astype("int32")
    x = x * (np.arange(T)[None] < lengths[:, None])[..., None]
    x[3] = x[3, ::-1]  # left-padded for the Masking branch
    y = rng.standard_normal((2 * B, 1)).astype("float32")
    return [x, lengths], y


def train(model, weights):
    model.set_weights(weights)
    inputs, y = data()
    history = model.fit(inputs, y, epochs=3, batch_size=B, shuffle=False, verbose=0)
    return history.history["loss"], [w.tolist() for w in model.get_weights()]
"""

TF_SCRIPT = (
    r"""
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)
"""
    + COMMON
    + r"""
single = build()
weights = single.get_weights()
loss_1, w_1 = train(single, weights)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    mirrored = build()
loss_2, w_2 = train(mirrored, weights)
copies = len(mirrored.weights[0].value.values)  # a MirroredVariable per replica
print(json.dumps({"replicas": strategy.num_replicas_in_sync, "copies": copies,
                  "single": loss_1,
                  "parallel": loss_2, "w_single": w_1, "w_parallel": w_2}))
"""
)

JAX_SCRIPT = (
    r"""
import jax
"""
    + COMMON
    + r"""
single = build()
weights = single.get_weights()
loss_1, w_1 = train(single, weights)
keras.distribution.set_distribution(
    keras.distribution.DataParallel(devices=jax.devices())
)
parallel = build()
loss_2, w_2 = train(parallel, weights)
copies = len(parallel.weights[0].value.sharding.device_set)  # replicated
print(json.dumps({"replicas": len(jax.devices()), "copies": copies,
                  "single": loss_1,
                  "parallel": loss_2, "w_single": w_1, "w_parallel": w_2}))
"""
)


def run_script(script, backend, **env):
    stdout = run_python(["-c", script], backend, **env)
    return json.loads(stdout.strip().splitlines()[-1])


def assert_same_training(result):
    assert result["replicas"] == 2 and result["copies"] == 2
    assert np.all(np.isfinite(result["single"]))
    np.testing.assert_allclose(result["parallel"], result["single"], rtol=1e-5)
    for a, b in zip(result["w_parallel"], result["w_single"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="tf.distribute runs on the TF backend only (PyTorch: Keras 3.15 has "
    "no data-parallel fit for torch)",
)
def test_mirrored_strategy_on_two_cpus_matches_one_device():
    assert_same_training(run_script(TF_SCRIPT, "tensorflow"))


@pytest.mark.skipif(
    BACKEND != "jax",
    reason="keras.distribution (DataParallel) is implemented for JAX only: on "
    "PyTorch keras.distribution.list_devices() fails (no torch distribution "
    "backend in Keras 3.15), and torch DDP wraps models outside Keras' fit",
)
def test_jax_data_parallel_on_two_host_devices_matches_one_device():
    flags = os.environ.get("XLA_FLAGS", "")
    result = run_script(
        JAX_SCRIPT,
        "jax",
        XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count=2".strip(),
    )
    assert_same_training(result)
