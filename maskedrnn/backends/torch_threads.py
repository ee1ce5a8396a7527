"""PyTorch CPU thread count for small models (torch backend only).

A small model's per-op work is too small to split over PyTorch's thread
pool, whose threads then wait on each other: the demo and the bench default
to one thread.
"""

import contextlib
import os

from maskedrnn import backends

SMALL_MODEL_THREADS = 1


def resolve_threads(threads=None):
    """The intra-op thread count the demo uses on torch.

    Args:
        threads: Int >= 1, or `None` (default): `OMP_NUM_THREADS` when a
            positive int, else `SMALL_MODEL_THREADS`.

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
    """Runs the block with `torch.set_num_threads(count)`; a no-op elsewhere.

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
