"""`run_demo`: trains the three models from the same weights and compares them."""

import os
import tempfile

import keras
import numpy as np

from maskedrnn import backends
from maskedrnn.backends.torch_threads import torch_cpu_threads
from maskedrnn.demo.checks import format_results
from maskedrnn.demo.data import distance_data, pad_more, vowels_data
from maskedrnn.demo.models import (
    Progress,
    accuracy,
    build_model,
    compile_model,
    model_labels,
    model_names,
    predict_logits,
    softmax,
    warm_up,
)
from maskedrnn.demo.settings import EXTRA_PADDING_FACTOR, RELOAD_ATOL, check_settings


def run_demo(
    task="vowels",
    epochs=None,
    batch_size=None,
    padding="pre",
    seed=0,
    units=None,
    quick=False,
    save_path=None,
    verbose=1,
    threads=None,
    layer="bidirectional",
):
    """Trains the three models of the demo and compares them.

    Each model is built from the same initial weights (those of the
    `masked_bidirectional` model, copied with `set_weights`), and
    `keras.utils.set_random_seed(seed)` is called before each `fit`, so all
    three see the same batches in the same order. Test predictions are taken
    with `predict`; accuracies are computed from them with NumPy (over the
    valid tokens for `"distance"`).

    Each model also predicts the test set padded with `2 * maxlen` more
    padding steps (on the same side). A masked model must not change its
    predictions; the naive one reads the extra steps and does.

    Example:

    >>> results = run_demo("distance", quick=True, verbose=0)
    >>> results["max_abs_diff"]["ours_vs_keras_masked"] < 1e-4
    True
    >>> results["reload"]["ok"]
    True

    Args:
        task: `"vowels"` (Japanese Vowels speaker recognition, sequence
            classification) or `"distance"` (synthetic distance-to-end
            tagging). Defaults to `"vowels"`.
        epochs: Int >= 1 or `None`, training epochs. `None` (default) uses
            40 for vowels and 10 for distance (2 with `quick`).
        batch_size: Int >= 1 or `None`. `None` (default) uses 32 for vowels
            and 64 for distance (32 with `quick`).
        padding: `"pre"` (default; padding before the data, as in
            `keras.utils.pad_sequences`) or `"post"`.
        seed: Int, seed of the data (distance task), of the initial weights
            and of the batch order. Defaults to `0`.
        units: Int >= 1 or `None`, LSTM units per direction. `None` (default)
            uses 64 for vowels and 32 for distance (8 with `quick`).
        quick: Bool. `True` makes a tiny run (small model, 2 epochs, a small
            distance data set) for tests and CI. Defaults to `False`.
        save_path: Path of the `.keras` file the `masked_bidirectional` model
            is saved to, or `None` (default) for a temporary file that is
            deleted afterwards.
        verbose: `0` prints nothing, `1` (default) prints the settings, a
            progress bar per model and the final table.
        threads: Int >= 1 or `None`: PyTorch's CPU thread count while the
            demo runs (torch backend only; restored afterwards). `None`
            (default) uses `OMP_NUM_THREADS` if set, else 1.
        layer: `"bidirectional"` (default) compares `MaskedBidirectional`
            with Keras' `Bidirectional`; `"rnn"` compares `MaskedRNN(LSTM)`
            with Keras' `LSTM` (one direction, `RNN_MODEL_NAMES`). `units`
            is then the LSTM's units.

    Returns:
        A dict with keys:
        - `"task"`, `"backend"`, `"padding"`, `"seed"`, `"epochs"`,
          `"batch_size"`, `"units"`, `"quick"`, `"layer"`: the settings used,
          and
          `"extra_padding"`: the number of padding steps added for the
          padding-invariance check, and `"torch_threads"`: PyTorch's CPU
          thread count (`None` on other backends).
        - `"models"`: for each name in `MODEL_NAMES` (`RNN_MODEL_NAMES`
          with `layer="rnn"`), a dict with
          `"accuracy"` (test accuracy), `"extra_padding_accuracy"` (the same
          with the extra padding), `"extra_padding_max_abs_diff"` (max
          absolute change of the softmax probabilities caused by the extra
          padding, over valid steps), `"first_epoch_s"` (seconds, including
          tracing/compilation; after a warm-up fit of a model made of
          what the three share, with a `Dense` layer in the RNN's place,
          and with the model's optimizer built before the clock starts, so
          that what a process pays once, and what the three models share,
          falls on no model in particular),
          `"epoch_s"` (mean seconds of the later
          epochs; the first epoch's time when `epochs == 1`),
          `"train_loss"` and `"train_accuracy"` (last epoch, as logged by
          Keras), and `"logits"` (float32 NumPy array of test predictions:
          `(test, classes)` for vowels, `(test, time, classes)` for distance).
        - `"x_test"`: the padded test inputs the predictions were made on,
          `"y_test"`: int32 test labels (`-1` at padding for distance), and
          `"valid_test"`: bool `(test, time)` array, True at real steps.
        - `"max_abs_diff"`: dict with `"ours_vs_keras_masked"` and
          `"naive_vs_keras_masked"`: max absolute difference of the softmax
          probabilities over the test set (over valid tokens for distance).
        - `"reload"`: dict with `"path"` (`None` for a temporary file),
          `"max_abs_diff"` (reloaded vs in-memory logits) and `"ok"` (that
          difference is at most 1e-6).

    Raises:
        ValueError: for an invalid argument; the message names it.
    """
    settings = check_settings(
        task,
        epochs,
        batch_size,
        padding,
        seed,
        units,
        quick,
        save_path,
        threads,
        layer,
    )
    with torch_cpu_threads(settings["threads"]) as torch_threads:
        results = _run(task, padding, seed, quick, settings, verbose, torch_threads)
    if verbose:
        print(format_results(results))
    return results


def _run(task, padding, seed, quick, settings, verbose, torch_threads):
    epochs = settings["epochs"]
    batch_size = settings["batch_size"]
    units = settings["units"]
    save_path = settings["save_path"]

    np.random.seed(seed)
    if task == "vowels":
        data = vowels_data(padding)
    else:
        data = distance_data(padding, quick, seed)
    backend = backends.name()
    if verbose:
        print(
            f"maskedrnn demo: task={task} backend={backend} padding={padding} "
            f"epochs={epochs} batch_size={batch_size} units={units} seed={seed}"
            f"\n  train {data['x_train'].shape}, test {data['x_test'].shape}"
        )
        if torch_threads is not None:
            print(
                f"  torch CPU threads: {torch_threads} "
                f"({settings['threads_source']}; --threads N to change)"
            )

    keras.utils.set_random_seed(seed)
    layer = settings["layer"]
    names, labels = model_names(layer), model_labels(layer)
    ours = names[0]
    models = {kind: build_model(task, kind, data, units, layer) for kind in names}
    initial = models[ours].get_weights()
    for kind in names[1:]:
        models[kind].set_weights(initial)

    extra = EXTRA_PADDING_FACTOR * data["maxlen"]
    x_test_more = pad_more(data["x_test"], extra, padding)
    original_steps = pad_more(np.ones_like(data["valid_test"]), extra, padding)
    per_model = {}
    warm_up(task, data, units, layer, settings["learning_rate"], batch_size)
    for kind in names:
        model = models[kind]
        compile_model(model, task, settings["learning_rate"])
        # The optimizer's variables (the same shapes in every model) are
        # made before the clock starts: made on the first fit, their
        # first-time cost would fall on the first model alone.
        model.optimizer.build(model.trainable_variables)
        progress = Progress(labels[kind], epochs, verbose)
        keras.utils.set_random_seed(seed)
        model.fit(
            data["x_train"],
            data["y_train"],
            epochs=epochs,
            batch_size=batch_size,
            shuffle=True,
            verbose=0,
            callbacks=[progress],
        )
        logits = predict_logits(model, data["x_test"], batch_size)
        logits_more = predict_logits(model, x_test_more, batch_size)
        if task == "distance":
            # Back to the original steps (drop the extra padding).
            logits_more = logits_more[original_steps].reshape(logits.shape)
        probs = softmax(logits)
        shift = np.abs(softmax(logits_more) - probs)
        if task == "distance":
            shift = shift[data["valid_test"]]
        seconds = progress.epoch_seconds
        per_model[kind] = {
            "accuracy": accuracy(logits, data["y_test"], data["valid_test"]),
            "extra_padding_accuracy": accuracy(
                logits_more, data["y_test"], data["valid_test"]
            ),
            "extra_padding_max_abs_diff": float(shift.max()),
            "first_epoch_s": seconds[0],
            "epoch_s": float(np.mean(seconds[1:] if len(seconds) > 1 else seconds)),
            "train_loss": float(progress.last_logs.get("loss", np.nan)),
            "train_accuracy": float(progress.last_logs.get("accuracy", np.nan)),
            "logits": logits,
        }

    def prob_diff(a, b):
        diff = np.abs(softmax(per_model[a]["logits"]) - softmax(per_model[b]["logits"]))
        if task == "distance":
            diff = diff[data["valid_test"]]
        return float(diff.max())

    # The same function at the same weights: ours given the trained weights
    # of Keras' masked model predicts what that model predicts (training
    # drift, see AGREEMENT_ATOL, plays no part here).
    twin = build_model(task, ours, data, units, layer)
    twin.set_weights(models["keras_masked"].get_weights())
    per_model["same_weights"] = {
        "logits": predict_logits(twin, data["x_test"], batch_size)
    }

    reload_info = _save_and_reload(
        models[ours],
        per_model[ours]["logits"],
        data["x_test"],
        batch_size,
        save_path,
    )
    results = {
        "task": task,
        "extra_padding": extra,
        "backend": backend,
        "padding": padding,
        "seed": seed,
        "epochs": epochs,
        "batch_size": batch_size,
        "units": units,
        "quick": bool(quick),
        "layer": layer,
        "models": {k: v for k, v in per_model.items() if k != "same_weights"},
        "x_test": data["x_test"],
        "y_test": data["y_test"],
        "valid_test": data["valid_test"],
        "max_abs_diff": {
            "ours_vs_keras_masked": prob_diff(ours, "keras_masked"),
            "same_weights_vs_keras_masked": prob_diff("same_weights", "keras_masked"),
            "naive_vs_keras_masked": prob_diff("naive", "keras_masked"),
        },
        "reload": reload_info,
        "torch_threads": torch_threads,
    }
    return results


def _save_and_reload(model, logits, x_test, batch_size, save_path):
    def check(path):
        model.save(path)
        reloaded = keras.saving.load_model(path)
        again = predict_logits(reloaded, x_test, batch_size)
        diff = float(np.max(np.abs(again - logits)))
        return {"path": save_path, "max_abs_diff": diff, "ok": diff <= RELOAD_ATOL}

    if save_path is not None:
        parent = os.path.dirname(os.path.abspath(save_path))
        os.makedirs(parent, exist_ok=True)
        return check(save_path)
    with tempfile.TemporaryDirectory() as tmp:
        return check(os.path.join(tmp, f"{model.name}.keras"))
