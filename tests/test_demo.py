"""The `python -m maskedrnn` demo (`maskedrnn.demo`), run in quick mode.

Oracles: Keras' own masked `keras.layers.Bidirectional` trained alongside from
the same initial weights on the same batches (our model must give the same
predictions), NumPy recomputations of the reported accuracies and data
preparation, the in-memory model for the save/reload check, and the model's
own predictions without extra padding for the padding-invariance check.
"""

import functools
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional, MaskedRNN, datasets, demo
from maskedrnn.backends import torch_threads as _torch_threads

BACKEND = keras.backend.backend()
# Ours and Keras' masked wrapper compute the same function; after two quick
# epochs their probabilities differ by float32 rounding only, compounded over
# the training steps: at most 8.9e-8 observed on the three backends (these
# quick distance and vowels runs, CPU). 1e-6 is 11x that, far below any real
# divergence (the unmasked model: >1e-2; our outputs scaled by 1.01: 1.8e-4,
# see test_cli_exits_nonzero_when_ours_disagrees).
AGREE_ATOL = 1e-6
# The naive (unmasked) model reads the padding: its probabilities differ from
# the masked ones by ~1e-2 after the quick run (1.3e-2 to 3.4e-2 observed).
DIFFERS_ATOL = 1e-3


@pytest.fixture(scope="module")
def distance(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo") / "ours.keras"
    results = demo.run_demo(
        "distance", quick=True, padding="post", save_path=path, verbose=0
    )
    return results, path


# Each `Model.fit` of a demo run: (model name, optimizer built when it
# began, the shapes of its input and of its logits layer's kernel, its batch
# size).
VOWELS_FITS = []


@pytest.fixture(scope="module")
def vowels():
    real = keras.Model.fit

    def fit(self, *args, **kwargs):
        shapes = (tuple(self.input_shape), tuple(self.get_layer("logits").kernel.shape))
        batch = kwargs["batch_size"]
        VOWELS_FITS.append((self.name, self.optimizer.built, shapes, batch))
        return real(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(keras.Model, "fit", fit)
        # One epoch keeps it cheap on every backend (most of the time is
        # tracing).
        return demo.run_demo("vowels", quick=True, epochs=1, padding="pre", verbose=0)


def _probs(logits):
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.on_backends("torch")
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
    # What `python -m maskedrnn` checks before exiting 0.
    assert demo.check_agreement(results) == []
    expected_threads = _torch_threads.resolve_threads()[0]
    assert results["torch_threads"] == (
        expected_threads if BACKEND == "torch" else None
    )


@pytest.mark.on_backends("torch")
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


@pytest.mark.on_backends("torch")
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


@pytest.mark.on_backends("torch")
@pytest.mark.slow  # 20-30 s on TensorFlow and JAX (tracing), 9 s on torch
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


@pytest.mark.on_backends("torch")  # the demo's own code, no layer's
def test_first_epochs_are_timed_after_a_warm_up_with_optimizers_built(vowels):
    """A model of what the compared models share is fitted first, on their
    input shape and batch size with their logits layer's shape, and each
    compared model's optimizer is built before its fit: the first epochs
    hold no first-fit costs of the process, of what the models share, or of
    the optimizer's variables."""
    assert VOWELS_FITS[0][0] == "warm_up"
    _, _, warm_shapes, warm_batch = VOWELS_FITS[0]
    compared = VOWELS_FITS[1:]
    assert [fit[0] for fit in compared] == list(demo.MODEL_NAMES)
    assert all(fit[1] for fit in compared)
    assert all(fit[2:] == (warm_shapes, warm_batch) for fit in compared)


@pytest.mark.parametrize("padding", ["pre", "post"])
def test_vowels_features_standardised_over_valid_frames(padding):
    data = demo.data.vowels_data(padding)
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
        ({"threads": 0}, "threads"),
        ({"layer": "lstm"}, "layer"),
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
    for label in demo.models.MODEL_LABELS.values():
        assert f"{label} " in out
        assert "2/2" in out  # the progress bar reached the last epoch
    assert path.is_file()


def test_demo_command_quiets_tensorflow_unless_the_user_chose_a_level():
    from maskedrnn._quiet_demo import is_demo_command, quiet_tensorflow

    assert is_demo_command(["python", "-m", "maskedrnn", "--quick"])
    assert is_demo_command(["python3", "-u", "-m", "maskedrnn"])
    assert not is_demo_command(["python", "-m", "maskedrnn.bench"])
    assert not is_demo_command(["python", "-m", "pytest", "maskedrnn"])
    assert not is_demo_command(["python", "train.py", "-m"])
    environ = {}
    assert quiet_tensorflow(["python", "-m", "maskedrnn"], environ)
    assert environ == {"TF_CPP_MIN_LOG_LEVEL": "2"}
    environ = {"TF_CPP_MIN_LOG_LEVEL": "0"}
    assert not quiet_tensorflow(["python", "-m", "maskedrnn"], environ)
    assert environ == {"TF_CPP_MIN_LOG_LEVEL": "0"}  # the user's level wins
    environ = {}
    assert not quiet_tensorflow(["python", "-m", "pytest"], environ)
    assert environ == {}  # other programs are left alone


def test_plain_import_leaves_the_demo_quieting_alone():
    """Only `python -m maskedrnn...` loads `_quiet_demo`: a program that
    imports the package keeps TensorFlow's log level and its stderr."""
    code = "import sys, maskedrnn; print('maskedrnn._quiet_demo' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


@pytest.mark.skipif(
    BACKEND != "tensorflow", reason="TensorFlow's start-up log: TensorFlow only"
)
def test_cli_prints_no_tensorflow_start_up_log():
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["KERAS_BACKEND"] = "tensorflow"
    command = [sys.executable, "-m", "maskedrnn", "--help"]
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m maskedrnn")
    for line in ("cpu_feature_guard", "oneDNN", "absl::InitializeLog"):
        assert line not in proc.stderr, proc.stderr


def _results(same=1e-7, drift=1e-7, shift_ours=0.0, shift_keras=0.0, reload_ok=True):
    return {
        "max_abs_diff": {
            "ours_vs_keras_masked": drift,
            "same_weights_vs_keras_masked": same,
        },
        "models": {
            "masked_bidirectional": {"extra_padding_max_abs_diff": shift_ours},
            "keras_masked": {"extra_padding_max_abs_diff": shift_keras},
        },
        "reload": {"ok": reload_ok, "max_abs_diff": 0.0 if reload_ok else 0.5},
    }


def test_check_agreement_names_each_broken_promise():
    assert demo.AGREEMENT_ATOL == 1e-5
    assert demo.TRAINING_DRIFT_ATOL == 1e-3
    assert demo.check_agreement(_results(same=1e-5, drift=1e-5)) == []
    # Same weights: the function itself must agree to 1e-5.
    (problem,) = demo.check_agreement(_results(same=2e-5))
    assert "disagree at the same weights" in problem and "2.0e-05" in problem
    (problem,) = demo.check_agreement(_results(same=float("nan")))
    assert "nan" in problem
    # Trained apart: rounding drift up to 1e-3 (torch MaskedRNN: 6.3e-5).
    assert demo.check_agreement(_results(drift=6.3e-5)) == []
    (problem,) = demo.check_agreement(_results(drift=2e-3))
    assert "ended 2.0e-03 apart" in problem
    (problem,) = demo.check_agreement(_results(drift=float("nan")))
    assert "nan" in problem
    (problem,) = demo.check_agreement(_results(shift_ours=3e-3))
    assert problem.startswith("MaskedBidirectional changed its predictions")
    (problem,) = demo.check_agreement(_results(reload_ok=False))
    assert "reloaded" in problem
    assert len(demo.check_agreement(_results(1.0, 1.0, 1.0, 1.0, False))) == 5


@pytest.mark.skipif(
    BACKEND != "torch",
    reason="the exit status does not depend on the backend; this end-to-end "
    "run is cheapest on torch (2 s against ~20 s of tracing elsewhere)",
)
def test_cli_exits_nonzero_when_ours_disagrees(monkeypatch, capsys, tmp_path):
    """Our layer's outputs scaled by 1.01 (a wrong implementation): the demo
    must report the disagreement and exit 1, not 0."""
    call = MaskedBidirectional.call

    @functools.wraps(call)
    def perturbed(self, *args, **kwargs):
        return call(self, *args, **kwargs) * 1.01

    monkeypatch.setattr(MaskedBidirectional, "call", perturbed)
    path = tmp_path / "run.json"
    argv = ["--quick", "--task", "distance", "--epochs", "1", "--json", str(path)]
    assert demo.main(argv) == 1
    captured = capsys.readouterr()
    assert "error: MaskedBidirectional and Keras' masked Bidirectional disagree" in (
        captured.err
    )
    assert "exit status 1" in captured.err
    summary = json.loads(path.read_text())
    assert summary["command"] == ["python", "-m", "maskedrnn", *argv]
    assert summary["backend"] == BACKEND
    assert summary["max_abs_diff"]["same_weights_vs_keras_masked"] > (
        demo.AGREEMENT_ATOL
    )
    assert len(summary["problems"]) == 1 and "disagree" in summary["problems"][0]
    assert set(summary["models"]) == set(demo.MODEL_NAMES)
    assert "logits" not in summary["models"]["naive"]
    for model in summary["models"].values():
        # Each model's first epoch (its tracing and compiling included), as
        # docs/benchmarks.md quotes it.
        assert model["first_epoch_s"] > 0 and model["epoch_s"] > 0


def test_thread_count_resolution(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert _torch_threads.resolve_threads() == (1, "default for small models")
    assert _torch_threads.resolve_threads(3) == (3, "threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert _torch_threads.resolve_threads() == (2, "OMP_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    assert _torch_threads.resolve_threads() == (1, "default for small models")


def test_torch_thread_count_is_set_then_restored():
    with _torch_threads.torch_cpu_threads(1) as count:
        if BACKEND != "torch":
            assert count is None
            return
        import torch

        assert count == 1 and torch.get_num_threads() == 1
    before = torch.get_num_threads()
    with _torch_threads.torch_cpu_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before


# ------------------------------------------------- --layer rnn: MaskedRNN(LSTM)


@pytest.fixture(scope="module")
def rnn_distance(tmp_path_factory):
    # Left padding: the case where a masked LSTM must skip leading steps.
    path = tmp_path_factory.mktemp("demo_rnn") / "ours_rnn.keras"
    results = demo.run_demo(
        "distance",
        quick=True,
        padding="pre",
        layer="rnn",
        save_path=path,
        verbose=0,
    )
    return results, path


def test_rnn_models_are_one_direction_lstms():
    data = demo.data.distance_data("pre", quick=True, seed=0)
    models = {
        kind: demo.models.build_model("distance", kind, data, 4, layer="rnn")
        for kind in demo.RNN_MODEL_NAMES
    }
    ours = models["masked_rnn"].get_layer("rnn")
    assert isinstance(ours, MaskedRNN)
    assert isinstance(ours.layer, keras.layers.LSTM)
    for kind in ("keras_masked", "naive"):
        layer = models[kind].get_layer("rnn")
        assert type(layer) is keras.layers.LSTM, kind
    embeddings = {kind: m.layers[1] for kind, m in models.items()}
    assert embeddings["masked_rnn"].mask_zero and embeddings["keras_masked"].mask_zero
    assert not embeddings["naive"].mask_zero
    # The same weights in the same order: one set fits all three models.
    shapes = [[w.shape for w in m.get_weights()] for m in models.values()]
    assert shapes[0] == shapes[1] == shapes[2]


@pytest.mark.on_backends("torch")
def test_rnn_distance_ours_matches_keras_masked_lstm(rnn_distance):
    results, _ = rnn_distance
    assert results["layer"] == "rnn"
    models = results["models"]
    assert set(models) == set(demo.RNN_MODEL_NAMES)
    valid = results["valid_test"]
    np.testing.assert_array_equal(valid, results["y_test"] != -1)
    assert not valid[:, 0].all()  # left padding: some rows start with padding
    ours = _probs(models["masked_rnn"]["logits"])[valid]
    ref = _probs(models["keras_masked"]["logits"])[valid]
    np.testing.assert_allclose(ours, ref, atol=AGREE_ATOL, rtol=0)
    reported = results["max_abs_diff"]["ours_vs_keras_masked"]
    assert reported == pytest.approx(np.abs(ours - ref).max(), abs=1e-7)
    assert reported <= demo.AGREEMENT_ATOL
    for kind in demo.RNN_MODEL_NAMES:
        predicted = models[kind]["logits"].argmax(-1)[valid]
        expected = np.mean(predicted == results["y_test"][valid])
        assert models[kind]["accuracy"] == pytest.approx(expected, abs=1e-12)
    assert demo.check_agreement(results) == []
    table = demo.format_results(results)
    for label in ("MaskedRNN ", "keras LSTM + mask ", "keras LSTM, no mask "):
        assert label in table
    assert "max |p_ours - p_keras_masked| (valid tokens): " in table
    assert "save/reload of MaskedRNN model: OK" in table
    summary = demo.summarize(results)
    assert summary["layer"] == "rnn" and summary["problems"] == []
    json.dumps(summary)  # JSON-ready


@pytest.mark.on_backends("torch")
def test_rnn_distance_naive_reads_padding(rnn_distance):
    results, _ = rnn_distance
    models = results["models"]
    diffs = results["max_abs_diff"]
    assert diffs["naive_vs_keras_masked"] > DIFFERS_ATOL
    assert diffs["naive_vs_keras_masked"] > 100 * diffs["ours_vs_keras_masked"]
    assert models["naive"]["extra_padding_max_abs_diff"] > DIFFERS_ATOL
    for kind in ("masked_rnn", "keras_masked"):
        assert models[kind]["extra_padding_max_abs_diff"] < 1e-5, kind
        assert models[kind]["extra_padding_accuracy"] == models[kind]["accuracy"]


@pytest.mark.on_backends("torch")
def test_rnn_distance_saved_model_reloads(rnn_distance):
    results, path = rnn_distance
    assert results["reload"]["path"] == os.fspath(path)
    assert results["reload"]["ok"]
    reloaded = keras.saving.load_model(path)
    assert isinstance(reloaded.get_layer("rnn"), MaskedRNN)
    again = reloaded.predict(results["x_test"], verbose=0)
    np.testing.assert_allclose(
        again, results["models"]["masked_rnn"]["logits"], atol=1e-6
    )


def test_check_agreement_names_masked_rnn():
    results = _results(same=2e-5, shift_ours=3e-3)
    results["layer"] = "rnn"
    models = results["models"]
    models["masked_rnn"] = models.pop("masked_bidirectional")
    disagree, shifted = demo.check_agreement(results)
    assert disagree.startswith("MaskedRNN and Keras' masked LSTM disagree")
    assert shifted.startswith("MaskedRNN changed its predictions")


@pytest.mark.skipif(
    BACKEND != "torch",
    reason="the exit status does not depend on the backend; cheapest on torch",
)
def test_cli_layer_rnn_exits_nonzero_when_ours_disagrees(monkeypatch, capsys):
    """`MaskedRNN`'s outputs scaled by 1.01: `--layer rnn` must exit 1."""
    call = MaskedRNN.call

    @functools.wraps(call)
    def perturbed(self, *args, **kwargs):
        return call(self, *args, **kwargs) * 1.01

    monkeypatch.setattr(MaskedRNN, "call", perturbed)
    argv = ["--quick", "--task", "distance", "--epochs", "1", "--layer", "rnn"]
    assert demo.main(argv) == 1
    err = capsys.readouterr().err
    assert "error: MaskedRNN and Keras' masked LSTM disagree" in err
    assert "exit status 1" in err
