"""Backend-specific questions of maskedrnn, answered in one place.

`is_concrete`: argument checks that need values (e.g. `lengths <= time`) run
only when the tensor is concrete: eager TensorFlow, PyTorch outside
`torch.compile` tracing, and JAX outside `jit` tracing. Inside compiled
graphs they are skipped (see docs for what happens then).

`prefers_generic_gru_loop`: which Keras GRU loop is faster on a JAX CPU.

(PyTorch's native kernels, the one backend-specific compute path, live in
`maskedrnn/_torch_kernels.py`.)
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


def prefers_generic_gru_loop(inner):
    """True for a GRU on the JAX backend on CPU left at `use_cudnn="auto"`.

    There Keras' unmasked GRU kernel (`backend.gru`: a `lax.scan` over input
    projections computed up front; JAX has no cuDNN GRU) runs the forward
    pass 2.5x (B=16 T=50 D=U=32) and 3.6x (B=64 T=200 D=U=128) slower than
    Keras' generic step loop, and fwd+bwd 1.2x slower (jitted, full rows;
    `scripts/bench_cpu.sh jax-gru-full-small jax-gru-full-large`, results in
    docs/results/cpu-jax-gru-full-*.json and docs/benchmarks.md).
    `MaskedBidirectional` then sets `use_cudnn=False` on its inner GRU copies,
    which sends them to the generic loop, still without a mask. Not on a
    GPU, where `backend.gru`'s one large input matmul is the better bet, and
    not when the user asked for `use_cudnn=True`.
    """
    if keras.backend.backend() != "jax":
        return False
    if type(inner) is not keras.layers.GRU or inner.use_cudnn != "auto":
        return False
    import jax

    return jax.default_backend() == "cpu"
