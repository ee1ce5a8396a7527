"""A SimpleRNN direction's training on torch CPU: PyTorch's kernel
(`torch.rnn_tanh` / `torch.rnn_relu`, its backward pass autograd's replay of
the recorded per-step ops) against `maskedrnn.backends.torch_kernels.SimpleRNNFunction`
(what a masked SimpleRNN runs while gradients are recorded), one thread.

First on the CPU benchmark's MaskedRNN batch (B=32 T=100 D=U=64, lengths
uniform in [20, 100], valid-first and zero-padded, as the layer's kernel gets
it): median of 100 interleaved rounds after 5 warm-up calls, fwd+bwd of
`sum(y * w)` w.r.t. the inputs, the initial state and the four weights, and
the largest differences from PyTorch's outputs and gradients. Then at other
sizes (full rows of random data, the better of two medians of 15 calls).

    python scripts/torch_rnn_paths.py > docs/results/torch-rnn-paths.txt
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
w = np.random.default_rng(1).standard_normal((batch, time_steps, units))
w = torch.from_numpy(w).float() * valid[..., None]
h0 = torch.zeros(batch, units)


def kernel(relu):
    fn = torch.rnn_relu if relu else torch.rnn_tanh

    def run(x, h0, *params):
        return fn(x, h0[None], params, True, 1, 0.0, True, False, True)[0]

    return run


def function(relu):
    def run(x, h0, *params):
        return torch_kernels.SimpleRNNFunction.apply(x, h0, *params, relu)

    return run


def train(fn, x, h0, w, params):
    def step():
        xl = x.detach().requires_grad_(True)
        hl = h0.detach().requires_grad_(True)
        y = fn(xl, hl, *params)
        return y, torch.autograd.grad((y * w).sum(), [xl, hl, *params])

    return step


print(
    "SimpleRNN training (fwd+bwd) on torch CPU, 1 thread, torch "
    f"{torch.__version__}\n"
)
print(
    "B=32 T=100 D=U=64, lengths uniform in [20, 100] (mean "
    f"{lengths.mean():.1f}), valid-first; median of 100 interleaved rounds (ms)"
)
print(f"{'activation':10s} {'kernel':>8s} {'Function':>9s} {'ratio':>6s} "
      f"{'max|d y|':>9s} {'max|d grads|':>12s}")
for relu in (False, True):
    torch.manual_seed(0)
    module = torch.nn.RNN(
        features, units, batch_first=True, nonlinearity="relu" if relu else "tanh"
    )
    params = list(module.parameters())
    theirs = train(kernel(relu), x, h0, w, params)
    ours = train(function(relu), x, h0, w, params)
    ms = interleaved_medians({"kernel": theirs, "ours": ours}, 100, warmup=5)
    t_theirs, t_ours = ms["kernel"], ms["ours"]
    (y1, g1), (y2, g2) = theirs(), ours()
    d_grads = max(max_diff(a, b) for a, b in zip(g1, g2))
    print(f"{'relu' if relu else 'tanh':10s} {t_theirs:8.3f} {t_ours:9.3f} "
          f"{t_ours / t_theirs:6.2f} {max_diff(y1, y2):9.1e} {d_grads:12.1e}")

print("\nother sizes, tanh, full rows: the better of two medians of 15 calls (ms)")
print(f"{'B':>4s} {'T':>4s} {'D':>4s} {'U':>4s} {'kernel':>8s} {'Function':>9s} "
      f"{'ratio':>6s}")
for b, t, d, u in OTHER_SIZES:
    torch.manual_seed(0)
    params = list(torch.nn.RNN(d, u, batch_first=True).parameters())
    xs, hs, ws = torch.randn(b, t, d), torch.zeros(b, u), torch.randn(b, t, u)
    theirs = train(kernel(False), xs, hs, ws, params)
    ours = train(function(False), xs, hs, ws, params)
    best = best_of_two({"kernel": theirs, "ours": ours})
    print(f"{b:4d} {t:4d} {d:4d} {u:4d} {best['kernel']:8.2f} {best['ours']:9.2f} "
          f"{best['ours'] / best['kernel']:6.2f}")
