"""The batch of the CPU benchmark's MaskedRNN runs, for the torch scripts
(`profile_rnn_torch.py`, `torch_forward_floor.py`, `torch_gru_paths.py`):
B=32 T=100 D=64, lengths uniform in [20, 100], left-padded, zeros at the
padding."""

import numpy as np

BATCH, TIME, FEATURES, UNITS = 32, 100, 64, 64


def left_padded_batch(seed=0):
    """`(x, mask, lengths)` as numpy arrays: float32 `(B, T, D)`, bool
    `(B, T)` (True at valid steps) and int `(B,)`."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, TIME + 1, size=BATCH)
    mask = np.arange(TIME)[None, :] >= (TIME - lengths)[:, None]
    x = rng.standard_normal((BATCH, TIME, FEATURES)).astype("float32")
    return x * mask[..., None], mask, lengths
