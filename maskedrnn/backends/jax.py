"""The JAX backend: Keras' layers; without a GPU, Keras' masked loop for all.

JAX has no fused RNN kernel without a GPU: Keras' JAX backend reaches cuDNN
only on one, and its unmasked GRU kernel (a `lax.scan` over input
projections computed up front) runs slower than its generic loop on a CPU.
So there every Keras RNN runs a `lax.scan` step loop, masked or not, at
nearly the same cost: the mask adds a fused select per step, and ours'
valid-first gathers and per-row reversals would cost extra on top
(docs/benchmarks.md). Keras' masked loop on the caller's order is exact and
does none of it (`cpu_why`), unless the wrapped layer says `use_cudnn=True`.
An LSTM whose final states are wanted follows TensorFlow's rule
(`keras_ways.states_why`).
"""

import jax
import keras
from keras import ops

from maskedrnn.backends import Why, keras_ways, soft

NAME = "jax"
WAYS = ("keras-unmasked", "keras-masked")

layout = run_direction = keras_ways.no_caller_order_kernel
FUSED_WAYS = ()
run_fused = keras_ways.no_fused_kernel
fused_why = keras_ways.fused_why


def is_concrete(x):
    """True when `x` holds values (outside `jit` tracing)."""
    return not isinstance(x, jax.core.Tracer)


def host_readable(x):
    """True when `x`'s values can be read on the host now (`is_concrete`;
    the lengths check reads them there)."""
    return is_concrete(x)


def scalar(value, dtype):
    """A 0-d tensor of `value` (a Python number or a scalar tensor) in
    `dtype` (`keras.ops.cast`)."""
    return ops.cast(value, dtype)


def invert_permutation(perm):
    """`inverse[b, perm[b, t]] = t` for each row of an int32 `(batch, time)`
    tensor of permutations: a scatter (cheaper than an argsort on JAX)."""
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
    `index` of any shape (`keras.ops.take`)."""
    return ops.take(flat, index, axis=0)


def has_fused_rnn_kernel():
    """True when Keras' LSTM/GRU may run cuDNN here: Keras' own test (a
    visible GPU, `_is_gpu_available()` of its backend's `rnn` module)."""
    from maskedrnn._keras_private import keras_backend_rnn

    return bool(keras_backend_rnn(NAME)._is_gpu_available())


_CPU_WHY = soft(
    "JAX has no fused RNN kernel without a GPU, so Keras' masked loop "
    "costs about what its unmasked loop does, and running it on the "
    "batch as it is saves the valid-first reordering"
)

_FLOAT64_SIMPLE_RNN = Why(
    "float64 SimpleRNN on JAX: Keras' unmasked loop mixes a float32 "
    "step into the float64 carry and fails ('scan body function carry "
    "input and carry output must have equal types'); its masked loop "
    "does not"
)


def cpu_why(inner):
    """None, or a soft `Why`: on a JAX CPU every RNN runs Keras' masked loop
    (see the module docstring); not with `use_cudnn=True`."""
    if has_fused_rnn_kernel():
        return None
    if getattr(inner, "use_cudnn", "auto") is True:
        return None
    return _CPU_WHY


def options(inner, where, want_states):
    """`[(way, why)]`, best first: Keras' unmasked layer, else its masked
    loop (see the module docstring)."""
    hard = None
    if type(inner) is keras.layers.SimpleRNN and inner.cell.compute_dtype == "float64":
        hard = _FLOAT64_SIMPLE_RNN
    return keras_ways.options(
        inner,
        unmasked_soft=(
            keras_ways.states_why(inner, want_states, has_fused_rnn_kernel)
            or cpu_why(inner)
        ),
        unmasked_hard=hard,
    )


def describe(way, inner, want_states, options):
    """The `kernel_info()` sentence for `way`."""
    return keras_ways.describe(way, inner, options)


def run(way, inner, x, initial_state, training, steps, want_states):
    """Runs `way` over valid-first `x`; `(outputs, states or None)`."""
    return keras_ways.run(way, inner, x, initial_state, training, steps)
