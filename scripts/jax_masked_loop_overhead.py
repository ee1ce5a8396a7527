"""What MaskedRNN adds around Keras' masked loop on a JAX CPU, where it runs
that loop itself (`maskedrnn.layers.kernels.jax_cpu_reason`).

JAX CPU, one XLA thread, the CPU benchmark's MaskedRNN batch (B=32 T=100
D=U=64, lengths uniform in [20, 100], left-padded), forward pass, jitted
`stateless_call` with `mask=`; the median of 300 interleaved rounds after 5
warm-up calls, for a SimpleRNN (tanh), a GRU and an LSTM of 64 units
returning sequences (`zero_output_for_mask=True`, as the bench):

- `keras`: the Keras layer fed the mask (`use_cudnn=False`);
- `maskedrnn`: `MaskedRNN` around the same layer, same weights;
- `maskedrnn, no zeroing`: the same with its zeroing of the masked inputs
  (`direction.zero_where_masked`, which keeps inf/NaN at padded steps out
  of outputs and gradients) replaced by the identity: what that costs.

The bench's separate runs put ours' forward pass at 1.00-1.08 of Keras
masked on JAX; interleaved in one process the two are compared call by
call.

    python scripts/jax_masked_loop_overhead.py \
        > docs/results/jax-masked-loop-overhead.txt
"""

import os

os.environ["KERAS_BACKEND"] = "jax"

# One XLA CPU thread, as the bench's --threads 1 (before JAX starts).
from maskedrnn.bench.harness_jax import set_threads  # noqa: E402

set_threads(1)

import jax  # noqa: E402
import keras  # noqa: E402
from rnn_cpu_batch import (  # noqa: E402
    FEATURES,
    UNITS,
    interleaved_medians,
    left_padded_batch,
)

import maskedrnn  # noqa: E402
from maskedrnn.layers import direction  # noqa: E402

x, mask, _ = left_padded_batch()
LAYERS = {
    "SimpleRNN": lambda: keras.layers.SimpleRNN(
        UNITS, return_sequences=True, zero_output_for_mask=True
    ),
    "GRU": lambda: keras.layers.GRU(
        UNITS, return_sequences=True, zero_output_for_mask=True, use_cudnn=False
    ),
    "LSTM": lambda: keras.layers.LSTM(
        UNITS, return_sequences=True, zero_output_for_mask=True, use_cudnn=False
    ),
}


def jitted_forward(layer):
    """A no-argument function: the jitted forward pass of `layer` on the
    batch with its mask, blocked until done."""
    trainable = [v.value for v in layer.trainable_variables]
    fixed = [v.value for v in layer.non_trainable_variables]
    forward = jax.jit(
        lambda w, x, m: layer.stateless_call(w, fixed, x, mask=m)[0]
    )
    return lambda: jax.block_until_ready(forward(trainable, x, mask))


print(
    "MaskedRNN around Keras' masked loop on JAX CPU, 1 XLA thread, forward "
    f"(jitted), B=32 T=100 D=U=64, left-padded; jax {jax.__version__}, keras "
    f"{keras.__version__}; median of 300 interleaved rounds (ms)"
)
for name, make in LAYERS.items():
    keras_layer = make()
    keras_layer.build((None, None, FEATURES))
    ours = maskedrnn.MaskedRNN(make())
    ours.build((None, None, FEATURES))
    ours.set_weights(keras_layer.get_weights())
    cases = {"keras": jitted_forward(keras_layer), "maskedrnn": jitted_forward(ours)}
    zeroing = direction.zero_where_masked
    direction.zero_where_masked = lambda x, mask: x
    try:
        cases["maskedrnn, no zeroing"] = jitted_forward(ours)
        cases["maskedrnn, no zeroing"]()  # traced now, with the identity
    finally:
        direction.zero_where_masked = zeroing
    median = interleaved_medians(cases, 300, warmup=5)
    for case, ms in median.items():
        print(f"{name:10s} {case:22s} {ms:7.3f}  {ms / median['keras']:5.3f}")
