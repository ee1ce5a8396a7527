"""The JAX backend: cuDNN's LSTM on a GPU, length tiers, Keras' layers.

On a CUDA GPU an LSTM runs `"jax-fused"` (`jax_fused`, cuDNN) and a GRU
Keras' unmasked layer over valid-first data (JAX has no cuDNN GRU; Keras'
scan over input projections computed up front beats the tiers' row groups
there). An LSTM or GRU on a CPU, and a SimpleRNN on a GPU, run
`"jax-tiers"` (`jax_tiers`). The rest runs Keras' masked loop: without a
GPU it costs about what the unmasked one does, and needs no reordering.
"""

import jax
import keras
from keras import ops

from maskedrnn.backends import Reason, jax_fused, jax_tiers, keras_kernels, preference
from maskedrnn.backends.gather import flat_gather_time
from maskedrnn.backends.jax_rows import take_rows

NAME = "jax"
FUSED = "jax-fused"
TIERS = jax_tiers.KERNEL
KERNELS = (FUSED, TIERS, "keras-unmasked", "keras-masked")
ONE_CALL_KERNELS = (FUSED, TIERS)
# The tiers read the caller's order and place their outputs themselves.
IN_PLACE_KERNELS = (TIERS,)

layout = run_direction = keras_kernels.no_caller_order_kernel
scalar = keras_kernels.scalar
gather_or_zero = keras_kernels.gather_or_zero


def is_concrete(x):
    """True when `x` holds values (outside `jit` tracing)."""
    return not isinstance(x, jax.core.Tracer)


def host_readable(x):
    """True when `x`'s values can be read on the host with no device sync."""
    if not is_concrete(x):
        return False
    devices = getattr(x, "devices", None)
    return devices is None or all(d.platform == "cpu" for d in devices())


def invert_permutation(perm):
    """Inverts each row of int32 `(batch, time)` permutations (a scatter)."""
    shape = ops.shape(perm)
    batch, time = shape[0], shape[1]
    dest = perm + ops.expand_dims(ops.arange(batch, dtype="int32") * time, 1)
    src = ops.broadcast_to(ops.expand_dims(ops.arange(time, dtype="int32"), 0), shape)
    flat = ops.scatter(
        ops.reshape(dest, (-1, 1)), ops.reshape(src, (-1,)), (batch * time,)
    )
    return ops.reshape(ops.cast(flat, "int32"), shape)


def gather_time(x, index):
    """`x[b, index[b, t], ...]` for int32 `index` in range: one row gather
    of the `(batch * time, ...)` view (`take_rows`)."""
    return flat_gather_time(x, index, take_rows)


def has_fused_rnn_kernel():
    """True when Keras' LSTM/GRU may run cuDNN here, by Keras' own test."""
    from maskedrnn._keras_private import keras_backend_rnn

    return bool(keras_backend_rnn(NAME)._is_gpu_available())


_CPU_REASON = preference(
    "JAX has no fused RNN kernel without a GPU, so Keras' masked loop "
    "costs about what its unmasked loop does, and running it on the "
    "batch as it is saves the valid-first reordering"
)

_FLOAT64_SIMPLE_RNN = Reason(
    "float64 SimpleRNN on JAX: Keras' unmasked loop mixes a float32 "
    "step into the float64 carry and fails ('scan body function carry "
    "input and carry output must have equal types'); its masked loop "
    "does not"
)


def cpu_reason(inner):
    """A preference `Reason` for Keras' masked loop on a CPU, else None."""
    if has_fused_rnn_kernel():
        return None
    if getattr(inner, "use_cudnn", "auto") is True:
        return None
    return _CPU_REASON


_REFERENCE_REASON = preference(
    "no CUDA GPU: the kernel would run jax.experimental.rnn.lstm_ref, the "
    "pure-JAX reference of cuDNN's call, which is slower than Keras' loop "
    "on a CPU"
)

_DIFFERENT_DIRECTIONS = Reason(
    "the two directions differ in units or dtype, and one cuDNN call runs "
    "directions of one size"
)


def one_call_option_reason(inner):
    """None when `"jax-fused"` runs `inner` and is preferred, else a `Reason`."""
    text = jax_fused.equations_reason(inner)
    if text is not None:
        return Reason(text)
    if not jax_fused.cudnn_present():
        return _REFERENCE_REASON
    return None


def one_call_reason(inners):
    """None when `inners` can share one call of a one-call kernel, else a `Reason`."""
    text = jax_tiers.same_shapes_reason(inners)
    if text is not None:
        return Reason(text)
    first = inners[0].cell
    for other in inners[1:]:
        cell = other.cell
        if cell.units != first.units or cell.compute_dtype != first.compute_dtype:
            return _DIFFERENT_DIRECTIONS
    return None


_USE_CUDNN_TRUE = preference(
    "the inner layer has use_cudnn=True, which asks for Keras' cuDNN kernel"
)


_KERAS_CUDNN_LSTM = preference(
    "Keras' LSTM may run cuDNN here (a GPU), which is faster than the tiers"
)


_KERAS_GRU_GPU = preference(
    "on a GPU Keras' unmasked GRU (one scan, the input projections computed "
    "up front) runs faster than the tiers' row groups"
)


_SIMPLE_RNN_CPU = preference(
    "a SimpleRNN's step is one small matmul: on a CPU the tiers' per-step "
    "bookkeeping and reordering cost what the skipped steps save, so "
    "Keras' masked loop runs it there"
)


def tiers_reason(inner):
    """None when `"jax-tiers"` runs `inner` exactly and is preferred.

    Else a blocking `Reason` for other equations, or a preference when cuDNN serves
    the layer or it is a SimpleRNN on a CPU.
    """
    text = jax_tiers.equations_reason(inner)
    if text is not None:
        return Reason(text)
    if getattr(inner, "use_cudnn", "auto") is True:
        return _USE_CUDNN_TRUE
    if type(inner) is keras.layers.SimpleRNN and not has_fused_rnn_kernel():
        return _SIMPLE_RNN_CPU
    if type(inner) is keras.layers.GRU and has_fused_rnn_kernel():
        return _KERAS_GRU_GPU
    if (
        type(inner) is keras.layers.LSTM
        and inner.use_cudnn is not False
        and has_fused_rnn_kernel()
    ):
        return _KERAS_CUDNN_LSTM
    return None


_SYMBOLIC_SHAPE = Reason(
    "the batch or time size is symbolic (jax.export's shape polymorphism, "
    "as when Keras' exporter traces a dynamic batch): the tiers' row groups "
    "are static slices of the batch"
)


def static_shape_reason(where):
    """A blocking `Reason` when the inputs `where` have a symbolic batch or time."""
    shape = getattr(where, "shape", ())
    if len(shape) == 3 and not all(d is None or isinstance(d, int) for d in shape[:2]):
        return _SYMBOLIC_SHAPE
    return None


def options(inner, where, want_states):
    """`[(kernel, reason)]`, best first: cuDNN, tiers, Keras' unmasked, masked."""
    tiers = tiers_reason(inner)
    if tiers is None or not tiers.blocking:
        tiers = static_shape_reason(where) or tiers
    fused = [(FUSED, one_call_option_reason(inner)), (TIERS, tiers)]
    blocking = None
    if type(inner) is keras.layers.SimpleRNN and inner.cell.compute_dtype == "float64":
        blocking = _FLOAT64_SIMPLE_RNN
    return fused + keras_kernels.options(
        inner,
        unmasked_preference=(
            keras_kernels.states_reason(inner, want_states, has_fused_rnn_kernel)
            or cpu_reason(inner)
        ),
        unmasked_blocking=blocking,
    )


def describe(kernel, inner, want_states, options):
    """The `kernel_info()` sentence for `kernel`."""
    if kernel == FUSED:
        text = (
            "one jax.experimental.rnn.lstm call for every direction over "
            "valid-first data, a padding flag holding the state over each "
            "row's tail (cuDNN's LSTM; exact final [h, c])"
        )
        reason = dict(options).get(FUSED)
        if reason is not None:
            text += f", here its pure-JAX reference lstm_ref ({reason})"
        return text
    if kernel == TIERS:
        return jax_tiers.describe(inner)
    return keras_kernels.describe(kernel, inner, options)


def run_one_call(kernel, inners, x, steps, initial_states, want_states):
    """Every direction of a call in one `"jax-fused"` or `"jax-tiers"` call."""
    if kernel == TIERS:
        return jax_tiers.run_one_call(inners, x, steps, initial_states, want_states)
    if kernel != FUSED:
        raise NotImplementedError(f"{kernel!r} is not a one-call kernel of JAX")
    weights = [jax_fused.cell_weights(inner) for inner in inners]
    initial = None
    if any(s is not None for s in initial_states):
        batch = ops.shape(x)[0]
        initial = [
            s
            if s is not None
            else [ops.zeros((batch, i.cell.units), i.compute_dtype) for _ in range(2)]
            for s, i in zip(initial_states, inners)
        ]
    y, states = jax_fused.lstm(x, steps.lengths, weights, initial)
    return y, [list(s) if want_states else [] for s in states]


def run_one_call_in_place(
    kernel, inners, x, steps, initial_states, dropout_masks, want_states, place
):
    """Every direction of a call in one `"jax-tiers"` call over `x` in the
    caller's order, each direction's inputs times its `(batch, features)`
    input dropout mask (None: no dropout), the outputs placed as `place`
    says (`run_plan`'s `place`); `(outputs, states)`, the directions side by
    side."""
    if kernel != TIERS:
        raise NotImplementedError(f"{kernel!r} reads valid-first data only")
    mask = steps.mask if steps.masked else None
    y, states = jax_tiers.run_in_place(
        inners, x, mask, initial_states, place, dropout_masks=dropout_masks
    )
    return y, [list(s) if want_states else [] for s in states]


def run(kernel, inner, x, initial_state, training, steps, want_states):
    """Runs `kernel` over valid-first `x`; `(outputs, states or None)`."""
    if kernel == FUSED:
        y, states = run_one_call(
            kernel, [inner], x, steps, [initial_state], want_states
        )
        return y, states[0] if want_states else []
    if kernel == TIERS:
        y, states = jax_tiers.run(inner, x, steps.lengths, initial_state)
        return y, states if want_states else []
    return keras_kernels.run(kernel, inner, x, initial_state, training, steps)
