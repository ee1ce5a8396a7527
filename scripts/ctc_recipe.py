"""CTC digit recognition: maskedrnn's masked recipe vs Keras' unmasked one.

Trains two models from the same initial weights, in the same batch order, on
`maskedrnn.datasets.make_spoken_digits_task` (digit strings rendered as noisy
frames of varying duration, zero-padded):

* `masked`: `Masking -> MaskedBidirectional(GRU) -> Dense`, loss
  `maskedrnn.MaskedCTC()`, decoded with `maskedrnn.ctc_decode` (the mask
  decides each row's frames);
* `keras_unmasked`: keras-io's recipe as it runs on Keras 3.15.1:
  `Bidirectional(GRU) -> Dense` with no mask (`keras.losses.CTC` fails in
  `fit` on a masked output), loss `keras.losses.CTC()` (every row's logit
  length is the padded length), decoded with `keras.ops.ctc_decode` over the
  padded length.

It reports the character error rate (`maskedrnn.ctc.character_error_rate`)
on the test set as padded, and on the same test set with 20 more zero
frames at the end of every row. Writes JSON to `--out` (default: stdout).

    KERAS_BACKEND=tensorflow python scripts/ctc_recipe.py \\
        --out docs/results/ctc_recipe_tensorflow.json
"""

import argparse
import json
import os
import platform
import sys
import time

import keras
import numpy as np
from keras import ops

import maskedrnn
from maskedrnn.ctc import character_error_rate
from maskedrnn.datasets import make_spoken_digits_task

VOCABULARY = "_0123456789"  # id 0: the CTC blank; id d + 1: digit d


def build(masked, features, units, seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((None, features))
    x = keras.layers.Masking()(inputs) if masked else inputs
    gru = keras.layers.GRU(units, return_sequences=True)
    if masked:
        x = maskedrnn.MaskedBidirectional(gru)(x)
    else:
        x = keras.layers.Bidirectional(gru)(x)
    logits = keras.layers.Dense(len(VOCABULARY))(x)
    return keras.Model(inputs, logits)


def cer(model, x, labels, masked):
    logits = model.predict(x, batch_size=256, verbose=0)
    if masked:
        decoded, _ = maskedrnn.ctc_decode(logits, mask=np.any(x != 0, axis=-1))
    else:
        decoded, _ = ops.ctc_decode(logits, np.full(len(x), x.shape[1], "int32"))
    truth = maskedrnn.ctc_ids_to_text(labels, vocabulary=VOCABULARY)
    guess = maskedrnn.ctc_ids_to_text(decoded[0], vocabulary=VOCABULARY)
    return character_error_rate(truth, guess), guess[:3], truth[:3]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=1500)
    parser.add_argument("--test", type=int, default=500)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--units", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--extra-padding", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    x, labels, lengths = make_spoken_digits_task(args.train + args.test, seed=args.seed)
    x_train, y_train = x[: args.train], labels[: args.train]
    x_test, y_test = x[args.train :], labels[args.train :]
    pad = np.zeros((len(x_test), args.extra_padding, x.shape[-1]), "float32")
    x_test_long = np.concatenate([x_test, pad], axis=1)

    results = {
        "command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:]),
        "backend": keras.backend.backend(),
        "keras": keras.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "settings": vars(args),
        "data": {
            "frames_min": int(lengths.min()),
            "frames_max": int(lengths.max()),
            "frames_mean": round(float(lengths.mean()), 2),
            "padded_frames": int(x.shape[1]),
        },
        "models": {},
    }
    initial = build(True, x.shape[-1], args.units, args.seed).get_weights()
    for name, masked in (("masked", True), ("keras_unmasked", False)):
        model = build(masked, x.shape[-1], args.units, args.seed)
        model.set_weights(initial)
        loss = maskedrnn.MaskedCTC() if masked else keras.losses.CTC()
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
        start = time.perf_counter()
        history = model.fit(
            x_train,
            y_train,
            batch_size=args.batch_size,
            epochs=args.epochs,
            shuffle=False,
            verbose=0,
        )
        seconds = time.perf_counter() - start
        test_cer, examples, truth = cer(model, x_test, y_test, masked)
        long_cer, _, _ = cer(model, x_test_long, y_test, masked)
        results["models"][name] = {
            "train_seconds": round(seconds, 1),
            "final_train_loss": round(float(history.history["loss"][-1]), 4),
            "test_cer": round(test_cer, 4),
            "test_cer_extra_padding": round(long_cer, 4),
            "examples": {"truth": truth, "decoded": examples},
        }
    text = json.dumps(results, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
