"""Is a demo disagreement a different function, or float drift in training?

`python -m maskedrnn` trains our model and Keras' masked one side by side
and checks that their test probabilities agree to `demo.AGREEMENT_ATOL`.
Two models computing the same function can still end training apart: their
float32 rounding differs (e.g. PyTorch's fused LSTM kernel against Keras'
step loop on the torch backend), and Adam, which divides each update by the
gradient's running RMS, turns tiny gradient differences into weight
differences that accumulate over hundreds of steps. This script separates
the two on the demo's default vowels run (`--layer` as in the demo):

1. trains both models exactly as the demo does (same initial weights, same
   seed before each `fit`, the demo's torch thread count) and prints the
   largest weight difference and the largest test-probability difference
   (what the demo reports);
2. copies the Keras model's trained weights into ours and predicts again:
   at the same weights the two must agree to float rounding (~1e-7 in
   probabilities); a wrong implementation would not.

Usage:

    KERAS_BACKEND=torch python scripts/demo_drift.py rnn
"""

import sys

import keras
import numpy as np

from maskedrnn import demo
from maskedrnn.backends.torch_threads import resolve_threads, torch_cpu_threads


def main(layer):
    names = demo._model_names(layer)
    ours, keras_masked = names[0], names[1]
    settings = demo._DEFAULTS["vowels"]
    data = demo._vowels_data("pre")
    keras.utils.set_random_seed(0)
    models = {
        k: demo._build_model("vowels", k, data, settings["units"], layer) for k in names
    }
    initial = models[ours].get_weights()
    for kind in names[1:]:
        models[kind].set_weights(initial)

    def probs(kind):
        logits = demo._predict(models[kind], data["x_test"], settings["batch_size"])
        return demo._softmax(logits)

    for kind in (ours, keras_masked):
        demo._compile(models[kind], "vowels", settings["learning_rate"])
        keras.utils.set_random_seed(0)
        models[kind].fit(
            data["x_train"],
            data["y_train"],
            epochs=settings["epochs"],
            batch_size=settings["batch_size"],
            shuffle=True,
            verbose=0,
        )
    weight_diff = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(models[ours].get_weights(), models[keras_masked].get_weights())
    )
    reference = probs(keras_masked)
    trained_apart = float(np.max(np.abs(probs(ours) - reference)))
    models[ours].set_weights(models[keras_masked].get_weights())
    same_weights = float(np.max(np.abs(probs(ours) - reference)))
    print(f"backend: {keras.backend.backend()}, layer: {layer}")
    print(f"trained side by side: max |w_ours - w_keras|  = {weight_diff:.2e}")
    print(f"trained side by side: max |p_ours - p_keras|  = {trained_apart:.2e}")
    print(f"same (Keras') weights: max |p_ours - p_keras| = {same_weights:.2e}")


if __name__ == "__main__":
    # The demo's thread count on torch (rounding depends on it).
    with torch_cpu_threads(resolve_threads()[0]):
        main(sys.argv[1] if len(sys.argv) > 1 else "bidirectional")
