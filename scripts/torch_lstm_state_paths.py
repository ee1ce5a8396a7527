"""Three exact ways to get an LSTM's final `[h, c]` on a masked batch with
PyTorch's CPU kernels, timed against each other (issue 11: "find a cheaper
exact way ... or show with a profile why none exists").

One direction of `MaskedRNN(LSTM(return_sequences=True, return_state=True))`
on the torch backend, CPU, one thread, through
`maskedrnn._torch_kernels.run_direction` (what the layer calls):

- `packed`: PyTorch's packed kernel (`torch.lstm` with `batch_sizes`): only
  the valid steps run, final states exact. What the layer runs in inference.
- `recompute`: the unpacked kernel over the zero-padded valid-first data
  (PyTorch's fused oneDNN LSTM), `h` read at each row's length and `c`
  recomputed from the outputs (`final_state.lstm_cell_state_at_length`).
  What the layer runs in training.
- `chunked`: the packed layout run as a series of unpacked (oneDNN) kernel
  calls, one per run of steps with the same number of active rows (one per
  distinct length): the finished rows leave between calls, so their states
  are exact. Not in the package; defined here.

Each path is timed on fresh batches (new lengths every call, as in real
use: oneDNN makes a new primitive for each new shape) and on one batch
repeated (the benchmark's setting, where oneDNN's primitive cache is always
hit), inference (`torch.no_grad()`) and training (gradients of the sum of
outputs and states w.r.t. the inputs and every weight). Medians in ms; the
largest difference of `chunked` from `packed` (outputs and states) is
printed too. Output: docs/results/torch-lstm-state-paths.txt.

    KERAS_BACKEND=torch python scripts/torch_lstm_state_paths.py
"""

import contextlib
import time

import keras
import numpy as np
import torch

import maskedrnn
from maskedrnn import _torch_kernels

# (batch, time, features = units, shortest length as a fraction of time).
SIZES = [
    (16, 50, 32, 0.2),
    (32, 100, 64, 0.2),
    (128, 100, 64, 0.01),
    (64, 200, 128, 0.5),
]
CALLS = 30


def chunked_lstm(data, batch_sizes, hx, params, has_biases, layers, dropout, train, bi):
    """`torch.lstm`'s packed form computed by its unpacked form: one call per
    run of steps with the same batch size (rows sorted by decreasing length,
    so the rows that finish are the last ones of the previous run)."""
    sizes = batch_sizes.tolist()
    starts = [0] + [k for k in range(1, len(sizes)) if sizes[k] != sizes[k - 1]]
    bounds = list(zip(starts, starts[1:] + [len(sizes)]))
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    h, c = hx[0][0], hx[1][0]
    outputs, finished = [], []
    for start, stop in bounds:
        rows = sizes[start]
        if rows < h.shape[0]:
            finished.append((h[rows:], c[rows:]))
            h, c = h[:rows], c[:rows]
        run = data[offsets[start] : offsets[stop]].view(stop - start, rows, -1)
        hx = [h[None], c[None]]
        # Unpacked form, time-major (batch_first=False): run is (steps, rows, D).
        flags = (has_biases, layers, dropout, train, bi, False)
        y, h, c = torch.lstm(run, hx, params, *flags)
        h, c = h[0], c[0]
        outputs.append(y.reshape(-1, y.shape[-1]))
    finished.append((h, c))
    finished.reverse()
    h_n = torch.cat([f[0] for f in finished])[None]
    c_n = torch.cat([f[1] for f in finished])[None]
    return torch.cat(outputs), h_n, c_n


@contextlib.contextmanager
def chunked_kernel():
    kernel = _torch_kernels._kernel

    def patched(inner, hx):
        params, _, hx = kernel(inner, hx)
        return params, chunked_lstm, hx

    _torch_kernels._kernel = patched
    try:
        yield
    finally:
        _torch_kernels._kernel = kernel


def batches(rng, batch, time_steps, features, low, count):
    out = []
    for _ in range(count):
        lengths = rng.integers(int(np.ceil(low * time_steps)), time_steps + 1, batch)
        mask = np.arange(time_steps)[None, :] >= (time_steps - lengths)[:, None]
        x = rng.standard_normal((batch, time_steps, features)).astype("float32")
        out.append((torch.from_numpy(x * mask[..., None]), torch.from_numpy(mask)))
    return out


def main():
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print(
        "LSTM final [h, c] on PyTorch's CPU kernels, 1 thread, left-padded, "
        f"median of {CALLS} calls (ms); fresh: new lengths each call; "
        "repeated: one batch"
    )
    header = f"{'B':>4} {'T':>4} {'D=U':>4} {'chunks':>6}  {'mode':5} {'batches':8}"
    print(header + "".join(f"{p:>11}" for p in ("packed", "chunked", "recompute")))
    for batch, time_steps, units, low in SIZES:
        layer = maskedrnn.MaskedRNN(
            keras.layers.LSTM(units, return_sequences=True, return_state=True)
        )
        layer.build((None, None, units))
        inner = layer.layer
        weights = [v.value for v in layer.trainable_variables]
        fresh = batches(rng, batch, time_steps, units, low, CALLS)
        repeated = fresh[:1] * CALLS
        chunks = []

        def call(x, mask, packed, train):
            layout = _torch_kernels.Layout(mask)
            if packed:
                chunks.append(int(torch.unique(layout.batch_sizes).numel()))
            if not train:
                with torch.no_grad():
                    return _torch_kernels.run_direction(
                        inner, x, None, layout, place="held_zeros", packed=packed
                    )
            x = x.detach().requires_grad_(True)
            y, states = _torch_kernels.run_direction(
                inner, x, None, layout, place="held_zeros", packed=packed
            )
            loss = y.sum() + sum(s.sum() for s in states)
            return torch.autograd.grad(loss, [x] + weights)

        def timed(data, packed, train, chunk=False):
            times = []
            with chunked_kernel() if chunk else contextlib.nullcontext():
                call(*data[0], packed, train)  # warm-up
                for x, mask in data:
                    start = time.perf_counter()
                    call(x, mask, packed, train)
                    times.append((time.perf_counter() - start) * 1e3)
            return float(np.median(times))

        x, mask = fresh[0]
        with torch.no_grad():
            y_p, s_p = call(x, mask, True, False)
            with chunked_kernel():
                y_c, s_c = call(x, mask, True, False)
        diff = max(float((a - b).abs().max()) for a, b in zip([y_p] + s_p, [y_c] + s_c))
        for train in (False, True):
            for name, data in (("fresh", fresh), ("repeated", repeated)):
                chunks.clear()
                row = [
                    timed(data, True, train),
                    timed(data, True, train, chunk=True),
                    timed(data, False, train),
                ]
                mode = "train" if train else "infer"
                n = int(np.median(chunks))
                print(
                    f"{batch:>4} {time_steps:>4} {units:>4} {n:>6}  {mode:5} {name:8}"
                    + "".join(f"{t:>11.2f}" for t in row)
                )
        print(f"     chunked - packed, outputs and states: max |diff| {diff:.1e}")


if __name__ == "__main__":
    main()
