"""`python -m maskedrnn --bucket`: seconds per epoch with and without bucketing."""

import time

import keras
import numpy as np

from maskedrnn import backends
from maskedrnn._checks import check_int
from maskedrnn.backends.torch_threads import torch_cpu_threads
from maskedrnn.bucketing import BucketedDataset
from maskedrnn.demo.data import distance_data, vowels_data
from maskedrnn.demo.models import accuracy, build_model, compile_model, predict_logits
from maskedrnn.demo.settings import check_settings


def run_bucket_demo(
    task="vowels",
    epochs=None,
    batch_size=None,
    padding="pre",
    seed=0,
    units=None,
    quick=False,
    num_buckets=4,
    verbose=1,
    threads=None,
    layer="bidirectional",
):
    """Seconds per epoch of the masked model with and without bucketing.

    `python -m maskedrnn --bucket`. Two copies of the `masked_bidirectional`
    model of `run_demo` start from the same weights; epochs alternate between
    `model.fit` on the training set padded to the longest sequence and on a
    `maskedrnn.bucketing.BucketedDataset` of the same sequences (quantile
    boundaries, each batch padded only to its bucket's boundary,
    `carry_remainder=True`, fed as `to_tf_dataset()` on TensorFlow). The first
    epoch of each includes compilation and is reported apart.

    Args:
        task: `"vowels"` (default) or `"distance"`.
        epochs: Int >= 1 or `None` (the task's default), epochs per model.
        batch_size: Int >= 1 or `None` (the task's default).
        padding: `"pre"` (default) or `"post"`.
        seed: Int >= 0, seed of the weights, data and shuffling. Defaults to
            `0`.
        units: Int >= 1 or `None` (the task's default), LSTM units.
        quick: Bool, tiny settings for tests. Defaults to `False`.
        num_buckets: Int >= 1, quantile buckets. Defaults to `4`.
        verbose: `0` silent, `1` (default) prints the comparison.
        threads: Int >= 1 or `None`: PyTorch's CPU thread count, as in
            `run_demo`. Defaults to `None`.
        layer: `"bidirectional"` (default, `MaskedBidirectional`) or `"rnn"`
            (`MaskedRNN`), as in `run_demo`.

    Returns:
        A dict with `"boundaries"`, `"maxlen"`, and for `"bucketed"` and
        `"padded"` a dict of `"epoch_s"` (list of seconds per epoch) and
        `"accuracy"` (test accuracy; over valid tokens for distance).
    """
    settings = check_settings(
        task, epochs, batch_size, padding, seed, units, quick, None, threads, layer
    )
    check_int("num_buckets", num_buckets, 1)
    with torch_cpu_threads(settings["threads"]):
        return _bucket_demo(
            task, padding, seed, quick, settings, num_buckets, verbose, layer
        )


def _bucket_demo(task, padding, seed, quick, settings, num_buckets, verbose, layer):
    data = vowels_data(padding) if task == "vowels" else None
    if data is None:
        data = distance_data(padding, quick, seed)
        valid = data["y_train"] != -1
        labels = [row[v] for row, v in zip(data["y_train"], valid)]
    else:
        valid = ~np.all(data["x_train"] == 0.0, axis=-1)
        labels = data["y_train"]
    sequences = [row[v] for row, v in zip(data["x_train"], valid)]
    dataset = BucketedDataset(
        sequences,
        labels,
        batch_size=settings["batch_size"],
        num_buckets=num_buckets,
        padding=padding,
        seed=seed,
        # The recipe of docs/scaling.md: every batch full but the last, and on
        # TensorFlow a tf.data.Dataset with a static batch axis.
        carry_remainder=True,
    )
    train_data = dataset
    if backends.name() == "tensorflow":
        train_data = dataset.to_tf_dataset()
    keras.utils.set_random_seed(seed)
    models = {}
    for name in ("bucketed", "padded"):
        kind = "masked_rnn" if layer == "rnn" else "masked_bidirectional"
        models[name] = build_model(task, kind, data, settings["units"], layer)
        compile_model(models[name], task, settings["learning_rate"])
    models["padded"].set_weights(models["bucketed"].get_weights())
    seconds = {"bucketed": [], "padded": []}
    for _ in range(settings["epochs"]):
        for name, model in models.items():
            start = time.perf_counter()
            if name == "bucketed":
                # The dataset shuffles itself (per epoch, seeded).
                model.fit(train_data, epochs=1, verbose=0, shuffle=False)
            else:
                model.fit(
                    data["x_train"],
                    data["y_train"],
                    batch_size=settings["batch_size"],
                    epochs=1,
                    verbose=0,
                )
            seconds[name].append(time.perf_counter() - start)
    results = {"boundaries": dataset.boundaries, "maxlen": data["maxlen"]}
    for name, model in models.items():
        logits = predict_logits(model, data["x_test"], settings["batch_size"])
        results[name] = {
            "epoch_s": seconds[name],
            "accuracy": accuracy(logits, data["y_test"], data["valid_test"]),
        }
    if verbose:
        print(
            f"maskedrnn demo --bucket: task={task} backend={backends.name()} "
            f"padding={padding} epochs={settings['epochs']} "
            f"batch_size={settings['batch_size']} units={settings['units']}"
        )
        for name, label in (
            ("padded", f"padded to {data['maxlen']}"),
            ("bucketed", f"bucketed, boundaries {dataset.boundaries}"),
        ):
            s = results[name]["epoch_s"]
            later = float(np.mean(s[1:])) if len(s) > 1 else s[0]
            print(
                f"  {label:<40} {later:7.3f} s/epoch (first epoch {s[0]:.2f} s), "
                f"test accuracy {results[name]['accuracy']:.4f}"
            )
    return results
