"""Where a converted model's layers see masks its original did not.

Since Keras 3.16 Keras' RNN wrappers read a mask but no longer pass it on;
maskedrnn's layers still do, as Keras up to 3.15. `mask_changes` finds the
places where that changes what a converted model computes.
"""

import inspect

import keras

from maskedrnn._keras_private import get_keras_mask


def _carries_mask(tensor):
    """Whether the symbolic `tensor` carries a mask when the model runs.

    A nested model's output carries its inner output's mask at run time only.
    """
    if get_keras_mask(tensor) is not None:
        return True
    history = getattr(tensor, "_keras_history", None)
    model = history.operation if history is not None else None
    if isinstance(model, keras.Model) and getattr(model, "outputs", None):
        return _carries_mask(keras.tree.flatten(model.outputs)[history.tensor_index])
    return False


def _has_mask(node):
    """Whether the layer call in `node` got a mask.

    Keras hands an input's mask on only to a call with one tensor argument.
    """
    if node.arguments.kwargs.get("mask") is not None:
        return True
    values = list(node.arguments.args) + list(node.arguments.kwargs.values())
    tensors = [
        v
        for v in values
        if keras.tree.flatten(v)
        and all(isinstance(t, keras.KerasTensor) for t in keras.tree.flatten(v))
    ]
    if len(tensors) != 1:
        return False
    return _carries_mask(keras.tree.flatten(tensors[0])[0])


def _reads_mask(layer):
    return "mask" in inspect.signature(layer.call).parameters


def _layers(model):
    """`{name: layer}` of `model` and the models nested in it."""
    found = {}
    for layer in model.layers:
        found[layer.name] = layer
        if isinstance(layer, keras.Model):
            found.update(_layers(layer))
    return found


def mask_changes(old, new):
    """Layers and outputs of `new` that see a mask where `old`'s do not.

    Args:
        old: The model given to `convert_model`.
        new: Its converted copy (same layer names).

    Returns:
        `(layers, outputs)`: the names of the layers that read a mask (their
        `call` takes `mask`) and get one in `new` but none in `old`, and the
        names of the layers making the outputs that carry a mask in `new` but
        not in `old` (a compiled loss or metric averages over their valid
        steps only).
    """
    old_layers = _layers(old)
    layers = []
    for name, layer in _layers(new).items():
        before = old_layers.get(name)
        if before is None or not _reads_mask(layer):
            continue
        gained = [
            _has_mask(n) and not _has_mask(o)
            for n, o in zip(layer._inbound_nodes, before._inbound_nodes)
        ]
        if any(gained):
            layers.append(name)
    outputs = [
        n._keras_history.operation.name  # the layer that made the output
        for n, o in zip(new.outputs, old.outputs)
        if _carries_mask(n) and not _carries_mask(o)
    ]
    return layers, outputs


def describe(layers, outputs):
    """The warning `convert_model` gives for `mask_changes`' result."""
    where = []
    if layers:
        where.append("layers " + ", ".join(f"'{name}'" for name in layers))
    if outputs:
        where.append(
            "the loss and metrics of outputs "
            + ", ".join(f"'{name}'" for name in outputs)
        )
    return (
        "convert_model: the converted model passes masks on where this "
        "version of Keras does not, so its predictions differ from the "
        f"original model's: {' and '.join(where)} now see the mask. Since "
        "Keras 3.16, Keras' RNN, Bidirectional and TimeDistributed layers no "
        "longer pass their input's mask to the layers after them; maskedrnn's "
        "layers do, as Keras did up to 3.15. The converted model computes "
        "what the original computed on Keras 3.15 (the masked semantics it "
        "was likely trained with)."
    )
