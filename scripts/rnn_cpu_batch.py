"""The batch of the CPU benchmark's MaskedRNN runs, for the torch scripts
(`profile_rnn_torch.py`, `torch_forward_floor.py`, `torch_gru_paths.py`,
`torch_rnn_paths.py`): B=32 T=100 D=64, lengths uniform in [20, 100],
left-padded, zeros at the padding; and the timing they share."""

import time

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


def interleaved_medians(cases, rounds, warmup=0):
    """Median ms of each case of the dict `cases` (name -> function of no
    arguments) over `rounds` rounds, every case once a round, in order,
    after `warmup` calls of each: slow drifts of a shared machine hit all
    cases alike."""
    times = {name: [] for name in cases}
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    for _ in range(rounds):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) * 1e3 for name, t in times.items()}


def best_of_two(cases, rounds=15, warmup=3):
    """The smaller of two `interleaved_medians` of each case, in ms."""
    first = interleaved_medians(cases, rounds, warmup)
    second = interleaved_medians(cases, rounds, warmup)
    return {name: min(first[name], second[name]) for name in cases}


def max_diff(a, b):
    """The largest absolute difference of two torch tensors, a float."""
    return float((a - b).detach().abs().max())
