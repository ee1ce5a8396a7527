"""Masks of padded batches: conversion and combination, written once.

A mask is a `(batch, time)` tensor, True (or non-zero) at valid steps. The
layers (`MaskedBidirectional`, `MaskedRNN`), `maskedrnn.ops`, the losses
and the metrics read masks through `as_bool`.
"""

import keras
from keras import ops

__all__ = ["as_bool"]


def as_bool(mask):
    """`mask` as a boolean tensor: non-zero = valid step.

    Example:

    >>> as_bool([[1, 1, 0], [2, 0, 0]])
    [[True, True, False], [True, False, False]]

    Args:
        mask: Boolean or numeric tensor (or array-like).

    Returns:
        A boolean tensor of the shape of `mask`.
    """
    mask = ops.convert_to_tensor(mask)
    if keras.backend.standardize_dtype(mask.dtype) != "bool":
        mask = ops.not_equal(mask, 0)
    return mask
