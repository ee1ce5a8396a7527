"""Would one cuDNN call with `seq_lengths` serve the masked layers on a JAX
GPU? A probe for the GPU check.

On a JAX GPU the layers run Keras' unmasked cuDNN LSTM per direction (two
calls for `MaskedBidirectional`, around per-row reversals) and, with
`return_state=True`, recompute the cell state from the outputs
(`maskedrnn.layers.final_state`). Keras' own unmasked `Bidirectional` is a
single fused call, `jax.experimental.rnn.lstm(..., bidirectional=True)`,
with `seq_lengths` set to the full length. That function takes per-row
`seq_lengths`: on right-padded (valid-first) data cuDNN then runs each row
to its own length, reads the backward direction from each row's own last
step, and returns each row's final `h` and `c`. If that is exact and as
fast as the unmasked call, one such call could replace both directions,
their reversals and the recomputation. This script measures, jitted,
forward and forward+backward (gradients w.r.t. the inputs and every
weight), the LSTM with final states, bidirectional and one direction:

- `keras_unmasked`: Keras' layer without a mask (cuDNN, fused
  bidirectional): the bar, wrong over the padding;
- `maskedrnn`: `MaskedBidirectional` / `MaskedRNN` with `lengths=`, as
  they run here now;
- `cudnn_seq_lengths`: `jax.experimental.rnn.lstm` with the rows' lengths,
  the weights moved as Keras' JAX backend moves them;
- `keras_masked`: Keras' layer with the mask (`use_cudnn=False`, its step
  loop): the exact oracle, timed too.

and each one's largest difference from `keras_masked` (outputs at valid
steps, final states). It also tries a row of length 0 (the layers return
the initial state for it; what does cuDNN do?). Median of `--calls` calls
after 3 warm-up calls (the first compiles), synchronized.

    KERAS_BACKEND=jax python benchmarks/jax_cudnn_seq_lengths.py             # GPU
    KERAS_BACKEND=jax python benchmarks/jax_cudnn_seq_lengths.py --quick --ref

`--ref` calls `jax.experimental.rnn.lstm_ref` (JAX's reference for the cuDNN
call's semantics, a `lax.scan`) instead of `lstm`, which needs a GPU: for
checking the script on a CPU. Sizes: the GPU figures' B=64 T=100 D=U=512,
lengths uniform in [20, 100] (`--quick`: B=4 T=6 D=U=8, 3 calls).
"""

import argparse
import time

import keras
import numpy as np

import maskedrnn

if keras.backend.backend() != "jax":
    raise SystemExit("run with KERAS_BACKEND=jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import rnn  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--calls", type=int, default=30)
parser.add_argument("--quick", action="store_true")
parser.add_argument("--ref", action="store_true", help="lstm_ref, not cuDNN")
args = parser.parse_args()
if args.quick:
    batch, steps, units, args.calls = 4, 6, 8, 3
else:
    batch, steps, units = 64, 100, 512

rng = np.random.default_rng(0)
lengths_np = rng.integers(max(1, steps // 5), steps + 1, batch).astype("int32")
lengths_np[0] = steps
valid_np = np.arange(steps)[None, :] < lengths_np[:, None]
x = jnp.asarray(
    rng.standard_normal((batch, steps, units)).astype("float32") * valid_np[..., None]
)
lengths = jnp.asarray(lengths_np)
valid = jnp.asarray(valid_np)


def cudnn_lstm(x, h0, c0, weights, seq_lengths, bidirectional):
    kw = dict(input_size=units, hidden_size=units, num_layers=1, dropout=0.0)
    if not args.ref:
        return rnn.lstm(
            x, h0, c0, weights, seq_lengths, bidirectional=bidirectional, **kw
        )
    w_ih, w_hh, b_ih, b_hh = rnn.unpack_lstm_weights(
        weights, units, units, 1, bidirectional
    )
    return rnn.lstm_ref(
        x, h0, c0, w_ih, w_hh, b_ih, b_hh, seq_lengths,
        bidirectional=bidirectional, **kw,
    )


def flat_weights(cells):
    """Keras LSTM cells' weights in the flat cuDNN blob, as Keras' JAX
    backend builds it (`bidirectional_lstm` in keras/src/backend/jax/rnn.py):
    every direction's `W_ih` `(4U, D)` and `W_hh` `(4U, U)` (Keras' kernels
    transposed; gate order i, f, g, o is Keras' i, f, c, o), then every
    direction's `b_ih` (Keras' bias) and `b_hh` (zeros)."""
    matrices = [
        jnp.concatenate([kernel.T.ravel(), recurrent.T.ravel()])
        for kernel, recurrent, _ in cells
    ]
    biases = [
        jnp.concatenate([bias, jnp.zeros_like(bias)]) for _, _, bias in cells
    ]
    return jnp.concatenate(matrices + biases)


def case_functions(bidirectional):
    """`{name: (fn(params, x) -> [outputs at valid steps, *states], params)}`."""
    inner = keras.layers.LSTM(units, return_sequences=True, return_state=True)
    oracle_inner = keras.layers.LSTM(
        units, return_sequences=True, return_state=True, use_cudnn=False
    )
    plain_inner = keras.layers.LSTM(units, return_sequences=True)
    if bidirectional:
        ours = maskedrnn.MaskedBidirectional(inner)
        oracle = keras.layers.Bidirectional(oracle_inner)
        plain = keras.layers.Bidirectional(plain_inner)
        directions = [ours.forward_layer, ours.backward_layer]
    else:
        ours, oracle, plain = maskedrnn.MaskedRNN(inner), oracle_inner, plain_inner
        directions = [ours.layer]
    for layer in (ours, oracle, plain):
        layer.build((None, None, units))
    oracle.set_weights(ours.get_weights())
    plain.set_weights(ours.get_weights())
    variables = list(ours.trainable_variables)
    # Where each direction's kernel, recurrent kernel and bias sit in params.
    slots = [
        [
            next(i for i, v in enumerate(variables) if v is w)
            for w in (d.cell.kernel, d.cell.recurrent_kernel, d.cell.bias)
        ]
        for d in directions
    ]
    n = len(directions)

    def keras_fn(layer, **kwargs):
        frozen = [v.value for v in layer.non_trainable_variables]

        def fn(params, x):
            out, _ = layer.stateless_call(params, frozen, x, **kwargs)
            y, *states = out if isinstance(out, (list, tuple)) else [out]
            return [y * valid[..., None]] + list(states)

        return fn, [v.value for v in layer.trainable_variables]

    def seq_fn(params, x):
        cells = [[params[i] for i in slot] for slot in slots]
        zeros = jnp.zeros((n, batch, units), x.dtype)
        y, h, c = cudnn_lstm(x, zeros, zeros, flat_weights(cells), lengths, n == 2)
        states = [s for d in range(n) for s in (h[d], c[d])]
        return [y * valid[..., None]] + states

    plain_frozen = [v.value for v in plain.non_trainable_variables]

    def plain_fn(params, x):
        y, _ = plain.stateless_call(params, plain_frozen, x)
        # No states: its outputs stand in for them (wrong, a ceiling).
        return [y] + [y[:, -1, :units]] * (2 * n)

    return {
        "keras_unmasked": (plain_fn, [v.value for v in plain.trainable_variables]),
        "maskedrnn": keras_fn(ours, lengths=lengths),
        "cudnn_seq_lengths": (seq_fn, [v.value for v in variables]),
        "keras_masked": keras_fn(oracle, mask=valid),
    }


def timed(fn, params, train):
    if train:
        weights = [jnp.ones_like(t) for t in fn(params, x)]

        def loss(params, x):
            return sum(jnp.sum(t * w) for t, w in zip(fn(params, x), weights))

        step = jax.jit(jax.grad(loss, argnums=(0, 1)))
    else:
        step = jax.jit(fn)
    for _ in range(3):
        jax.block_until_ready(step(params, x))
    times = []
    for _ in range(args.calls):
        start = time.perf_counter()
        jax.block_until_ready(step(params, x))
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def max_diff(a, b):
    return max(float(jnp.max(jnp.abs(p - q))) for p, q in zip(a, b))


device = jax.devices()[0]
print(
    f"LSTM with final states, {device.platform}: {device.device_kind}, "
    f"jax {jax.__version__}, B={batch} T={steps} D=U={units}, right-padded, "
    f"lengths {lengths_np.min()}-{steps} (mean {lengths_np.mean():.1f}), "
    f"median of {args.calls} calls (ms)"
    + (", lstm_ref instead of cuDNN (--ref)" if args.ref else "")
)
for bidirectional in (True, False):
    cases = case_functions(bidirectional)
    oracle = cases["keras_masked"][0](cases["keras_masked"][1], x)
    print("bidirectional" if bidirectional else "one direction (MaskedRNN)")
    print(f"  {'case':20}{'fwd':>10}{'fwd+bwd':>10}   max |diff| from keras_masked")
    for name, (fn, params) in cases.items():
        diff = max_diff(fn(params, x), oracle)
        note = " (no mask: wrong)" if name == "keras_unmasked" else ""
        fwd, both = timed(fn, params, False), timed(fn, params, True)
        print(f"  {name:20}{fwd:>10.3f}{both:>10.3f}   {diff:.1e}{note}")
    fn, params = cases["cudnn_seq_lengths"]
    try:
        lengths = lengths.at[-1].set(0)
        out = fn(params, x)
        jax.block_until_ready(out)
        print(
            "  a row of length 0: no error; its final states "
            + ", ".join(f"{float(jnp.max(jnp.abs(s[-1]))):.2e}" for s in out[1:])
            + " (max |.|; the layers return the initial state, zeros here)"
        )
    except Exception as error:  # a probe: report what cuDNN says, go on
        print(f"  a row of length 0: {type(error).__name__}: {str(error)[:300]}")
    lengths = jnp.asarray(lengths_np)
