"""The only backend-specific code of maskedrnn: whether a tensor has values now.

Argument checks that need values (e.g. `lengths <= time`) run only when the
tensor is concrete: eager TensorFlow, PyTorch outside `torch.compile` tracing,
and JAX outside `jit` tracing. Inside compiled graphs they are skipped (see
docs for what happens then).
"""

import keras


def is_concrete(x):
    """True when `x` holds values that can be read on the host right now."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return (
            tf.executing_eagerly()
            and not isinstance(x, tf.Variable)
            and hasattr(x, "numpy")
        )
    if backend == "jax":
        import jax

        return not isinstance(x, jax.core.Tracer)
    if backend == "torch":
        import torch

        compiling = getattr(torch.compiler, "is_compiling", lambda: False)
        return not compiling() and not getattr(x, "_is_symbolic", False)
    if backend == "numpy":
        return True
    raise NotImplementedError(
        f"maskedrnn does not know how to inspect tensors of the {backend!r} "
        "backend; use tensorflow, jax or torch."
    )
