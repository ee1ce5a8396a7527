"""Gate layouts shared by every converter: gate counts, block splits, reorders.

An LSTM or GRU keeps one block of `U` rows or columns per gate, and
libraries disagree on the order of those blocks. Every reorder in
`maskedrnn.convert` (and in `maskedrnn.backends.torch_kernels`, which feeds Keras
GRU weights to PyTorch's kernel) goes through the functions here; each
permutation below says which orders it maps.

Gate orders, with `D` input features and `U` units:

| Layout | LSTM | GRU |
|---|---|---|
| Keras 3 (column blocks of `(D, G*U)` / `(U, G*U)`) | i, f, c, o | z, r, h |
| cuDNN canonical, legacy CuDNN layers' cuDNN call | i, f, c, o | r, z, h |
| PyTorch (row blocks of `(G*U, D)` / `(G*U, U)`) | i, f, g(=c), o | r, z, n(=h) |
| TF1 `LSTMBlockCell` / `CudnnCompatibleLSTMCell` | i, c(j), f, o | — |

The functions are generic in the array library: they default to numpy, and
`swap_gru_zr(w, -1, torch.chunk, torch.cat)` applies the same permutation to
torch tensors (this module never imports torch).
"""

import numpy as np

#: Number of gate blocks of an LSTM (i, f, c, o).
LSTM_GATES = 4
#: Number of gate blocks of a GRU (z, r, h in Keras).
GRU_GATES = 3
#: Number of blocks of a plain RNN (`keras.layers.SimpleRNN`, PyTorch's
#: `nn.RNN`): one, no gates, so nothing to reorder.
SIMPLE_RNN_GATES = 1

#: Keras GRU gate order z, r, h  <->  cuDNN / PyTorch order r, z, h (n):
#: swap the first two blocks, keep the candidate last. Its own inverse.
GRU_SWAP_ZR = (1, 0, 2)

#: TF1 LSTM cell order i, c(j), f, o  <->  Keras order i, f, c, o: swap the
#: middle two blocks. Its own inverse.
TF1_LSTM_SWAP_CF = (0, 2, 1, 3)


def split_gates(x, n_gates, axis, split=np.split):
    """Splits `x` into `n_gates` equal gate blocks along `axis`.

    Example: a Keras LSTM kernel `(D, 4U)` split on axis 1 gives the four
    `(D, U)` blocks i, f, c, o.
    """
    return split(x, n_gates, axis)


def reorder_blocks(blocks, order):
    """Returns the list of gate blocks (or of per-gate matrices / biases)
    `blocks` in `order`: item `k` of the result is `blocks[order[k]]`."""
    return [blocks[i] for i in order]


def reorder_gates(x, order, axis, split=np.split, concatenate=np.concatenate):
    """Returns `x` with its gate blocks along `axis` put in `order`.

    Block `k` of the result is block `order[k]` of `x`; `len(order)` is the
    number of gates. `split(x, n, axis)` and `concatenate(blocks, axis)`
    default to numpy's (`torch.chunk` / `torch.cat` have the same positional
    signatures).
    """
    blocks = split_gates(x, len(order), axis, split)
    return concatenate(reorder_blocks(blocks, order), axis)


def swap_gru_zr(x, axis=-1, split=np.split, concatenate=np.concatenate):
    """Keras GRU gate blocks z, r, h <-> cuDNN / PyTorch blocks r, z, h(n).

    The one definition of the Keras<->PyTorch/cuDNN GRU gate permutation
    (`GRU_SWAP_ZR`), used by the converters and by the torch backend's
    native GRU kernel. It is its own inverse, so it serves both directions.

    Args:
        x: array with `3U` entries along `axis` (a kernel `(D, 3U)`, a
            recurrent kernel `(U, 3U)`, a bias `(3U,)` or `(2, 3U)`, or
            PyTorch's `(3U, D)` with `axis=0`).
        axis: int (default `-1`), the gate axis.
        split: `split(x, 3, axis)` (default `np.split`).
        concatenate: `concatenate(blocks, axis)` (default `np.concatenate`).

    Returns:
        `x` with its first two gate blocks swapped.

    Example:

    >>> swap_gru_zr(np.array([0, 0, 1, 1, 2, 2]))
    array([1, 1, 0, 0, 2, 2])
    """
    return reorder_gates(x, GRU_SWAP_ZR, axis, split, concatenate)


def map_gate_blocks(matrix, n_gates, fn):
    """Applies `fn` to each gate's column block of `matrix`, keeping the
    gate order: `(rows, n_gates * U)` -> `n_gates` blocks `(rows, U)` ->
    `fn(block)` each -> concatenated on axis 1 again."""
    return np.concatenate(
        [fn(block) for block in split_gates(matrix, n_gates, 1)], axis=1
    )


def halve_bias(bias):
    """Splits one summed Keras LSTM bias `(4U,)` into two equal halves for
    layouts that keep an input and a recurrent bias (legacy CuDNNLSTM, TF1
    canonical params). Only the sum enters the LSTM equations, so any split
    computes the same function; halves are what tf-keras and TF's
    `CudnnLSTMSaveable` write."""
    return bias * np.asarray(0.5, dtype=bias.dtype)
