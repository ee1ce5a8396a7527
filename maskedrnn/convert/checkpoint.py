"""Weight checkpoints across Keras' RNN layers and maskedrnn's wrappers.

Keras 3 weight files key layers by class name (`bidirectional`,
`masked_bidirectional`, ...), so Keras' `load_weights` cannot cross them.
"""

import os
import tempfile
import zipfile

import keras

from maskedrnn._keras_private import Functional
from maskedrnn.convert.model import (
    _PLAIN_RNNS,
    _Converter,
    _inner_sources,
    _ToKeras,
    _ToMasked,
)
from maskedrnn.layers import MaskedBidirectional, MaskedRNN

__all__ = ["load_weights"]

# Where `.keras` archives keep their weights (keras/src/saving/saving_lib.py).
_KERAS_ARCHIVE_WEIGHTS = "model.weights.h5"


def _layout(filepath):
    """`{dataset path: shape}` of a Keras weights file, without the optimizer.

    The optimizer's variables are numbered in the model's weight order, which
    the wrappers do not change.
    """
    import h5py  # Only here: `import maskedrnn` must not need h5py.

    layout = {}

    def visit(name, item):
        if isinstance(item, h5py.Dataset) and not name.startswith("optimizer/"):
            layout[name] = tuple(item.shape)

    if str(filepath).endswith(".keras"):
        with zipfile.ZipFile(filepath) as archive:
            with archive.open(_KERAS_ARCHIVE_WEIGHTS) as stream:
                with h5py.File(stream, "r") as file:
                    file.visititems(visit)
    else:
        with h5py.File(filepath, "r") as file:
            file.visititems(visit)
    return layout


def _model_layout(model, directory, name):
    path = os.path.join(directory, f"{name}.weights.h5")
    model.save_weights(path)
    return _layout(path)


def _twin(model, direction, kinds):
    """`model` rebuilt with its `kinds` layers swapped, and the converter used."""
    converter = _Converter(
        direction, compile=False, select=lambda layer: isinstance(layer, kinds)
    )
    return converter.convert(model), converter


_GROUPS = (
    (_ToKeras, ((MaskedBidirectional,), (MaskedRNN,))),
    (_ToMasked, ((keras.layers.Bidirectional,), _PLAIN_RNNS)),
)


def _swaps(model):
    """`(direction, classes)` to try: all groups the model has, then each alone."""
    for direction, groups in _GROUPS:
        present = [group for group in groups if _inner_sources(model, group)]
        if present:
            yield direction, tuple(cls for group in present for cls in group)
        if len(present) > 1:
            yield from ((direction, group) for group in present)


def _differences(expected, found):
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    reshaped = sorted(
        path for path in set(expected) & set(found) if expected[path] != found[path]
    )
    lines = []
    for title, paths in (
        ("in the model but not in the file", missing),
        ("in the file but not in the model", unexpected),
        ("with different shapes", reshaped),
    ):
        if paths:
            shown = ", ".join(paths[:4]) + (", ..." if len(paths) > 4 else "")
            lines.append(f"{len(paths)} weights {title} ({shown})")
    return "; ".join(lines)


def load_weights(model, filepath):
    """Loads Keras weights across Keras' RNN layers and maskedrnn's wrappers.

    Loads a checkpoint of a model built with `Bidirectional` and plain
    `LSTM`/`GRU`/`SimpleRNN` layers into the same architecture built with
    `MaskedBidirectional`/`MaskedRNN` (e.g. from `convert_model`), and back;
    Keras' `load_weights` cannot, its files key layers by class name. If the
    layouts differ, `model` is rebuilt with the other classes until one matches
    the file, and only the layers' weights (no optimizer state) are copied.
    Nothing is assigned unless a layout matches.

    Args:
        model: A built Sequential or Functional `keras.Model` (a subclassed
            one keys layers by attribute, so `model.load_weights` works).
        filepath: Path of a `.weights.h5` or `.keras` file.

    Returns:
        None; the model's variables are assigned in place.

    Raises:
        TypeError: If `model` is not a `keras.Model`.
        ValueError: If `model` is not built, `filepath` has another extension,
            or no layout matches (the message lists the weights that differ).

    Example:

    ```python
    inputs = keras.Input((None, 4))
    x = keras.layers.Bidirectional(keras.layers.LSTM(8))(inputs)
    old_model = keras.Model(inputs, keras.layers.Dense(1)(x))
    old_model.save_weights("old.weights.h5")

    new_model = maskedrnn.convert_model(old_model)
    maskedrnn.load_weights(new_model, "old.weights.h5")  # works both ways
    ```
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            "`model` must be a keras.Model (e.g. the one `convert_model` "
            f"returns); got model={model!r}."
        )
    if not model.built:
        raise ValueError(
            f"Model '{model.name}' is not built, so it has no weights to load "
            "into yet; got an unbuilt model. Build it first "
            "(`model.build(input_shape)` or call it once on a batch)."
        )
    filepath = os.fspath(filepath)
    if not str(filepath).endswith((".weights.h5", ".keras")):
        raise ValueError(
            "`filepath` must be a Keras 3 weights file ending in `.weights.h5` "
            "(from `model.save_weights`) or a `.keras` file (from `model.save`); "
            f"got {filepath!r}. For tf-keras `.h5` files with CuDNN layers use "
            "`maskedrnn.convert.load_legacy_cudnn_h5`."
        )
    found = _layout(filepath)
    with tempfile.TemporaryDirectory() as directory:
        own = _model_layout(model, directory, "own")
        if own == found:
            model.load_weights(filepath)
            return
        rebuildable = isinstance(model, (keras.Sequential, Functional))
        tried = [own]
        swaps = _swaps(model) if rebuildable else ()
        for index, (direction, kinds) in enumerate(swaps):
            twin, converter = _twin(model, direction, kinds)
            tried.append(_model_layout(twin, directory, f"twin{index}"))
            if tried[-1] != found:
                continue
            twin.load_weights(filepath)
            # Check every pair, then assign: all or nothing.
            assignments = []
            for original, copy in converter.leaves:
                values = copy.get_weights()
                for variable, value in zip(original.weights, values, strict=True):
                    if tuple(variable.shape) != tuple(value.shape):
                        raise ValueError(
                            f"Layer '{original.name}': weight {variable.path!r} "
                            f"has shape {tuple(variable.shape)} but the file "
                            f"holds shape {tuple(value.shape)}; got a checkpoint "
                            "of another architecture."
                        )
                    assignments.append((variable, value))
            for variable, value in assignments:
                variable.assign(value)
            return
    # Report against the layout that differs least (e.g. the swapped model).
    closest = min(
        tried, key=lambda layout: len(set(layout.items()) ^ set(found.items()))
    )
    hint = (
        ""
        if rebuildable
        else f" '{model.name}' is a subclassed model, which cannot be rebuilt "
        "with the other wrapper class; its layers are keyed by attribute name, "
        "so `model.load_weights(filepath)` loads checkpoints of the same class."
    )
    raise ValueError(
        f"The weights in {filepath!r} do not fit model '{model.name}', neither "
        "as it is nor with its Bidirectional/MaskedBidirectional layers swapped: "
        f"{_differences(closest, found)}; got a checkpoint of another "
        f"architecture. Build the model with the same layers, in the same "
        f"order, as the saved one.{hint}"
    )
