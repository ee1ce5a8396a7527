"""maskedrnn.steps.Steps, each field checked against numpy, one row at a time."""

import numpy as np
import pytest

from maskedrnn.steps import Steps
from tests.helpers import to_np

# Every pattern in one batch: right and left padding, holes, empty and full.
MASK = np.array(
    [
        [1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1],
        [1, 0, 1, 0, 1],
        [0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1],
    ],
    bool,
)
LENGTHS = np.array([3, 0, 5, 1, 2], "int32")


def np_fields(mask):
    """`lengths`, `order` (valid-first gather) and `rank` of a mask."""
    lengths = mask.sum(1)
    order = np.stack(
        [np.concatenate([np.flatnonzero(r), np.flatnonzero(~r)]) for r in mask]
    )
    rank = np.cumsum(mask, 1) - 1
    return lengths, order, rank


def np_valid_first_fields(lengths, time):
    valid = np.arange(time)[None, :] < lengths[:, None]
    reverse = np.tile(np.arange(time), (len(lengths), 1))
    for i, n in enumerate(lengths):
        reverse[i, :n] = np.arange(n)[::-1]
    return valid, reverse, np.maximum(lengths - 1, 0), (lengths > 0)[:, None]


def check_valid_first_fields(steps, lengths):
    valid, reverse, last, has_steps = np_valid_first_fields(lengths, MASK.shape[1])
    np.testing.assert_array_equal(to_np(steps.lengths), lengths)
    np.testing.assert_array_equal(to_np(steps.valid), valid)
    np.testing.assert_array_equal(to_np(steps.reverse), reverse)
    np.testing.assert_array_equal(to_np(steps.last), last)
    np.testing.assert_array_equal(to_np(steps.has_steps), has_steps)


def test_from_mask_ranks_any_pattern():
    steps = Steps.from_mask(MASK)
    lengths, order, rank = np_fields(MASK)
    assert steps.masked and not steps.right_padded
    assert steps.known_lengths is None  # only ranking the mask gives them
    check_valid_first_fields(steps, lengths)
    np.testing.assert_array_equal(to_np(steps.known_lengths), lengths)
    np.testing.assert_array_equal(to_np(steps.mask), MASK)
    np.testing.assert_array_equal(to_np(steps.order), order)
    np.testing.assert_array_equal(np.argsort(to_np(steps.inverse), 1), order)
    np.testing.assert_array_equal(to_np(steps.rank), rank)
    x = np.arange(MASK.size, dtype="float32").reshape(MASK.shape)
    np.testing.assert_array_equal(
        to_np(steps.valid_first(x)), np.take_along_axis(x, order, 1)
    )


def test_from_lengths_is_valid_first_already():
    steps = Steps.from_lengths(LENGTHS, MASK.shape[1])
    assert steps.masked and steps.right_padded
    assert steps.order is None and steps.inverse is None and steps.rank is None
    np.testing.assert_array_equal(to_np(steps.known_lengths), LENGTHS)
    check_valid_first_fields(steps, LENGTHS)
    np.testing.assert_array_equal(
        to_np(steps.mask), np.arange(5)[None, :] < LENGTHS[:, None]
    )
    x = np.ones((5, 5, 2), "float32")
    assert steps.valid_first(x) is x


def test_full_has_every_step():
    steps = Steps.full(3, 4)
    assert not steps.masked and steps.mask is None and steps.order is None
    np.testing.assert_array_equal(to_np(steps.lengths), [4, 4, 4])
    assert steps.flipped() is steps


@pytest.mark.parametrize("made_from", ["lengths", "mask"])
def test_flipped_reads_the_reversed_mask_and_keeps_the_lengths(made_from):
    if made_from == "lengths":
        steps = Steps.from_lengths(LENGTHS, MASK.shape[1])
        mask = np.arange(5)[None, :] < LENGTHS[:, None]
    else:
        steps, mask = Steps.from_mask(MASK), MASK
        _ = steps.lengths  # derived: the flipped steps know them
    flipped = steps.flipped()
    lengths, order, rank = np_fields(mask[:, ::-1])
    assert not flipped.right_padded
    np.testing.assert_array_equal(to_np(flipped.known_lengths), lengths)
    np.testing.assert_array_equal(to_np(flipped.mask), mask[:, ::-1])
    np.testing.assert_array_equal(to_np(flipped.order), order)
    np.testing.assert_array_equal(np.argsort(to_np(flipped.inverse), 1), order)
    np.testing.assert_array_equal(to_np(flipped.rank), rank)
    check_valid_first_fields(flipped, lengths)
