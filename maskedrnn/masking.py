"""Masks of padded batches: `(batch, time)`, True (or non-zero) at valid steps.

Every module reads masks through `as_bool`; the step masks of the losses
and metrics are built here too.
"""

import math
import numbers

import keras
from keras import ops

__all__ = [
    "as_bool",
    "check_pad_value",
    "padding_steps",
    "step_masks",
    "combine_masks",
    "expand_sample_weight",
]


def as_bool(mask):
    """`mask` as a boolean tensor: non-zero = valid step.

    Args:
        mask: Boolean or numeric tensor (or array-like).

    Returns:
        A boolean tensor of the shape of `mask`.

    Example:

    >>> as_bool([[1, 1, 0], [2, 0, 0]])
    [[True, True, False], [True, False, False]]
    """
    mask = ops.convert_to_tensor(mask)
    if keras.backend.standardize_dtype(mask.dtype) != "bool":
        # Not a Python 0: copying it to CUDA waits for the queued kernels.
        mask = ops.not_equal(mask, ops.zeros_like(mask))
    return mask


def check_pad_value(pad_value):
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


def padding_steps(y_true, y_pred, pad_value):
    """Boolean tensor, True at the steps of `y_true` equal to `pad_value`.

    With `y_pred`'s rank, a step is padding when all its last axis is; a NaN
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


def _covers_leading_axes(mask, x):
    """Whether `mask`'s (static) shape is a prefix of `x`'s shape."""
    if len(mask.shape) > len(x.shape):
        return False
    return all(m is None or d is None or m == d for m, d in zip(mask.shape, x.shape))


def step_masks(y_true, y_pred, native_mask, mask, pad_value):
    """Collects the step masks and zeroes `y_true` at every masked step.

    Returns:
        `(y_true, masks)`: `y_true` (original dtype) with 0 at masked steps and
        the list of boolean step masks (valid = True) that are present.
    """
    masks = []
    if native_mask is not None:
        masks.append(as_bool(native_mask))
    if mask is not None:
        masks.append(as_bool(mask))
    if pad_value is not None:
        masks.append(ops.logical_not(padding_steps(y_true, y_pred, pad_value)))
    for valid in masks:
        if not _covers_leading_axes(valid, y_true):
            continue
        while len(valid.shape) < len(y_true.shape):
            valid = ops.expand_dims(valid, -1)
        y_true = ops.where(valid, y_true, ops.zeros_like(y_true))
    return y_true, masks


def combine_masks(masks, values, what):
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


def expand_sample_weight(sample_weight, values, dtype):
    """Broadcasts a per-sequence `(batch,)` weight over the time axis.

    Keras would broadcast it from the right; it gets the values' full shape,
    as Keras multiplies it in place with the mask.
    """
    sample_weight = ops.convert_to_tensor(sample_weight, dtype=dtype)
    rank = len(sample_weight.shape)
    if 1 <= rank < len(values.shape):
        for _ in range(len(values.shape) - rank):
            sample_weight = ops.expand_dims(sample_weight, -1)
        # Not `broadcast_to`: PyTorch cannot multiply that view in place.
        sample_weight = sample_weight * ops.ones_like(values, dtype=dtype)
    return sample_weight
