"""A GRU direction on torch CPU, the ways MaskedRNN could run it (one thread,
the CPU benchmark's MaskedRNN batch: B=32 T=100 D=U=64, lengths uniform in
[20, 100], already valid-first and zero-padded as the layer's kernel gets it).

Training, fwd+bwd (the gradients of `sum(y * w)` w.r.t. the inputs, the
initial state and the four weights):

- `torch.gru unpacked`: PyTorch's kernel over every step, its backward pass
  autograd's replay of the recorded per-step ops (what ours ran before
  `GRUFunction`);
- `torch.gru packed`: the kernel on the packed valid steps (`batch_sizes`),
  as `nn.GRU` on a `PackedSequence`;
- `GRUFunction`: `maskedrnn.backends.torch_kernels.GRUFunction`, what ours runs now.

Inference (forward, `torch.no_grad()`):

- `torch.gru packed`: what ours runs;
- `torch.gru unpacked`;
- `GRUFunction forward`: its forward pass (a Python loop over all steps);
- `python packed loop`: the same per-step torch ops over the packed valid
  steps only (rows sorted by length, fewer rows each step): the best a
  Python loop could do in inference.

Then training at other sizes (full-length rows of random data, fwd+bwd
w.r.t. the inputs and the weights): `torch.gru` unpacked against
`GRUFunction`, the better of two medians of 15 calls each: is
`GRUFunction` the faster one everywhere, not only at the benchmark's size?

Each case's median of 100 rounds (every case once a round, in order) after
5 warm-up calls, and the largest difference of its outputs from
`torch.gru packed` at the valid steps (and, in training, of its gradients
from `torch.gru unpacked`'s over the same zero-padded data: equal by
construction of the padding, which is zero and never reaches a valid step's
output in valid-first order).

    python scripts/torch_gru_paths.py > docs/results/torch-gru-paths.txt
"""


import numpy as np
import torch
from rnn_cpu_batch import BATCH as batch
from rnn_cpu_batch import FEATURES as features
from rnn_cpu_batch import (
    OTHER_SIZES,
    best_of_two,
    interleaved_medians,
    max_diff,
    valid_first_batch,
)
from rnn_cpu_batch import TIME as time_steps
from rnn_cpu_batch import UNITS as units

from maskedrnn.backends import torch_kernels

torch.set_num_threads(1)
x, valid, lengths = valid_first_batch()
x, valid = torch.from_numpy(x), torch.from_numpy(valid)
torch.manual_seed(0)
module = torch.nn.GRU(features, units, batch_first=True)
params = list(module.parameters())  # weight_ih, weight_hh, bias_ih, bias_hh
h0 = torch.zeros(batch, units)
w = np.random.default_rng(1).standard_normal((batch, time_steps, units))
w = torch.from_numpy(w).float() * valid[..., None]
lengths_t = torch.as_tensor(lengths)
# Packed layout of the valid steps: rows by decreasing length, time-major.
by_length = torch.argsort(lengths_t, descending=True, stable=True)
batch_sizes = torch.tensor(
    [(lengths > t).sum() for t in range(int(lengths.max()))], dtype=torch.int64
)
steps = [(t, int(b)) for t, b in enumerate(batch_sizes)]


def packed_data(x):
    """`(sum(lengths), features)`: step t's rows of x (by decreasing length)."""
    xs = x[by_length]
    return torch.cat([xs[:b, t] for t, b in steps])


def unpacked_to_padded(data, width):
    """The inverse of `packed_data`: `(batch, time, width)`, zeros after each
    row's length, rows in the caller's order."""
    out = data.new_zeros(batch, time_steps, width)
    offset = 0
    for t, b in steps:
        out[by_length[:b], t] = data[offset : offset + b]
        offset += b
    return out


def gru_unpacked(x, h0, *p):
    return torch.gru(x, h0[None], p, True, 1, 0.0, False, False, True)[0]


def gru_packed(x, h0, *p):
    data = packed_data(x)
    # The packed kernel's hx rows are in the packed (by length) order.
    hx = h0[by_length][None]
    out = torch.gru(data, batch_sizes, hx, p, True, 1, 0.0, False, False)[0]
    return unpacked_to_padded(out, units)


def python_packed_loop(x, h0, w_ih, w_hh, b_ih, b_hh):
    """GRUFunction's per-step ops over the packed valid steps only."""
    data = packed_data(x)
    gi = torch.addmm(b_ih, data, w_ih.t())
    w_hh_t = w_hh.t()
    y = data.new_empty(data.shape[0], units)
    h = h0[by_length].clone()
    gh_full = data.new_empty(batch, 3 * units)
    offset = 0
    for _, b in steps:
        g, gh, hb = gi[offset : offset + b], gh_full[:b], h[:b]
        torch.addmm(b_hh, hb, w_hh_t, out=gh)
        rz = g[:, : 2 * units]
        rz.add_(gh[:, : 2 * units]).sigmoid_()
        n = g[:, 2 * units :]
        n.addcmul_(rz[:, :units], gh[:, 2 * units :]).tanh_()
        torch.lerp(n, hb, rz[:, units:], out=y[offset : offset + b])
        hb.copy_(y[offset : offset + b])
        offset += b
    return unpacked_to_padded(y, units)


def train(fn):
    def step():
        xl = x.detach().requires_grad_(True)
        hl = h0.detach().requires_grad_(True)
        y = fn(xl, hl, *params)
        grads = torch.autograd.grad((y * w).sum(), [xl, hl, *params])
        return y, grads

    return step


def infer(fn):
    def step():
        with torch.no_grad():
            return fn(x, h0, *params), ()

    return step


train_cases = {
    "torch.gru unpacked": train(gru_unpacked),
    "torch.gru packed": train(gru_packed),
    "GRUFunction": train(torch_kernels.GRUFunction.apply),
}
infer_cases = {
    "torch.gru packed": infer(gru_packed),
    "torch.gru unpacked": infer(gru_unpacked),
    "GRUFunction forward": infer(torch_kernels.GRUFunction.apply),
    "python packed loop": infer(python_packed_loop),
}


def report(title, cases, reference, grads_reference=None):
    ms = interleaved_medians(cases, 100, warmup=5)
    ref_y, ref_grads = cases[reference]()
    base = ms[reference]
    print(title)
    head = f"{'case':22s} {'median ms':>9s} {'÷ ' + reference:>22s} {'max|d y|':>9s}"
    print(head, end="")
    print(f" {'max|d grads|':>12s}" if grads_reference else "")
    if grads_reference:
        _, ref_grads = cases[grads_reference]()
    for name, fn in cases.items():
        y, grads = fn()
        line = f"{name:22s} {ms[name]:9.3f} {ms[name] / base:22.2f} "
        line += f"{max_diff(y * valid[..., None], ref_y * valid[..., None]):9.1e}"
        if grads_reference:
            line += f" {max(max_diff(g, r) for g, r in zip(grads, ref_grads)):12.1e}"
        print(line)
    print()


print(
    "A GRU direction on torch CPU, 1 thread, B=32 T=100 D=U=64, "
    f"lengths uniform in [20, 100] (mean {lengths.mean():.1f}), valid-first, "
    f"torch {torch.__version__}; median of 100 interleaved rounds (ms)\n"
)
report("training, fwd+bwd", train_cases, "torch.gru unpacked", "torch.gru unpacked")
report("inference, forward", infer_cases, "torch.gru packed")

print("training, fwd+bwd, other sizes (full rows)")
print(f"{'B':>4s} {'T':>4s} {'D':>4s} {'U':>4s} {'torch.gru ms':>12s} "
      f"{'GRUFunction ms':>14s} {'ratio':>6s}")
for b, t, d, u in OTHER_SIZES:
    torch.manual_seed(0)
    weights = list(torch.nn.GRU(d, u, batch_first=True).parameters())
    xs, hs, ws = torch.randn(b, t, d), torch.zeros(b, u), torch.randn(b, t, u)

    def sized(fn, xs=xs, hs=hs, ws=ws, weights=weights):
        def step():
            xl = xs.detach().requires_grad_(True)
            y = fn(xl, hs, *weights)
            return torch.autograd.grad((y * ws).sum(), [xl, *weights])

        return step

    theirs = best_of_two({"kernel": sized(gru_unpacked)})["kernel"]
    ours = best_of_two({"ours": sized(torch_kernels.GRUFunction.apply)})["ours"]
    print(f"{b:4d} {t:4d} {d:4d} {u:4d} {theirs:12.2f} {ours:14.2f} "
          f"{ours / theirs:6.2f}")
