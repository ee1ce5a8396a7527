"""Could MaskedRNN's JAX CPU path beat Keras' masked layer with a scan of its
own? One direction on JAX CPU, one XLA thread, jitted, full-length rows of
random data (the cost of a scan does not depend on the padding: ours runs
valid-first data unmasked, Keras masked the same loop with a `where` per
step).

Cases, for an LSTM and a GRU of `U` units:

- `keras loop`: Keras' generic step loop (`backend.rnn` over the cell's
  `call`, the layer with `use_cudnn=False`): what Keras' masked layer runs
  on a JAX CPU, and, with the mask, what ours runs there
  (`maskedrnn.backends.jax.cpu_why`);
- `keras backend.gru` (GRU only): Keras' unmasked JAX GRU kernel (the input
  projections of all steps in one matmul, then a `lax.scan`), which a JAX
  GPU runs (JAX has no cuDNN GRU) and ours avoids on a JAX CPU;
- `own scan`: the same equations written as one projection-first scan: the
  input projections of all steps in one matmul outside the loop, split into
  gate blocks before the loop (the fastest form found; splitting inside the
  step was slower), per step one `(B, U) x (U, G*U)` matmul and the gates.

Forward (`jax.jit` of the outputs) and fwd+bwd (`jax.jit` of
`value_and_grad` of `sum(y ** 2)` w.r.t. the weights and the inputs), at
the benchmark's size (B=32 T=100 D=U=64) and at the torch scripts' other
sizes (`rnn_cpu_batch.OTHER_SIZES`); each the better of two medians of 15
interleaved rounds after 3 warm-up calls, and the largest difference of the
outputs from `keras loop`. The question is whether `own scan` is faster at
every size, as `torch_kernels.GRUFunction` is on torch: a backend-specific
path is worth its code only then.

    python scripts/jax_scan_paths.py > docs/results/jax-scan-paths.txt
"""

import os

os.environ["KERAS_BACKEND"] = "jax"

# One XLA CPU thread, as the bench's --threads 1 (before JAX starts).
from maskedrnn.bench.harness_jax import set_threads  # noqa: E402

set_threads(1)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from rnn_cpu_batch import (  # noqa: E402
    BATCH,
    FEATURES,
    OTHER_SIZES,
    TIME,
    UNITS,
    best_of_two,
)

from maskedrnn._keras_private import keras_backend_rnn  # noqa: E402

SIZES = [(BATCH, TIME, FEATURES, UNITS)] + OTHER_SIZES


def own_scan(cell, weights, x, units):
    """One projection-first `lax.scan` of Keras' LSTM / GRU(reset_after=True)
    equations (default activations), zero initial state; `(B, T, U)`."""
    kernel, recurrent_kernel, bias = weights
    h0 = jnp.zeros((x.shape[0], units), x.dtype)
    if cell == "gru":
        input_bias, recurrent_bias = bias[0], bias[1]
    else:
        input_bias, recurrent_bias = bias, 0.0
    # (T, B, G*U) projections of every step, split into G gate blocks of
    # (T, B, U) before the loop: Keras' gate orders, GRU z r h, LSTM i f c o.
    projected = jnp.swapaxes(x @ kernel + input_bias, 0, 1)
    n_gates = projected.shape[-1] // units
    blocks = tuple(
        projected[..., i * units : (i + 1) * units] for i in range(n_gates)
    )

    def gru_step(h, xs):
        x_z, x_r, x_h = xs
        inner = h @ recurrent_kernel + recurrent_bias
        z = jax.nn.sigmoid(x_z + inner[:, :units])
        r = jax.nn.sigmoid(x_r + inner[:, units : 2 * units])
        candidate = jnp.tanh(x_h + r * inner[:, 2 * units :])
        h = z * h + (1 - z) * candidate
        return h, h

    def lstm_step(carry, xs):
        c, h = carry
        x_i, x_f, x_c, x_o = xs
        inner = h @ recurrent_kernel
        i = jax.nn.sigmoid(x_i + inner[:, :units])
        f = jax.nn.sigmoid(x_f + inner[:, units : 2 * units])
        g = jnp.tanh(x_c + inner[:, 2 * units : 3 * units])
        o = jax.nn.sigmoid(x_o + inner[:, 3 * units :])
        c = f * c + i * g
        h = o * jnp.tanh(c)
        return (c, h), h

    if cell == "gru":
        _, ys = lax.scan(gru_step, h0, blocks)
    else:
        _, ys = lax.scan(lstm_step, (h0, h0), blocks)
    return jnp.swapaxes(ys, 0, 1)


def keras_gru_kernel(weights, x, units):
    """Keras' unmasked JAX GRU kernel (`backend.gru`), zero initial state."""
    kernel, recurrent_kernel, bias = weights
    h0 = jnp.zeros((x.shape[0], units), x.dtype)
    _, outputs, _ = keras_backend_rnn("jax").gru(
        x, h0, None, kernel, recurrent_kernel, bias,
        jnp.tanh, jax.nn.sigmoid, return_sequences=True,
    )
    return outputs


def cases_for(cell, size):
    """`{name: (forward, fwd+bwd)}` of jitted no-argument functions, and the
    largest output difference of each from `keras loop`."""
    batch, time_steps, features, units = size
    layer_cls = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM}[cell]
    layer = layer_cls(units, return_sequences=True, use_cudnn=False)
    layer.build((batch, time_steps, features))
    rng = np.random.default_rng(0)
    x = jnp.asarray(
        rng.standard_normal((batch, time_steps, features)).astype("float32")
    )
    weights = [v.value for v in layer.trainable_variables]
    fixed = [v.value for v in layer.non_trainable_variables]

    def keras_loop(weights, x):
        return layer.stateless_call(weights, fixed, x)[0]

    functions = {"keras loop": keras_loop}
    if cell == "gru":
        functions["keras backend.gru"] = lambda w, x: keras_gru_kernel(w, x, units)
    functions["own scan"] = lambda w, x: own_scan(cell, w, x, units)
    reference = jax.jit(keras_loop)(weights, x)
    cases, diffs = {}, {}
    for name, fn in functions.items():
        forward = jax.jit(fn)
        grads = jax.jit(
            jax.value_and_grad(
                lambda w, x, fn=fn: jnp.sum(fn(w, x) ** 2), argnums=(0, 1)
            )
        )
        cases[name] = (
            lambda f=forward: jax.block_until_ready(f(weights, x)),
            lambda g=grads: jax.block_until_ready(g(weights, x)),
        )
        diffs[name] = float(jnp.max(jnp.abs(forward(weights, x) - reference)))
    return cases, diffs


print(
    "One LSTM/GRU direction on JAX CPU, 1 XLA thread, jitted, "
    f"full rows of random data; jax {jax.__version__}, keras "
    f"{keras.__version__}; the better of two medians of 15 interleaved "
    "rounds after 3 warm-up calls (ms)"
)
for cell in ("lstm", "gru"):
    print(f"\n{cell.upper()}")
    print(
        f"{'B':>4} {'T':>4} {'D':>4} {'U':>4}  {'case':18s} {'fwd ms':>8} "
        f"{'fwd+bwd ms':>10}  {'÷ keras loop':>12}  max|d y|"
    )
    for size in SIZES:
        cases, diffs = cases_for(cell, size)
        forward = best_of_two({n: c[0] for n, c in cases.items()})
        train = best_of_two({n: c[1] for n, c in cases.items()})
        for name in cases:
            ratio = (
                f"{forward[name] / forward['keras loop']:.2f} / "
                f"{train[name] / train['keras loop']:.2f}"
            )
            print(
                f"{size[0]:4d} {size[1]:4d} {size[2]:4d} {size[3]:4d}  "
                f"{name:18s} {forward[name]:8.3f} {train[name]:10.3f}  "
                f"{ratio:>12}  {diffs[name]:.1e}",
                flush=True,
            )
