"""Would the saturated padding pay on a GPU? A probe for the GPU check.

On a torch CPU an LSTM's exact final cell state comes from PyTorch's fused
kernel itself: the kernel reads a padding flag whose `W_ih` column pins the
forget gate to 1 and the input gate to 0 at padded steps, so `c` passes the
padded tail unchanged (`maskedrnn.backends.torch_kernels.saturated_lstm`). On CUDA
the layers still run Keras' unmasked cuDNN LSTM and recompute `c` from the
outputs (`maskedrnn.layers.final_state`), about 3/4 of the LSTM's own
arithmetic again. Keras' torch backend reaches cuDNN through
`torch._VF.lstm`, the very function `torch.lstm` is, so the saturated call
would run the same cuDNN kernel with one input feature more. This script
measures, on right-padded data (already valid-first, so no gathers in the
way), one direction and then both (`MaskedBidirectional`), forward and
forward+backward (gradients w.r.t. the inputs and every weight):

- `keras_unmasked`: Keras' LSTM without a mask (cuDNN on CUDA): the floor,
  wrong over the padding;
- `maskedrnn`: `MaskedRNN(LSTM(return_sequences=True, return_state=True))`
  with `lengths=`, as it runs here now (on CUDA: Keras' cuDNN LSTM and the
  recomputation of `c`);
- `saturated`: `torch.lstm` on the inputs with the padding flag appended
  and `torch_kernels._saturated_lstm_params`, `h` read at each row's
  length, `c` the kernel's own; bidirectional: one bidirectional call,
  whose backward direction reads each row's padded tail first, from the
  zero state the flag keeps (`c` stays 0, so `h` stays 0), so it needs no
  per-row reversal, and returns its exact final `h` and `c` itself (on a
  CPU this is not faster than two calls,
  docs/results/torch-bidirectional-call.txt; on cuDNN Keras' unmasked
  `Bidirectional` is one such call, the bar);
- `torch_packed`: `torch.lstm` on the packed valid steps (PyTorch's
  `nn.LSTM` on a `PackedSequence`): the exact oracle.

and the largest difference of `saturated` and `maskedrnn` from
`torch_packed` (outputs at valid steps, `h`, `c`), with TF32 off and on
(cuDNN's default on Ampere and later is on: TF32 rounds the flag's weight
but keeps `0 * w = 0` at valid steps, so the saturation must survive it).
Median of `--calls` calls after 5 warm-up calls, synchronized.

    KERAS_BACKEND=torch python benchmarks/cuda_saturated_lstm.py            # CUDA
    KERAS_BACKEND=torch python benchmarks/cuda_saturated_lstm.py --quick --device cpu

Sizes: the GPU figures' B=64 T=100 D=U=512, lengths uniform in [20, 100]
(`--quick`: B=4 T=6 D=U=8, 3 calls, for a CPU check of the script).
"""

import argparse
import time

import keras
import numpy as np
import torch

import maskedrnn
from maskedrnn.backends import torch_kernels

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--device", default="cuda")
parser.add_argument("--calls", type=int, default=50)
parser.add_argument("--quick", action="store_true")
args = parser.parse_args()
if args.quick:
    batch, steps, units, args.calls = 4, 6, 8, 3
else:
    batch, steps, units = 64, 100, 512
device = torch.device(args.device)
if device.type == "cuda" and not torch.cuda.is_available():
    raise SystemExit("no CUDA device: run with --device cpu (and --quick)")

rng = np.random.default_rng(0)
lengths_np = rng.integers(max(1, steps // 5), steps + 1, batch)
lengths_np[0] = steps
mask_np = np.arange(steps)[None, :] < lengths_np[:, None]
x = torch.tensor(
    rng.standard_normal((batch, steps, units)).astype("float32") * mask_np[..., None],
    device=device,
)
lengths = torch.tensor(lengths_np, device=device)
lengths_cpu = torch.tensor(lengths_np)
flag = torch.tensor(~mask_np, dtype=torch.float32, device=device)[..., None]
rows = torch.arange(batch, device=device)
valid = torch.tensor(mask_np, device=device)



def with_states(y, states):
    # Outputs at valid steps, then the final states: what every case returns.
    return [y * valid[..., None]] + list(states)


def build(directions):
    """`{case: (fn(x) -> outputs, params)}` for one direction (`MaskedRNN`)
    or two (`MaskedBidirectional`)."""
    kw = dict(return_sequences=True, return_state=True)
    if directions == 1:
        ours = maskedrnn.MaskedRNN(keras.layers.LSTM(units, **kw))
        plain = keras.layers.LSTM(units, return_sequences=True)
    else:
        ours = maskedrnn.MaskedBidirectional(keras.layers.LSTM(units, **kw))
        plain = keras.layers.Bidirectional(
            keras.layers.LSTM(units, return_sequences=True)
        )
    ours.build((None, None, units))
    plain.build((None, None, units))
    plain.set_weights(ours.get_weights())
    cells = (
        [ours.layer.cell]
        if directions == 1
        else [ours.forward_layer.cell, ours.backward_layer.cell]
    )
    weights = [v.value for v in ours.trainable_variables]
    zeros = torch.zeros((directions, batch, units), device=device)

    def kernel_args(make):
        return [p for cell in cells for p in make(cell)]

    def saturated(x):
        # The backward direction (if any) reads each row's padded tail first,
        # from the zero state, which the flag keeps: c stays 0, h stays 0.
        params = kernel_args(torch_kernels._saturated_lstm_params)
        y, h, c = torch.lstm(
            torch.cat([x, flag], -1), (zeros, zeros), params, True, 1, 0.0,
            torch.is_grad_enabled(), directions == 2, True,
        )
        states = [y[rows, lengths - 1, :units], c[0]]
        if directions == 2:
            states += [h[1], c[1]]
        return with_states(y, states)

    def torch_packed(x):
        params = kernel_args(torch_kernels._plain_params)
        seq = torch.nn.utils.rnn.pack_padded_sequence(
            x, lengths_cpu, batch_first=True, enforce_sorted=False
        )
        data, h, c = torch.lstm(
            seq.data, seq.batch_sizes, (zeros, zeros), params, True, 1, 0.0,
            torch.is_grad_enabled(), directions == 2,
        )
        seq = torch.nn.utils.rnn.PackedSequence(
            data, seq.batch_sizes, seq.sorted_indices, seq.unsorted_indices
        )
        y, _ = torch.nn.utils.rnn.pad_packed_sequence(
            seq, batch_first=True, total_length=steps
        )
        back = seq.unsorted_indices
        return with_states(
            y, [s[d][back] for d in range(directions) for s in (h, c)]
        )

    def maskedrnn_call(x):
        y, *states = ours(x, lengths=lengths)
        return with_states(y, states)

    def keras_unmasked(x):
        y = plain(x)
        return [y] + [y[:, -1, :units]] * (2 * directions)

    plain_weights = [v.value for v in plain.trainable_variables]
    return {
        "keras_unmasked": (keras_unmasked, plain_weights),
        "maskedrnn": (maskedrnn_call, weights),
        "saturated": (saturated, weights),
        "torch_packed": (torch_packed, weights),
    }


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, params, train):
    def step():
        if not train:
            with torch.no_grad():
                return fn(x)
        xl = x.detach().requires_grad_(True)
        loss = sum(t.sum() for t in fn(xl))
        return torch.autograd.grad(loss, [xl] + params)

    for _ in range(5):
        step()
    times = []
    for _ in range(args.calls):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def max_diff(a, b):
    return max(float((p - q).abs().max()) for p, q in zip(a, b))


name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
print(
    f"LSTM with final states, {name}, B={batch} T={steps} D=U={units}, "
    f"right-padded, lengths {lengths_np.min()}-{steps} (mean "
    f"{lengths_np.mean():.1f}), median of {args.calls} calls (ms), torch "
    f"{torch.__version__}"
)
for directions in (1, 2):
    cases = build(directions)
    print(
        "one direction (MaskedRNN)"
        if directions == 1
        else "bidirectional (MaskedBidirectional; saturated: one bidirectional call)"
    )
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        with torch.no_grad():
            oracle = cases["torch_packed"][0](x)
            diffs = {
                n: max_diff(cases[n][0](x), oracle) for n in ("saturated", "maskedrnn")
            }
        print(
            f"  TF32 {'on' if tf32 else 'off'}: max |diff| from torch_packed "
            "(outputs at valid steps, final states): "
            + ", ".join(f"{n} {d:.1e}" for n, d in diffs.items())
        )
        print(f"    {'case':16}{'fwd':>10}{'fwd+bwd':>10}")
        for case, (fn, params) in cases.items():
            fwd, both = timed(fn, params, False), timed(fn, params, True)
            print(f"    {case:16}{fwd:>10.3f}{both:>10.3f}")
