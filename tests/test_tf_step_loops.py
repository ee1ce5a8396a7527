"""The step loops of TensorFlow's GRU and SimpleRNN kernel, alone.

Oracle: numpy in float64, row by row over each row's own steps. Every step a
loop must not run holds NaN in its inputs: a loop that read one would put a
NaN in its outputs. (The layers over these loops are checked against Keras'
masked layers in test_tf_tiers.py.)
"""

import numpy as np
import pytest

from tests.helpers import BACKEND

pytestmark = pytest.mark.skipif(
    BACKEND != "tensorflow", reason="TensorFlow's step loops: TensorFlow only"
)

if BACKEND == "tensorflow":
    import tensorflow as tf

    from maskedrnn.backends import tensorflow_step_loops as step_loops
    from maskedrnn.backends import tensorflow_tiers as tiers

# Sorted longest first, as the loops take them: an empty row last.
LENGTHS = np.array([10, 9, 5, 5, 3, 1, 1, 0])
UNITS = 3


def whole(steps, block):
    return -(-steps // block) * block


@pytest.mark.parametrize("known", [True, False], ids=["static", "tensor"])
def test_block_rows_counts_the_rows_with_a_step_in_each_block(known):
    """Per block of 2 steps, the rows whose length passes its first step,
    then a 0 for the block past the time axis (the time axis known to the
    trace, or a tensor)."""
    time = 10 if known else tf.constant(10)
    rows = tiers.block_rows(tf.constant(LENGTHS, "int32"), time, 2)
    np.testing.assert_array_equal(rows.numpy(), [7, 5, 4, 2, 2, 0])


def run_blocks(lengths, block):
    """`(time, rows)`: the padded time axis, and each row's steps the loops
    run (its own, up to the end of its last block)."""
    time = whole(int(lengths.max()), block) + block
    return time, [whole(int(n), block) for n in lengths]


@pytest.mark.parametrize("block", [1, 2, 4])
def test_shrinking_forward_runs_each_block_over_its_rows(block):
    """Each row runs to the end of the block holding its last step, from its
    initial state, as `h' = tanh(x_t + h U)` does in float64; its outputs
    after that block are zeros, and no step after it is read. In a graph,
    as the kernel runs them."""
    rng = np.random.default_rng(block)
    time, ran = run_blocks(LENGTHS, block)
    batch = len(LENGTHS)
    x = rng.standard_normal((time, batch, UNITS))
    for r, n in enumerate(ran):
        x[n:, r] = np.nan
    u = rng.standard_normal((UNITS, UNITS)) * 0.5
    h0 = rng.standard_normal((batch, UNITS))
    u_tf = tf.constant(u)

    def step(h, inputs):
        h = tf.tanh(inputs[0] + tf.matmul(h, u_tf))
        return h, [h]

    rows = tiers.block_rows(tf.constant(LENGTHS, "int32"), time, block)

    # autograph off, as the kernel traces them.
    @tf.function(autograph=False)
    def run(x, h0):
        return step_loops.shrinking_forward(x, h0, rows, lambda xb: [xb], step, block)

    got = run(tf.constant(x), tf.constant(h0)).numpy()
    assert not np.isnan(got).any()
    for r, n in enumerate(ran):
        h = h0[r]
        for t in range(n):
            h = np.tanh(x[t, r] + h @ u)
            np.testing.assert_allclose(got[t, r], h, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(got[n:, r], 0)


@pytest.mark.parametrize("block", [1, 2, 4])
def test_shrinking_backward_runs_each_block_over_its_rows(block):
    """From the last block to the first, each block's `grads` sees the rows
    with a step in it, the gradient carried from the block after grown by
    the rows that end in it (zeros for them). Outputs zeros after each row's
    last block, sums over the blocks each row runs, and no step after a
    row's last block read."""
    rng = np.random.default_rng(10 + block)
    time, ran = run_blocks(LENGTHS, block)
    batch = len(LENGTHS)
    dhs = rng.standard_normal((time, batch, UNITS))
    for r, n in enumerate(ran):
        dhs[n:, r] = np.nan
    rows = tiers.block_rows(tf.constant(LENGTHS, "int32"), time, block)

    def grads(dh, inputs):
        # A carried sum of every step's input; the input, doubled, out; the
        # sum of the inputs as the block's term.
        (d,) = inputs
        return dh + tf.reduce_sum(d, 0), 2 * d, [tf.reduce_sum(d, (0, 1))]

    # autograph off, as the kernel traces them.
    @tf.function(autograph=False)
    def run(dhs):
        zeros = [tf.zeros((UNITS,), "float64")]
        return step_loops.shrinking_backward(
            [dhs], rows, grads, zeros, UNITS, UNITS, block
        )

    outs, dh0, (total,) = run(tf.constant(dhs))
    outs, dh0, total = outs.numpy(), dh0.numpy(), total.numpy()
    want_total = np.zeros(UNITS)
    for r, n in enumerate(ran):
        np.testing.assert_allclose(outs[:n, r], 2 * dhs[:n, r], rtol=1e-12)
        np.testing.assert_array_equal(outs[n:, r], 0)
        np.testing.assert_allclose(dh0[r], dhs[:n, r].sum(0), rtol=1e-12)
        want_total += dhs[:n, r].sum(0)
    np.testing.assert_allclose(total, want_total, rtol=1e-12)
