"""`convert_model`'s `only=` and `exclude=`: which layers it converts."""

import keras


def selector(model, only, exclude):
    """`select(layer) -> bool` for `convert_model`'s `only=` / `exclude=`."""
    names = {layer.name for layer in model._flatten_layers(include_self=False)}

    def items_of(value, argument):
        if value is None:
            return None
        items = [value] if isinstance(value, (str, type)) else list(value)
        for item in items:
            if isinstance(item, str):
                if item not in names:
                    raise ValueError(
                        f"`{argument}` names layer {item!r}, which model "
                        f"'{model.name}' does not have; got {argument}={value!r}. "
                        f"Its layers: {sorted(names)}."
                    )
            elif not (isinstance(item, type) and issubclass(item, keras.layers.Layer)):
                raise TypeError(
                    f"`{argument}` must hold layer names and layer classes (e.g. "
                    f"keras.layers.LSTM); got {item!r} in {argument}={value!r}."
                )
        return items

    def matches(layer, items):
        return any(
            layer.name == item if isinstance(item, str) else isinstance(layer, item)
            for item in items
        )

    only_items = items_of(only, "only")
    exclude_items = items_of(exclude, "exclude")

    def select(layer):
        if only_items is not None and not matches(layer, only_items):
            return False
        return not (exclude_items and matches(layer, exclude_items))

    return select
