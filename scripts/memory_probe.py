"""Peak-memory growth of one forward + backward pass over a long sequence.

Usage (writes the JSON that docs/errors.md quotes):

    python scripts/memory_probe.py --out docs/results/memory_tf_cpu.json

TensorFlow CPU, batch 2 (one full row, one half padded), 2 features, 4
units, `MaskedBidirectional(LSTM)` against Keras' `Bidirectional(LSTM)`
without a mask, in one `tf.function` traced with `None` dimensions on a
T=8 warm-up: the growth of the peak RSS (`ru_maxrss`) from that warm-up
to the step at T, each configuration in a fresh process. The probe is
`_peak_memory_mb` of tests/test_properties.py, whose
`test_long_sequence_memory_is_bounded_by_keras_unmasked` bounds ours by it.
"""

import argparse
import json
import pathlib
import platform
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_properties import _peak_memory_mb  # noqa: E402

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
        mb = _peak_memory_mb(which, time, state=state)
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
