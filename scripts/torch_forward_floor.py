"""How far MaskedRNN's torch forward pass with states is from PyTorch packed,
and where that gap sits (CPU, one thread, inference).

Times, interleaved in one process (median of 200 calls after 10 warm-up
calls, under `torch.no_grad()`), on the benchmark's MaskedRNN data (B=32
T=100 D=U=64, lengths uniform in [20, 100], left-padded, `mask=`):

- `torch_packed`: `nn.GRU`/`nn.LSTM` on a `PackedSequence` with the gather
  to valid-first and back, as the bench's `torch_packed` row;
- `kernel_only`: the packed kernel alone (`torch.gru`/`torch.lstm` with
  `batch_sizes`) on data packed beforehand: what both of the above share;
- `maskedrnn`: `MaskedRNN(GRU|LSTM(64, return_sequences=True,
  return_state=True))(x, mask=mask)`;
- `maskedrnn_call`: its `call` method alone (no Keras `Layer.__call__`);
- `keras_call_floor`: `Layer.__call__` of a layer whose `call` returns its
  input (the same arguments and output structure): what Keras adds to any
  layer call.

Prints each median and the overheads over `kernel_only`, then the two
that matter timed alone, interleaved with each other only (`maskedrnn`
and `torch_packed`, run back to back: warm), and the number of Python
function calls of one call of `maskedrnn`, its `call` and the identity
layer (`cProfile`) (docs/results/torch-forward-floor-<cell>.txt,
docs/benchmarks.md).

    KERAS_BACKEND=torch python scripts/torch_forward_floor.py gru
"""

import cProfile
import pstats
import sys

import keras
import numpy as np
import torch
from rnn_cpu_batch import BATCH as batch
from rnn_cpu_batch import FEATURES as features
from rnn_cpu_batch import TIME as time_steps
from rnn_cpu_batch import UNITS as units
from rnn_cpu_batch import interleaved_medians, left_padded_batch

import maskedrnn
from maskedrnn.backends import torch_kernels

cell = sys.argv[1] if len(sys.argv) > 1 else "gru"
torch.set_num_threads(1)
x_np, mask_np, lengths = left_padded_batch()
x, mask = torch.from_numpy(x_np), torch.from_numpy(mask_np)
keras_cls = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM}[cell]
torch_cls = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[cell]
layer = maskedrnn.MaskedRNN(keras_cls(units, return_sequences=True, return_state=True))
layer(x, mask=mask)
module = torch_cls(features, units, batch_first=True)

# PyTorch packed, as the bench's torch_packed: valid steps first, pack, run,
# unpack, back in place (index tensors made once, outside the timing).
order = np.argsort(~mask_np, axis=1, kind="stable")
gather, scatter = torch.from_numpy(order), torch.from_numpy(np.argsort(order, 1))
rows = torch.arange(batch)[:, None]
lengths_cpu = torch.as_tensor(lengths)


def torch_packed():
    seq = torch.nn.utils.rnn.pack_padded_sequence(
        x[rows, gather], lengths_cpu, batch_first=True, enforce_sorted=False
    )
    y, hidden = module(seq)
    y, _ = torch.nn.utils.rnn.pad_packed_sequence(
        y, batch_first=True, total_length=time_steps
    )
    return y[rows, scatter], hidden


# The same packed data once, for the kernel alone.
packed = torch.nn.utils.rnn.pack_padded_sequence(
    x[rows, gather], lengths_cpu, batch_first=True, enforce_sorted=False
)
h0 = torch.zeros(1, batch, units)
hx = [h0] if cell == "gru" else [h0, h0]
params, kernel, hx = torch_kernels._kernel(layer.layer, hx)


def kernel_only():
    data, sizes = packed.data, packed.batch_sizes
    return kernel(data, sizes, hx, params, True, 1, 0.0, False, False)


class Identity(keras.layers.Layer):
    """A layer whose `call` costs nothing: what remains is `Layer.__call__`."""

    def __init__(self):
        super().__init__()
        self.supports_masking = True

    def call(self, inputs, mask=None, lengths=None, initial_state=None, training=None):
        return inputs, inputs[:, 0], inputs[:, 0]

    def compute_mask(self, inputs, mask=None):
        return (mask, None, None)


identity = Identity()
identity(x, mask=mask)
cases = {
    "torch_packed": torch_packed,
    "kernel_only": kernel_only,
    "maskedrnn": lambda: layer(x, mask=mask),
    "maskedrnn_call": lambda: layer.call(x, mask=mask),
    "keras_call_floor": lambda: identity(x, mask=mask),
}


with torch.no_grad():
    median = interleaved_medians(cases, 200, warmup=10)
print(
    f"MaskedRNN({cell.upper()}, return_state=True) forward vs PyTorch packed, "
    "torch CPU, 1 thread, B=32 T=100 D=U=64, left-padded, median of 200 "
    "interleaved calls (ms)"
)
for name, ms in median.items():
    print(f"{name:18s} {ms:7.3f}")
kernel_ms = median["kernel_only"]
derived = {
    "torch_packed - kernel_only": median["torch_packed"] - kernel_ms,
    "maskedrnn - kernel_only": median["maskedrnn"] - kernel_ms,
    "  of it Layer.__call__ (ours)": median["maskedrnn"] - median["maskedrnn_call"],
}
for name, ms in derived.items():
    print(f"{name:30s} {ms:7.3f}")
ratio = median["maskedrnn"] / median["torch_packed"]
print(f"{'maskedrnn / torch_packed':30s} {ratio:7.2f}")

# The two alone, back to back (warm: nothing else runs in between).
pair = {"torch_packed": cases["torch_packed"], "maskedrnn": cases["maskedrnn"]}
with torch.no_grad():
    pair_median = interleaved_medians(pair, 200)
print("the two alone, interleaved with each other only (ms)")
for name, ms in pair_median.items():
    print(f"{name:18s} {ms:7.3f}")
ratio = pair_median["maskedrnn"] / pair_median["torch_packed"]
print(f"{'maskedrnn / torch_packed':30s} {ratio:7.2f}")

# Python function calls of one call (what Keras' Layer.__call__ adds).
print("Python function calls of one call (cProfile)")
with torch.no_grad():
    for name in ("maskedrnn", "maskedrnn_call", "keras_call_floor"):
        profiler = cProfile.Profile()
        profiler.enable()
        cases[name]()
        profiler.disable()
        print(f"{name:18s} {pstats.Stats(profiler).total_calls:7d}")
