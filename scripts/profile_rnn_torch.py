"""Where MaskedRNN's forward pass spends its time on the torch backend (CPU).

Profiles 20 eager forward calls (under `torch.no_grad()`, 1 thread, after 3
warm-up calls) of `MaskedRNN(GRU|LSTM(64, return_sequences=True))` on the
benchmark's MaskedRNN data (B=32 T=100 D=64, lengths uniform in [20, 100],
left-padded, `mask=`) with `torch.profiler` and prints the ops by total CPU
time (the table of docs/results/profile-torch-rnn-<cell>-fwd.txt).

    KERAS_BACKEND=torch python scripts/profile_rnn_torch.py gru
"""

import sys

import keras
import torch
from rnn_cpu_batch import UNITS as units
from rnn_cpu_batch import left_padded_batch

import maskedrnn

cell = sys.argv[1] if len(sys.argv) > 1 else "gru"
torch.set_num_threads(1)
x, mask, _ = left_padded_batch()
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
