"""What MaskedRNN adds around Keras' masked step loop, where it runs that
loop itself, and what its zeroing of the masked inputs costs in each form.

Where no fused kernel is kept (every RNN on a JAX CPU,
`maskedrnn.backends.jax.cpu_why`; `keras.layers.RNN(cell)` on every
backend; an LSTM whose states are wanted on a TensorFlow CPU) ours calls
Keras' masked loop on the batch as it is, after zeroing the inputs at
masked steps (so that inf or NaN there reach neither outputs nor
gradients). Cases, on the CPU benchmark's
MaskedRNN batch (B=32 T=100 D=U=64, lengths uniform in [20, 100],
left-padded), one thread, the bench's harness (`jax.jit`, `tf.function`,
eager torch), forward (`infer`) and fwd+bwd (`train`, gradients w.r.t.
inputs and weights):

- `keras`: the Keras layer fed the mask;
- `maskedrnn`: `MaskedRNN` around the same layer, same weights, as it
  ships (`direction.zero_masked_inputs`, the zeroing in time-major order:
  in a forward pass XLA fuses it into the transpose Keras' loop makes
  anyway);
- `maskedrnn, batch-major zeroing`: the same with the zeroing in the
  caller's order (`direction.zero_where_masked`, what ours did before);
- `maskedrnn, no zeroing`: the zeroing replaced by the identity (unsafe
  with inf/NaN padding): what any zeroing costs.

Each the median of 200 interleaved rounds (every case once a round) after
5 warm-up calls, and its ratio to `keras`. The layers are `keras.layers.
RNN(SimpleRNNCell | GRUCell | LSTMCell(64), return_sequences=True,
zero_output_for_mask=True)`, which take Keras' masked loop on every backend
(on a JAX CPU `LSTM/GRU/SimpleRNN` run the same loop).

    KERAS_BACKEND=jax python scripts/masked_loop_zeroing.py \
        > docs/results/masked-loop-zeroing-jax.txt
"""

import importlib
import os

import numpy as np
from rnn_cpu_batch import FEATURES, UNITS, interleaved_medians, left_padded_batch

BACKEND = os.environ.get("KERAS_BACKEND", "tensorflow")
harness_module = importlib.import_module(f"maskedrnn.bench.harness_{BACKEND}")
# One thread, as the bench's --threads 1 (on JAX before it starts).
threads = harness_module.set_threads(1)

import keras  # noqa: E402

import maskedrnn  # noqa: E402
from maskedrnn.layers import direction  # noqa: E402

CELLS = {
    "SimpleRNN": keras.layers.SimpleRNNCell,
    "GRU": keras.layers.GRUCell,
    "LSTM": keras.layers.LSTMCell,
}
ZEROING = {
    "maskedrnn": direction.zero_masked_inputs,
    "maskedrnn, batch-major zeroing": direction.zero_where_masked,
    "maskedrnn, no zeroing": lambda x, mask: x,
}


def with_zeroing(step, zeroing):
    """`step` run with `direction.zero_masked_inputs` set to `zeroing` (while
    it runs: eager torch calls it each time; JAX and TensorFlow when they
    trace, on the first call)."""

    def run():
        kept = direction.zero_masked_inputs
        direction.zero_masked_inputs = zeroing
        try:
            return step()
        finally:
            direction.zero_masked_inputs = kept

    return run


def main():
    harness = harness_module.Harness(gpu=False)
    x_np, mask_np, _ = left_padded_batch()
    x, mask = harness.tensor(x_np), harness.tensor(mask_np)
    rng = np.random.default_rng(1)
    w = harness.tensor(
        rng.standard_normal((x_np.shape[0], x_np.shape[1], UNITS)).astype("float32")
    )
    print(
        f"MaskedRNN around Keras' masked loop, {BACKEND} CPU, {threads}, "
        "B=32 T=100 D=U=64, left-padded; keras "
        f"{keras.__version__}; median of 200 interleaved rounds (ms) and "
        "ratio to keras"
    )
    for name, cell in CELLS.items():

        def make(cell=cell):
            return keras.layers.RNN(
                cell(UNITS), return_sequences=True, zero_output_for_mask=True
            )

        keras_layer = make()
        keras_layer.build((None, None, FEATURES))
        ours = maskedrnn.MaskedRNN(make())
        ours.build((None, None, FEATURES))
        ours.set_weights(keras_layer.get_weights())
        for mode in ("infer", "train"):
            cases = {
                "keras": harness.keras_step(
                    keras_layer, mode, x, w, {"mask": mask}
                )
            }
            for case, zeroing in ZEROING.items():
                cases[case] = with_zeroing(
                    harness.keras_step(ours, mode, x, w, {"mask": mask}), zeroing
                )
            blocked = {
                case: (lambda step=step: harness.block(step()))
                for case, step in cases.items()
            }
            median = interleaved_medians(blocked, 200, warmup=5)
            for case, ms in median.items():
                print(
                    f"{name:10s} {mode:5s} {case:31s} {ms:7.3f}  "
                    f"{ms / median['keras']:5.3f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
