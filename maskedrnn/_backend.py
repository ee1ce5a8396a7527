"""Backend-specific questions of maskedrnn, answered in one place.

`is_concrete`: argument checks that need values (e.g. `lengths <= time`) run
only when the tensor is concrete: eager TensorFlow, PyTorch outside
`torch.compile` tracing, and JAX outside `jit` tracing. Inside compiled
graphs they are skipped (see docs for what happens then).

`invert_permutation`: per-row inverse permutations, by scatter on JAX and by
argsort elsewhere (whichever is faster on that backend).

`take_rows`: a row gather, by `index_select` on torch (Keras' `take` runs
`embedding` there, whose backward is twice as slow).

`has_fused_rnn_kernel`: whether the backend has a fused LSTM/GRU kernel on
this machine (cuDNN), which decides how an LSTM's exact final states are
obtained (`maskedrnn.layers.kernels`).

(PyTorch's native kernels, the one backend-specific compute path, live in
`maskedrnn/_torch_kernels.py`.)
"""

import keras
from keras import ops


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


def invert_permutation(perm):
    """`inverse[b, perm[b, t]] = t` for each row of an int32 `(batch, time)`
    tensor of permutations.

    On JAX a scatter (`keras.ops.scatter`); on TensorFlow and torch an
    argsort. Measured on this project's CPU benchmark sizes (32 x 100, 200
    calls, median; `tf.function` / `jax.jit` / eager torch): argsort 0.21 /
    0.27 / 0.08 ms, scatter 0.26 / 0.12 / 17.8 ms on TensorFlow / JAX / torch
    (Keras' torch `scatter` is slow). Both give the same result.
    """
    if keras.backend.backend() != "jax":
        return ops.cast(ops.argsort(perm, axis=1), "int32")
    shape = ops.shape(perm)
    batch, time = shape[0], shape[1]
    # Flat destinations: row b's step t goes to slot b * time + perm[b, t].
    dest = perm + ops.expand_dims(ops.arange(batch, dtype="int32") * time, 1)
    src = ops.broadcast_to(ops.expand_dims(ops.arange(time, dtype="int32"), 0), shape)
    flat = ops.scatter(
        ops.reshape(dest, (-1, 1)), ops.reshape(src, (-1,)), (batch * time,)
    )
    return ops.reshape(ops.cast(flat, "int32"), shape)


def take_rows(flat, index):
    """`flat[index]`: rows of `flat` (axis 0) gathered by an integer tensor
    `index` of any shape, giving `index.shape + flat.shape[1:]`.

    `keras.ops.take(flat, index, axis=0)`, except on torch: there Keras
    runs `torch.nn.functional.embedding` (after a `long()` cast and a
    `where` for negative indices, which this package never passes), whose
    backward sorts the indices; `index_select` is the same gather with a
    plain scatter-add backward. Measured on a CPU, one thread, 3200 rows
    of 64 floats: forward and backward 228 us by `embedding`, 106 us by
    `index_select` (forward alone 19 / 18 us).
    """
    if keras.backend.backend() != "torch":
        return ops.take(flat, index, axis=0)
    import torch

    index = ops.convert_to_tensor(index)
    rows = torch.index_select(flat, 0, index.reshape(-1).to(torch.int64))
    return rows.reshape(tuple(index.shape) + tuple(flat.shape[1:]))


def has_fused_rnn_kernel():
    """True when Keras' LSTM/GRU on this backend may run cuDNN here.

    TensorFlow and JAX: Keras' own test (`_is_gpu_available()` of its
    backend's `rnn` module: a visible GPU). Without one, Keras' unmasked and
    masked LSTM both run its generic step loop. torch: False here; its CPU
    kernels are PyTorch's own (`maskedrnn._torch_kernels`) and a CUDA
    device is checked per tensor there.
    """
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "jax"):
        return False
    from maskedrnn._keras_private import keras_backend_rnn

    return bool(keras_backend_rnn(backend)._is_gpu_available())
