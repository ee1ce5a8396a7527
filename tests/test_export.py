"""Export of MaskedBidirectional models for serving, checked against Keras.

Each exported artifact is run by its own runtime (TensorFlow, LiteRT,
ONNX Runtime) and must reproduce the Keras model's predictions (atol 1e-4)
on a batch with every padding pattern, and on a second batch with another
batch size and another time length (dynamic shapes). The model
(`tests.test_deploy.build_model`) has both kinds of length input: a `mask`
from `Embedding(mask_zero=True)` and an explicit `lengths` input, and outputs
the exact LSTM final states.

On a TensorFlow CPU the model's LSTM runs TensorFlow's fused `BlockLSTMV2`
(`"tf-block-lstm"`) and its GRU the length tiers (`"tf-tiers"`), except
while Keras' exporter traces them: every graph `model.export` writes
(SavedModel, ONNX) carries Keras' own LSTM and GRU, which the converters
read; `export_litert` traces inside
`maskedrnn.backends.portable()`. Which kernel each export traced is read from
`maskedrnn.backends.record()`.

Limits are pinned by tests too: LiteRT needs a fixed batch size (the
dynamic-batch file needs the Flex delegate, which `ai-edge-litert` lacks),
tf2onnx has no `BlockLSTMV2` (Keras' exporter traces Keras' LSTM: plain
`model.export` needs no `portable()`),
and a JAX-backend SavedModel export needs a fixed time length until
`maskedrnn.ops.linear_recurrence_last` handles a symbolic time axis.

The exports run on the TensorFlow backend only (Keras exports through
TensorFlow; the JAX export is checked from the TensorFlow run, in a
subprocess); the helpers' own checks run on every backend. Needs `ai-edge-litert`,
`onnxruntime` and `tf2onnx` (the `ci` and `export` extras install them): a
missing one skips its test with the reason, except under CI (environment
variable `CI` set to `true` or `1`, as `.ci/run` does), where docs/export.md
promises these runtimes are checked, so a missing one fails.
"""

import importlib
import json
import os
import pathlib
import sys

import keras
import numpy as np
import pytest

import maskedrnn.export as mexport
from maskedrnn import backends
from tests.helpers import run_module_on_backend
from tests.test_deploy import build_model, make_batch, predict

BACKEND = keras.backend.backend()
ATOL = 1e-4
INPUTS = ("ids", "feats", "lengths")

def under_ci():
    """True when the `CI` environment variable says this is a CI run."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require(module):
    """Imports `module`; outside CI a missing one skips the test, under CI
    it fails it (the runtimes docs/export.md lists must be checked there)."""
    if not under_ci():
        return pytest.importorskip(module)
    try:
        return importlib.import_module(module)
    except ImportError as error:
        pytest.fail(
            f"{module} is not installed, and CI must check the export runtimes "
            f"docs/export.md lists; install them with pip install -e '.[ci]' "
            f"(got ImportError: {error})."
        )


tf_only = pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="Keras exports SavedModel, LiteRT and ONNX through TensorFlow; "
    "these tests run in the TensorFlow pytest run (the JAX export is "
    "checked from there, in a subprocess)",
)


def assert_matches_keras(outputs, expected, what, rows=None):
    """`outputs`: list of arrays in the model's output order."""
    assert len(outputs) == len(expected), what
    for i, (out, exp) in enumerate(zip(outputs, expected)):
        out = np.asarray(out)
        if rows is not None:
            out = out[:rows]
        assert out.shape == exp.shape, f"{what}, output {i}"
        np.testing.assert_allclose(
            out, exp, atol=ATOL, rtol=1e-4, err_msg=f"{what}, output {i}"
        )


def by_output_index(named):
    """Orders a `{"output_0": ..., "output_1": ...}` dict (SavedModel and
    LiteRT signatures name the model's outputs in order)."""
    return [named[f"output_{i}"] for i in range(len(named))]


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(11)
    return build_model()


@pytest.fixture(scope="module")
def batches(model):
    """Two batches with different batch sizes and time lengths, with the
    Keras model's predictions."""
    out = {}
    for name, (batch, time, seed) in {"6x7": (6, 7, 0), "3x11": (3, 11, 1)}.items():
        x = make_batch(batch, time, seed)
        out[name] = (dict(zip(INPUTS, x)), predict(model, x))
    return out


def kernels_traced(plans):
    return {d.kernel for p in plans for d in p.directions}


# The LSTM's fused kernel and the GRU's tiers (a TensorFlow CPU's defaults).
TIERED = {"tf-block-lstm", "tf-tiers"}


def block_lstm_here():
    """Whether the model's LSTM runs `BlockLSTMV2` and its GRU the length
    tiers by default here (a TensorFlow CPU)."""
    if BACKEND != "tensorflow":
        return False
    return not backends.current().has_fused_rnn_kernel()


@pytest.fixture(scope="module")
def saved_model_dir(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "saved_model"
    with backends.record() as plans:
        model.export(path, format="tf_saved_model", verbose=False)
    assert (TIERED & kernels_traced(plans) == TIERED) == block_lstm_here()
    return path


@pytest.fixture(scope="module")
def portable_saved_model_dir(model, tmp_path_factory):
    """The SavedModel traced inside `maskedrnn.backends.portable()`: Keras'
    own LSTM, what the LiteRT converter reads."""
    path = tmp_path_factory.mktemp("export") / "portable_saved_model"
    with backends.portable(), backends.record() as plans:
        model.export(path, format="tf_saved_model", verbose=False)
    assert not TIERED & kernels_traced(plans)
    return path


# ------------------------------------------------------------- SavedModel


@tf_only
def test_saved_model_matches_keras(saved_model_dir, batches):
    import tensorflow as tf

    loaded = tf.saved_model.load(str(saved_model_dir))
    serve = loaded.signatures["serving_default"]
    _, specs = serve.structured_input_signature
    assert {k: (tuple(s.shape), s.dtype.name) for k, s in specs.items()} == {
        "ids": ((None, None), "int32"),
        "feats": ((None, None, 3), "float32"),
        "lengths": ((None,), "int32"),
    }
    for name, (x, expected) in batches.items():
        named = serve(**{k: tf.constant(v) for k, v in x.items()})
        outputs = [t.numpy() for t in by_output_index(named)]
        assert_matches_keras(outputs, expected, f"SavedModel signature, {name}")
        # The `serve` endpoint takes the model's input list.
        outputs = [t.numpy() for t in loaded.serve([x[k] for k in INPUTS])]
        assert_matches_keras(outputs, expected, f"SavedModel serve, {name}")


# ----------------------------------------------------------------- LiteRT


@tf_only
@pytest.mark.slow
def test_litert_with_fixed_batch_matches_keras(model, batches, tmp_path):
    interpreter = require("ai_edge_litert.interpreter")
    with backends.record() as plans:
        path = mexport.export_litert(model, tmp_path / "m.tflite", batch_size=6)
    assert plans and not TIERED & kernels_traced(plans)
    lite = interpreter.Interpreter(model_path=path)
    details = {d["name"]: d for d in lite.get_input_details()}
    shapes = {
        k.split("_", 2)[-1].split(":")[0]: list(d["shape_signature"])
        for k, d in details.items()
    }
    # Fixed batch (6), dynamic time (-1).
    assert shapes == {"ids": [6, -1], "feats": [6, -1, 3], "lengths": [6]}
    runner = lite.get_signature_runner("serving_default")
    x, expected = batches["6x7"]
    outputs = by_output_index(runner(**x))
    assert_matches_keras(outputs, expected, "LiteRT, 6x7")
    # Fewer rows and another length: pad with empty rows, keep the first 3.
    x, expected = batches["3x11"]
    padded, n = mexport.pad_batch_rows([x[k] for k in INPUTS], 6)
    assert n == 3
    outputs = by_output_index(runner(**dict(zip(INPUTS, padded))))
    assert_matches_keras(outputs, expected, "LiteRT, 3x11 padded to 6", rows=n)


@tf_only
@pytest.mark.slow
def test_litert_dynamic_batch_needs_the_flex_delegate(
    portable_saved_model_dir, batches
):
    """Limit: with a dynamic batch, Keras' RNN loop (a TensorArray of
    `(batch, units)` steps) does not lower to TFLite built-in ops; allowing
    TensorFlow ops converts, but the LiteRT interpreter has no Flex delegate
    to run them. Hence `export_litert`'s fixed batch."""
    interpreter = require("ai_edge_litert.interpreter")
    import tensorflow as tf

    def convert(ops):
        converter = tf.lite.TFLiteConverter.from_saved_model(
            str(portable_saved_model_dir)
        )
        converter.target_spec.supported_ops = ops
        return converter.convert()

    builtins = tf.lite.OpsSet.TFLITE_BUILTINS
    with pytest.raises(Exception, match="element_shape to be static"):
        convert([builtins])
    blob = convert([builtins, tf.lite.OpsSet.SELECT_TF_OPS])
    runner = interpreter.Interpreter(model_content=blob).get_signature_runner()
    x, _ = batches["6x7"]
    with pytest.raises(RuntimeError, match="Flex delegate"):
        runner(**x)


@tf_only
def test_export_litert_checks_its_arguments(model, tmp_path):
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        mexport.export_litert(model, tmp_path / "m.tflite", batch_size=0)
    with pytest.raises(ValueError, match="end with '.tflite'"):
        mexport.export_litert(model, tmp_path / "m.lite", batch_size=2)
    with pytest.raises(ValueError, match="exactly one of batch_size"):
        mexport.export_litert(model, tmp_path / "m.tflite")
    dynamic = [[keras.InputSpec(shape=(None, None), dtype="int32")]]
    with pytest.raises(ValueError, match="fixed \\(int\\) batch size"):
        mexport.export_litert(model, tmp_path / "m.tflite", input_signature=dynamic)
    with pytest.raises(ValueError, match="sets target_spec"):
        mexport.export_litert(
            model, tmp_path / "m.tflite", batch_size=2, target_spec={}
        )


@pytest.mark.skipif(
    BACKEND == "tensorflow", reason="checks the error on the other backends"
)
def test_export_litert_refuses_other_backends(model, tmp_path):
    with pytest.raises(ValueError, match="needs the TensorFlow backend"):
        mexport.export_litert(model, tmp_path / "m.tflite", batch_size=2)


def test_static_batch_signature_and_pad_batch_rows(model):
    (specs,) = mexport.static_batch_signature(model, 4)
    assert [(s.name, s.shape, s.dtype) for s in specs] == [
        ("ids", (4, None), "int32"),
        ("feats", (4, None, 3), "float32"),
        ("lengths", (4,), "int32"),
    ]
    ids = np.array([[3, 1], [2, 0]], "int32")
    lengths = np.array([2, 1], "int32")
    (p_ids, p_lengths), n = mexport.pad_batch_rows([ids, lengths], 4)
    assert n == 2
    np.testing.assert_array_equal(p_ids, [[3, 1], [2, 0], [0, 0], [0, 0]])
    np.testing.assert_array_equal(p_lengths, [2, 1, 0, 0])
    assert p_ids.dtype == ids.dtype and p_lengths.dtype == lengths.dtype
    with pytest.raises(ValueError, match="feed them in chunks"):
        mexport.pad_batch_rows([ids], 1)
    with pytest.raises(ValueError, match="same number of rows"):
        mexport.pad_batch_rows([ids, lengths[:1]], 4)


# ------------------------------------------------------------------- ONNX


@tf_only
@pytest.mark.slow
def test_onnx_matches_keras(model, batches, tmp_path):
    ort = require("onnxruntime")
    require("tf2onnx")
    path = tmp_path / "m.onnx"
    with backends.portable(), backends.record() as plans:
        model.export(path, format="onnx", verbose=False)
    assert plans and not TIERED & kernels_traced(plans)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    assert sorted(inputs) == sorted(INPUTS)
    # Batch and time are symbolic (named) dimensions, features fixed.
    assert [isinstance(d, str) for d in inputs["feats"].shape] == [True, True, False]
    assert isinstance(inputs["lengths"].shape[0], str)
    for name, (x, expected) in batches.items():
        outputs = session.run(None, x)
        assert_matches_keras(outputs, expected, f"ONNX, {name}")


@tf_only
@pytest.mark.slow
def test_plain_onnx_export_traces_keras_lstm_and_loads(model, batches, tmp_path):
    """`model.export(format="onnx")` with no `portable()` block: Keras'
    exporter traces the model, so the LSTM runs Keras' layer there (tf2onnx
    has no `BlockLSTMV2`) and ONNX Runtime loads and runs the file; the
    same model outside the export still runs BlockLSTMV2."""
    ort = require("onnxruntime")
    require("tf2onnx")
    path = tmp_path / "m.onnx"
    with backends.record() as plans:
        model.export(path, format="onnx", verbose=False)
    # (The exporter also reads `uses_fast_path` eagerly, a plan of no graph.)
    if block_lstm_here():
        sentences = [s for p in plans for s in p.info().values()]
        assert any("traced by Keras' exporter" in s for s in sentences), sentences
        with backends.record() as eager_plans:
            model(list(make_batch(2, 5, 0)))
        assert TIERED <= kernels_traced(eager_plans)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name, (x, expected) = next(iter(batches.items()))
    assert_matches_keras(session.run(None, x), expected, f"ONNX, {name}")


# ------------------------------------------------- SavedModel from JAX

JAX_TIME = 7


def _jax_export_worker(workdir):
    """Runs under KERAS_BACKEND=jax: loads `model.keras`, exports it as a
    SavedModel with a fixed time length (`static/`) and with dynamic batch
    and time (`dynamic/`), and records each export's error, if any."""
    workdir = pathlib.Path(workdir)
    model = keras.models.load_model(workdir / "model.keras")
    signature = [
        [
            keras.InputSpec(shape=(None, JAX_TIME), dtype="int32", name="ids"),
            keras.InputSpec(shape=(None, JAX_TIME, 3), dtype="float32", name="feats"),
            keras.InputSpec(shape=(None,), dtype="int32", name="lengths"),
        ]
    ]
    errors = {}
    for name, sig in (("static", signature), ("dynamic", None)):
        try:
            model.export(
                workdir / name,
                format="tf_saved_model",
                input_signature=sig,
                verbose=False,
            )
            errors[name] = None
        except Exception as e:  # recorded for the test to assert on
            errors[name] = f"{type(e).__name__}: {e}"
    (workdir / "errors.json").write_text(json.dumps(errors))


@pytest.fixture(scope="module")
def jax_exports(model, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("jax_export")
    model.save(workdir / "model.keras")
    run_module_on_backend("tests.test_export", workdir, "jax")
    return workdir, json.loads((workdir / "errors.json").read_text())


def _check_jax_saved_model(path, model, batch_specs):
    import tensorflow as tf

    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    for batch, time, seed in batch_specs:
        x = make_batch(batch, time, seed)
        named = serve(**{k: tf.constant(v) for k, v in zip(INPUTS, x)})
        outputs = [t.numpy() for t in by_output_index(named)]
        assert_matches_keras(
            outputs, predict(model, x), f"JAX SavedModel, {batch}x{time}"
        )


@tf_only
@pytest.mark.slow
def test_jax_saved_model_with_fixed_time_matches_keras(model, jax_exports):
    workdir, errors = jax_exports
    assert errors["static"] is None, errors["static"]
    # Dynamic batch, fixed time.
    _check_jax_saved_model(
        workdir / "static", model, [(6, JAX_TIME, 0), (3, JAX_TIME, 1)]
    )


@tf_only
@pytest.mark.slow
def test_jax_saved_model_with_dynamic_time_matches_keras(model, jax_exports):
    workdir, errors = jax_exports
    assert errors["dynamic"] is None, errors["dynamic"]
    _check_jax_saved_model(workdir / "dynamic", model, [(6, 7, 0), (3, 11, 1)])


if __name__ == "__main__":
    _jax_export_worker(sys.argv[1])


def test_missing_runtime_skips_locally_and_fails_under_ci(monkeypatch):
    missing = "maskedrnn_no_such_runtime"
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        require(missing)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must check"):
        require(missing)
    assert require("json") is json
