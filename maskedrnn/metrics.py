"""Per-timestep metrics that skip padded steps, with or without Keras masks.

Each metric reports `sum(value * weight) / sum(weight)` over every valid
step seen since `reset_state()`, with the mask sources of `MaskedLoss`.
Unlike Keras' own metrics, which average each sequence over time first,
this stays the mean over valid steps when batches differ in length.
"""

import keras
from keras import ops

from maskedrnn._keras_private import get_keras_mask
from maskedrnn.masking import (
    check_pad_value,
    combine_masks,
    expand_sample_weight,
    step_masks,
)

__all__ = ["MaskedAccuracy", "MaskedMeanAbsoluteError", "MaskedMeanSquaredError"]


class _MaskedStepMean(keras.metrics.Metric):
    """Weighted mean of per-step values over the valid steps of all batches.

    Subclasses define `_step_values(y_true, y_pred)`; masked labels are 0 then.
    """

    def __init__(self, pad_value=None, name=None, dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.pad_value = check_pad_value(pad_value)
        self.total = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="total"
        )
        self.count = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="count"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        """Accumulates the valid steps of one batch; padded steps add nothing.

        Args:
            y_true: Labels or targets, `(batch, time)` or `(batch, time, ...)`.
            y_pred: Predictions `(batch, time, ...)`, possibly with a Keras mask.
            sample_weight: Optional weights `(batch,)` or `(batch, time)`.
        """
        native_mask = get_keras_mask(y_pred)
        y_pred = ops.convert_to_tensor(y_pred)
        y_true = ops.convert_to_tensor(y_true)
        y_true, masks = step_masks(y_true, y_pred, native_mask, None, self.pad_value)
        values = ops.cast(self._step_values(y_true, y_pred), self.dtype)
        valid = combine_masks(masks, values, "metric value")
        weights = ops.ones_like(values)
        if valid is not None:
            values = ops.where(valid, values, ops.zeros_like(values))
            weights = ops.cast(valid, self.dtype)
        if sample_weight is not None:
            sample_weight = expand_sample_weight(sample_weight, values, self.dtype)
            weights = weights * sample_weight
        self.total.assign_add(ops.sum(values * weights))
        self.count.assign_add(ops.sum(ops.broadcast_to(weights, ops.shape(values))))

    def result(self):
        return ops.divide_no_nan(self.total, self.count)

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "pad_value": self.pad_value}


@keras.saving.register_keras_serializable(package="maskedrnn")
class MaskedAccuracy(_MaskedStepMean):
    """Sparse categorical accuracy over the valid timesteps of all batches.

    Args:
        pad_value: Number; labels equal to it mark padded steps. Defaults to
            `None`.
        name: Name of the metric. Defaults to `"masked_accuracy"`.
        dtype: Dtype of the result and accumulators. Defaults to `None`.

    Call arguments (`update_state`):
        y_true: Integer labels `(batch, time)` or `(batch, time, 1)`.
        y_pred: Scores `(batch, time, classes)`, possibly with a Keras mask.
        sample_weight: Optional `(batch,)` or `(batch, time)` weights.

    Example:

    >>> m = MaskedAccuracy(pad_value=-1)
    >>> m.update_state([[1, 0, -1]], [[[0.1, 0.9], [0.2, 0.8], [0.5, 0.5]]])
    >>> float(m.result())  # 1 of 2 valid steps correct
    0.5
    """

    def __init__(self, pad_value=None, name="masked_accuracy", dtype=None):
        super().__init__(pad_value=pad_value, name=name, dtype=dtype)
        self._direction = "up"

    def _step_values(self, y_true, y_pred):
        if len(y_true.shape) == len(y_pred.shape) and y_true.shape[-1] not in (
            1,
            None,
        ):
            raise ValueError(
                "MaskedAccuracy takes integer labels of shape (batch, time) or "
                f"(batch, time, 1); got y_true of shape {tuple(y_true.shape)}"
                f" for y_pred of shape {tuple(y_pred.shape)}. For one-hot labels "
                "pass ops.argmax(y_true, axis=-1)."
            )
        return keras.metrics.sparse_categorical_accuracy(y_true, y_pred)


class _MaskedMeanError(_MaskedStepMean):
    """Mean over valid steps of a per-step error averaged over features."""

    def _step_values(self, y_true, y_pred):
        y_pred = ops.cast(y_pred, self.dtype)
        y_true = ops.cast(y_true, self.dtype)
        if len(y_true.shape) == len(y_pred.shape) - 1:
            if y_pred.shape[-1] not in (1, None):
                raise ValueError(
                    f"{self.__class__.__name__}: y_true of shape "
                    f"{tuple(y_true.shape)} has one axis less than y_pred of "
                    f"shape {tuple(y_pred.shape)}, which only works when y_pred "
                    "has a single feature; give y_true the features axis."
                )
            y_true = ops.expand_dims(y_true, -1)
        return ops.mean(self._error(y_true, y_pred), axis=-1)


@keras.saving.register_keras_serializable(package="maskedrnn")
class MaskedMeanAbsoluteError(_MaskedMeanError):
    """Mean absolute error over the valid timesteps of all batches.

    Args:
        pad_value: Number; a step is padding when all its targets equal it.
            Defaults to `None`.
        name: Name of the metric. Defaults to `"masked_mean_absolute_error"`.
        dtype: Dtype of the result and accumulators. Defaults to `None`.

    Call arguments (`update_state`):
        y_true: Targets `(batch, time, features)`, or `(batch, time)` for one
            feature.
        y_pred: Predictions `(batch, time, features)`.
        sample_weight: Optional `(batch,)` or `(batch, time)` weights.

    Example:

    >>> m = MaskedMeanAbsoluteError(pad_value=-1.0)
    >>> m.update_state([[[1.0], [-1.0]]], [[[0.5], [3.0]]])
    >>> float(m.result())  # only the first step is valid
    0.5
    """

    def __init__(self, pad_value=None, name="masked_mean_absolute_error", dtype=None):
        super().__init__(pad_value=pad_value, name=name, dtype=dtype)
        self._direction = "down"

    def _error(self, y_true, y_pred):
        return ops.abs(y_true - y_pred)


@keras.saving.register_keras_serializable(package="maskedrnn")
class MaskedMeanSquaredError(_MaskedMeanError):
    """Mean squared error over the valid timesteps of all batches.

    Args:
        pad_value: Number; a step is padding when all its targets equal it.
            Defaults to `None`.
        name: Name of the metric. Defaults to `"masked_mean_squared_error"`.
        dtype: Dtype of the result and accumulators. Defaults to `None`.

    Call arguments (`update_state`):
        y_true: Targets `(batch, time, features)`, or `(batch, time)` for one
            feature.
        y_pred: Predictions `(batch, time, features)`.
        sample_weight: Optional `(batch,)` or `(batch, time)` weights.

    Example:

    >>> m = MaskedMeanSquaredError(pad_value=-1.0)
    >>> m.update_state([[[1.0], [-1.0]]], [[[0.5], [3.0]]])
    >>> float(m.result())  # only the first step is valid
    0.25
    """

    def __init__(self, pad_value=None, name="masked_mean_squared_error", dtype=None):
        super().__init__(pad_value=pad_value, name=name, dtype=dtype)
        self._direction = "down"

    def _error(self, y_true, y_pred):
        return ops.square(y_true - y_pred)
