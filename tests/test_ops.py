"""maskedrnn.ops, each checked against a direct numpy implementation."""

import keras
import numpy as np
import pytest
from keras import ops

from maskedrnn import ops as mops
from tests.helpers import BACKEND, loss_and_grads, to_np


def np_reverse_sequence(x, lengths, axis=1):
    """Reference: tf.reverse_sequence semantics, one row at a time."""
    x = np.moveaxis(np.array(x), axis, 1).copy()
    out = x.copy()
    for i, n in enumerate(lengths):
        n = int(min(max(n, 0), x.shape[1]))
        out[i, :n] = x[i, :n][::-1]
    return np.moveaxis(out, 1, axis)


@pytest.mark.parametrize("shape", [(4, 6), (4, 6, 3), (3, 5, 2, 2)])
def test_reverse_sequence_matches_numpy(shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype("float32")
    lengths = np.array([0, 1, shape[1], 3][: shape[0]], "int32")
    got = to_np(mops.reverse_sequence(x, lengths))
    np.testing.assert_array_equal(got, np_reverse_sequence(x, lengths))
    # It is its own inverse.
    back = to_np(mops.reverse_sequence(got, lengths))
    np.testing.assert_array_equal(back, x)


def test_reverse_sequence_other_axis_and_docstring_example():
    x = np.array([[1, 2, 3, 0, 0], [1, 2, 0, 0, 0]], "float32")
    got = to_np(mops.reverse_sequence(x, [3, 2]))
    np.testing.assert_array_equal(got, [[3, 2, 1, 0, 0], [2, 1, 0, 0, 0]])
    rng = np.random.default_rng(1)
    y = rng.standard_normal((3, 2, 5)).astype("float32")
    got = to_np(mops.reverse_sequence(y, [5, 2, 0], axis=2))
    np.testing.assert_array_equal(got, np_reverse_sequence(y, [5, 2, 0], axis=2))
    got = to_np(mops.reverse_sequence(y, [5, 2, 0], axis=-1))
    np.testing.assert_array_equal(got, np_reverse_sequence(y, [5, 2, 0], axis=2))


def test_reverse_sequence_rejects_batch_axis():
    with pytest.raises(ValueError, match="axis=0"):
        mops.reverse_sequence(np.zeros((2, 3)), [1, 2], axis=0)
    with pytest.raises(ValueError, match="rank >= 2"):
        mops.reverse_sequence(np.zeros((3,)), [1, 2, 3])


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.reverse_sequence oracle")
def test_reverse_sequence_matches_tf():
    import tensorflow as tf

    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 7, 3)).astype("float32")
    lengths = np.array([7, 0, 3, 1, 6])
    expected = tf.reverse_sequence(x, lengths, seq_axis=1, batch_axis=0).numpy()
    np.testing.assert_array_equal(to_np(mops.reverse_sequence(x, lengths)), expected)


def test_reverse_sequence_gradient_is_the_reverse_permutation():
    """d(sum(w * reverse(x)))/dx = reverse(w): the op is a permutation."""
    from tests.helpers import loss_and_grads

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 5, 2)).astype("float32")
    lengths = np.array([5, 2, 0], "int32")

    class Rev(keras.layers.Layer):
        def call(self, x):
            return mops.reverse_sequence(x, lengths)

    layer = Rev()
    layer(x)  # build (a stateless layer still needs it for stateless_call)
    _, (gx,) = loss_and_grads(layer, x)
    # loss_and_grads weights the output with this fixed pattern:
    w = np.random.default_rng(123).standard_normal(x.shape).astype("float32")
    np.testing.assert_allclose(gx, np_reverse_sequence(w, lengths), atol=1e-6)


def test_sequence_mask():
    got = to_np(mops.sequence_mask([3, 0, 5], maxlen=5))
    expected = np.arange(5)[None, :] < np.array([3, 0, 5])[:, None]
    np.testing.assert_array_equal(got, expected)
    assert to_np(mops.sequence_mask([1, 2])).shape == (2, 2)
    np.testing.assert_array_equal(
        to_np(mops.sequence_mask([1, 2], 3, dtype="float32")),
        [[1, 0, 0], [1, 1, 0]],
    )


def test_lengths_from_mask_and_padding():
    mask = np.array([[1, 1, 1, 0], [0, 0, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]])
    np.testing.assert_array_equal(to_np(mops.lengths_from_mask(mask)), [3, 2, 0, 2])
    np.testing.assert_array_equal(
        to_np(mops.lengths_from_mask(mask.astype(bool))), mask.sum(1)
    )
    ids = np.array([[5, 7, 2, 0, 0], [4, 0, 0, 0, 0], [1, 2, 3, 4, 5], [0, 1, 1, 1, 1]])
    np.testing.assert_array_equal(to_np(mops.lengths_from_padding(ids)), [3, 1, 5, 0])
    np.testing.assert_array_equal(
        to_np(mops.lengths_from_padding(ids, pad_value=5)), [0, 5, 4, 5]
    )
    feats = np.zeros((2, 4, 3), "float32")
    feats[0, :2] = 1.0
    feats[1, :, 0] = 1.0
    np.testing.assert_array_equal(to_np(mops.lengths_from_padding(feats)), [2, 4])


def holes_mask(seed):
    """A random (6, 9) mask with holes, an all-padding row 0 and a full row 1."""
    mask = np.random.default_rng(seed).random((6, 9)) > 0.4
    mask[0] = False
    mask[1] = True
    return mask


def test_valid_first_order_is_a_stable_partition():
    mask = holes_mask(4)
    order, inverse, lengths = (to_np(t) for t in mops.valid_first_order(mask))
    for i in range(len(mask)):
        valid = np.flatnonzero(mask[i])
        padded = np.flatnonzero(~mask[i])
        np.testing.assert_array_equal(order[i], np.concatenate([valid, padded]))
        np.testing.assert_array_equal(order[i][inverse[i]], np.arange(9))
    np.testing.assert_array_equal(lengths, mask.sum(1))


def test_valid_ranks_count_valid_steps_and_place_padded_ones_after():
    # numpy oracle: rank = running count of valid steps - 1; inverse sends
    # the k-th valid step to slot k and the k-th padded one to n + k.
    mask = holes_mask(5)
    rank, inverse, lengths = (to_np(t) for t in mops.valid_ranks(mask))
    np.testing.assert_array_equal(rank, np.cumsum(mask, axis=1) - 1)
    for i in range(len(mask)):
        n = mask[i].sum()
        expected = np.empty(9, int)
        expected[mask[i]] = np.arange(n)
        expected[~mask[i]] = n + np.arange(9 - n)
        np.testing.assert_array_equal(inverse[i], expected)
    np.testing.assert_array_equal(lengths, mask.sum(1))
    dtypes = {keras.backend.standardize_dtype(t.dtype) for t in mops.valid_ranks(mask)}
    assert dtypes == {"int32"}


def np_linear_recurrence_last(a, b, lengths, initial):
    c = np.array(initial, "float64").copy()
    for i, n in enumerate(lengths):
        for t in range(n):
            c[i] = a[i, t] * c[i] + b[i, t]
    return c


@pytest.mark.parametrize("time", [1, 2, 5, 8, 13])
def test_linear_recurrence_last_matches_sequential_loop(time):
    rng = np.random.default_rng(time)
    a = rng.random((5, time, 3)).astype("float32")
    b = rng.standard_normal((5, time, 3)).astype("float32")
    lengths = np.array([0, 1, time, time // 2, max(time - 1, 0)], "int32")
    c0 = rng.standard_normal((5, 3)).astype("float32")
    got = to_np(mops.linear_recurrence_last(a, b, lengths, c0))
    expected = np_linear_recurrence_last(a, b, lengths, c0)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert got.dtype == np.float32


def test_linear_recurrence_docstring_example():
    got = mops.linear_recurrence_last([[0.5, 0.5, 0.5]], [[1.0, 1.0, 1.0]], [2], [0.0])
    np.testing.assert_allclose(to_np(got), [1.5])


@pytest.mark.skipif(BACKEND != "tensorflow", reason="dynamic time axis is TF-only")
def test_linear_recurrence_with_unknown_time_axis_in_tf_function():
    import tensorflow as tf

    spec = tf.TensorSpec([None, None, 2])
    fn = tf.function(
        mops.linear_recurrence_last,
        input_signature=[
            spec,
            spec,
            tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([None, 2]),
        ],
    )
    rng = np.random.default_rng(9)
    for time in (3, 11):
        a = rng.random((2, time, 2)).astype("float32")
        b = rng.standard_normal((2, time, 2)).astype("float32")
        lengths = np.array([time, 1], "int32")
        c0 = np.zeros((2, 2), "float32")
        np.testing.assert_allclose(
            fn(a, b, lengths, c0).numpy(),
            np_linear_recurrence_last(a, b, lengths, c0),
            atol=1e-5,
        )


def test_ops_are_backend_tensors():
    x = mops.sequence_mask([1, 2], 3)
    assert ops.is_tensor(x)


def test_reverse_sequence_of_an_empty_batch_keeps_its_shape():
    x = np.zeros((0, 5, 2), "float32")
    y = to_np(mops.reverse_sequence(x, np.zeros((0,), "int32")))
    assert y.shape == (0, 5, 2)


def test_reverse_sequence_clips_lengths_above_the_time_axis():
    """As documented (and as tf.reverse_sequence's numpy reference): lengths
    above the time axis reverse the whole row, negative ones nothing. Another
    row's data, NaN or an IndexError would be wrong."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 5, 2)).astype("float32")
    lengths = np.array([7, 5, -2, 100], "int32")
    got = to_np(mops.reverse_sequence(x, lengths))
    np.testing.assert_array_equal(got, np_reverse_sequence(x, lengths))
    np.testing.assert_array_equal(got[0], x[0, ::-1])


def test_reverse_index_matches_reverse_sequence_and_its_example():
    np.testing.assert_array_equal(
        to_np(mops.reverse_index([3, 7, -1], time=4)),
        [[2, 1, 0, 3], [3, 2, 1, 0], [0, 1, 2, 3]],
    )
    x = np.random.default_rng(4).standard_normal((3, 4, 2)).astype("float32")
    lengths = np.array([3, 7, -1], "int32")
    np.testing.assert_array_equal(
        to_np(mops.gather_time(x, mops.reverse_index(lengths, 4))),
        np_reverse_sequence(x, lengths),
    )


def test_gather_time_matches_numpy_and_its_example():
    x = [[[1.0], [2.0], [3.0]], [[4.0], [5.0], [6.0]]]
    np.testing.assert_array_equal(
        to_np(mops.gather_time(np.array(x, "float32"), [[2, 0, 1], [1, 1, 0]])),
        [[[3.0], [1.0], [2.0]], [[5.0], [5.0], [4.0]]],
    )
    rng = np.random.default_rng(5)
    y = rng.standard_normal((3, 6, 2, 2)).astype("float32")
    index = rng.integers(0, 6, size=(3, 6)).astype("int32")
    expected = np.stack([y[b, index[b]] for b in range(3)])
    np.testing.assert_array_equal(to_np(mops.gather_time(y, index)), expected)
    assert "gather_time" in mops.__all__


def test_gather_time_gradient_adds_up_repeated_indices():
    """The gradient of a gather is a scatter-add (numpy oracle): a step read
    twice gets both cotangents, a step never read gets zero (on torch the
    gather is `index_select`, `_backend.take_rows`)."""
    index = np.array([[2, 2, 0, 2], [3, 1, 1, 0]], "int32")

    class Gather(keras.layers.Layer):
        def call(self, x):
            return mops.gather_time(x, index)

    x = np.random.default_rng(6).standard_normal((2, 4, 3)).astype("float32")
    layer = Gather()
    layer(x)  # built (JAX's stateless_call asks for it)
    _, (grad,) = loss_and_grads(layer, x)
    # loss_and_grads weights the output by this pattern (its fixed seed).
    w = np.random.default_rng(123).standard_normal((2, 4, 3)).astype("float32")
    expected = np.zeros_like(x)
    for b in range(2):
        np.add.at(expected[b], index[b], w[b])
    np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-6)


def test_sequence_mask_with_all_lengths_negative_is_empty_like_tf():
    mask = mops.sequence_mask(np.array([-1, -3], "int32"))
    assert tuple(mask.shape) == (2, 0)
    assert tuple(mops.sequence_mask(np.array([0, 0], "int32")).shape) == (2, 0)
