"""The one-line upgrade: swap Keras' RNN layers for maskedrnn's in a model.

`convert_model(model)` rebuilds a Sequential or Functional model with
`MaskedBidirectional` and `MaskedRNN` layers; `bidirectional_to_masked(layer)`
converts one layer.
"""

import warnings

import keras

# Private Keras API: `Functional` (see `maskedrnn._keras_private`) and
# `Layer._flatten_layers`, to find RNNs inside layers copied as a whole.
from maskedrnn._keras_private import Functional
from maskedrnn.convert import masks
from maskedrnn.convert.select import selector
from maskedrnn.layers import MaskedBidirectional, MaskedRNN

__all__ = ["bidirectional_to_masked", "convert_model"]

# Layers with a fused kernel to keep; `keras.layers.RNN(cell)` has none.
_PLAIN_RNNS = (keras.layers.LSTM, keras.layers.GRU, keras.layers.SimpleRNN)
# Layers whose sublayers are RNNs by design, not layers left unconverted.
_RNN_WRAPPERS = (keras.layers.Bidirectional, MaskedBidirectional, MaskedRNN)

_SUBCLASSED_HOWTO = (
    "Swap the layer by hand: in the model's __init__, replace e.g. "
    "`self.rnn = keras.layers.Bidirectional(keras.layers.LSTM(64))` by "
    "`self.rnn = maskedrnn.MaskedBidirectional(keras.layers.LSTM(64))` (same "
    "arguments; call it with the same `mask`), create and build the new model "
    "(call it once on a batch), then copy the weights with "
    "`new_model.set_weights(old_model.get_weights())`: MaskedBidirectional "
    "holds the same weights as Bidirectional, in the same order. For one "
    "built layer, `maskedrnn.bidirectional_to_masked(layer)` returns the "
    "MaskedBidirectional with its weights."
)


def _unconvertible_reason(layer):
    """Why a `Bidirectional` cannot become a `MaskedBidirectional`, or None."""
    if type(layer) is not keras.layers.Bidirectional:
        return (
            f"it is a subclass of Bidirectional ({type(layer).__name__}), "
            "whose own behaviour MaskedBidirectional would not keep"
        )
    for inner in (layer.forward_layer, layer.backward_layer):
        if not isinstance(inner, keras.layers.RNN):
            return (
                f"it wraps {type(inner).__name__} '{inner.name}', which is not "
                "a keras.layers.RNN (MaskedBidirectional wraps RNN layers only)"
            )
    if layer.stateful:
        return (
            "its RNN is stateful=True; MaskedBidirectional does not carry "
            "states across batches"
        )
    if layer.forward_layer.go_backwards:
        return (
            "its wrapped layer has go_backwards=True, so its 'forward' "
            "direction reads backwards; MaskedBidirectional needs a forward "
            "layer with go_backwards=False"
        )
    return None


def _rnn_unconvertible_reason(layer):
    """Why a plain `LSTM`/`GRU`/`SimpleRNN` cannot become a `MaskedRNN`, or None."""
    if type(layer) not in _PLAIN_RNNS:
        return (
            f"it is a subclass ({type(layer).__name__}) of a Keras RNN layer, "
            "whose own behaviour MaskedRNN would not keep"
        )
    if layer.stateful:
        return "it is stateful=True; MaskedRNN does not carry states across batches"
    return None


def _masked_from_rnn(layer):
    """An unbuilt `MaskedRNN` around a copy of `layer`, with its name and dtype."""
    return MaskedRNN(
        _plain_copy(layer),
        name=layer.name,
        dtype=layer.dtype_policy,
        trainable=layer.trainable,
    )


def _rnn_from_masked(layer):
    """The plain RNN layer a `MaskedRNN` stands for (inverse of `_masked_from_rnn`)."""
    config = layer.get_config()["layer"]
    config["config"]["name"] = layer.name
    config["config"]["trainable"] = layer.trainable
    new = keras.saving.deserialize_keras_object(config)
    if hasattr(layer.layer, "use_cudnn"):
        new.use_cudnn = layer.layer.use_cudnn
    return new


def _lengths_to_mask(inputs, lengths):
    # Built with cumsum because the time dimension may be unknown here.
    ones = keras.ops.ones_like(inputs[:, :, 0], dtype="int32")
    positions = keras.ops.cumsum(ones, axis=1)
    lengths = keras.ops.expand_dims(keras.ops.cast(lengths, "int32"), -1)
    return keras.ops.less_equal(positions, lengths)


def _copy_use_cudnn(source, target):
    """Copies `use_cudnn`, which RNN configs do not hold, onto a copy."""
    for attr in (None, "forward_layer", "backward_layer"):
        src = source if attr is None else getattr(source, attr, None)
        dst = target if attr is None else getattr(target, attr, None)
        if src is not None and dst is not None and hasattr(src, "use_cudnn"):
            dst.use_cudnn = src.use_cudnn


def _masked_from_bidirectional(layer):
    """An unbuilt `MaskedBidirectional` with `layer`'s configuration."""
    base = layer.get_config()
    for key in ("layer", "backward_layer", "merge_mode"):
        base.pop(key, None)
    # Passed as objects so that their `use_cudnn` is copied too.
    return MaskedBidirectional(
        layer.forward_layer,
        merge_mode=layer.merge_mode,
        backward_layer=layer.backward_layer,
        **base,
    )


def _plain_copy(layer):
    """A copy of `layer` from its config, as `keras.models.clone_model` makes."""
    new = layer.__class__.from_config(layer.get_config())
    _copy_use_cudnn(layer, new)
    return new


def _sequences_shape(layer):
    """The input shape a built `Bidirectional` was built with."""
    config = layer.get_build_config()
    if config is None:
        return None
    if "input_shape" in config:
        return config["input_shape"]
    return config["shapes_dict"].get("sequences_shape")


def bidirectional_to_masked(layer):
    """Returns a `MaskedBidirectional` equivalent to a `Bidirectional` layer.

    Same configuration; if `layer` is built, built for the same input shape
    with a copy of its weights. Same outputs and states for the same mask.

    Args:
        layer: A `keras.layers.Bidirectional` around a `keras.layers.RNN`
            that is not stateful and has `go_backwards=False`.

    Returns:
        A `maskedrnn.MaskedBidirectional` instance.

    Raises:
        TypeError: If `layer` is not a `keras.layers.Bidirectional`.
        ValueError: If `layer` cannot be expressed as one; the message says why.

    Example:

    ```python
    bidi = keras.layers.Bidirectional(keras.layers.LSTM(8, return_sequences=True))
    bidi.build((None, None, 3))
    masked = maskedrnn.bidirectional_to_masked(bidi)  # same weights, built
    ```
    """
    if not isinstance(layer, keras.layers.Bidirectional):
        raise TypeError(
            "`layer` must be a keras.layers.Bidirectional instance; got "
            f"layer={layer!r}. For a whole model use `convert_model(model)`."
        )
    reason = _unconvertible_reason(layer)
    if reason is not None:
        raise ValueError(
            f"Bidirectional layer '{layer.name}' cannot become a "
            f"MaskedBidirectional: {reason}. Keep keras.layers.Bidirectional "
            "for it."
        )
    masked = _masked_from_bidirectional(layer)
    if layer.built:
        shape = _sequences_shape(layer)
        if shape is None:
            raise ValueError(
                f"Bidirectional layer '{layer.name}' is marked built but does "
                "not record the input shape it was built for, so its weights "
                "cannot be copied; build it with `layer.build(input_shape)` or "
                "call it once on a batch."
            )
        masked.build(shape)
        masked.set_weights(layer.get_weights())
    return masked


def _bidirectional_from_masked(layer):
    """An unbuilt `Bidirectional` with `layer`'s configuration."""
    new = keras.layers.Bidirectional.from_config(layer.get_config())
    _copy_use_cudnn(layer, new)
    return new


class _ToMasked:
    """`convert_model`'s swap: `Bidirectional` and plain RNNs to maskedrnn's."""

    source = (keras.layers.Bidirectional, *_PLAIN_RNNS)

    @staticmethod
    def reason(layer):
        if isinstance(layer, keras.layers.Bidirectional):
            return _unconvertible_reason(layer)
        return _rnn_unconvertible_reason(layer)

    @staticmethod
    def swap(layer):
        if isinstance(layer, keras.layers.Bidirectional):
            return _masked_from_bidirectional(layer)
        return _masked_from_rnn(layer)

    @staticmethod
    def call(layer, *args, **kwargs):
        if "sequences" in kwargs:
            args = (kwargs.pop("sequences"),) + args
        return layer(*args, **kwargs)


class _ToKeras:
    """The inverse swap, used by `load_weights` to rebuild a checkpoint's model."""

    source = (MaskedBidirectional, MaskedRNN)

    @staticmethod
    def reason(layer):
        return None

    @staticmethod
    def swap(layer):
        if isinstance(layer, MaskedBidirectional):
            return _bidirectional_from_masked(layer)
        return _rnn_from_masked(layer)

    @staticmethod
    def call(layer, *args, **kwargs):
        # Keras' layers have no `lengths`: it becomes the mask.
        args = list(args)
        if "inputs" in kwargs:
            args.insert(0, kwargs.pop("inputs"))
        lengths = args.pop(4) if len(args) > 4 else kwargs.pop("lengths", None)
        if lengths is not None:
            mask = _lengths_to_mask(args[0], lengths)
            if len(args) > 2:
                args[2] = mask
            else:
                kwargs["mask"] = mask
        return layer(*args, **kwargs)


def _inner_sources(layer, source):
    """The `source` layers inside a layer copied as a whole, wrappers' RNNs aside."""
    found = []
    for inner in layer._flatten_layers(include_self=False, recursive=False):
        if isinstance(inner, source):
            found.append(inner)
        if not isinstance(inner, (*_RNN_WRAPPERS, keras.layers.RNN)):
            found += _inner_sources(inner, source)
    return found


class _Converter:
    """Rebuilds a Sequential/Functional model, swapping wrapper layers.

    One instance per top-level model, so that a layer shared between a nested
    model and its parent stays shared.
    """

    def __init__(self, direction=_ToMasked, compile=True, select=None):
        self.direction = direction
        self.compile = compile
        self.select = select or (lambda layer: True)
        self.copies = {}  # id(original layer) -> its copy
        self.leaves = []  # (original, copy) pairs whose weights get copied
        self.converted = set()  # ids of the swapped copies
        self.left = []  # (layer name, reason) for layers kept as they are
        self.compile_errors = []  # (model name, error) for compile states lost

    def convert(self, model):
        # clone_model's own compile raises for an unregistered loss function;
        # compile here instead, so that failure only warns.
        compiled = model.compiled
        model.compiled = False
        try:
            if isinstance(model, keras.Sequential):
                new = keras.models.clone_model(model, clone_function=self.clone)
            else:
                new = keras.models.clone_model(
                    model, clone_function=self.clone, call_function=self.call
                )
        finally:
            model.compiled = compiled
        # clone_model drops a Functional's `trainable`; only False is copied,
        # since setting it also sets every sublayer's flag.
        if not model.trainable:
            new.trainable = False
        if compiled and self.compile:
            self.compile_like(model, new)
        return new

    def compile_like(self, model, new):
        config = model.get_compile_config()
        try:
            new.compile_from_config(config)
        except (TypeError, ValueError) as error:
            # Typically an unregistered loss; the weights convert anyway.
            self.compile_errors.append((model.name, error))

    def clone(self, layer):
        if id(layer) in self.copies:
            return self.copies[id(layer)]
        source = self.direction.source
        if isinstance(layer, (keras.Sequential, Functional)):
            new = self.convert(layer)
        elif isinstance(layer, source):
            reason = self.direction.reason(layer)
            if not self.select(layer):
                new = _plain_copy(layer)  # left out by `only=` / `exclude=`
            elif reason is None:
                new = self.direction.swap(layer)
                self.converted.add(id(new))
            else:
                self.left.append((layer.name, reason))
                new = _plain_copy(layer)
            self.leaves.append((layer, new))
        elif not isinstance(layer, keras.layers.Layer):
            # A graph operation (e.g. `keras.ops.not_equal`): no weights.
            new = _plain_copy(layer)
        else:
            for inner in _inner_sources(layer, source):
                if self.select(inner):
                    self.left.append(
                        (
                            inner.name,
                            f"it is inside {type(layer).__name__} "
                            f"'{layer.name}', which convert_model copies as a "
                            "whole from its config (only layers of Sequential "
                            "and Functional models are swapped)",
                        )
                    )
            new = _plain_copy(layer)
            self.leaves.append((layer, new))
        self.copies[id(layer)] = new
        return new

    def call(self, layer, *args, **kwargs):
        if id(layer) not in self.converted:
            return layer(*args, **kwargs)
        return self.direction.call(layer, *args, **kwargs)

    def copy_weights(self):
        for old, new in self.leaves:
            if not old.built:
                continue
            if not new.built:
                raise ValueError(
                    f"Layer '{old.name}' is built but its copy could not be "
                    "built: the model does not know its input shape. Build the "
                    "model first (`model.build(input_shape)` or call it once "
                    "on a batch), then convert it."
                )
            new.set_weights(old.get_weights())


def convert_model(model, strict=False, only=None, exclude=None):
    """The one-line upgrade: masked RNNs that keep their fused kernels.

    Returns a copy of `model` in which every `Bidirectional` around an RNN is a
    `MaskedBidirectional` and every plain `LSTM`, `GRU` and `SimpleRNN` a
    `MaskedRNN`, with the same configuration, names and weights; nested
    Sequential/Functional models are converted too. Fed the same inputs, it
    returns the same predictions (on Keras >= 3.16, which stops passing RNN
    masks on, a warning names the layers that now see one). Layers that cannot
    be expressed (stateful, subclasses, `go_backwards=True`, inside a layer
    copied whole) are kept, with a warning. A compiled model is compiled again
    from its config, or left uncompiled with a warning (see `docs/convert.md`).

    Args:
        model: A built `keras.Sequential` or Functional `keras.Model`.
        strict: Bool; if `True`, a layer that cannot be converted raises
            instead of warning. Defaults to `False`.
        only: Optional layer name, layer class, or list of them: only those
            layers are converted (a class matches the layer itself, not the
            RNN inside a `Bidirectional`). Defaults to `None` (all).
        exclude: Optional layer name, layer class, or list of them to keep as
            they are. Defaults to `None`.

    Returns:
        A new model of the same kind, sharing no weights with `model`.

    Raises:
        TypeError: If `model` is not a `keras.Model`, or `only`/`exclude` hold
            something other than layer names and classes.
        ValueError: If `model` is subclassed, `only`/`exclude` name a missing
            layer, or `strict=True` and a layer cannot be converted.

    Example:

    ```python
    inputs = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(1000, 16, mask_zero=True)(inputs)
    x = keras.layers.Bidirectional(keras.layers.LSTM(32, return_sequences=True))(x)
    x = keras.layers.GRU(16)(x)
    outputs = keras.layers.Dense(5, activation="softmax")(x)
    model = keras.Model(inputs, outputs)

    fast_model = maskedrnn.convert_model(model)  # same predictions, unmasked RNNs
    only_bidi = maskedrnn.convert_model(model, only=keras.layers.Bidirectional)
    ```
    """
    if isinstance(model, keras.layers.Bidirectional):
        raise TypeError(
            "`model` is a single Bidirectional layer; use "
            "`bidirectional_to_masked(layer)` for one layer."
        )
    if isinstance(model, keras.layers.RNN):
        raise TypeError(
            "`model` is a single RNN layer; use `maskedrnn.MaskedRNN(layer)` "
            "and `set_weights(layer.get_weights())` for one layer."
        )
    if not isinstance(model, keras.Model):
        raise TypeError(
            "`model` must be a keras.Model (Sequential or Functional); "
            f"got model={model!r}."
        )
    if not isinstance(model, (keras.Sequential, Functional)):
        raise ValueError(
            f"convert_model rebuilds Sequential and Functional models only; "
            f"'{model.name}' is a subclassed model ({type(model).__name__}), "
            "whose layers are made and called by its own Python code, which "
            f"convert_model cannot rewrite. {_SUBCLASSED_HOWTO}"
        )
    converter = _Converter(select=selector(model, only, exclude))
    new_model = converter.convert(model)
    if converter.left and strict:
        listing = "; ".join(f"'{name}': {reason}" for name, reason in converter.left)
        raise ValueError(
            "strict=True and some layers cannot become MaskedBidirectional or "
            f"MaskedRNN: {listing}. Pass strict=False to keep them as they are "
            "(or leave them out with `exclude=`)."
        )
    converter.copy_weights()
    for name, error in converter.compile_errors:
        warnings.warn(
            f"convert_model converted model '{name}' but could not compile the "
            f"copy from its compile config: {error} The new model is not "
            "compiled. Compile it with the arguments you gave the original, "
            "e.g. `new_model.compile(optimizer=..., loss=my_loss_fn, "
            "metrics=[...])`, or register your loss/metric functions with "
            "`@keras.saving.register_keras_serializable()` before converting so "
            "that convert_model carries the compile state.",
            stacklevel=2,
        )
    for name, reason in converter.left:
        warnings.warn(
            f"convert_model kept layer '{name}' as it is: {reason}.",
            stacklevel=2,
        )
    changed_layers, changed_outputs = masks.mask_changes(model, new_model)
    if changed_layers or changed_outputs:
        warnings.warn(masks.describe(changed_layers, changed_outputs), stacklevel=2)
    return new_model
