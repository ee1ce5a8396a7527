"""How much of a masked layer in a stack is the per-layer reordering?

A stack of masked RNN layers on a pre-padded (left-padded) batch: every
layer computes the valid-first order from the mask and gathers its input and
output (`maskedrnn.ops.valid_first_order`, `gather_time`). This script times,
forward and forward+backward, on the current Keras backend (CPU):

- `stack_mask`: 3 x `MaskedBidirectional(LSTM)` on the left-padded batch
  with its mask (each layer reorders);
- `stack_lengths`: the same 3 layers on the right-padded batch with
  `lengths` (no reordering at all: the lower bound for passing lengths on);
- `reorder`: the reordering work of one layer alone (order from the mask,
  one gather in, one gather out per direction's output).

It writes a JSON file with the medians and `reorder / layer`, where
`layer = stack_mask / 3`. Usage:

    KERAS_BACKEND=tensorflow python scripts/stack_gathers.py out.json
"""

import json
import os
import sys
import time

import keras
import numpy as np
from keras import ops

import maskedrnn
from maskedrnn import ops as mops

B, T, D, U, LAYERS, REPEATS = 32, 100, 64, 64, 3, 15
BACKEND = keras.backend.backend()


def compiled(fn):
    """The function as this backend runs it in training (TF: tf.function;
    JAX: jax.jit; torch: eager, as Keras runs it by default)."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn)
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    return fn


def grad_fn(model, inputs_fn):
    """fwd+bwd: the gradient of sum(outputs) w.r.t. the trainable weights."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        @tf.function
        def step(*args):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(inputs_fn(*args)))
            return tape.gradient(loss, model.trainable_variables)

        return step
    if BACKEND == "jax":
        import jax

        non_trainable = [v.value for v in model.non_trainable_variables]

        def loss(tv, *args):
            out, _ = model.stateless_call(tv, non_trainable, inputs_fn(*args))
            return out.sum()

        g = jax.jit(jax.grad(loss))
        tv = [v.value for v in model.trainable_variables]
        return lambda *args: g(tv, *args)
    import torch

    def step(*args):
        loss = model(inputs_fn(*args)).sum()
        return torch.autograd.grad(loss, [v.value for v in model.trainable_weights])

    return step


def median_ms(fn, *args):
    def run():
        out = fn(*args)
        for t in out if isinstance(out, (list, tuple)) else [out]:
            ops.convert_to_numpy(t)

    run()
    run()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


class Stack(keras.Model):
    def __init__(self):
        super().__init__()
        self.rnns = [
            maskedrnn.MaskedBidirectional(keras.layers.LSTM(U, return_sequences=True))
            for _ in range(LAYERS)
        ]

    def call(self, inputs):
        x, mask, lengths = inputs
        for rnn in self.rnns:
            x = rnn(x, mask=mask) if lengths is None else rnn(x, lengths=lengths)
        return x


def reorder(x, y2, mask):
    order, inverse, _ = mops.valid_first_order(mask)
    return [mops.gather_time(x, order), mops.gather_time(y2, inverse)]


def main(path):
    rng = np.random.default_rng(0)
    lengths = rng.integers(T // 2, T + 1, size=B).astype("int32")
    right = np.arange(T)[None] < lengths[:, None]
    left = right[:, ::-1].copy()
    x_right = rng.standard_normal((B, T, D)).astype("float32") * right[..., None]
    x_left = x_right[:, ::-1].copy()
    y2 = rng.standard_normal((B, T, 2 * U)).astype("float32")
    model = Stack()
    model((x_left, left, None))
    x_left_t, left_t = ops.convert_to_tensor(x_left), ops.convert_to_tensor(left)
    x_right_t = ops.convert_to_tensor(x_right)
    lengths_t = ops.convert_to_tensor(lengths)
    y2_t = ops.convert_to_tensor(y2)
    results = {
        "backend": BACKEND,
        "shape": {"B": B, "T": T, "D": D, "U": U, "layers": LAYERS},
        "repeats": REPEATS,
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "loadavg_before": os.getloadavg(),
    }
    fwd_mask = compiled(lambda x, m: model((x, m, None)))
    fwd_lengths = compiled(lambda x, n: model((x, None, n)))
    results["fwd_ms"] = {
        "stack_mask": median_ms(fwd_mask, x_left_t, left_t),
        "stack_lengths": median_ms(fwd_lengths, x_right_t, lengths_t),
        "reorder": median_ms(compiled(reorder), x_left_t, y2_t, left_t),
    }
    bwd_mask = grad_fn(model, lambda x, m: (x, m, None))
    bwd_lengths = grad_fn(model, lambda x, n: (x, None, n))
    results["fwd_bwd_ms"] = {
        "stack_mask": median_ms(bwd_mask, x_left_t, left_t),
        "stack_lengths": median_ms(bwd_lengths, x_right_t, lengths_t),
    }
    for key in ("fwd_ms", "fwd_bwd_ms"):
        r = results[key]
        layer = r["stack_mask"] / LAYERS
        r["layer"] = layer
        r["saving_per_layer_with_lengths"] = (
            r["stack_mask"] - r["stack_lengths"]
        ) / LAYERS
        r["saving_per_layer / layer"] = r["saving_per_layer_with_lengths"] / layer
        if "reorder" in r:
            r["reorder / layer"] = r["reorder"] / layer
    print(json.dumps(results, indent=2))
    with open(path, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1])
