"""The step loops of TensorFlow's GRU and SimpleRNN kernel (`tensorflow_cells`).

Each loop is one `tf.while_loop` over blocks of steps, a block's steps
traced into the loop's body (so the loop's own ops run once per block):

- `scan` steps every row from the first step to the last of its
  sequences: one tier of rows (`tensorflow_tiers.run_tiers`), whose inputs
  are projected before the loop in one matmul.
- `shrinking_forward` and `shrinking_backward` run rows sorted longest
  first, each block over the rows that have a step in it: the rows leave
  the loop block by block as they end, and each block projects its own
  rows' inputs, so no padded step is computed past the block a row ends
  in. `tensorflow_tiers.block_rows` gives each block's rows.

The cell's equations come as functions: a `step(h, inputs) -> (h, outs)`
and, for the shrinking loops, the projection of a block's inputs and the
gradients of a block's steps (`tensorflow_cells`, on
`tensorflow_equations`). Where a loop pads or leaves steps unrun, the
caller ignores what they hold (steps past a row's length) or reads zeros
(steps past every row).
"""

import numpy as np
import tensorflow as tf

from maskedrnn.backends import tensorflow_tiers as tiers
from maskedrnn.backends.tensorflow_shapes import reshape_to, size


def scan(step, h0, seqs, widths, block, blocks, backward=False):
    """Runs `h, outs = step(h, inputs)` over time-major `seqs`, `block` at a time.

    Args:
        step: A function of `(h, list of (rows, width) tensors)` returning
            `(h, list of (rows, width_i) tensors)`, one per `widths`.
        h0: `(rows, units)`, the carried value before the first step.
        seqs: List of `(blocks * block, rows, width)` tensors.
        widths: Python ints, the widths of `step`'s outputs.
        block: Python int, the steps per loop iteration.
        blocks: Scalar int32 tensor, the loop's iterations.
        backward: Whether to run from the last step to the first.

    Returns:
        `(h, outs)`: the last carried value and one `(blocks * block,
        rows, width_i)` tensor per `widths`.
    """
    rows = size(h0, 0)
    dtype = seqs[0].dtype
    blocked = [
        tf.reshape(s, reshape_to([blocks, block, rows, s.shape[-1]])) for s in seqs
    ]
    known_rows = rows if isinstance(rows, int) else None
    # The steps, for a reshape: unknown, read as -1 where the rows are known.
    steps = -1 if known_rows is not None else blocks * block
    arrays = [
        tf.TensorArray(
            dtype, size=blocks, element_shape=tf.TensorShape([block, known_rows, w])
        )
        for w in widths
    ]

    def body(i, h, *arrays):
        # Block i of each sequence: one slice (a view, no copy) sharing its
        # bounds, where `b[i]` is six ops each.
        begin = tf.reshape(i, [1])
        end, one = begin + 1, tf.constant([1])
        inputs = [
            tf.strided_slice(b, begin, end, one, shrink_axis_mask=1) for b in blocked
        ]
        h, outs = unrolled(step, h, inputs, len(widths), block, backward)
        arrays = [a.write(i, o) for a, o in zip(arrays, outs)]
        return (i - 1 if backward else i + 1, h, *arrays)

    out = tf.while_loop(
        (lambda i, *_: i >= 0) if backward else (lambda i, *_: i < blocks),
        body,
        (blocks - 1 if backward else 0, h0, *arrays),
    )
    results = []
    for a, w in zip(out[2:], widths):
        full = tiers.stack(a, [block, rows, w])
        results.append(tf.reshape(full, reshape_to([steps, rows, w])))
    return out[1], results


def unrolled(step, h, inputs, outputs, block, backward):
    """`step` over the `block` steps of `inputs` (`(block, rows, width)`
    tensors), from the last step where `backward`: `(h, outs)`, one
    `(block, rows, width_i)` tensor per output of `step`."""
    per_step = [tf.unstack(x, num=block) for x in inputs]
    outs = [[None] * block for _ in range(outputs)]
    for j in range(block - 1, -1, -1) if backward else range(block):
        h, out = step(h, [x[j] for x in per_step])
        for kept, value in zip(outs, out):
            kept[j] = value
    return h, [tf.stack(o) for o in outs]


def _block_bounds(rows, blocks):
    """Per block i, the `tf.strided_slice` bounds of its rows' steps in a
    `(blocks, block, batch, width)` tensor, the block's index dropped and
    its rows the first `rows[i]`: `(begins, ends)`, `(blocks, 3)` each; the
    rows are `ends[i][2:]`."""
    if isinstance(blocks, int):
        # Known to the trace: the begins one constant.
        index = np.arange(blocks, dtype="int32")
        zeros = np.zeros(blocks, "int32")
        begins = tf.constant(np.stack([index, zeros, zeros], 1))
    else:
        index = tf.range(blocks)
        zeros = tf.zeros_like(index)
        begins = tf.stack([index, zeros, zeros], 1)
    return begins, tf.stack([index + 1, zeros, rows], 1)


def _row_pads(rows, batch):
    """Per block, the `tf.pad` paddings taking its rows' `(block, rows[i],
    width)` outputs to `batch` rows: `(blocks, 3, 2)`."""
    zeros = tf.zeros_like(rows)
    pads = tf.stack([zeros, zeros, zeros, batch - rows, zeros, zeros], 1)
    return tf.reshape(pads, [-1, 3, 2])


def _blocks_of(x, block):
    """Time-major `x` `(blocks * block, batch, width)` as `(blocks, block,
    batch, width)`."""
    blocks = size(x, 0) // block
    return tf.reshape(x, reshape_to([blocks, block, size(x, 1), x.shape[2]]))


def _block_slice(blocked, begin, end):
    """Block `begin[0]`'s first `end[2]` rows of `_blocks_of`'s `blocked`:
    `(block, rows, width)`, one op. Its static shape keeps the block and
    width sizes, which bounds read from a tensor would lose: reshapes of
    it then need no shape op."""
    out = tf.strided_slice(
        blocked, begin, end, tf.constant([1, 1, 1]), end_mask=2, shrink_axis_mask=1
    )
    out.set_shape([blocked.shape[1], None, blocked.shape[3]])
    return out


def _first_rows(h, end):
    """The first `end[2]` rows of `h` (`end` from `_block_bounds`): one
    slice of `end` serves as both bounds, the begin masked to 0."""
    rows = end[2:]
    return tf.strided_slice(h, rows, rows, [1], begin_mask=1)


def _array(dtype, blocks, block, batch, width):
    """A `tf.TensorArray` of `blocks` `(block, batch, width)` elements:
    zeros where none is written (`_stacked`)."""
    known = batch if isinstance(batch, int) else None
    shape = tf.TensorShape([block, known, width])
    return tf.TensorArray(dtype, size=blocks, element_shape=shape)


def _stacked(array, block, batch, width, steps):
    """The `(block, batch, width)` elements of `array` as one `(steps,
    batch, width)` tensor; those never written are zeros."""
    out = tiers.stack(array, [block, batch, width])
    return tf.reshape(out, reshape_to([steps, batch, width]))


def shrinking_forward(x, h0, rows, project, step, block):
    """The outputs of `step` over sorted rows that leave as they end.

    Args:
        x: `(blocks * block, batch, features)`, time-major, rows sorted
            longest first.
        h0: `(batch, units)`, the states before the first step.
        rows: `(blocks + 1,)` int32, the rows with a step in each block,
            then a 0 (`tensorflow_tiers.block_rows`).
        project: Maps a block's inputs `(block, rows, features)` to the
            list of `step`'s inputs, `(block, rows, width_i)` each.
        step: `step(h, inputs) -> (h, [h])`, one step of the cell.
        block: Python int, the steps per loop iteration.

    Returns:
        `(blocks * block, batch, units)`: each block's outputs at its rows,
        zeros at the other rows and in every block past the longest row.
    """
    steps, batch, units = size(x, 0), size(x, 1), h0.shape[1]
    blocked = _blocks_of(x, block)
    begins, ends = _block_bounds(rows, steps // block + 1)
    pads = _row_pads(rows, batch)

    def body(i, h, array):
        begin, end = tf.gather(begins, i), tf.gather(ends, i)
        h = _first_rows(h, end)
        inputs = _block_slice(blocked, begin, end)
        h, (out,) = unrolled(step, h, project(inputs), 1, block, False)
        return i + 1, h, array.write(i, tf.pad(out, tf.gather(pads, i)))

    _, _, array = tf.while_loop(
        # Up to the first block of no rows (the last, at the latest).
        lambda i, *_: tf.gather(rows, i) > 0,
        body,
        (0, h0, _array(x.dtype, steps // block, block, batch, units)),
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, units]), None),
    )
    return _stacked(array, block, batch, units, steps)


def shrinking_backward(seqs, rows, grads, sums, width, units, block):
    """The gradients of `shrinking_forward`, block by block from the last.

    Args:
        seqs: Time-major `(blocks * block, batch, width_i)` tensors, rows
            sorted longest first, each block sliced to its rows for `grads`.
        rows: `(blocks + 1,)` int32, the forward's `rows`.
        grads: `grads(dh, inputs) -> (dh, out, terms)`: from the gradient
            `dh` w.r.t. the block's last state (its rows), that w.r.t. the
            state before the block, a `(block, rows, width)` tensor of the
            block's rows (the gradient w.r.t. its inputs) and one term per
            `sums`.
        sums: Tensors summed over the blocks (their zeros).
        width: Python int, the width of `grads`' `out`.
        units: Python int, the width of `dh`.
        block: Python int, the steps per loop iteration.

    Returns:
        `(outs, dh0, sums)`: `outs` `(blocks * block, batch, width)` (zeros
        at the rows no block ran), `dh0` `(batch, units)` the gradient
        w.r.t. the initial states (zeros for rows of no step), and the sums.
    """
    batch, steps = size(seqs[0], 1), size(seqs[0], 0)
    dtype = seqs[0].dtype
    blocked = [_blocks_of(s, block) for s in seqs]
    begins, ends = _block_bounds(rows, steps // block + 1)
    pads = _row_pads(rows, batch)
    # Each block's rows past the next block's, as the gradient's new rows.
    after = tf.concat([rows[1:], [0]], 0)
    zeros = tf.zeros_like(rows)
    grow = tf.reshape(tf.stack([zeros, rows - after, zeros, zeros], 1), [-1, 2, 2])
    # The blocks holding a row's step: `rows` is non-increasing.
    blocks = tf.reduce_sum(tf.cast(rows > 0, "int32"))

    def body(i, dh, array, *sums):
        dh = tf.pad(dh, tf.gather(grow, i))
        begin, end = tf.gather(begins, i), tf.gather(ends, i)
        dh, out, terms = grads(dh, [_block_slice(b, begin, end) for b in blocked])
        array = array.write(i, tf.pad(out, tf.gather(pads, i)))
        return (i - 1, dh, array, *[s + t for s, t in zip(sums, terms)])

    out = tf.while_loop(
        lambda i, *_: i >= 0,
        body,
        (
            blocks - 1,
            tf.zeros([0, units], dtype),
            _array(dtype, steps // block, block, batch, width),
            *sums,
        ),
        shape_invariants=(
            tf.TensorShape([]),
            tf.TensorShape([None, units]),
            None,
            *[s.shape for s in sums],
        ),
    )
    dh0 = tf.pad(out[1], [[0, batch - size(out[1], 0)], [0, 0]])
    return _stacked(out[2], block, batch, width, steps), dh0, list(out[3:])
