"""Deployment: a `.keras` file holding MaskedBidirectional is a plain Keras file.

Train on a GPU (where the inner LSTM/GRU run on cuDNN), infer on a CPU or on
another backend: that works when the saved file holds nothing tied to a
device or a backend. A cuDNN training run itself needs a GPU
(tests/test_gpu_to_cpu.py, skipped without one). What is proved here, on any
machine:

- the file holds only Keras' own layer classes plus `MaskedBidirectional`,
  whose config has no device setting (`use_cudnn` is not serialized, as in
  Keras), and its weights file is identical (paths, shapes, values) to that of
  the same model built with `keras.layers.Bidirectional`: the oracle model
  loads it and, fed the same mask, predicts the same;
- a model set to `use_cudnn=True` (the GPU setting) saves the same file as
  one set to `use_cudnn=False`. Keras' cuDNN kernels read the same
  `kernel`/`recurrent_kernel`/`bias` variables as the generic kernels and
  repack them at call time (`keras/src/backend/tensorflow/rnn.py`,
  `_cudnn_lstm` / `_cudnn_gru`), so a GPU-trained file has this same layout;
- a model trained and saved under TensorFlow loads and predicts the same
  (atol 1e-5) under JAX and PyTorch, each in its own process; models saved
  under those load under TensorFlow (and JAX's under PyTorch).

This module is also the worker that the cross-backend test runs in a
subprocess: `python -m tests.test_deploy WORKDIR` (see `_worker`).
"""

import io
import json
import pathlib
import sys
import zipfile

import h5py
import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional
from tests.helpers import lengths_to_mask, run_module_on_backend, to_np

V, D, U = 12, 3, 4
ATOL = 1e-5
BACKEND = keras.backend.backend()
DEVICE_WORDS = ("cudnn", "cuda", "gpu", "device")


# ------------------------------------------------------------------ model


def build_model(oracle=False, use_cudnn="auto"):
    """A two-branch model covering both ways of giving lengths.

    - mask branch: `ids` -> `Embedding(mask_zero=True)` -> bidirectional GRU
      (last output) -> `Dense`: the mask comes from the padding id 0;
    - lengths branch: `feats` + `lengths` -> bidirectional LSTM returning the
      sequence and its four final states -> `Dense` on the sequence, and the
      states concatenated (so the exact LSTM cell state is an output).

    With `oracle=True` the same layers (same names) use
    `keras.layers.Bidirectional(..., use_cudnn=False)` instead, and the
    lengths branch takes a boolean `feats_mask` input in place of `lengths`.

    Returns:
        A Functional model with inputs `[ids, feats, lengths]` (or
        `[ids, feats, feats_mask]`) and outputs `[pooled (batch, 2),
        tags (batch, time, 2), states (batch, 4 * U)]`.
    """
    if oracle:
        wrap, cudnn = keras.layers.Bidirectional, False
        third = keras.Input((None,), dtype="bool", name="feats_mask")
    else:
        wrap, cudnn = MaskedBidirectional, use_cudnn
        third = keras.Input((), dtype="int32", name="lengths")
    ids = keras.Input((None,), dtype="int32", name="ids")
    feats = keras.Input((None, D), name="feats")
    emb = keras.layers.Embedding(V, D, mask_zero=True, name="embed")(ids)
    gru = keras.layers.GRU(U, use_cudnn=cudnn, name="gru")
    pooled = wrap(gru, name="gru_birnn")(emb)
    lstm = keras.layers.LSTM(
        U, return_sequences=True, return_state=True, use_cudnn=cudnn, name="lstm"
    )
    lstm = wrap(lstm, name="lstm_birnn")
    if oracle:
        seq, *states = lstm(feats, mask=third)
    else:
        seq, *states = lstm(feats, lengths=third)
    outputs = [
        keras.layers.Dense(2, name="head_pooled")(pooled),
        keras.layers.Dense(2, name="head_tags")(seq),
        keras.layers.Concatenate(name="states")(states),
    ]
    return keras.Model([ids, feats, third], outputs, name="tagger")


def copy_weights(source, target):
    for layer in source.layers:
        if layer.weights:
            target.get_layer(layer.name).set_weights(layer.get_weights())


def make_batch(batch, time, seed):
    """`[ids, feats, lengths]` with every padding pattern.

    `ids` rows cycle through: right-padded, left-padded (the default of
    `keras.utils.pad_sequences`), holes, all padding, full, one step. `feats`
    is right-padded by `lengths` (one row of length 0, one full row) and
    holds random garbage in its padded steps, which must not matter.
    """
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, V, (batch, time)).astype("int32")
    for row in range(batch):
        pattern = row % 6
        if pattern == 0:
            ids[row, max(1, time - 3) :] = 0
        elif pattern == 1:
            ids[row, : time // 2] = 0
        elif pattern == 2:
            ids[row, 1::3] = 0
        elif pattern == 3:
            ids[row] = 0
        elif pattern == 5:
            ids[row, 1:] = 0
    feats = rng.standard_normal((batch, time, D)).astype("float32")
    lengths = rng.integers(1, time, batch).astype("int32")
    lengths[0], lengths[-1] = time, 0
    return [ids, feats, lengths]


def predict(model, inputs):
    return [to_np(y) for y in model(inputs, training=False)]


def train(model, seed=0):
    """A few Adam steps on random targets, so the file holds trained weights
    and optimizer state."""
    rng = np.random.default_rng(seed)
    x = make_batch(6, 7, seed)
    y = [
        rng.standard_normal((6, 2)).astype("float32"),
        rng.standard_normal((6, 7, 2)).astype("float32"),
        rng.standard_normal((6, 4 * U)).astype("float32"),
    ]
    model.compile(
        optimizer=keras.optimizers.Adam(0.05), loss=["mse"] * 3, run_eagerly=True
    )
    before = model.get_weights()
    model.fit(x, y, epochs=3, batch_size=6, verbose=0)
    changed = [not np.allclose(a, b) for a, b in zip(before, model.get_weights())]
    assert all(changed), "training must update every weight"
    return model


def assert_outputs_close(actual, expected, what):
    assert len(actual) == len(expected), what
    for i, (a, e) in enumerate(zip(actual, expected)):
        np.testing.assert_allclose(
            a, e, atol=ATOL, rtol=1e-5, err_msg=f"{what}, output {i}"
        )


# -------------------------------------------------------- file contents


def read_keras_file(path):
    """(member names, config dict, {h5 dataset path: array}) of a .keras zip."""
    with zipfile.ZipFile(path) as z:
        names = sorted(z.namelist())
        config = json.loads(z.read("config.json"))
        weights = {}
        with h5py.File(io.BytesIO(z.read("model.weights.h5")), "r") as f:
            f.visititems(
                lambda name, obj: (
                    weights.__setitem__(name, obj[()])
                    if isinstance(obj, h5py.Dataset)
                    else None
                )
            )
    return names, config, weights


def walk_config(obj, path=""):
    """Yields `(path, dict)` for every dict nested anywhere in a config."""
    if isinstance(obj, dict):
        yield path, obj
        for key, value in obj.items():
            yield from walk_config(value, f"{path}/{key}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from walk_config(value, f"{path}[{i}]")


@pytest.fixture(scope="module")
def model_and_oracle():
    keras.utils.set_random_seed(1)
    ours = build_model()
    oracle = build_model(oracle=True)
    copy_weights(ours, oracle)
    return ours, oracle


def test_keras_file_holds_only_keras_classes_and_no_device_setting(
    model_and_oracle, tmp_path
):
    ours, _ = model_and_oracle
    path = tmp_path / "ours.keras"
    ours.save(path)
    names, config, _ = read_keras_file(path)
    assert names == ["config.json", "metadata.json", "model.weights.h5"]

    classes = {
        (entry.get("module"), entry["class_name"])
        for _, entry in walk_config(config)
        if "class_name" in entry
    }
    not_keras = {
        (module, name)
        for module, name in classes
        if name != "__keras_tensor__" and not (module or "").startswith("keras")
    }
    assert not_keras == {
        ("maskedrnn.layers.masked_bidirectional", "MaskedBidirectional")
    }
    assert ("keras.layers", "LSTM") in classes
    assert ("keras.layers", "GRU") in classes

    for where, entry in walk_config(config):
        for key, value in entry.items():
            for text in (key, value if isinstance(value, str) else ""):
                assert not any(w in text.lower() for w in DEVICE_WORDS), (
                    f"device-specific entry {key}={value!r} at {where}"
                )


def test_weights_file_is_that_of_keras_bidirectional(model_and_oracle, tmp_path):
    """Same datasets, shapes and values as the same model built with
    keras.layers.Bidirectional. Keras keys a model's layers in the file by
    their snake-cased class name, so only that group name differs."""
    ours, oracle = model_and_oracle
    ours.save(tmp_path / "ours.keras")
    oracle.save(tmp_path / "oracle.keras")
    _, _, ours_w = read_keras_file(tmp_path / "ours.keras")
    _, _, oracle_w = read_keras_file(tmp_path / "oracle.keras")
    renamed = {
        name.replace("layers/masked_bidirectional", "layers/bidirectional"): value
        for name, value in ours_w.items()
    }
    assert sorted(renamed) == sorted(oracle_w)
    assert "layers/masked_bidirectional/forward_layer/cell/vars/0" in ours_w
    # Per direction: kernel (D, 4U), recurrent_kernel (U, 4U), bias (4U,).
    prefix = "layers/masked_bidirectional_1/forward_layer/cell/vars"
    assert [ours_w[f"{prefix}/{i}"].shape for i in range(3)] == [
        (D, 4 * U),
        (U, 4 * U),
        (4 * U,),
    ]
    for name, value in oracle_w.items():
        np.testing.assert_array_equal(renamed[name], value, err_msg=name)


def test_loaded_file_predicts_like_keras_bidirectional(model_and_oracle, tmp_path):
    """The reloaded model's weights, given to the Keras oracle (plain
    Bidirectional, no maskedrnn layer) with the same mask, predict the same;
    and weights saved from the oracle (e.g. trained with cuDNN in plain
    Keras) run in MaskedBidirectional."""
    ours, _ = model_and_oracle
    ours.save(tmp_path / "ours.keras")
    x = make_batch(6, 7, seed=2)
    oracle_x = [x[0], x[1], lengths_to_mask(x[2], 7)]

    loaded = keras.models.load_model(tmp_path / "ours.keras")
    oracle = build_model(oracle=True)
    copy_weights(loaded, oracle)
    expected = predict(oracle, oracle_x)
    assert_outputs_close(predict(loaded, x), expected, "ours.keras")

    oracle.save(tmp_path / "oracle.keras")
    fresh = build_model()
    copy_weights(keras.models.load_model(tmp_path / "oracle.keras"), fresh)
    assert_outputs_close(predict(fresh, x), expected, "oracle.keras into ours")


def test_load_weights_does_not_cross_layer_classes(model_and_oracle, tmp_path):
    """Limit (Keras' file format): `load_weights` finds a layer's weights by
    its class name, so a Bidirectional model cannot `load_weights` a
    MaskedBidirectional file (nor the reverse). Copy them with
    `set_weights(get_weights())` (same order), or convert the model with
    `maskedrnn.convert_model`."""
    ours, _ = model_and_oracle
    ours.save(tmp_path / "ours.keras")
    with pytest.raises(ValueError, match="could not be loaded"):
        build_model(oracle=True).load_weights(tmp_path / "ours.keras")


def test_file_does_not_depend_on_use_cudnn(tmp_path):
    """The GPU setting (`use_cudnn=True`) and the CPU one save the same file."""
    keras.utils.set_random_seed(3)
    model = build_model(use_cudnn=True)
    inner = [
        getattr(model.get_layer(name), direction)
        for name in ("gru_birnn", "lstm_birnn")
        for direction in ("forward_layer", "backward_layer")
    ]
    assert all(layer.use_cudnn is True for layer in inner)
    model.save(tmp_path / "gpu.keras")
    for layer in inner:
        layer.use_cudnn = False
    model.save(tmp_path / "cpu.keras")
    _, gpu_config, gpu_w = read_keras_file(tmp_path / "gpu.keras")
    _, cpu_config, cpu_w = read_keras_file(tmp_path / "cpu.keras")
    assert gpu_config == cpu_config
    assert sorted(gpu_w) == sorted(cpu_w)
    for name in gpu_w:
        np.testing.assert_array_equal(gpu_w[name], cpu_w[name], err_msg=name)
    reloaded = keras.models.load_model(tmp_path / "gpu.keras")
    assert reloaded.get_layer("lstm_birnn").forward_layer.use_cudnn == "auto"


# ----------------------------------------------------- across backends

OTHER_BACKENDS = ("jax", "torch")


def _worker(workdir):
    """Runs in a subprocess under its own KERAS_BACKEND.

    1. Loads every `<saver>.keras` in `workdir`, predicts on `inputs.npz`,
       writes `<backend>_loads_<saver>.npz`.
    2. Builds its own model (fresh weights: training under JAX would add
       a jit compilation to this slow test), saves `<backend>.keras` and its
       own predictions as `<backend>_own.npz`.
    """
    workdir = pathlib.Path(workdir)
    with np.load(workdir / "inputs.npz") as f:
        x = [f["ids"], f["feats"], f["lengths"]]
    for path in sorted(workdir.glob("*.keras")):
        model = keras.models.load_model(path)
        out = predict(model, x)
        np.savez(workdir / f"{BACKEND}_loads_{path.stem}.npz", *out)
    keras.utils.set_random_seed(7)
    model = build_model()
    model.save(workdir / f"{BACKEND}.keras")
    np.savez(workdir / f"{BACKEND}_own.npz", *predict(model, x))


def _load_npz(path):
    with np.load(path) as f:
        return [f[f"arr_{i}"] for i in range(len(f.files))]


@pytest.mark.slow
@pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="spawns the other backends itself; run once, from the TensorFlow "
    "pytest run, so that the suite does not repeat it per backend",
)
def test_trained_file_round_trips_between_backends(tmp_path):
    """TF trains and saves; JAX then PyTorch load it (each in a subprocess)
    and save their own model; PyTorch also loads JAX's file; TF loads
    both. Every load predicts what the saver predicted, on a batch with
    every padding pattern."""
    keras.utils.set_random_seed(5)
    x = make_batch(6, 9, seed=4)
    np.savez(tmp_path / "inputs.npz", ids=x[0], feats=x[1], lengths=x[2])
    model = train(build_model())
    model.save(tmp_path / "tensorflow.keras")
    saved = {"tensorflow": predict(model, x)}

    # The saver's predictions are masked Bidirectional's (Keras' oracle).
    oracle = build_model(oracle=True)
    copy_weights(model, oracle)
    oracle_x = [x[0], x[1], lengths_to_mask(x[2], 9)]
    assert_outputs_close(saved["tensorflow"], predict(oracle, oracle_x), "oracle")

    for backend in OTHER_BACKENDS:
        run_module_on_backend("tests.test_deploy", tmp_path, backend)
        saved[backend] = _load_npz(tmp_path / f"{backend}_own.npz")

    checked = []
    for backend in OTHER_BACKENDS:
        for saver in saved:
            out = tmp_path / f"{backend}_loads_{saver}.npz"
            if saver != backend and out.exists():
                what = f"saved by {saver}, loaded by {backend}"
                assert_outputs_close(_load_npz(out), saved[saver], what)
                checked.append((saver, backend))
    for saver in OTHER_BACKENDS:
        loaded = keras.models.load_model(tmp_path / f"{saver}.keras")
        what = f"saved by {saver}, loaded by tensorflow"
        assert_outputs_close(predict(loaded, x), saved[saver], what)
        checked.append((saver, "tensorflow"))
    assert sorted(checked) == sorted(
        [
            ("tensorflow", "jax"),
            ("tensorflow", "torch"),
            ("jax", "torch"),
            ("jax", "tensorflow"),
            ("torch", "tensorflow"),
        ]
    )


if __name__ == "__main__":
    _worker(sys.argv[1])
