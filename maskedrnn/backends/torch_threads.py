"""PyTorch CPU thread count for small models (torch backend only).

PyTorch sizes its intra-op thread pool to every core. For models as small as
the demo's (a 64-unit LSTM, batches of 32) the per-op work is too small to
split, and on a busy machine the pool's threads wait on each other, so
the demo and the bench default to one thread. Other backends are left
alone.
"""

import contextlib
import os

from maskedrnn import backends

# Thread count for small models when neither the caller nor OMP_NUM_THREADS
# says otherwise.
SMALL_MODEL_THREADS = 1


def resolve_threads(threads=None):
    """The intra-op thread count the demo uses on torch.

    Args:
        threads: Int >= 1, or `None` (default): the value of the
            `OMP_NUM_THREADS` environment variable when it is a positive
            int, else `SMALL_MODEL_THREADS`.

    Returns:
        A pair `(count, source)`, `source` saying where the count comes from
        (`"threads"`, `"OMP_NUM_THREADS"` or `"default for small models"`).
    """
    if threads is not None:
        return int(threads), "threads"
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env), "OMP_NUM_THREADS"
    return SMALL_MODEL_THREADS, "default for small models"


@contextlib.contextmanager
def torch_cpu_threads(count):
    """Runs the block with `torch.set_num_threads(count)`, then restores it.

    On another backend nothing changes and the block receives `None`.

    Args:
        count: Int >= 1, PyTorch's intra-op thread count inside the block.

    Yields:
        `count` on the torch backend, `None` otherwise.
    """
    if backends.name() != "torch":
        yield None
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield count
    finally:
        torch.set_num_threads(before)
