"""What the demo promises, checked (`check_agreement`), and its report."""

from maskedrnn.demo.models import model_labels, model_names
from maskedrnn.demo.settings import AGREEMENT_ATOL, RELOAD_ATOL, TRAINING_DRIFT_ATOL


def check_agreement(results, atol=AGREEMENT_ATOL):
    """What the README promises about a demo run, checked.

    1. `MaskedBidirectional` and Keras' masked `Bidirectional` (with
       `layer="rnn"`: `MaskedRNN` and Keras' masked `LSTM`) predict the
       same probabilities at the same weights, to `atol` (over valid tokens
       for `"distance"`), and the two trained models stay within
       `TRAINING_DRIFT_ATOL` (1e-3) of each other.
    2. Re-padding the test set with extra padding changes neither masked
       model's probabilities by more than `atol`.
    3. The saved-and-reloaded model predicts what the in-memory one did
       (to 1e-6 in logits).

    Example:

    >>> results = {
    ...     "max_abs_diff": {
    ...         "ours_vs_keras_masked": 3e-7,
    ...         "same_weights_vs_keras_masked": 2e-7,
    ...     },
    ...     "models": {
    ...         "masked_bidirectional": {"extra_padding_max_abs_diff": 0.0},
    ...         "keras_masked": {"extra_padding_max_abs_diff": 2e-3},
    ...     },
    ...     "reload": {"ok": True, "max_abs_diff": 0.0},
    ... }
    >>> problems = check_agreement(results)
    >>> len(problems)
    1
    >>> print(problems[0][:60])
    keras Bidirectional + mask changed its predictions by up to

    Args:
        results: The dict returned by `run_demo`.
        atol: Float, the largest accepted difference of a predicted
            probability. Defaults to `AGREEMENT_ATOL` (1e-5).

    Returns:
        A list of messages, one per broken promise; empty when all hold.
    """
    problems = []
    layer = results.get("layer", "bidirectional")
    ours, labels = model_names(layer)[0], model_labels(layer)
    keras_layer = "LSTM" if layer == "rnn" else "Bidirectional"
    diffs = results["max_abs_diff"]
    same = diffs.get("same_weights_vs_keras_masked", diffs["ours_vs_keras_masked"])
    if not same <= atol:  # also catches NaN
        problems.append(
            f"{labels[ours]} and Keras' masked {keras_layer} disagree at the "
            f"same weights: their predicted probabilities differ by up to "
            f"{same:.1e}, more than the {atol:.1e} float rounding explains."
        )
    drift = diffs["ours_vs_keras_masked"]
    if not drift <= TRAINING_DRIFT_ATOL:
        problems.append(
            f"{labels[ours]} and Keras' masked {keras_layer}, trained from the "
            f"same weights on the same batches, ended {drift:.1e} apart in "
            f"predicted probabilities, more than the {TRAINING_DRIFT_ATOL:.0e} "
            "that rounding explains."
        )
    for kind in (ours, "keras_masked"):
        shift = results["models"][kind]["extra_padding_max_abs_diff"]
        if not shift <= atol:
            problems.append(
                f"{labels[kind]} changed its predictions by up to "
                f"{shift:.1e} when the test set got more padding; a masked "
                f"model must not change them by more than {atol:.1e}."
            )
    reload = results["reload"]
    if not reload["ok"]:
        problems.append(
            "the reloaded model's predictions differ from the in-memory ones "
            f"by up to {reload['max_abs_diff']:.1e} (logits; at most "
            f"{RELOAD_ATOL:.0e} expected)."
        )
    return problems


def summarize(results):
    """The JSON-ready part of `run_demo`'s results (no arrays).

    Args:
        results: The dict returned by `run_demo`.

    Returns:
        A dict: the settings, per model every number of `results["models"]`
        (not the logits), `"max_abs_diff"`, `"reload"`, `"torch_threads"`,
        and `"problems"`: the list `check_agreement` returns.
    """
    skip = ("models", "x_test", "y_test", "valid_test")
    summary = {k: v for k, v in results.items() if k not in skip}
    summary["models"] = {
        kind: {k: v for k, v in m.items() if k != "logits"}
        for kind, m in results["models"].items()
    }
    summary["problems"] = check_agreement(results)
    return summary


def format_results(results):
    """The final table of `run_demo` as a string.

    Args:
        results: The dict returned by `run_demo`.

    Returns:
        A multi-line string: one row per model (test accuracy, first-epoch
        and later-epoch seconds, last training loss, accuracy and largest
        probability change with extra padding), then the prediction
        differences and the save/reload check.
    """
    metric = "test acc" if results["task"] == "vowels" else "masked test acc"
    header = (
        f"{'model':<30} {metric:>15} {'1st epoch s':>11} {'s/epoch':>8} "
        f"{'train loss':>10} {'acc +pad':>8} {'max dp +pad':>11}"
    )
    lines = ["", header, "-" * len(header)]
    layer = results.get("layer", "bidirectional")
    names, labels = model_names(layer), model_labels(layer)
    for kind in names:
        m = results["models"][kind]
        lines.append(
            f"{labels[kind]:<30} {m['accuracy']:>15.4f} "
            f"{m['first_epoch_s']:>11.2f} {m['epoch_s']:>8.3f} "
            f"{m['train_loss']:>10.4f} {m['extra_padding_accuracy']:>8.4f} "
            f"{m['extra_padding_max_abs_diff']:>11.1e}"
        )
    diffs = results["max_abs_diff"]
    reload = results["reload"]
    where = "" if results["task"] == "vowels" else " (valid tokens)"
    lines += [
        "",
        f"max |p_ours - p_keras_masked|{where}: {diffs['ours_vs_keras_masked']:.2e}",
    ]
    if "same_weights_vs_keras_masked" in diffs:
        lines.append(
            f"  same at Keras' trained weights: "
            f"{diffs['same_weights_vs_keras_masked']:.2e}"
        )
    lines += [
        f"max |p_naive - p_keras_masked|{where}: {diffs['naive_vs_keras_masked']:.2e}",
        f"save/reload of {labels[names[0]]} model: "
        + ("OK" if reload["ok"] else "MISMATCH")
        + f" (max |diff| {reload['max_abs_diff']:.1e}"
        + (f", saved to {reload['path']}" if reload["path"] else "")
        + ")",
        f"'+pad': test set re-padded with {results['extra_padding']} more "
        "padding steps; 'max dp': largest change of a predicted probability.",
        f"backend: {results['backend']}, padding: {results['padding']}"
        + (
            f", torch CPU threads: {results['torch_threads']}"
            if results.get("torch_threads") is not None
            else ""
        ),
    ]
    return "\n".join(lines)
