"""Seconds per epoch of `model.fit` with length bucketing vs padding to T.

Usage (writes the JSON that docs/scaling.md quotes):

    python scripts/bucketing_speed.py --out docs/results/bucketing_speed.json

Runs every backend in a child process of its own (`--backends`), each with
one thread (`torch.set_num_threads(1)`, TensorFlow intra/inter-op 1, XLA's
Eigen thread pool off), because the machine is shared. For each seed, two
models start from the same initial weights:

* `bucketed`: `maskedrnn.bucketing.BucketedDataset` (quantile boundaries,
  each batch padded to its bucket's boundary);
* `padded`: the same sequences padded to the global length T, `fit` with
  `batch_size`.

Epochs alternate (bucketed, padded, bucketed, ...) in one process; the first
epoch of each (compilation) is reported but left out of the ratios; the
ratio of each later pair is `bucketed / padded`, and the summary quotes
medians over all pairs and seeds. Final test accuracy of both models is
recorded (masked accuracy for the synthetic tagging task).

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
        "maxlen": maxlen,
    }


def _build(task, units):
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
    model.compile(keras.optimizers.Adam(3e-3), loss=loss, metrics=metrics)
    return model


def measure(task, seeds, epochs, batch_size, units, num_buckets, n_train, n_test):
    """Runs in the child process; returns a JSON-able dict for one backend."""
    import keras

    from maskedrnn.bucketing import BucketedDataset

    backend = keras.backend.backend()
    _configure_backend(backend)
    runs = []
    for seed in seeds:
        data = _synthetic(seed, n_train, n_test) if task == "synthetic" else _vowels()
        ds = BucketedDataset(
            data["x"],
            data["y"],
            batch_size=batch_size,
            num_buckets=num_buckets,
            seed=seed,
        )
        steps = sum(
            len(b) * ds.sampler.boundary_of(b) for b in ds.sampler.batches(epoch=0)
        )
        keras.utils.set_random_seed(seed)
        bucketed = _build(task, units)
        padded = _build(task, units)
        padded.set_weights(bucketed.get_weights())
        seconds = {"bucketed": [], "padded": []}
        for _ in range(epochs):
            start = time.perf_counter()
            bucketed.fit(ds, epochs=1, verbose=0)
            seconds["bucketed"].append(time.perf_counter() - start)
            start = time.perf_counter()
            padded.fit(
                data["x_pad"], data["y_pad"], batch_size=batch_size, epochs=1, verbose=0
            )
            seconds["padded"].append(time.perf_counter() - start)
        accuracy = {}
        for name, model in (("bucketed", bucketed), ("padded", padded)):
            result = model.evaluate(
                data["x_test"],
                data["y_test"],
                batch_size=256,
                verbose=0,
                return_dict=True,
            )
            accuracy[name] = float(
                result.get("masked_accuracy", result.get("accuracy"))
            )
        ratios = [b / p for b, p in zip(seconds["bucketed"][1:], seconds["padded"][1:])]
        runs.append(
            {
                "seed": seed,
                "boundaries": ds.boundaries,
                "padded_steps_fraction": steps / (len(data["x"]) * data["maxlen"]),
                "seconds": seconds,
                "ratios": ratios,
                "test_accuracy": accuracy,
            }
        )
    all_ratios = [r for run in runs for r in run["ratios"]]
    return {
        "backend": backend,
        "task": task,
        "median_ratio": float(np.median(all_ratios)),
        "min_ratio": float(np.min(all_ratios)),
        "max_ratio": float(np.max(all_ratios)),
        "median_epoch_s": {
            k: float(np.median([s for run in runs for s in run["seconds"][k][1:]]))
            for k in ("bucketed", "padded")
        },
        "runs": runs,
    }


def table(paths):
    """The Markdown table of docs/scaling.md from result files."""
    lines = [
        "| backend | task | median ratio (range) | pairs | median s/epoch "
        "bucketed / padded | padded steps | test accuracy bucketed / padded |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        for r in report["results"]:
            runs = r["runs"]
            pairs = sum(len(run["ratios"]) for run in runs)
            steps = np.mean([run["padded_steps_fraction"] for run in runs])
            accuracy = ", ".join(
                f"{run['test_accuracy']['bucketed']:.3f} / "
                f"{run['test_accuracy']['padded']:.3f}"
                for run in runs
            )
            lines.append(
                f"| {r['backend']} | {r['task']} | {r['median_ratio']:.2f} "
                f"({r['min_ratio']:.2f}-{r['max_ratio']:.2f}) | {pairs} | "
                f"{r['median_epoch_s']['bucketed']:.2f} / "
                f"{r['median_epoch_s']['padded']:.2f} | {steps:.2f} | {accuracy} |"
            )
    return "\n".join(lines)


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
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.child:
        results = [
            measure(
                task,
                seeds,
                args.epochs,
                args.batch_size,
                args.units,
                args.num_buckets,
                args.n_train,
                args.n_test,
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
            print(
                f"{r['backend']:<10} {r['task']:<9} bucketed/padded median "
                f"{r['median_ratio']:.2f} (range {r['min_ratio']:.2f}-"
                f"{r['max_ratio']:.2f}); s/epoch {r['median_epoch_s']['bucketed']:.2f}"
                f" vs {r['median_epoch_s']['padded']:.2f}; accuracy "
                + ", ".join(
                    f"{run['test_accuracy']['bucketed']:.3f}/"
                    f"{run['test_accuracy']['padded']:.3f}"
                    for run in r["runs"]
                ),
                flush=True,
            )
            results.append(r)
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
