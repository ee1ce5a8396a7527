"""Quiets TensorFlow's C++ start-up log for `python -m maskedrnn` (the demo).

`python -m maskedrnn` imports the package, and so Keras and TensorFlow,
before the demo's own code runs; the package imports this module first, so
that the demo's output starts with its own lines, not TensorFlow's (oneDNN,
cpu_feature_guard): it sets `TF_CPP_MIN_LOG_LEVEL=2` and imports TensorFlow
with stderr silenced (some builds log while loading, before reading that
level). A `TF_CPP_MIN_LOG_LEVEL` the user set is kept, and TensorFlow then
logs as it does; nothing changes for any other program that imports
maskedrnn.
"""

import os
import sys


def is_demo_command(argv):
    """Whether `argv` (`sys.orig_argv`) runs `python [options] -m maskedrnn`."""
    return "-m" in argv and argv[argv.index("-m") + 1 :][:1] == ["maskedrnn"]


def quiet_tensorflow(argv, environ):
    """Sets `TF_CPP_MIN_LOG_LEVEL=2` in `environ` for the demo command,
    unless `environ` has a level already; True when it set it."""
    if is_demo_command(argv) and "TF_CPP_MIN_LOG_LEVEL" not in environ:
        environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        return True
    return False


def import_tensorflow_silently():
    """Imports TensorFlow with the process's stderr (file descriptor 2)
    sent to /dev/null: some TensorFlow builds log their oneDNN line while
    loading, before they read `TF_CPP_MIN_LOG_LEVEL`. An import error is
    raised as usual once stderr is back."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


if quiet_tensorflow(getattr(sys, "orig_argv", []), os.environ):
    if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
        import_tensorflow_silently()
