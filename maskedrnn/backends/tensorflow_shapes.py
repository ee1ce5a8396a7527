"""Tensor sizes for TensorFlow graphs: Python ints where the trace knows them.

Every `tf.shape(x)[i]` adds a `Shape`, a `StridedSlice` and three constants
to the graph, traced and optimised again on every first call of a
`tf.function`. The TensorFlow kernels read each size here instead: a static
size costs no op, and a reshape with at most one unknown size is one
constant.
"""

import tensorflow as tf


def size(x, axis):
    """`x`'s size on `axis`: a Python int where the trace knows it, else a
    scalar int32 tensor."""
    known = x.shape[axis]
    return known if known is not None else tf.shape(x)[axis]


def reshape_to(sizes):
    """A `tf.reshape` shape of `sizes` (ints or scalar tensors): a list of
    ints, the one unknown size as -1, where at most one is unknown; else
    one stacked tensor."""
    unknown = [i for i, s in enumerate(sizes) if not isinstance(s, int)]
    if len(unknown) <= 1:
        return [-1 if i in unknown else s for i, s in enumerate(sizes)]
    return tf.stack(sizes)


def leading_shape(x, count, tail):
    """The `tf.reshape` shape `x.shape[:count] + tail` (`tail` Python ints):
    a list of ints where at most one of the leading sizes is unknown (read
    as -1, no op), else one tensor read with `tf.shape`."""
    lead = list(x.shape[:count])
    unknown = [i for i, s in enumerate(lead) if s is None]
    if len(unknown) > 1:
        return tf.concat([tf.shape(x)[:count], list(tail)], 0)
    if unknown:
        lead[unknown[0]] = -1
    return lead + list(tail)
