"""Serving helpers: LiteRT (TFLite) export with a fixed batch, and row padding.

Keras exports models that use `MaskedBidirectional` to a TensorFlow
SavedModel and to ONNX with dynamic batch and time axes, directly with
`model.export(...)` (see `docs/export.md`). LiteRT is the exception: Keras'
TensorFlow RNN loop stores its per-step outputs in a `TensorArray` whose
element shape is `(batch, units)`, and the LiteRT converter can only lower
that to built-in ops when the batch size is known. Left dynamic, it needs the
TensorFlow "Flex" delegate, which the pip `ai-edge-litert` interpreter does
not ship. `export_litert` therefore fixes the batch size (the time axis stays
dynamic), and `pad_batch_rows` pads a smaller batch up to it with zero-length
rows, which `MaskedBidirectional` handles exactly.

The LiteRT converter (built-in ops) and tf2onnx have no
`tf.raw_ops.BlockLSTMV2`, the fused LSTM kernel an LSTM runs on a TensorFlow
CPU (`maskedrnn.backends.WAYS`, `"tf-block-lstm"`): `export_litert` traces the
model inside `maskedrnn.backends.portable()`, where every LSTM runs Keras' own
layer, which they convert; so does every graph Keras' exporter traces
(`model.export`, ONNX and SavedModel alike).
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

    Every other axis keeps its declared size (`None` stays dynamic). The
    structure is what `model.export(..., input_signature=...)` expects.

    Args:
        model: A built Functional or Sequential `keras.Model`.
        batch_size: Positive int, the batch size to fix.

    Returns:
        For a Functional model, a one-element list holding the model's input
        structure (list, dict or single spec) of `keras.InputSpec`; for a
        Sequential model, a list of `keras.InputSpec`. Each spec keeps the
        input's name and dtype.

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

    Calls `model.export(filepath, format="litert", ...)` with a fixed batch
    size and TFLite built-in ops only, so that the file runs on the plain
    `ai_edge_litert.interpreter.Interpreter` (which has no Flex delegate for
    TensorFlow ops). The time axis stays dynamic: the interpreter's signature
    runner resizes it for each call. Run batches smaller than `batch_size`
    by padding them with `pad_batch_rows`; feed larger ones in chunks.

    Conversion fails (with the converter's error) rather than silently
    emitting TensorFlow ops that the LiteRT interpreter cannot run. The model
    is traced inside `maskedrnn.backends.portable()`: its LSTMs run Keras'
    layer, not TensorFlow's `BlockLSTMV2` (no LiteRT built-in op), and
    compute the same function.

    Requires the TensorFlow backend: Keras converts through a TensorFlow
    SavedModel.

    Args:
        model: A built `keras.Model`, e.g. one using `MaskedBidirectional` with
            `Embedding(mask_zero=True)` or an explicit `lengths` input.
        filepath: `str` or path ending in `.tflite`.
        batch_size: Positive int, the fixed batch size of the exported model.
            Defaults to `None`: then `input_signature` is required.
        input_signature: Optional signature in `model.export`'s format, with
            a fixed (int) batch size in every spec. Defaults to `None`:
            `static_batch_signature(model, batch_size)`.
        verbose: Passed to `model.export`. Defaults to `None` (Keras' default).
        **converter_kwargs: Extra `tf.lite.TFLiteConverter` attributes
            passed through `model.export` (e.g. `optimizations`). Defaults to
            none. `target_spec` is set here and cannot be passed.

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

    For a model exported with a fixed batch size (`export_litert`): zero rows
    are empty sequences (length 0, or all padding ids for
    `Embedding(mask_zero=True)`), which `MaskedBidirectional` handles exactly
    and independently of the real rows. Discard the outputs past the first
    `n` rows.

    Args:
        arrays: List (or tuple) of arrays with the same number of rows `n`,
            e.g. `[features, lengths]` or `[ids]`.
        batch_size: Positive int, at least `n`.

    Returns:
        A tuple `(padded, n)`: the list of padded numpy arrays, each with
        `batch_size` rows and its original dtype, and `n`.

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
