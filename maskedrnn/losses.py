"""Per-timestep losses that skip padded steps, with or without Keras masks.

`MaskedLoss` wraps any per-timestep Keras loss. Its value is the one Keras 3
computes for that loss when `y_pred` carries a Keras mask (see
`keras.losses.Loss.__call__`), so a model whose layers do not propagate masks
(for example one built on `maskedrnn.MaskedBidirectional` with `lengths`) can
be trained with exactly the objective of its masked counterpart.

The step mask is the logical AND of every source that is present:

1. the Keras mask attached to `y_pred` (what Keras itself would use);
2. `mask` or `lengths` given to `masked_loss`;
3. `pad_value` in `y_true`: a step is padding where its label equals
   `pad_value` (for `y_true` with a trailing feature axis: where all its
   features do);
4. a Keras mask the wrapped loss attaches to its output (as Keras does).

With consistent data (padded labels exactly where the Keras mask is False) the
AND is the Keras mask itself. Before the wrapped loss runs, `y_true` is set to
0 at every masked step, so that e.g. sparse categorical crossentropy never
sees a `-1` label (an error on TensorFlow and PyTorch, a NaN on GPUs).
"""

import math
import numbers

import keras
from keras import ops

from maskedrnn._keras_private import (
    LossFunctionWrapper,
    get_keras_mask,
    reduce_weighted_values,
)
from maskedrnn.ops import sequence_mask

__all__ = ["MaskedLoss", "masked_loss"]


# --------------------------------------------------------------------------
# Helpers shared with `maskedrnn.metrics`.


def _check_pad_value(pad_value):
    """Validates `pad_value` and returns it as a plain Python number."""
    if pad_value is None:
        return None
    if isinstance(pad_value, bool) or not isinstance(pad_value, numbers.Real):
        raise TypeError(
            "`pad_value` must be None or a number that marks padded labels in "
            f"y_true (for example -1); got pad_value={pad_value!r}."
        )
    if isinstance(pad_value, numbers.Integral):
        return int(pad_value)
    return float(pad_value)


def _is_int_dtype(dtype):
    dtype = keras.backend.standardize_dtype(dtype)
    return "int" in dtype or dtype == "bool"


def _padding_steps(y_true, y_pred, pad_value):
    """Boolean tensor, True at the steps of `y_true` that are padding.

    If `y_true` has the rank of `y_pred` its last axis holds the features (or
    a single label) of a step, and the step is padding when all of them equal
    `pad_value`; if it has one axis less, each entry is a step. A NaN
    `pad_value` matches NaN entries.
    """
    rank_true, rank_pred = len(y_true.shape), len(y_pred.shape)
    if rank_true not in (rank_pred, rank_pred - 1) or rank_true == 0:
        raise ValueError(
            "With `pad_value`, y_true must have the rank of y_pred (a trailing "
            "feature or label axis) or one axis less (one label per step); "
            f"got y_true of shape {tuple(y_true.shape)} and y_pred of shape "
            f"{tuple(y_pred.shape)}."
        )
    if isinstance(pad_value, float) and math.isnan(pad_value):
        if _is_int_dtype(y_true.dtype):
            raise ValueError(
                "pad_value=nan cannot occur in integer labels (y_true has dtype "
                f"{y_true.dtype}); pass the integer used for padding instead."
            )
        is_pad = ops.isnan(y_true)
    else:
        if _is_int_dtype(y_true.dtype) and not float(pad_value).is_integer():
            raise ValueError(
                f"pad_value={pad_value} cannot occur in integer labels (y_true "
                f"has dtype {y_true.dtype}); pass the integer used for padding."
            )
        is_pad = ops.equal(y_true, ops.cast(pad_value, y_true.dtype))
    if rank_true == rank_pred:
        is_pad = ops.all(is_pad, axis=-1)
    return is_pad


def _as_bool(mask):
    mask = ops.convert_to_tensor(mask)
    if keras.backend.standardize_dtype(mask.dtype) != "bool":
        mask = ops.not_equal(mask, 0)
    return mask


def _covers_leading_axes(mask, x):
    """Whether `mask`'s (static) shape is a prefix of `x`'s shape."""
    if len(mask.shape) > len(x.shape):
        return False
    return all(m is None or d is None or m == d for m, d in zip(mask.shape, x.shape))


def _step_masks(y_true, y_pred, native_mask, mask, pad_value):
    """Collects the step masks and zeroes `y_true` at every masked step.

    Returns:
        `(y_true, masks)`: `y_true` (original dtype) with 0 at masked steps and
        the list of boolean step masks (valid = True) that are present.
    """
    masks = []
    if native_mask is not None:
        masks.append(_as_bool(native_mask))
    if mask is not None:
        masks.append(_as_bool(mask))
    if pad_value is not None:
        masks.append(ops.logical_not(_padding_steps(y_true, y_pred, pad_value)))
    for valid in masks:
        if not _covers_leading_axes(valid, y_true):
            continue
        while len(valid.shape) < len(y_true.shape):
            valid = ops.expand_dims(valid, -1)
        y_true = ops.where(valid, y_true, ops.zeros_like(y_true))
    return y_true, masks


def _combine_masks(masks, values, what):
    """ANDs the step masks, checking each has the rank of the values."""
    combined = None
    for valid in masks:
        if len(valid.shape) != len(values.shape):
            raise ValueError(
                f"The step mask has shape {tuple(valid.shape)} but the {what} "
                f"has shape {tuple(values.shape)}: masking needs one value per "
                "step. Give y_true and y_pred a trailing feature axis (e.g. "
                "shape (batch, time, 1)) so that the loss keeps the time axis."
            )
        combined = valid if combined is None else ops.logical_and(combined, valid)
    return combined


def _expand_sample_weight(sample_weight, values, dtype):
    """Broadcasts a per-sequence `(batch,)` weight over the time axis.

    Keras multiplies a `(batch,)` weight with `(batch, time)` values by
    broadcasting from the right (an error unless batch == time); a weight
    of lower rank than the values is meant per leading axes, so it gets
    trailing unit axes, then the values' shape (Keras multiplies it in place
    with the mask, which PyTorch only allows for equal shapes).
    """
    sample_weight = ops.convert_to_tensor(sample_weight, dtype=dtype)
    rank = len(sample_weight.shape)
    if 1 <= rank < len(values.shape):
        for _ in range(len(values.shape) - rank):
            sample_weight = ops.expand_dims(sample_weight, -1)
        # A product, not `broadcast_to`: PyTorch's broadcast view cannot be
        # multiplied in place.
        sample_weight = sample_weight * ops.ones_like(values, dtype=dtype)
    return sample_weight


# --------------------------------------------------------------------------


def _resolve_loss(loss):
    """Turns a loss identifier into a `keras.losses.Loss` instance."""
    if isinstance(loss, MaskedLoss):
        raise ValueError(
            "`loss` is already a MaskedLoss; pass the loss it wraps instead."
        )
    if isinstance(loss, keras.losses.Loss):
        return loss
    if isinstance(loss, type):
        raise TypeError(
            f"`loss` must be a loss instance, function or name; got the "
            f"class {loss.__name__}. Instantiate it, e.g. `{loss.__name__}()`."
        )
    if isinstance(loss, (str, dict)):
        fn = keras.losses.get(loss)
    elif callable(loss):
        fn = loss
    else:
        raise TypeError(
            "`loss` must be a keras.losses.Loss instance, a loss function "
            "fn(y_true, y_pred) or the name of a Keras loss (e.g. "
            f"'sparse_categorical_crossentropy'); got loss={loss!r}."
        )
    if isinstance(fn, keras.losses.Loss):
        return fn
    return LossFunctionWrapper(fn, name=getattr(fn, "__name__", None))


@keras.saving.register_keras_serializable(package="maskedrnn")
class MaskedLoss(keras.losses.Loss):
    """Wraps a per-timestep loss so that padded steps do not count.

    The mask comes from the Keras mask attached to `y_pred` (the native Keras
    path), from `pad_value` in `y_true` (for models whose outputs carry no
    mask), or both (their logical AND). Without either the loss equals the
    wrapped one. The value is exactly what Keras computes for the wrapped
    loss when `y_pred` carries the mask; in particular the default
    `"sum_over_batch_size"` reduction is the mean over valid steps:
    `sum(loss * sample_weight * mask) / sum(mask)`.

    The wrapped loss is evaluated unreduced (`Loss.call`); its own `reduction`
    is ignored, `reduction` here applies. Labels at masked steps are replaced
    by 0 before it runs, so padded labels such as `-1` never reach it.

    Args:
        loss: The per-timestep loss: a `keras.losses.Loss` instance (e.g.
            `keras.losses.SparseCategoricalCrossentropy(from_logits=True)`), a
            function `fn(y_true, y_pred)` returning one value per step, or the
            name of a Keras loss (e.g. `"sparse_categorical_crossentropy"`).
            It must keep the time axis: for `y_pred` of shape
            `(batch, time, features)` it returns `(batch, time)`.
        pad_value: Number or `None`. Steps whose label in `y_true` equals
            `pad_value` are padding. `y_true` of the rank of `y_pred` has a
            trailing axis and a step is padding when all its entries equal
            `pad_value`; `y_true` with one axis less (integer labels of shape
            `(batch, time)`) is compared entry by entry. `float("nan")`
            matches NaN. Defaults to `None` (no padding value).
        reduction: Type of reduction, as in `keras.losses.Loss`: `"sum"`,
            `"sum_over_batch_size"`, `"mean"`, `"mean_with_sample_weight"`,
            `"none"` or `None`. With a mask, `"sum_over_batch_size"` and
            `"mean"` divide by the number of valid steps and
            `"mean_with_sample_weight"` by the sum of valid weights. Defaults
            to `"sum_over_batch_size"`.
        name: Optional name of the loss instance. Defaults to `None`
            (`"masked_loss"`).
        dtype: Dtype of the loss computation, as in `keras.losses.Loss`.
            Defaults to `None` (`keras.backend.floatx()`).

    Call arguments:
        y_true: Labels of shape `(batch, time)` (integer class ids) or
            `(batch, time, ...)`.
        y_pred: Predictions of shape `(batch, time, ...)`, possibly carrying
            a `(batch, time)` Keras mask.
        sample_weight: Optional weights of shape `(batch,)` (per sequence) or
            `(batch, time)` (per step). A `(batch,)` weight applies to every
            step of its sequence (plain Keras 3 rejects this shape for
            per-step losses).

    Returns:
        A scalar, or the `(batch, time)` weighted values (0 at masked steps)
        for `reduction="none"`.

    Example:

    >>> loss = MaskedLoss(
    ...     keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    ...     pad_value=-1,
    ... )
    >>> y_true = np.array([[1, 0, -1], [2, -1, -1]])  # -1: padding
    >>> y_pred = np.random.normal(size=(2, 3, 4))     # logits
    >>> value = loss(y_true, y_pred)  # mean over the 3 valid steps

    ```python
    model.compile(optimizer="adam", loss=MaskedLoss(
        "sparse_categorical_crossentropy", pad_value=-1))
    ```
    """

    def __init__(
        self,
        loss,
        pad_value=None,
        reduction="sum_over_batch_size",
        name=None,
        dtype=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.loss = _resolve_loss(loss)
        if isinstance(loss, str):
            self._loss_config = loss
        elif isinstance(loss, dict):
            self._loss_config = keras.losses.serialize(self.loss)
        else:
            self._loss_config = keras.losses.serialize(loss)
        self.pad_value = _check_pad_value(pad_value)

    def __call__(self, y_true, y_pred, sample_weight=None):
        return self._masked_call(
            y_true, y_pred, sample_weight, mask=None, reduction=self.reduction
        )

    def call(self, y_true, y_pred):
        """Per-step values of the wrapped loss, 0 at masked steps."""
        return self._masked_call(y_true, y_pred, None, mask=None, reduction="none")

    def _masked_call(self, y_true, y_pred, sample_weight, mask, reduction):
        native_mask = get_keras_mask(y_pred)
        with keras.name_scope(self.name):
            y_pred = ops.convert_to_tensor(y_pred, dtype=self.dtype)
            y_true = ops.convert_to_tensor(y_true)
            y_true, masks = _step_masks(
                y_true, y_pred, native_mask, mask, self.pad_value
            )
            y_true = ops.convert_to_tensor(y_true, dtype=self.dtype)
            values = self.loss.call(y_true, y_pred)
            out_mask = get_keras_mask(values)
            if out_mask is not None:
                masks.append(_as_bool(out_mask))
            valid = _combine_masks(masks, values, "loss value")
            if valid is not None:
                # Same value as Keras (which multiplies by the mask), but a
                # non-finite value at a masked step cannot leak into the sum.
                values = ops.where(valid, values, ops.zeros_like(values))
            if sample_weight is not None:
                sample_weight = _expand_sample_weight(sample_weight, values, self.dtype)
            return reduce_weighted_values(
                values,
                sample_weight=sample_weight,
                mask=valid,
                reduction=reduction,
                dtype=self.dtype,
            )

    def get_config(self):
        return {
            "loss": self._loss_config,
            "pad_value": self.pad_value,
            "reduction": self.reduction,
            "name": self.name,
            "dtype": self._dtype_policy.name,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config["loss"], dict):
            config["loss"] = keras.losses.deserialize(config["loss"])
        return cls(**config)


def masked_loss(
    loss_fn,
    y_true,
    y_pred,
    mask=None,
    lengths=None,
    sample_weight=None,
    pad_value=None,
    reduction="sum_over_batch_size",
):
    """Masked per-timestep loss as a function, for custom training loops.

    Equal to `MaskedLoss(loss_fn, pad_value, reduction)(y_true, y_pred,
    sample_weight)` with `mask` (or the mask of `lengths`) as one more mask
    source: the step mask is the AND of `mask`/`lengths`, the Keras mask on
    `y_pred` and `pad_value` in `y_true`, whichever are present.

    Args:
        loss_fn: The per-timestep loss: a `keras.losses.Loss` instance, a
            function `fn(y_true, y_pred)` or the name of a Keras loss.
        y_true: Labels of shape `(batch, time)` or `(batch, time, ...)`.
        y_pred: Predictions of shape `(batch, time, ...)`.
        mask: Optional boolean or 0/1 tensor of shape `(batch, time)`, True at
            valid steps. Defaults to `None`.
        lengths: Optional integer tensor of shape `(batch,)`: the sequences are
            right-padded and row `i` has `lengths[i]` valid steps. Do not pass
            both `mask` and `lengths`. Defaults to `None`.
        sample_weight: Optional weights of shape `(batch,)` or
            `(batch, time)`. Defaults to `None`.
        pad_value: Number or `None`: steps whose label equals it are padding
            (see `MaskedLoss`). Defaults to `None`.
        reduction: As in `MaskedLoss`. Defaults to `"sum_over_batch_size"`.

    Returns:
        A scalar, or `(batch, time)` values for `reduction="none"`.

    Example:

    >>> y_true = np.zeros((2, 3, 1))
    >>> y_pred = np.array([[[1.0], [2.0], [9.0]], [[3.0], [9.0], [9.0]]])
    >>> lengths = np.array([2, 1])  # the 9s are padding
    >>> loss = masked_loss("mean_squared_error", y_true, y_pred, lengths=lengths)
    >>> round(float(loss), 4)  # (1 + 4 + 9) / 3 valid steps
    4.6667

    In a custom training loop, on a model without Keras masks:

    ```python
    logits = model(x)  # (batch, time, classes)
    loss = masked_loss(
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        y_true, logits, lengths=lengths)
    ```
    """
    if mask is not None and lengths is not None:
        raise ValueError(
            "Pass either `mask` or `lengths` to masked_loss, not both "
            "(lengths=L is the same as mask=sequence_mask(L, time))."
        )
    if lengths is not None:
        y_pred_shape = ops.shape(y_pred)
        if len(y_pred_shape) < 2:
            raise ValueError(
                "`lengths` needs y_pred of shape (batch, time, ...); got "
                f"y_pred of shape {tuple(y_pred_shape)}."
            )
        mask = sequence_mask(lengths, maxlen=y_pred_shape[1])
    loss = MaskedLoss(loss_fn, pad_value=pad_value, reduction=reduction)
    return loss._masked_call(
        y_true, y_pred, sample_weight, mask=mask, reduction=loss.reduction
    )
