"""Gate counts and gate-block permutations shared by the converters and the
torch backend (importable from `maskedrnn.convert.gate_layout` too).

Keras orders LSTM gates i, f, c, o and GRU gates z, r, h; cuDNN and PyTorch
order GRU gates r, z, h(n); TF1 LSTM cells order i, c(j), f, o (see
`docs/convert.md`). The functions default to numpy; pass `torch.chunk` and
`torch.cat` as `split` and `concatenate` for torch tensors.
"""

import numpy as np

#: Number of gate blocks of an LSTM (i, f, c, o).
LSTM_GATES = 4
#: Number of gate blocks of a GRU (z, r, h in Keras).
GRU_GATES = 3
#: Number of blocks of a plain RNN (`SimpleRNN`, `nn.RNN`).
SIMPLE_RNN_GATES = 1

#: Keras GRU z, r, h <-> cuDNN / PyTorch r, z, h(n). Its own inverse.
GRU_SWAP_ZR = (1, 0, 2)

#: TF1 LSTM cell i, c(j), f, o <-> Keras i, f, c, o. Its own inverse.
TF1_LSTM_SWAP_CF = (0, 2, 1, 3)


def split_gates(x, n_gates, axis, split=np.split):
    """Splits `x` into `n_gates` equal gate blocks along `axis`."""
    return split(x, n_gates, axis)


def reorder_blocks(blocks, order):
    """Returns `[blocks[k] for k in order]`."""
    return [blocks[i] for i in order]


def reorder_gates(x, order, axis, split=np.split, concatenate=np.concatenate):
    """Returns `x` whose gate block `k` along `axis` is block `order[k]`."""
    blocks = split_gates(x, len(order), axis, split)
    return concatenate(reorder_blocks(blocks, order), axis)


def swap_gru_zr(x, axis=-1, split=np.split, concatenate=np.concatenate):
    """Swaps Keras GRU gate blocks z, r, h <-> cuDNN / PyTorch r, z, h(n).

    Its own inverse, so it serves both directions.

    Args:
        x: Array with `3U` entries along `axis`.
        axis: Int, the gate axis. Defaults to `-1`.
        split: `split(x, 3, axis)`. Defaults to `np.split`.
        concatenate: `concatenate(blocks, axis)`. Defaults to
            `np.concatenate`.

    Returns:
        `x` with its first two gate blocks swapped.

    Example:

    >>> swap_gru_zr(np.array([0, 0, 1, 1, 2, 2]))
    array([1, 1, 0, 0, 2, 2])
    """
    return reorder_gates(x, GRU_SWAP_ZR, axis, split, concatenate)


def map_gate_blocks(matrix, n_gates, fn):
    """Applies `fn` to each gate's column block of `matrix`, in order."""
    return np.concatenate(
        [fn(block) for block in split_gates(matrix, n_gates, 1)], axis=1
    )


def halve_bias(bias):
    """Half of a summed LSTM bias, as tf-keras writes each of its two biases."""
    return bias * np.asarray(0.5, dtype=bias.dtype)
