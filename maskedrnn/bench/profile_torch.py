"""Where MaskedRNN's forward pass spends its time on the torch backend (CPU).

Profiles 20 eager forward calls (under `torch.no_grad()`, 1 thread, after 3
warm-up calls) of `MaskedRNN(GRU|LSTM(64, return_sequences=True))` on the
benchmark's MaskedRNN data (B=32 T=100 D=64, lengths uniform in [20, 100],
left-padded, `mask=`) with `torch.profiler` and prints the ops by total CPU
time.

    KERAS_BACKEND=torch python -m maskedrnn.bench.profile_torch gru
"""

import sys

import keras
import numpy as np

import maskedrnn

BATCH, TIME, FEATURES, units = 32, 100, 64, 64


def left_padded_batch(seed=0):
    """`(x, mask)`: float32 `(B, T, D)` zeroed at the padding, bool `(B, T)`."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, TIME + 1, size=BATCH)
    mask = np.arange(TIME)[None, :] >= (TIME - lengths)[:, None]
    x = rng.standard_normal((BATCH, TIME, FEATURES)).astype("float32")
    return x * mask[..., None], mask


def main(argv=None):
    import torch  # on the torch backend only: imported when run

    argv = sys.argv[1:] if argv is None else argv
    cell = argv[0] if argv else "gru"
    torch.set_num_threads(1)
    x, mask = left_padded_batch()
    inner = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM}[cell]
    layer = maskedrnn.MaskedRNN(inner(units, return_sequences=True))
    x, mask = keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(mask)
    with torch.no_grad():
        for _ in range(3):
            layer(x, mask=mask)
        cpu = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=cpu) as prof:
            for _ in range(20):
                layer(x, mask=mask)
    print(
        f"MaskedRNN({cell.upper()}) forward, torch CPU, 1 thread, 20 calls, mask=, "
        "pre-padded"
    )
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
    return 0


if __name__ == "__main__":
    sys.exit(main())
