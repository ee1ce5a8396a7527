"""Two LSTM directions in one bidirectional kernel call: exact, but not
faster on a torch CPU. Times it against what `MaskedBidirectional` runs.

On valid-first (right-padded) data an unpacked bidirectional LSTM kernel
reads its backward direction from the last step of the time axis, so each
row's padded tail comes first: `0 0 3 2 1`. With the padding flag of
`maskedrnn.backends.torch_kernels.saturated_lstm` (forget gate 1, input gate 0 at a
padded step) the zero initial state passes the tail unchanged (`c` stays
0, so `h = o * tanh(c)` stays 0), and the backward direction then reads
`3 2 1`: one kernel call gives both directions exactly, with no per-row
reversal, when no initial state is given. `fused` below is that call (one
gather in, one kernel call, one gather out); `layer` is what
`MaskedBidirectional(LSTM)` runs on a torch CPU (one `run_direction` per
direction, each gathering its reading order straight from the caller's
batch). Both are timed interleaved in one process, the whole layer call
(median of 30 rounds, one thread, B=32 T=100 D=U=64, left-padded, the
CPU benchmark's batch), without and with `return_state`, inference and
training (gradients w.r.t. the inputs and every weight), after checking
that both give the same outputs and states, or gradients (largest
difference relative to each tensor's largest value, printed). Output:
docs/results/torch-bidirectional-call.txt.

On a GPU the question is different (Keras' unmasked `Bidirectional` is one
fused cuDNN call there, much faster than two): `scripts/cuda_saturated_lstm.py`
times the same call on cuDNN.

    KERAS_BACKEND=torch python scripts/torch_bidirectional_call.py
"""

import time

import keras
import numpy as np
import torch
from rnn_cpu_batch import left_padded_batch

import maskedrnn
from maskedrnn.backends import torch as torch_backend
from maskedrnn.backends import torch_direction, torch_kernels

ROUNDS = 30


def fused(forward, backward, x, layout, want_states):
    """Both directions in one bidirectional `torch.lstm` call (zero initial
    states), from and back to the caller's order: `(forward outputs,
    backward outputs, forward states, backward states)` as
    `run_direction` gives them (`place="zeros"`)."""
    cell = forward.cell
    units = forward.units
    batch, time_steps = layout.batch, layout.time
    flat = x.reshape(batch * time_steps, x.shape[2])
    data = torch_kernels.with_padding_row(flat)
    data = data.index_select(0, layout.read_index(False))
    data = data.reshape(batch, time_steps, -1)
    params = torch_kernels._params(
        cell, torch_kernels._saturated_lstm_params
    ) + torch_kernels._params(backward.cell, torch_kernels._saturated_lstm_params)
    zeros = x.new_zeros((2, batch, units))
    flags = torch_kernels._flags(cell)[:-1] + (True,)  # bidirectional
    out, h, c = torch.lstm(data, (zeros, zeros), params, *flags, True)
    out = torch_direction.with_zero_row(out.reshape(batch * time_steps, 2 * units))
    y = out.index_select(0, layout.place_index("zeros", False))
    y = y.reshape(batch, time_steps, 2 * units)
    if not want_states:
        return y[..., :units], y[..., units:], [], []
    has_steps = layout.has_steps[:, None]
    fwd_h = out.index_select(0, layout.last_index(False))[:, :units]
    states = [torch.where(has_steps, s, 0.0) for s in (fwd_h, c[0], h[1], c[1])]
    return y[..., :units], y[..., units:], states[:2], states[2:]


def main():
    torch.set_num_threads(1)
    x_np, mask_np, _ = left_padded_batch()
    x, mask = torch.from_numpy(x_np), torch.from_numpy(mask_np)
    print(
        "MaskedBidirectional(LSTM) on torch CPU, 1 thread, B=32 T=100 D=U=64, "
        f"left-padded: the layer's two direction calls vs one fused "
        f"bidirectional call, median of {ROUNDS} interleaved rounds (ms)"
    )
    print(f"{'return_state':13}{'mode':7}{'layer':>9}{'fused':>9}{'fused/layer':>13}")
    original = torch_backend.run_direction
    for return_state in (False, True):
        layer = maskedrnn.MaskedBidirectional(
            keras.layers.LSTM(64, return_sequences=True, return_state=return_state)
        )
        layer(x, mask=mask)
        weights = [v.value for v in layer.trainable_variables]
        calls = {}

        def fused_run_direction(
            way, inner, x, layout, initial_state, reverse, place, want
        ):
            # The layer asks for the forward direction first: run both then.
            if not reverse:
                calls["both"] = fused(
                    layer.forward_layer, layer.backward_layer, x, layout, want
                )
                y_fwd, _, s_fwd, _ = calls["both"]
                return y_fwd, s_fwd
            _, y_bwd, _, s_bwd = calls.pop("both")
            return y_bwd, s_bwd

        def call(way, train):
            torch_backend.run_direction = (
                fused_run_direction if way == "fused" else original
            )
            try:
                if not train:
                    with torch.no_grad():
                        return layer(x, mask=mask)
                xl = x.clone().requires_grad_(True)
                out = layer(xl, mask=mask)
                out = out if isinstance(out, (list, tuple)) else [out]
                return torch.autograd.grad(sum(o.sum() for o in out), [xl] + weights)
            finally:
                torch_backend.run_direction = original

        for train in (False, True):
            a, b = call("layer", train), call("fused", train)
            a = a if isinstance(a, (list, tuple)) else [a]
            b = b if isinstance(b, (list, tuple)) else [b]
            # Relative to each tensor's largest value (weight gradients of
            # a sum over 3200 steps reach 1e3).
            diff = max(
                float((p - q).abs().max() / p.abs().max().clamp(min=1))
                for p, q in zip(a, b)
            )
            assert diff < 1e-5, diff
            times = {"layer": [], "fused": []}
            for _ in range(ROUNDS):
                for way in times:
                    call(way, train)
                    start = time.perf_counter()
                    call(way, train)
                    times[way].append((time.perf_counter() - start) * 1e3)
            layer_ms, fused_ms = (float(np.median(times[w])) for w in times)
            mode = "train" if train else "infer"
            print(
                f"{str(return_state):13}{mode:7}{layer_ms:>9.2f}{fused_ms:>9.2f}"
                f"{fused_ms / layer_ms:>13.2f}   (max relative |diff| {diff:.1e})"
            )


if __name__ == "__main__":
    main()
