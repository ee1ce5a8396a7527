"""The batch of the CPU benchmark's MaskedRNN runs, for the torch scripts
(`profile_rnn_torch.py`, `torch_forward_floor.py`, `torch_gru_paths.py`,
`torch_rnn_paths.py`): B=32 T=100 D=64, lengths uniform in [20, 100],
left-padded, zeros at the padding."""

import numpy as np

BATCH, TIME, FEATURES, UNITS = 32, 100, 64, 64
# (B, T, D, U) around it, for the scripts that check a finding at other sizes.
OTHER_SIZES = [
    (8, 100, 64, 64),
    (128, 100, 64, 64),
    (16, 400, 32, 32),
    (32, 50, 256, 256),
    (64, 200, 128, 128),
    (256, 30, 128, 512),
]


def left_padded_batch(seed=0):
    """`(x, mask, lengths)` as numpy arrays: float32 `(B, T, D)`, bool
    `(B, T)` (True at valid steps) and int `(B,)`."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, TIME + 1, size=BATCH)
    mask = np.arange(TIME)[None, :] >= (TIME - lengths)[:, None]
    x = rng.standard_normal((BATCH, TIME, FEATURES)).astype("float32")
    return x * mask[..., None], mask, lengths


def valid_first_batch(seed=0):
    """The same batch as the layers' kernels get it: `(x, valid, lengths)`,
    `x` float32 `(B, T, D)` with each row's valid steps first, then its
    zeroed padding; `valid` bool `(B, T)`, True at each row's first
    `lengths` steps; `lengths` int `(B,)`."""
    x, mask, lengths = left_padded_batch(seed)
    order = np.argsort(~mask, axis=1, kind="stable")
    x = np.take_along_axis(x, order[..., None], axis=1)
    valid = np.arange(TIME)[None, :] < lengths[:, None]
    return x, valid, lengths
