"""Training across processes (loopback only) matches one process.

Oracle: the same model, initial weights and global batches of 8 trained in
this (single) process with `model.fit(batch_size=8, shuffle=False)` and
SGD. Two worker processes on 127.0.0.1 each take half of every global batch
(rows `[0, 4)` and `[4, 8)`); they must end with identical weights, equal to
the oracle's (rtol 1e-5). The model has a `MaskedBidirectional` LSTM fed
`lengths` (rows of length 0 to T) and a `MaskedBidirectional` GRU fed a
Keras mask (one row left-padded).

- TensorFlow: `tf.distribute.MultiWorkerMirroredStrategy` (`TF_CONFIG`), with
  a custom training step under `strategy.run` (Keras 3.15's `fit` fails under
  this strategy before training: its `_maybe_symbolic_build` passes the
  input batch, a tuple, to `strategy.reduce`, which raises "Attempt to
  convert a value (PerReplica...)"; see docs/scaling.md).
- JAX: `jax.distributed.initialize` (2 CPU processes, gloo collectives) and
  `keras.distribution.DataParallel(auto_shard_dataset=False)` around plain
  `model.fit`: each process passes its own rows.
- torch: Keras has no torch distribution; `torch.distributed` (gloo) with
  `torch.nn.parallel.DistributedDataParallel` wrapped around the Keras model
  (a `torch.nn.Module` on this backend) and a `torch.optim.SGD` loop.

Each test runs only under its own backend's pytest process; the workers
have timeouts and exit by themselves.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional
from tests.helpers import BACKEND, ROOT

B, T, D, U = 8, 5, 3, 4
EPOCHS = 3
LR = 0.1
TIMEOUT = 420  # seconds for a whole run of the workers
GRACE = 30  # seconds the peers of a failed worker get before they are killed

# Shared by the workers: the model, and this worker's rows of each batch.
COMMON = r"""
import json, os, sys
import numpy as np
import keras
from maskedrnn import MaskedBidirectional

B, EPOCHS, LR = 8, 3, 0.1
RANK = int(os.environ["RANK"])
arrays = np.load(os.environ["DATA"])
x, lengths, y = arrays["x"], arrays["lengths"], arrays["y"]
weights = [arrays[f"w{i}"] for i in range(int(arrays["n_weights"]))]
PER = B // 2
MINE = np.concatenate(
    [np.arange(s + RANK * PER, s + (RANK + 1) * PER) for s in range(0, len(y), B)]
)


def build():
    keras.utils.set_random_seed(0)  # seed-generator states equal on every process
    inputs = keras.Input((None, x.shape[-1]))
    n_valid = keras.Input((), dtype="int32")
    seq = MaskedBidirectional(keras.layers.LSTM(4, return_sequences=True))(
        inputs, lengths=n_valid
    )
    masked = MaskedBidirectional(keras.layers.GRU(4))(keras.layers.Masking()(inputs))
    pooled = keras.layers.GlobalAveragePooling1D()(seq)
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([pooled, masked]))
    model = keras.Model([inputs, n_valid], out)
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    return model


def report(model, losses, replicas):
    print(json.dumps({"loss": losses, "replicas": replicas,
                      "w": [np.asarray(w).tolist() for w in model.get_weights()]}))
"""

TF_WORKER = (
    r"""
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
"""
    + COMMON
    + r"""
with strategy.scope():
    model = build()
    model.set_weights(weights)
    model.optimizer.build(model.trainable_variables)


def shard(context):
    per = context.get_per_replica_batch_size(B)
    ds = tf.data.Dataset.from_tensor_slices(((x[MINE], lengths[MINE]), y[MINE]))
    return ds.batch(per)


batches = strategy.distribute_datasets_from_function(shard)


def replica_step(inputs, target):
    with tf.GradientTape() as tape:
        per_row = tf.reduce_mean(tf.square(model(inputs, training=True) - target), -1)
        loss = tf.nn.compute_average_loss(per_row, global_batch_size=B)
    grads = tape.gradient(loss, model.trainable_variables)
    # Keras' optimizer all-reduces (sums) the replicas' gradients.
    model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def step(batch):
    return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)


losses = []
for _ in range(EPOCHS):
    values = [float(step(batch)) for batch in batches]
    losses.append(sum(values) / len(values))
report(model, losses, strategy.num_replicas_in_sync)
"""
)

JAX_WORKER = (
    r"""
import os

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=os.environ["COORDINATOR"], num_processes=2,
    process_id=int(os.environ["RANK"]), initialization_timeout=120,
)
"""
    + COMMON
    + r"""
# Each process passes its own rows: no auto-sharding.
keras.distribution.set_distribution(
    keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=False)
)
model = build()
model.set_weights(weights)
history = model.fit([x[MINE], lengths[MINE]], y[MINE], batch_size=PER,
                    epochs=EPOCHS, shuffle=False, verbose=0)
replicas = len(jax.devices())
jax.distributed.shutdown()
report(model, history.history["loss"], replicas)
"""
)

TORCH_WORKER = (
    r"""
import datetime
import gc
import os

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=os.environ["COORDINATOR"],
                        rank=int(os.environ["RANK"]), world_size=2,
                        timeout=datetime.timedelta(seconds=120))
"""
    + COMMON
    + r"""
model = build()
model.set_weights(weights)
ddp = torch.nn.parallel.DistributedDataParallel(model)  # averages gradients
optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
losses = []
for _ in range(EPOCHS):
    values = []
    for s in range(0, len(MINE), PER):
        rows = MINE[s : s + PER]
        pred = ddp([torch.tensor(x[rows]), torch.tensor(lengths[rows])])
        loss = torch.mean((pred - torch.tensor(y[rows])) ** 2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        both = loss.detach().clone()
        dist.all_reduce(both)
        values.append(float(both) / 2)
    losses.append(sum(values) / len(values))
replicas = dist.get_world_size()
# A clean teardown: no rank leaves while the other still communicates, and
# nothing that holds gloo work (DDP's reducer, its buckets) outlives the
# process group into interpreter shutdown, where gloo's threads abort.
dist.barrier()
del ddp, optimizer, pred, loss, both
gc.collect()
dist.destroy_process_group()
report(model, losses, replicas)
"""
)


def build_model():
    inputs = keras.Input((None, D))
    n_valid = keras.Input((), dtype="int32")
    seq = MaskedBidirectional(keras.layers.LSTM(U, return_sequences=True))(
        inputs, lengths=n_valid
    )
    masked = MaskedBidirectional(keras.layers.GRU(U))(keras.layers.Masking()(inputs))
    pooled = keras.layers.GlobalAveragePooling1D()(seq)
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([pooled, masked]))
    model = keras.Model([inputs, n_valid], out)
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    return model


def make_data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2 * B, T, D)).astype("float32")
    lengths = rng.integers(0, T + 1, 2 * B).astype("int32")
    x = x * (np.arange(T)[None] < lengths[:, None])[..., None]
    x[3] = x[3, ::-1]  # left-padded for the Masking branch
    y = rng.standard_normal((2 * B, 1)).astype("float32")
    return x, lengths, y


def free_ports(n):
    """Ports the OS reports free on 127.0.0.1 (bound, then released)."""
    sockets = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_workers(script, envs, data):
    """One `python -c script` per env, each the leader of its own process
    group (so that killing it kills whatever it started)."""
    procs = []
    for rank, extra in enumerate(envs):
        env = dict(
            os.environ,
            KERAS_BACKEND=BACKEND,
            JAX_PLATFORMS="cpu",
            CUDA_VISIBLE_DEVICES="",
            TF_CPP_MIN_LOG_LEVEL="3",
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
            RANK=str(rank),
            DATA=str(data),
            **extra,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", script],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    return procs


def wait_for_workers(procs, timeout=TIMEOUT, grace=GRACE):
    """Waits for every worker; returns `[(returncode, stdout, stderr)]`.

    A worker that fails leaves its peers blocked in a collective: they get
    `grace` seconds to finish, then are killed, and so is every worker still
    running after `timeout` seconds. No process outlives this call: each
    worker's whole process group is killed. Output is read in threads, so a
    full pipe never blocks a worker.
    """
    outputs = [None] * len(procs)

    def read(i):
        outputs[i] = procs[i].communicate()

    readers = [threading.Thread(target=read, args=(i,)) for i in range(len(procs))]
    for r in readers:
        r.start()
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                deadline = min(deadline, time.monotonic() + grace)
            time.sleep(0.2)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the worker and its children
            except ProcessLookupError:
                pass
        for r in readers:
            r.join()
    return [(p.returncode, *out) for p, out in zip(procs, outputs)]


def describe(rank, returncode, err):
    if returncode == -signal.SIGKILL:
        how = "was killed (it outlived a failed peer or the time limit)"
    elif returncode < 0:
        how = f"died of signal {signal.Signals(-returncode).name}"
    else:
        how = f"exited with status {returncode}"
    return f"worker {rank} {how}; its stderr ends with:\n{err[-3000:]}"


def run_workers(script, envs, tmp_path):
    """Starts one `python -c script` per env (with the data file), waits for
    all (see `wait_for_workers`) and returns their JSON reports, the
    single-process oracle's losses and its weights."""
    keras.utils.set_random_seed(0)
    model = build_model()
    x, lengths, y = make_data()
    weights = model.get_weights()
    data = tmp_path / "data.npz"
    arrays = {f"w{i}": w for i, w in enumerate(weights)}
    np.savez(data, x=x, lengths=lengths, y=y, n_weights=len(weights), **arrays)
    finished = wait_for_workers(start_workers(script, envs, data))
    failed = [
        describe(rank, code, err)
        for rank, (code, _, err) in enumerate(finished)
        if code != 0
    ]
    assert not failed, "\n\n".join(failed)
    results = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in finished]

    # The oracle: one process, the same global batches.
    model.set_weights(weights)
    history = model.fit(
        [x, lengths], y, batch_size=B, epochs=EPOCHS, shuffle=False, verbose=0
    )
    return results, history.history["loss"], model.get_weights()


def assert_replicas_match_single_process(results, loss, weights):
    first, second = results
    assert first["replicas"] == second["replicas"] == 2
    assert np.all(np.isfinite(loss)) and loss[-1] < loss[0]
    for a, b in zip(first["w"], second["w"]):
        np.testing.assert_array_equal(a, b)  # replicas stay in sync
    for result in results:
        np.testing.assert_allclose(result["loss"], loss, rtol=1e-5)
        for a, b in zip(result["w"], weights):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # two TensorFlow processes that connect over gRPC
@pytest.mark.skipif(
    BACKEND != "tensorflow", reason="TensorFlow multi-worker test (TF run only)"
)
def test_multi_worker_mirrored_strategy_two_processes(tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    envs = [
        {
            "TF_CONFIG": json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": i}}
            )
        }
        for i in range(2)
    ]
    assert_replicas_match_single_process(*run_workers(TF_WORKER, envs, tmp_path))


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "jax", reason="JAX multi-process test (JAX run only)")
def test_jax_distributed_data_parallel_two_processes(tmp_path):
    (port,) = free_ports(1)
    envs = [{"COORDINATOR": f"127.0.0.1:{port}"}] * 2
    assert_replicas_match_single_process(*run_workers(JAX_WORKER, envs, tmp_path))


@pytest.mark.slow
@pytest.mark.skipif(
    BACKEND != "torch", reason="torch.distributed test (torch run only)"
)
def test_torch_distributed_ddp_two_processes(tmp_path):
    (port,) = free_ports(1)
    envs = [{"COORDINATOR": f"tcp://127.0.0.1:{port}"}] * 2
    assert_replicas_match_single_process(*run_workers(TORCH_WORKER, envs, tmp_path))


def test_a_failed_worker_ends_the_run_with_its_message(tmp_path):
    """The launcher itself: rank 0 fails at once while rank 1 (and a child
    it started) would block for ten minutes, as a peer blocked in a
    collective would. The run ends after the grace period with rank 0's
    status and stderr, and neither rank 1 nor its child survives."""
    child_pid = tmp_path / "child.pid"
    script = (
        "import os, subprocess, sys, time\n"
        "if os.environ['RANK'] == '0':\n"
        "    sys.exit('rank 0 gives up')\n"
        "sleeper = [sys.executable, '-c', 'import time; time.sleep(600)']\n"
        "child = subprocess.Popen(sleeper)\n"
        f"open({str(child_pid)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    start = time.monotonic()
    finished = wait_for_workers(
        start_workers(script, [{}, {}], tmp_path / "unused.npz"), timeout=60, grace=3
    )
    assert time.monotonic() - start < 30
    (code0, _, err0), (code1, _, _) = finished
    assert code0 == 1 and "rank 0 gives up" in err0
    assert code1 == -signal.SIGKILL
    assert "worker 0 exited with status 1" in describe(0, code0, err0)
    assert "was killed" in describe(1, code1, "")
    stat = pathlib.Path(f"/proc/{int(child_pid.read_text())}/stat")
    for _ in range(50):  # the kill is asynchronous: wait for the child to go
        # Gone, or a zombie (dead, waiting for its new parent to reap it).
        if not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the child of the killed worker still runs: {stat.read_text()}")
