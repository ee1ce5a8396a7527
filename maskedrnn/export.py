"""Serving helpers: LiteRT (TFLite) export with a fixed batch, and row padding.

Keras exports these models to SavedModel and ONNX directly; LiteRT built-in
ops need a known batch size for Keras' RNN loop, so `export_litert` fixes it
and `pad_batch_rows` pads smaller batches with empty rows. See
`docs/export.md`.
"""

import keras
import numpy as np

from maskedrnn import backends

__all__ = ["export_litert", "pad_batch_rows", "static_batch_signature"]


def _check_batch_size(batch_size):
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, (int, np.integer))
        or batch_size < 1
    ):
        raise ValueError(
            "batch_size must be a positive int (the fixed number of rows the "
            f"exported model takes); got batch_size={batch_size!r}."
        )
    return int(batch_size)


def static_batch_signature(model, batch_size):
    """The input signature of `model` with its batch axis fixed to `batch_size`.

    Args:
        model: A built Functional or Sequential `keras.Model`.
        batch_size: Positive int.

    Returns:
        `model.export()`'s `input_signature`: `keras.InputSpec`s keeping the
        inputs' names, dtypes and other axes.

    Example:

    ```python
    seq = keras.Input((None, 12), name="seq")
    lengths = keras.Input((), dtype="int32", name="lengths")
    y = maskedrnn.MaskedBidirectional(keras.layers.GRU(8))(seq, lengths=lengths)
    model = keras.Model([seq, lengths], y)
    static_batch_signature(model, 4)
    # [[InputSpec(shape=(4, None, 12), name=seq),
    #   InputSpec(shape=(4,), dtype=int32, name=lengths)]]
    ```
    """
    batch_size = _check_batch_size(batch_size)
    if not isinstance(model, keras.Model):
        raise ValueError(f"model must be a keras.Model; got model={model!r}.")
    if not model.built:
        raise ValueError("model is not built: call it once or build it before export.")

    def spec(x):
        return keras.InputSpec(
            shape=(batch_size,) + tuple(x.shape[1:]),
            dtype=x.dtype,
            name=x.name,
        )

    if isinstance(model, keras.Sequential):
        return [spec(x) for x in model.inputs]
    if not isinstance(getattr(model, "inputs", None), list):
        raise ValueError(
            "static_batch_signature needs a Functional or Sequential model "
            "(one with symbolic inputs). For a subclassed model, pass "
            "input_signature to export_litert yourself."
        )
    return [keras.tree.map_structure(spec, model.input)]


def export_litert(
    model,
    filepath,
    batch_size=None,
    input_signature=None,
    verbose=None,
    **converter_kwargs,
):
    """Exports `model` to a `.tflite` file that runs on the LiteRT interpreter.

    `model.export(filepath, format="litert")` with a fixed batch size and
    built-in ops only, so the plain `ai_edge_litert` interpreter runs it; the
    time axis stays dynamic. Traced in `maskedrnn.backends.portable()`, so
    LSTMs run Keras' own layer. Needs the TensorFlow backend.

    Args:
        model: A built `keras.Model`.
        filepath: Path ending in `.tflite`.
        batch_size: Positive int, the fixed batch size; or pass
            `input_signature`.
        input_signature: Optional signature with a fixed batch size in every
            spec. Defaults to `static_batch_signature(model, batch_size)`.
        verbose: Passed to `model.export`. Defaults to `None`.
        **converter_kwargs: `tf.lite.TFLiteConverter` attributes, not
            `target_spec`.

    Returns:
        `filepath` as a `str`.

    Example:

    ```python
    maskedrnn.export.export_litert(model, "tagger.tflite", batch_size=8)

    from ai_edge_litert.interpreter import Interpreter
    runner = Interpreter(model_path="tagger.tflite").get_signature_runner()
    ids, n = maskedrnn.export.pad_batch_rows([ids], 8)  # 3 rows -> 8 rows
    outputs = runner(ids=ids[0])  # {"output_0": ...}; keep the first n rows
    ```
    """
    if backends.name() != "tensorflow":
        raise ValueError(
            "export_litert needs the TensorFlow backend (Keras converts to "
            "LiteRT through a TensorFlow SavedModel). Save the model as "
            ".keras, then load and export it with KERAS_BACKEND=tensorflow. "
            f"Current backend: {backends.name()!r}."
        )
    filepath = str(filepath)
    if not filepath.endswith(".tflite"):
        raise ValueError(
            f"filepath must end with '.tflite'; got filepath={filepath!r}."
        )
    if "target_spec" in converter_kwargs:
        raise ValueError(
            "export_litert sets target_spec (TFLite built-in ops only, so "
            "the file runs without the Flex delegate); call "
            "model.export(format='litert', ...) directly to choose your own."
        )
    if (batch_size is None) == (input_signature is None):
        raise ValueError(
            "Pass exactly one of batch_size (e.g. batch_size=8) and "
            "input_signature; got "
            f"batch_size={batch_size!r}, input_signature={input_signature!r}."
        )
    if input_signature is None:
        input_signature = static_batch_signature(model, batch_size)
    else:
        for spec in keras.tree.flatten(input_signature):
            shape = getattr(spec, "shape", None)
            if not shape or not isinstance(shape[0], int):
                raise ValueError(
                    "Every spec of input_signature needs a fixed (int) batch "
                    "size: LiteRT built-in ops cannot hold a dynamic batch "
                    f"for Keras' RNN loop; got a spec {spec!r}. Use "
                    "static_batch_signature(model, batch_size)."
                )

    import tensorflow as tf

    with backends.portable():
        model.export(
            filepath,
            format="litert",
            input_signature=input_signature,
            verbose=verbose,
            target_spec={"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS]},
            **converter_kwargs,
        )
    return filepath


def pad_batch_rows(arrays, batch_size):
    """Pads every array along axis 0 with zero rows up to `batch_size` rows.

    Zero rows are empty sequences, which the masked layers handle exactly and
    independently of the real rows; discard outputs past the first `n` rows.

    Args:
        arrays: List of arrays with the same number of rows `n`.
        batch_size: Positive int, at least `n`.

    Returns:
        A tuple `(padded, n)`: the padded numpy arrays, dtypes kept, and `n`.

    Example:

    >>> (padded,), n = pad_batch_rows([np.array([[3, 1], [2, 0]])], 4)
    >>> padded, n
    (array([[3, 1], [2, 0], [0, 0], [0, 0]]), 2)
    """
    batch_size = _check_batch_size(batch_size)
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise ValueError(
            "arrays must be a non-empty list of arrays, e.g. [ids] or "
            f"[features, lengths]; got arrays={arrays!r}."
        )
    arrays = [np.asarray(a) for a in arrays]
    rows = {a.shape[0] if a.ndim else None for a in arrays}
    if len(rows) != 1 or None in rows:
        raise ValueError(
            "All arrays need a batch axis with the same number of rows; got "
            f"shapes {[a.shape for a in arrays]}."
        )
    (n,) = rows
    if n > batch_size:
        raise ValueError(
            f"The arrays have {n} rows, more than batch_size={batch_size}; "
            "feed them in chunks of at most batch_size rows."
        )
    padded = [
        np.concatenate([a, np.zeros((batch_size - n,) + a.shape[1:], a.dtype)])
        for a in arrays
    ]
    return padded, n
