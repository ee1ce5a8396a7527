"""Peak-memory growth of one forward + backward pass over a long sequence.

Usage (writes the JSON that docs/errors.md quotes):

    python scripts/memory_probe.py --out docs/results/memory_tf_cpu.json

TensorFlow CPU, batch 2 (one full row, one half padded), 2 features, 4
units, `MaskedBidirectional(LSTM)` against Keras' `Bidirectional(LSTM)`
without a mask, in one `tf.function` traced with `None` dimensions on a
T=8 warm-up: the growth of the peak RSS (`ru_maxrss`) from that warm-up
to the step at T, each configuration in a fresh process
(`peak_memory_mb`; tests/test_properties.py's
`test_long_sequence_memory_is_bounded_by_keras_unmasked` bounds ours with
it).
"""

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# One configuration, run as `python -c PROBE WHICH T [state]` in a fresh
# process: prints {"delta_mb": ...}.
PROBE = r"""
import json, os, resource, sys
import numpy as np, keras, tensorflow as tf
from maskedrnn import MaskedBidirectional
which, T, state = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "state"
B, D, U = 2, 2, 4
inner = keras.layers.LSTM(U, return_sequences=True, return_state=state)
if which == "keras":
    layer = keras.layers.Bidirectional(inner)
else:
    layer = MaskedBidirectional(inner)

@tf.function(
    input_signature=[
        tf.TensorSpec((None, None, D)),
        tf.TensorSpec((None,), tf.int32),
        tf.TensorSpec((None, None), tf.bool),
    ]
)
def grads(x, lengths, mask):
    kw = {}
    if which == "ours-lengths":
        kw["lengths"] = lengths
    if which == "ours-mask":
        kw["mask"] = mask
    with tf.GradientTape() as tape:
        outputs = tf.nest.flatten(layer(x, **kw))
        loss = tf.add_n([tf.reduce_sum(o**2) for o in outputs])
    return tape.gradient(loss, layer.trainable_variables)

def step(t):
    x = np.random.default_rng(0).standard_normal((B, t, D)).astype("float32")
    m = np.ones((B, t), bool)
    m[1, : t // 2] = False
    return grads(x, np.array([t, t // 2], "int32"), m)

layer.build((None, None, D))
step(8)  # traced once (None dims), kernels loaded
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
step(T)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"delta_mb": (peak - base) / 1024}))
"""


def peak_memory_mb(which, time, state=False):
    """Growth of the peak RSS, in MB, of one forward + backward pass at
    `time` steps, in a fresh TensorFlow process.

    Args:
        which: `"keras"` (Keras' `Bidirectional(LSTM)`, no mask),
            `"ours-lengths"` or `"ours-mask"` (`MaskedBidirectional(LSTM)`
            given `lengths=` or a left-padded `mask=`).
        time: Int, the number of steps.
        state: Bool, whether the LSTM returns its final states.
    """
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, "-c", PROBE, which, str(time), "state" * state],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["delta_mb"]

RUNS = [
    ("keras", 2000, False),
    ("ours-lengths", 2000, False),
    ("ours-mask", 2000, False),
    ("keras", 8000, False),
    ("ours-lengths", 8000, False),
    ("ours-mask", 8000, False),
    ("keras", 2000, True),
    ("ours-mask", 2000, True),
]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    import keras
    import tensorflow as tf

    rows = []
    for which, time, state in RUNS:
        mb = peak_memory_mb(which, time, state=state)
        rows.append({"layer": which, "time": time, "return_state": state,
                     "delta_mb": round(mb, 1)})
        print(f"{which:13s} T={time:5d} return_state={state!s:5s} {mb:6.1f} MB",
              flush=True)
    results = {
        "rows": rows,
        "environment": {
            "python": platform.python_version(),
            "keras": keras.__version__,
            "tensorflow": tf.__version__,
            "platform": platform.platform(),
        },
    }
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
