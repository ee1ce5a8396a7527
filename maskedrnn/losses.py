"""Per-timestep losses that skip padded steps, with or without Keras masks.

The step mask is the AND of the sources present: the Keras mask of
`y_pred`, `mask`/`lengths` given to `masked_loss`, `pad_value` in `y_true`,
and a mask the wrapped loss attaches to its output. The value is what Keras
computes when `y_pred` carries that mask.
"""

import keras
from keras import ops

from maskedrnn._keras_private import (
    LossFunctionWrapper,
    get_keras_mask,
    reduce_weighted_values,
)
from maskedrnn.masking import (
    as_bool,
    check_pad_value,
    combine_masks,
    expand_sample_weight,
    step_masks,
)
from maskedrnn.ops import sequence_mask

__all__ = ["MaskedLoss", "masked_loss"]


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

    Steps are masked by the Keras mask of `y_pred`, by `pad_value` in `y_true`
    (for outputs without a mask), or both; without either the loss equals the
    wrapped one. The value is what Keras computes when `y_pred` carries the
    mask, e.g. `sum(loss * sample_weight * mask) / sum(mask)` by default.
    Padded steps contribute 0, and their labels are set to 0 first, so labels
    such as `-1` never reach the wrapped loss.

    Args:
        loss: A `keras.losses.Loss`, a function `fn(y_true, y_pred)` or a Keras
            loss name, returning `(batch, time)` values; its own `reduction`
            is ignored.
        pad_value: Number; steps whose label equals it (all features, for a
            feature axis) are padding. `float("nan")` matches NaN. Defaults to
            `None`.
        reduction: Type of reduction, as in `keras.losses.Loss`; means divide
            by the number of valid steps. Defaults to `"sum_over_batch_size"`.
        name: Name of the loss instance. Defaults to `"masked_loss"`.
        dtype: Dtype of the loss computation. Defaults to `None`.

    Call arguments:
        y_true: Labels `(batch, time)` (class ids) or `(batch, time, ...)`.
        y_pred: Predictions `(batch, time, ...)`, possibly with a Keras mask.
        sample_weight: Optional weights `(batch,)` or `(batch, time)`.

    Returns:
        A scalar, or `(batch, time)` values (0 at padded steps) for
        `reduction="none"`.

    Example:

    >>> loss = MaskedLoss(
    ...     keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    ...     pad_value=-1,
    ... )
    >>> y_true = np.array([[1, 0, -1], [2, -1, -1]])  # -1: padding
    >>> y_pred = np.random.normal(size=(2, 3, 4))     # logits
    >>> value = loss(y_true, y_pred)  # mean over the 3 valid steps
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
        self.pad_value = check_pad_value(pad_value)

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
            y_true, masks = step_masks(
                y_true, y_pred, native_mask, mask, self.pad_value
            )
            y_true = ops.convert_to_tensor(y_true, dtype=self.dtype)
            values = self.loss.call(y_true, y_pred)
            out_mask = get_keras_mask(values)
            if out_mask is not None:
                masks.append(as_bool(out_mask))
            valid = combine_masks(masks, values, "loss value")
            if valid is not None:
                # Keras multiplies by the mask; `where` also stops a
                # non-finite value at a masked step.
                values = ops.where(valid, values, ops.zeros_like(values))
            if sample_weight is not None:
                sample_weight = expand_sample_weight(sample_weight, values, self.dtype)
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

    `MaskedLoss(loss_fn, pad_value, reduction)(y_true, y_pred, sample_weight)`
    with `mask` (or `lengths`) as one more mask source.

    Args:
        loss_fn: The per-timestep loss, as `MaskedLoss`'s `loss`.
        y_true: Labels `(batch, time)` or `(batch, time, ...)`.
        y_pred: Predictions `(batch, time, ...)`.
        mask: Optional bool or 0/1 tensor `(batch, time)`, True at valid steps.
        lengths: Optional int tensor `(batch,)` for right-padded rows.
        sample_weight: Optional weights `(batch,)` or `(batch, time)`.
        pad_value: As in `MaskedLoss`. Defaults to `None`.
        reduction: As in `MaskedLoss`. Defaults to `"sum_over_batch_size"`.

    Returns:
        A scalar, or `(batch, time)` values (0 at padded steps).

    Example:

    >>> y_true = np.zeros((2, 3, 1))
    >>> y_pred = np.array([[[1.0], [2.0], [9.0]], [[3.0], [9.0], [9.0]]])
    >>> lengths = np.array([2, 1])  # the 9s are padding
    >>> loss = masked_loss("mean_squared_error", y_true, y_pred, lengths=lengths)
    >>> round(float(loss), 4)  # (1 + 4 + 9) / 3 valid steps
    4.6667
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
