"""maskedrnn.masking: mask conversion and the step masks of losses/metrics."""

import numpy as np
import pytest

from maskedrnn import masking
from tests.helpers import to_np


def test_as_bool_treats_non_zero_as_valid_and_keeps_bool_masks():
    np.testing.assert_array_equal(
        to_np(masking.as_bool([[1, 1, 0], [2, 0, 0]])),
        [[True, True, False], [True, False, False]],
    )
    np.testing.assert_array_equal(
        to_np(masking.as_bool(np.array([[0.5, 0.0]], "float32"))), [[True, False]]
    )
    mask = np.array([[True, False]])
    np.testing.assert_array_equal(to_np(masking.as_bool(mask)), mask)


def test_check_pad_value_accepts_numbers_and_names_the_argument():
    assert masking.check_pad_value(None) is None
    assert masking.check_pad_value(np.int64(-1)) == -1
    assert isinstance(masking.check_pad_value(-1.0), float)
    with pytest.raises(TypeError, match="pad_value.*got pad_value=True"):
        masking.check_pad_value(True)


def test_step_masks_zero_masked_labels_and_combine():
    y_true = np.array([[3, -1, 2], [-1, -1, 1]], "int32")
    y_pred = np.zeros((2, 3, 4), "float32")
    y, masks = masking.step_masks(y_true, y_pred, None, None, -1)
    np.testing.assert_array_equal(to_np(y), [[3, 0, 2], [0, 0, 1]])
    combined = masking.combine_masks(
        masks + [masking.as_bool([[1, 1, 0], [1, 1, 1]])],
        np.zeros((2, 3), "float32"),
        "loss value",
    )
    np.testing.assert_array_equal(
        to_np(combined), [[True, False, False], [False, False, True]]
    )
