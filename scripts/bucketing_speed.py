"""Seconds per epoch of `model.fit` with length bucketing vs padding to T.

Usage (writes the JSON that docs/scaling.md quotes):

    python scripts/bucketing_speed.py --backends tensorflow,jax \
        --tasks synthetic --out docs/results/bucketing_speed_steady.json

Runs every backend in a child process of its own (`--backends`), each with
one thread (`torch.set_num_threads(1)`, TensorFlow intra/inter-op 1, XLA's
Eigen thread pool off), because the machine is shared. For each seed, the
models below start from the same initial weights and each is trained by ONE
`model.fit(..., epochs=--epochs, shuffle=False)`; a
`keras.callbacks.Callback` times every epoch (`on_epoch_begin` to
`on_epoch_end`) and every train step, and records the 1-minute load average
at the end of each epoch. The first epoch (tracing, compilation) is reported
but left out: a model's steady epoch time is the median of its later
epochs, and the ratio of a seed is `median(variant) / median(padded)`.
Variants (`--variants`):

* `padded`: the sequences padded to the global length T, `fit` with
  `batch_size` (always run: it is the reference);
* `bucketed`: `maskedrnn.bucketing.BucketedDataset` (quantile boundaries,
  each batch padded to its bucket's boundary);
* `carry`: the same with `carry_remainder=True` (each bucket's incomplete
  last batch moves on to the next bucket: every batch full but the last);
* `carry_tf` (TensorFlow only): the `carry` dataset fed as
  `BucketedDataset.to_tf_dataset()`, whose spec keeps the batch size when
  every batch is full (a `PyDataset`'s spec has a free batch axis);
* `tfdata` (TensorFlow only): `tf.data.Dataset.bucket_by_sequence_length`
  with the same boundaries (`pad_to_bucket_boundary=True`), the recipe of
  docs/scaling.md, fed from in-memory padded arrays and reshuffled each epoch.

Per-step times are also grouped by batch shape `(rows, padded length)` for
the PyDataset variants (from the batches the dataset built, in order).
Final test accuracy of every model is recorded (masked accuracy for the
synthetic tagging task).

Tasks: `synthetic` (`make_distance_to_end_task`, lengths uniform in
[20, 100], T = 100, Embedding(mask_zero) -> MaskedBidirectional(LSTM 64,
return_sequences) -> Dense(8)) and `vowels` (Japanese Vowels, lengths 7-29,
Masking -> MaskedBidirectional(LSTM 64) -> Dense(9)).
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _configure_backend(backend):
    if backend == "torch":
        import torch

        torch.set_num_threads(1)
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def _synthetic(seed, n_train, n_test):
    from maskedrnn.datasets import make_distance_to_end_task

    ids, labels, lengths = make_distance_to_end_task(
        n_train + n_test, 100, vocab_size=16, n_classes=8, min_length=20, seed=seed
    )
    seqs = [ids[i, :n] for i, n in enumerate(lengths)]
    tags = [labels[i, :n] for i, n in enumerate(lengths)]
    return {
        "x": seqs[:n_train],
        "y": tags[:n_train],
        "x_pad": ids[:n_train],
        "y_pad": labels[:n_train],
        "x_test": ids[n_train:],
        "y_test": labels[n_train:],
        "lengths": lengths[:n_train],
        "maxlen": 100,
    }


def _vowels():
    from maskedrnn.datasets import load_japanese_vowels, pad_batch

    x_train, y_train = load_japanese_vowels("train")
    x_test, y_test = load_japanese_vowels("test")
    frames = np.concatenate(x_train)
    mean, std = frames.mean(0), frames.std(0)
    x_train = [(s - mean) / std for s in x_train]
    x_test = [(s - mean) / std for s in x_test]
    maxlen = max(len(s) for s in x_train + x_test)
    return {
        "x": x_train,
        "y": y_train,
        "x_pad": pad_batch(x_train, maxlen=maxlen)[0],
        "y_pad": y_train,
        "x_test": pad_batch(x_test, maxlen=maxlen)[0],
        "y_test": y_test,
        "lengths": np.asarray([len(s) for s in x_train]),
        "maxlen": maxlen,
    }


def _build(task, units, jit_compile="auto"):
    import keras

    import maskedrnn

    if task == "synthetic":
        inputs = keras.Input((None,), dtype="int32")
        h = keras.layers.Embedding(16, 16, mask_zero=True)(inputs)
        h = maskedrnn.MaskedBidirectional(
            keras.layers.LSTM(units, return_sequences=True)
        )(h)
        outputs = keras.layers.Dense(8, activation="softmax")(h)
        loss = maskedrnn.MaskedLoss("sparse_categorical_crossentropy", pad_value=-1)
        metrics = [maskedrnn.MaskedAccuracy(pad_value=-1)]
    else:
        inputs = keras.Input((None, 12))
        h = keras.layers.Masking()(inputs)
        h = maskedrnn.MaskedBidirectional(keras.layers.LSTM(units))(h)
        outputs = keras.layers.Dense(9, activation="softmax")(h)
        loss, metrics = "sparse_categorical_crossentropy", ["accuracy"]
    model = keras.Model(inputs, outputs)
    model.compile(
        keras.optimizers.Adam(3e-3), loss=loss, metrics=metrics, jit_compile=jit_compile
    )
    return model


def _test_accuracy(model, data):
    result = model.evaluate(
        data["x_test"], data["y_test"], batch_size=256, verbose=0, return_dict=True
    )
    return float(result.get("masked_accuracy", result.get("accuracy")))


def _timer():
    import keras

    class EpochTimer(keras.callbacks.Callback):
        """Seconds of every epoch (wall clock, and CPU seconds of the whole
        process) and of every train step, and the 1-minute load average at
        the end of every epoch."""

        def __init__(self):
            super().__init__()
            self.seconds, self.cpu, self.steps, self.load = [], [], [], []

        def on_epoch_begin(self, epoch, logs=None):
            self.steps.append([])
            self._cpu = time.process_time()
            self._epoch = time.perf_counter()

        def on_train_batch_begin(self, batch, logs=None):
            self._step = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.steps[-1].append(time.perf_counter() - self._step)

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self._epoch)
            self.cpu.append(time.process_time() - self._cpu)
            self.load.append(os.getloadavg()[0])

    return EpochTimer()


def _tf_buckets(data, boundaries, batch_size, seed):
    """The `tf.data.Dataset.bucket_by_sequence_length` recipe with the
    boundaries of `BucketedDataset` (a bucket of lengths <= b is padded to
    b), fed from the in-memory padded arrays, reshuffled every epoch."""
    import tensorflow as tf

    n = len(data["lengths"])
    examples = tf.data.Dataset.from_tensor_slices(
        (data["x_pad"], data["y_pad"], np.asarray(data["lengths"], "int32"))
    )
    examples = examples.shuffle(n, seed=seed, reshuffle_each_iteration=True)
    per_step = np.ndim(data["y_pad"]) > 1  # else one label per sequence
    examples = examples.map(lambda x, y, k: (x[:k], y[:k] if per_step else y))
    return examples.bucket_by_sequence_length(
        element_length_func=lambda x, y: tf.shape(x)[0],
        bucket_boundaries=[b + 1 for b in boundaries],  # lengths < b + 1
        bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
        padding_values=(
            tf.constant(0, data["x_pad"].dtype),
            tf.constant(-1, data["y_pad"].dtype),
        ),
        pad_to_bucket_boundary=True,
    ).prefetch(tf.data.AUTOTUNE)


def _padded_steps(ds):
    """Time steps the RNN runs in epoch 0 of `ds`, padding included: each
    batch's rows times the boundary it is padded to."""
    return sum(len(b) * ds.sampler.boundary_of(b) for b in ds.sampler.batches(epoch=0))


def _record_shapes(ds):
    """Makes `ds` record the `(rows, padded length)` of every batch it
    builds, in order, in `ds.fetched`."""
    ds.fetched = []
    make_batch = ds.make_batch

    def recording(indices):
        ds.fetched.append(f"{len(indices)}x{ds.sampler.boundary_of(indices)}")
        return make_batch(indices)

    ds.make_batch = recording


def _steps_by_shape(timer, ds):
    """Median step milliseconds per batch shape `(rows, padded length)` over
    the epochs after the first. The batches built last are the ones trained
    on, in order (before them, `fit` may build a few to infer its spec)."""
    steps = [t for epoch in timer.steps for t in epoch]
    if len(ds.fetched) < len(steps):
        return None
    shapes = ds.fetched[len(ds.fetched) - len(steps) :]
    by_shape = {}
    for shape, t in list(zip(shapes, steps))[len(timer.steps[0]) :]:
        by_shape.setdefault(shape, []).append(t)
    return {
        k: {"count": len(v), "median_ms": 1000 * float(np.median(v))}
        for k, v in sorted(by_shape.items())
    }


def measure_one_fit(
    task,
    seeds,
    epochs,
    batch_size,
    units,
    num_buckets,
    n_train,
    n_test,
    variants,
    jit_compile,
):
    """Runs in the child process: one `fit(epochs=epochs)` per model."""
    import keras

    from maskedrnn.bucketing import BucketedDataset

    backend = keras.backend.backend()
    _configure_backend(backend)
    variants = [v for v in variants if v != "padded"]
    if backend != "tensorflow":
        variants = [v for v in variants if v not in ("tfdata", "carry_tf")]
    runs = []
    for seed in seeds:
        data = _synthetic(seed, n_train, n_test) if task == "synthetic" else _vowels()
        keras.utils.set_random_seed(seed)
        first = _build(task, units, jit_compile)
        weights = first.get_weights()
        run = {"seed": seed, "variants": {}}
        for name in ["padded"] + variants:
            model = first if name == "padded" else _build(task, units, jit_compile)
            model.set_weights(weights)
            timer = _timer()
            entry = {}
            if name == "padded":
                model.fit(
                    data["x_pad"],
                    data["y_pad"],
                    batch_size=batch_size,
                    epochs=epochs,
                    shuffle=True,
                    verbose=0,
                    callbacks=[timer],
                )
                entry["batches_per_epoch"] = -(-len(data["x_pad"]) // batch_size)
                entry["padded_steps_fraction"] = 1.0
            elif name in ("bucketed", "carry", "carry_tf"):
                ds = BucketedDataset(
                    data["x"],
                    data["y"],
                    batch_size=batch_size,
                    num_buckets=num_buckets,
                    seed=seed,
                    carry_remainder=name != "bucketed",
                )
                batches = ds.sampler.batches(epoch=0)
                steps = _padded_steps(ds)
                slots = sum(ds.sampler.boundary_of(b) for b in batches)
                run["boundaries"] = ds.boundaries
                _record_shapes(ds)
                entry["batches_per_epoch"] = len(batches)
                entry["padded_steps_fraction"] = steps / (
                    len(data["x"]) * data["maxlen"]
                )
                entry["batch_steps_fraction"] = slots / (
                    -(-len(data["x"]) // batch_size) * data["maxlen"]
                )
                model.fit(
                    ds.to_tf_dataset() if name == "carry_tf" else ds,
                    epochs=epochs,
                    shuffle=False,
                    verbose=0,
                    callbacks=[timer],
                )
                entry["step_ms_by_shape"] = _steps_by_shape(timer, ds)
            else:  # tfdata
                boundaries = BucketedDataset(
                    data["x"], data["y"], num_buckets=num_buckets, seed=seed
                ).boundaries
                ds = _tf_buckets(data, boundaries, batch_size, seed)
                model.fit(ds, epochs=epochs, verbose=0, callbacks=[timer])
                entry["batches_per_epoch"] = len(timer.steps[-1])
            entry["seconds"] = timer.seconds
            entry["load_avg_1min"] = timer.load
            entry["cpu_seconds"] = timer.cpu
            entry["steady_s"] = float(np.median(timer.seconds[1:]))
            entry["steady_cpu_s"] = float(np.median(timer.cpu[1:]))
            entry["median_step_ms"] = 1000 * float(
                np.median([t for ep in timer.steps[1:] for t in ep])
            )
            entry["test_accuracy"] = _test_accuracy(model, data)
            run["variants"][name] = entry
        padded = run["variants"]["padded"]["steady_s"]
        run["ratios"] = {
            v: run["variants"][v]["steady_s"] / padded for v in run["variants"]
        }
        padded = run["variants"]["padded"]["steady_cpu_s"]
        run["cpu_ratios"] = {
            v: run["variants"][v]["steady_cpu_s"] / padded for v in run["variants"]
        }
        runs.append(run)
    summary = {}
    for v in ["padded"] + variants:
        ratios = [run["ratios"][v] for run in runs]
        summary[v] = {
            "median_ratio": float(np.median(ratios)),
            "min_ratio": float(np.min(ratios)),
            "max_ratio": float(np.max(ratios)),
            "median_steady_s": float(
                np.median([run["variants"][v]["steady_s"] for run in runs])
            ),
            "median_cpu_ratio": float(np.median([r["cpu_ratios"][v] for r in runs])),
            "test_accuracy": [run["variants"][v]["test_accuracy"] for run in runs],
        }
    loads = [
        x for run in runs for e in run["variants"].values() for x in e["load_avg_1min"]
    ]
    return {
        "backend": backend,
        "task": task,
        "mode": "one-fit",
        "jit_compile": jit_compile,
        "epochs": epochs,
        "n_train": len(data["x"]),
        "summary": summary,
        "load_avg_1min_range": [float(min(loads)), float(max(loads))],
        "runs": runs,
    }


def _results(paths):
    """The `results` entries of the result files `paths`, in order."""
    results = []
    for path in paths:
        with open(path) as f:
            results += json.load(f)["results"]
    return results


def steady_table(paths):
    """The Markdown table of docs/scaling.md from one-fit result files."""
    lines = [
        "| backend | task | variant | ratio to padded, median (range) | "
        "CPU-time ratio | steady s/epoch | batches/epoch | padded steps | "
        "test accuracy (seeds) | load avg 1 min |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in _results(paths):
        runs = r["runs"]
        for v, summary in r["summary"].items():
            entries = [run["variants"][v] for run in runs]
            fractions = [e.get("padded_steps_fraction") for e in entries]
            steps = "-" if None in fractions else f"{np.mean(fractions):.2f}"
            batches = sorted({e["batches_per_epoch"] for e in entries})
            loads = [x for e in entries for x in e["load_avg_1min"]]
            accuracy = ", ".join(f"{a:.3f}" for a in summary["test_accuracy"])
            seeds = ",".join(str(run["seed"]) for run in runs)
            ratio = (
                "1"
                if v == "padded"
                else f"{summary['median_ratio']:.2f} "
                f"({summary['min_ratio']:.2f}-{summary['max_ratio']:.2f})"
            )
            name = v + (" (XLA)" if r.get("jit_compile") is True else "")
            lines.append(
                f"| {r['backend']} | {r['task']} | {name} | {ratio} | "
                f"{summary['median_cpu_ratio']:.2f} | "
                f"{summary['median_steady_s']:.3f} | "
                f"{'/'.join(str(b) for b in batches)} | {steps} | "
                f"{accuracy} ({seeds}) | {min(loads):.2f}-{max(loads):.2f} |"
            )
    return "\n".join(lines)


def table(paths):
    """The Markdown table of docs/scaling.md from result files."""
    return steady_table(paths)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="tensorflow,jax,torch")
    parser.add_argument("--tasks", default="synthetic,vowels")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=4, help="first one is warm-up")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument("--num-buckets", type=int, default=8)
    parser.add_argument("--n-train", type=int, default=512)
    parser.add_argument("--n-test", type=int, default=256)
    parser.add_argument("--out", help="JSON file to write (default: stdout only)")
    parser.add_argument(
        "--table", nargs="+", metavar="JSON", help="print the Markdown table of files"
    )
    parser.add_argument(
        "--variants",
        default="bucketed,padded",
        help="one-fit mode: padded (always), bucketed, carry, tfdata (TensorFlow)",
    )
    parser.add_argument(
        "--jit-compile",
        action="store_true",
        help="compile(jit_compile=True) for every model (default: 'auto')",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.child:
        common = (
            seeds,
            args.epochs,
            args.batch_size,
            args.units,
            args.num_buckets,
            args.n_train,
            args.n_test,
        )
        results = [
            measure_one_fit(
                task,
                *common,
                args.variants.split(","),
                True if args.jit_compile else "auto",
            )
            for task in args.tasks.split(",")
        ]
        print(json.dumps(results))
        return 0
    command = [sys.executable, os.path.abspath(__file__), "--child"] + [
        a for a in (argv if argv is not None else sys.argv[1:]) if a != "--out"
    ]
    if args.out:
        command = [c for c in command if c != args.out]
    results = []
    for backend in args.backends.split(","):
        env = dict(
            os.environ,
            KERAS_BACKEND=backend,
            JAX_PLATFORMS="cpu",
            CUDA_VISIBLE_DEVICES="",
            TF_CPP_MIN_LOG_LEVEL="3",
        )
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        _one_thread_env(env)
        out = subprocess.run(command, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        for r in json.loads(out.stdout.strip().splitlines()[-1]):
            results.append(r)
            print(
                f"{r['backend']:<10} {r['task']:<9} steady s/epoch, ratio to "
                "padded (median over seeds), accuracies: "
                + "; ".join(
                    f"{v} {m['median_steady_s']:.3f} s {m['median_ratio']:.2f} "
                    + "/".join(f"{a:.3f}" for a in m["test_accuracy"])
                    for v, m in r["summary"].items()
                )
                + f"; load {r['load_avg_1min_range']}",
                flush=True,
            )
    report = {
        "command": "python scripts/bucketing_speed.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "results": results,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def _one_thread_env(env):
    env.setdefault("OMP_NUM_THREADS", "1")
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = (
        f"{flags} --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    ).strip()


if __name__ == "__main__":
    sys.exit(main())
