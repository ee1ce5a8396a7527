"""Four exact ways to get an LSTM's final `[h, c]` on a masked batch with
PyTorch's CPU kernels, timed against each other (issue 11: "find a cheaper
exact way ... or show with a profile why none exists").

One direction of `MaskedRNN(LSTM(return_sequences=True, return_state=True))`
on the torch backend, CPU, one thread, through
`maskedrnn.backends.torch_direction.run_direction` (what the layer calls):

- `packed`: PyTorch's packed kernel (`torch.lstm` with `batch_sizes`): only
  the valid steps run, final states exact (`run_direction(packed=True)`).
  What the layer ran in inference before `saturated`.
- `recompute`: the unpacked kernel over the zero-padded valid-first data
  (PyTorch's fused oneDNN LSTM), `h` read at each row's length and `c`
  recomputed from the outputs (`final_state.lstm_cell_state_at_length`).
  What the layer ran in training before `saturated`; what the layers still
  do where a GPU's cuDNN runs the LSTM. Defined here from the package's
  parts.
- `chunked`: the packed layout run as a series of unpacked (oneDNN) kernel
  calls, one per run of steps with the same number of active rows (one per
  distinct length): the finished rows leave between calls, so their states
  are exact. Not in the package; defined here.
- `saturated`: the unpacked kernel over the valid-first data with one input
  feature more, a padding flag whose weights pin the forget gate to 1 and
  the input gate to 0 at padded steps, so the kernel's own final `c` is
  each row's (`torch_kernels.saturated_lstm`; `run_direction(packed=False)`).
  What the layers run now, in inference and training.

Each path is timed on fresh batches (new lengths every call, as in real
use: oneDNN makes a new primitive for each new shape) and on one batch
repeated (the benchmark's setting, where oneDNN's primitive cache is always
hit), inference (`torch.no_grad()`) and training (gradients of the sum of
outputs and states w.r.t. the inputs and every weight). Medians in ms; the
largest difference of `chunked` from `packed` (outputs and states) is
printed too, and that of `saturated` and of `recompute`. Output:
docs/results/torch-lstm-state-paths.txt.

    KERAS_BACKEND=torch python scripts/torch_lstm_state_paths.py
"""

import contextlib
import time

import keras
import numpy as np
import torch

import maskedrnn
from maskedrnn.backends import torch_direction, torch_kernels
from maskedrnn.layers import final_state

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
    kernel = torch_kernels._kernel

    def patched(inner, hx):
        params, _, hx = kernel(inner, hx)
        return params, chunked_lstm, hx

    torch_kernels._kernel = patched
    try:
        yield
    finally:
        torch_kernels._kernel = kernel


def recompute_direction(inner, x, layout):
    """`run_direction(place="held_zeros", packed=False)` with `c` recomputed
    from the outputs (`final_state.lstm_cell_state_at_length`) instead of
    read off the saturated kernel: the way the layers took before."""
    batch, time, features = x.shape
    units = inner.units
    index = layout.read_index(False)
    data = torch_direction.with_zero_row(x.reshape(batch * time, features))
    data = data.index_select(0, index).reshape(batch, time, features)
    h0 = c0 = x.new_zeros((batch, units))
    out = torch_kernels._unpacked(inner, data, [h0, c0])
    c = final_state.lstm_cell_state_at_length(
        inner.cell, data, out, h0, c0, layout.lengths
    )
    flat = torch_direction.with_zero_row(out.reshape(batch * time, units))
    has_steps = layout.has_steps[:, None]
    h = torch.where(has_steps, flat.index_select(0, layout.last_index(False)), h0)
    c = torch.where(has_steps, c, c0)
    y = flat.index_select(0, layout.place_index("held_zeros", False))
    return y.reshape(batch, time, units), [h, c]


def batches(rng, batch, time_steps, features, low, count):
    out = []
    for _ in range(count):
        lengths = rng.integers(int(np.ceil(low * time_steps)), time_steps + 1, batch)
        mask = np.arange(time_steps)[None, :] >= (time_steps - lengths)[:, None]
        x = rng.standard_normal((batch, time_steps, features)).astype("float32")
        out.append((torch.from_numpy(x * mask[..., None]), torch.from_numpy(mask)))
    return out


WAYS = ("packed", "chunked", "recompute", "saturated")


def main():
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print(
        "LSTM final [h, c] on PyTorch's CPU kernels, 1 thread, left-padded, "
        f"median of {CALLS} calls (ms); fresh: new lengths each call; "
        "repeated: one batch"
    )
    header = f"{'B':>4} {'T':>4} {'D=U':>4} {'chunks':>6}  {'mode':5} {'batches':8}"
    print(header + "".join(f"{p:>11}" for p in WAYS))
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

        def direction(x, mask, way):
            layout = torch_direction.Layout(mask)
            if way in ("packed", "chunked"):
                chunks.append(int(torch.unique(layout.batch_sizes).numel()))
            if way == "recompute":
                return recompute_direction(inner, x, layout)
            with chunked_kernel() if way == "chunked" else contextlib.nullcontext():
                return torch_direction.run_direction(
                    inner, x, None, layout, place="held_zeros",
                    packed=way in ("packed", "chunked"),
                )

        def call(x, mask, way, train):
            if not train:
                with torch.no_grad():
                    return direction(x, mask, way)
            x = x.detach().requires_grad_(True)
            y, states = direction(x, mask, way)
            loss = y.sum() + sum(s.sum() for s in states)
            return torch.autograd.grad(loss, [x] + weights)

        def timed(data, way, train):
            times = []
            call(*data[0], way, train)  # warm-up
            for x, mask in data:
                start = time.perf_counter()
                call(x, mask, way, train)
                times.append((time.perf_counter() - start) * 1e3)
            return float(np.median(times))

        x, mask = fresh[0]
        results = {}
        with torch.no_grad():
            for way in WAYS:
                y, states = call(x, mask, way, False)
                results[way] = [y] + states
        for train in (False, True):
            for name, data in (("fresh", fresh), ("repeated", repeated)):
                chunks.clear()
                row = [timed(data, way, train) for way in WAYS]
                mode = "train" if train else "infer"
                n = int(np.median(chunks))
                print(
                    f"{batch:>4} {time_steps:>4} {units:>4} {n:>6}  {mode:5} {name:8}"
                    + "".join(f"{t:>11.2f}" for t in row)
                )
        for way in WAYS[1:]:
            diff = max(
                float((a - b).abs().max())
                for a, b in zip(results["packed"], results[way])
            )
            print(f"     {way} - packed, outputs and states: max |diff| {diff:.1e}")


if __name__ == "__main__":
    main()
