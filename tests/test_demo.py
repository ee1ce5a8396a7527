"""The `python -m maskedrnn` demo (`maskedrnn.demo`), run in quick mode.

Oracles: Keras' own masked `keras.layers.Bidirectional` trained alongside from
the same initial weights on the same batches (our model must give the same
predictions), NumPy recomputations of the reported accuracies and data
preparation, the in-memory model for the save/reload check, and the model's
own predictions without extra padding for the padding-invariance check.
"""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional, datasets, demo

BACKEND = keras.backend.backend()
# Ours and Keras' masked wrapper compute the same function; after two quick
# epochs their probabilities differ by float rounding only (~1e-7 observed).
AGREE_ATOL = 1e-4
# The naive (unmasked) model reads the padding: its probabilities differ from
# the masked ones by ~1e-2 after the quick run (1.3e-2 to 3.4e-2 observed).
DIFFERS_ATOL = 1e-3


@pytest.fixture(scope="module")
def one_torch_thread():
    """On torch, one intra-op thread while the demo trains (restored after).

    These models are tiny; with several busy processes on a 2-core machine,
    torch's thread pool made the vowels run ~13x slower in CPU time (121 s
    instead of 9 s). Results do not depend on it.
    """
    if BACKEND != "torch":
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def distance(tmp_path_factory, one_torch_thread):
    path = tmp_path_factory.mktemp("demo") / "ours.keras"
    results = demo.run_demo(
        "distance", quick=True, padding="post", save_path=path, verbose=0
    )
    return results, path


@pytest.fixture(scope="module")
def vowels(one_torch_thread):
    if BACKEND != "torch":
        pytest.skip(
            "the quick vowels run trains 3 models (~30 s of CPU on TensorFlow "
            "and JAX, mostly tracing); it runs under the torch suite only, "
            "where it is cheapest. The distance run covers every backend."
        )
    return demo.run_demo("vowels", quick=True, padding="pre", verbose=0)


def _probs(logits):
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_distance_ours_matches_keras_masked(distance):
    results, _ = distance
    models = results["models"]
    valid = results["valid_test"]
    np.testing.assert_array_equal(valid, results["y_test"] != -1)
    ours = _probs(models["masked_bidirectional"]["logits"])[valid]
    ref = _probs(models["keras_masked"]["logits"])[valid]
    np.testing.assert_allclose(ours, ref, atol=AGREE_ATOL, rtol=0)
    assert results["max_abs_diff"]["ours_vs_keras_masked"] == pytest.approx(
        np.abs(ours - ref).max(), abs=1e-7
    )
    # Reported accuracies are the argmax accuracy over the valid tokens.
    for kind in demo.MODEL_NAMES:
        predicted = models[kind]["logits"].argmax(-1)[valid]
        expected = np.mean(predicted == results["y_test"][valid])
        assert models[kind]["accuracy"] == pytest.approx(expected, abs=1e-12)
    assert models["masked_bidirectional"]["accuracy"] == pytest.approx(
        models["keras_masked"]["accuracy"], abs=1e-12
    )


def test_distance_naive_reads_padding(distance):
    results, _ = distance
    models = results["models"]
    diffs = results["max_abs_diff"]
    assert diffs["naive_vs_keras_masked"] > DIFFERS_ATOL
    assert diffs["naive_vs_keras_masked"] > 100 * diffs["ours_vs_keras_masked"]
    # More padding changes what the naive model predicts, not the masked ones.
    assert models["naive"]["extra_padding_max_abs_diff"] > DIFFERS_ATOL
    for kind in ("masked_bidirectional", "keras_masked"):
        assert models[kind]["extra_padding_max_abs_diff"] < 1e-5, kind
        assert models[kind]["extra_padding_accuracy"] == models[kind]["accuracy"]


def test_distance_saved_model_reloads(distance):
    results, path = distance
    assert results["reload"]["path"] == os.fspath(path)
    assert results["reload"]["ok"]
    assert results["reload"]["max_abs_diff"] <= 1e-6
    # The file is a complete model: load it here and predict again.
    reloaded = keras.saving.load_model(path)
    assert any(isinstance(layer, MaskedBidirectional) for layer in reloaded.layers)
    again = reloaded.predict(results["x_test"], verbose=0)
    np.testing.assert_allclose(
        again, results["models"]["masked_bidirectional"]["logits"], atol=1e-6
    )


def test_vowels_ours_matches_keras_masked(vowels):
    models = vowels["models"]
    ours = _probs(models["masked_bidirectional"]["logits"])
    ref = _probs(models["keras_masked"]["logits"])
    np.testing.assert_allclose(ours, ref, atol=AGREE_ATOL, rtol=0)
    _, y_test = datasets.load_japanese_vowels("test")
    np.testing.assert_array_equal(vowels["y_test"], y_test)
    for kind in demo.MODEL_NAMES:
        expected = np.mean(models[kind]["logits"].argmax(-1) == y_test)
        assert models[kind]["accuracy"] == pytest.approx(expected, abs=1e-12)
    assert vowels["max_abs_diff"]["naive_vs_keras_masked"] > DIFFERS_ATOL
    assert vowels["reload"]["ok"]
    assert vowels["reload"]["path"] is None


@pytest.mark.parametrize("padding", ["pre", "post"])
def test_vowels_features_standardised_over_valid_frames(padding):
    data = demo._vowels_data(padding)
    x_train, _ = datasets.load_japanese_vowels("train")
    x_test, _ = datasets.load_japanese_vowels("test")
    frames = np.concatenate(x_train)
    mean, std = frames.mean(0), frames.std(0)
    for raw, padded in ((x_train, data["x_train"]), (x_test, data["x_test"])):
        assert padded.shape == (len(raw), 29, 12)
        for seq, row in zip(raw, padded):
            n = len(seq)
            real = row[-n:] if padding == "pre" else row[:n]
            pad = row[:-n] if padding == "pre" else row[n:]
            np.testing.assert_allclose(real, (seq - mean) / std, atol=1e-5)
            assert not pad.any()
    lengths = [len(s) for s in x_test]
    np.testing.assert_array_equal(data["valid_test"].sum(1), lengths)
    real_train = data["x_train"][np.any(data["x_train"] != 0, axis=-1)]
    np.testing.assert_allclose(real_train.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(real_train.std(0), 1.0, atol=1e-4)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"task": "mnist"}, "task"),
        ({"padding": "left"}, "padding"),
        ({"epochs": 0}, "epochs"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"units": True}, "units"),
        ({"seed": -1}, "seed"),
        ({"save_path": "model.h5"}, "save_path"),
    ],
)
def test_invalid_arguments_are_refused_early(kwargs, name):
    with pytest.raises(ValueError, match=name):
        demo.run_demo(**kwargs, verbose=0)


def test_cli_rejects_invalid_option_with_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--epochs", "0"])
    assert exit_info.value.code == 2
    assert "epochs" in capsys.readouterr().err


@pytest.mark.slow  # ~25 s of CPU: a fresh interpreter plus a quick run
@pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="the command line runs once, under the TensorFlow suite, to save time",
)
def test_cli_quick_distance_exits_zero(tmp_path):
    path = tmp_path / "cli.keras"
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "maskedrnn",
            "--quick",
            "--task",
            "distance",
            "--save",
            str(path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "backend: tensorflow, padding: pre" in out
    assert "save/reload of MaskedBidirectional model: OK" in out
    for label in demo._MODEL_LABELS.values():
        assert f"{label} " in out
        assert "2/2" in out  # the progress bar reached the last epoch
    assert path.is_file()
