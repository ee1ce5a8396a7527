"""Quiets TensorFlow's C++ start-up log for `python -m maskedrnn` (the demo).

`python -m maskedrnn` imports the package, and so Keras and TensorFlow,
before the demo's own code runs; the package imports this module first, so
that the demo's output starts with its own lines, not TensorFlow's (oneDNN,
cpu_feature_guard). A `TF_CPP_MIN_LOG_LEVEL` the user set is kept, and
nothing changes for any other program that imports maskedrnn.
"""

import os
import sys


def is_demo_command(argv):
    """Whether `argv` (`sys.orig_argv`) runs `python [options] -m maskedrnn`."""
    return "-m" in argv and argv[argv.index("-m") + 1 :][:1] == ["maskedrnn"]


def quiet_tensorflow(argv, environ):
    """Sets `TF_CPP_MIN_LOG_LEVEL=2` in `environ` for the demo command,
    unless `environ` has a level already."""
    if is_demo_command(argv):
        environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


quiet_tensorflow(getattr(sys, "orig_argv", []), os.environ)
