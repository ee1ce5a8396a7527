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
                # Same value as Keras (which multiplies by the mask), but a
                # non-finite value at a masked step cannot leak into the sum.
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
