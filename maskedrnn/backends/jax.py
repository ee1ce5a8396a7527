"""The JAX backend: cuDNN's LSTM on a GPU, length tiers, Keras' layers.

JAX has no fused RNN kernel without a GPU: Keras' JAX backend reaches cuDNN
only on one, and its unmasked GRU kernel (a `lax.scan` over input
projections computed up front) runs slower than its generic loop on a CPU.
So there a Keras RNN that the length tiers (below) do not compute runs a
`lax.scan` step loop, masked or not, at nearly the same cost: Keras' masked
loop on the caller's order is exact and needs no valid-first reordering
(`cpu_why`), unless the wrapped layer says `use_cudnn=True`. An LSTM whose
final states are wanted follows TensorFlow's rule (`keras_ways.states_why`).

On a CUDA GPU an LSTM runs `"jax-fused"` (`maskedrnn.backends.jax_fused`):
both directions of a call in one `jax.experimental.rnn.lstm` call, cuDNN's
LSTM with per-row sequence lengths, over valid-first data: cuDNN reverses
each row by its own length for the backward direction and returns the
exact final `[h, c]`. Elsewhere the way is forceable and runs
`jax.experimental.rnn.lstm_ref`, the pure-JAX reference of that call (the
same equations; slower than Keras' loop on a CPU, so not the default
there).

An LSTM, GRU or SimpleRNN elsewhere may run `"jax-tiers"`
(`maskedrnn.backends.jax_tiers`): its rows sorted by length and run in
length tiers, so padded steps are computed only until a tier's longest row
ends, with exact final states and its own gradient; the default for an
LSTM or GRU on a CPU, and for a GRU or SimpleRNN on a GPU (JAX has no
cuDNN GRU). A SimpleRNN on a CPU runs Keras' masked loop, its step being
too small for the tiers to gain. What the tiers do not compute exactly
(`jax_tiers.equations_why`) runs Keras' layer.
"""

import jax
import keras
from keras import ops

from maskedrnn.backends import Why, jax_fused, jax_tiers, keras_ways, soft

NAME = "jax"
FUSED = "jax-fused"
TIERS = jax_tiers.WAY
WAYS = (FUSED, TIERS, "keras-unmasked", "keras-masked")
FUSED_WAYS = (FUSED, TIERS)

layout = run_direction = keras_ways.no_caller_order_kernel
scalar = keras_ways.scalar


def is_concrete(x):
    """True when `x` holds values (outside `jit` tracing)."""
    return not isinstance(x, jax.core.Tracer)


def host_readable(x):
    """True when `x`'s values can be read on the host with no device sync:
    concrete (`is_concrete`) and not an array on an accelerator. Lengths on
    a GPU are checked on the device instead (`maskedrnn._checks.
    check_lengths`: bad rows come out NaN)."""
    if not is_concrete(x):
        return False
    devices = getattr(x, "devices", None)
    return devices is None or all(d.platform == "cpu" for d in devices())


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


_REFERENCE_WHY = soft(
    "no CUDA GPU: the way would run jax.experimental.rnn.lstm_ref, the "
    "pure-JAX reference of cuDNN's call, which is slower than Keras' loop "
    "on a CPU"
)

_DIFFERENT_DIRECTIONS = Why(
    "the two directions differ in units or dtype, and one cuDNN call runs "
    "directions of one size"
)


def fused_option_why(inner):
    """None when `"jax-fused"` runs `inner` here and is preferred: a hard
    `Why` when its equations are not the layer's
    (`jax_fused.equations_why`), a soft one without a CUDA GPU."""
    text = jax_fused.equations_why(inner)
    if text is not None:
        return Why(text)
    if not jax_fused.cudnn_present():
        return _REFERENCE_WHY
    return None


def fused_why(inners):
    """None when `inners` can share one call of a one-call way, else a hard
    `Why` (one cuDNN call, or one tiered recurrence: the same RNN type,
    units and compute dtype)."""
    text = jax_tiers.same_shapes_why(inners)
    if text is not None:
        return Why(text)
    first = inners[0].cell
    for other in inners[1:]:
        cell = other.cell
        if cell.units != first.units or cell.compute_dtype != first.compute_dtype:
            return _DIFFERENT_DIRECTIONS
    return None


_USE_CUDNN_TRUE = soft(
    "the inner layer has use_cudnn=True, which asks for Keras' cuDNN kernel"
)


_KERAS_CUDNN_LSTM = soft(
    "Keras' LSTM may run cuDNN here (a GPU), which is faster than the tiers"
)


_SIMPLE_RNN_CPU = soft(
    "a SimpleRNN's step is one small matmul: on a CPU the tiers' per-step "
    "bookkeeping and reordering cost what the skipped steps save, so "
    "Keras' masked loop runs it there"
)


def tiers_why(inner):
    """None when `"jax-tiers"` runs `inner` exactly and is preferred: a
    hard `Why` when its equations are not the layer's
    (`jax_tiers.equations_why`), a soft one when the layer asks for cuDNN,
    is an LSTM that Keras may run on cuDNN (a GPU; JAX has no cuDNN GRU,
    so a GRU runs the tiers there), or is a SimpleRNN on a CPU."""
    text = jax_tiers.equations_why(inner)
    if text is not None:
        return Why(text)
    if getattr(inner, "use_cudnn", "auto") is True:
        return _USE_CUDNN_TRUE
    if type(inner) is keras.layers.SimpleRNN and not has_fused_rnn_kernel():
        return _SIMPLE_RNN_CPU
    if (
        type(inner) is keras.layers.LSTM
        and inner.use_cudnn is not False
        and has_fused_rnn_kernel()
    ):
        return _KERAS_CUDNN_LSTM
    return None


_SYMBOLIC_SHAPE = Why(
    "the batch or time size is symbolic (jax.export's shape polymorphism, "
    "as when Keras' exporter traces a dynamic batch): the tiers' row groups "
    "are static slices of the batch"
)


def static_shape_why(where):
    """A hard `Why` when the inputs `where` (batch, time, features) have a
    symbolic batch or time size, else None (weights, or concrete sizes)."""
    shape = getattr(where, "shape", ())
    if len(shape) == 3 and not all(d is None or isinstance(d, int) for d in shape[:2]):
        return _SYMBOLIC_SHAPE
    return None


def options(inner, where, want_states):
    """`[(way, why)]`, best first: the one-call cuDNN LSTM, the length
    tiers, Keras' unmasked layer, else its masked loop (see the module
    docstring)."""
    tiers = tiers_why(inner)
    if tiers is None or not tiers.hard:
        tiers = static_shape_why(where) or tiers
    fused = [(FUSED, fused_option_why(inner)), (TIERS, tiers)]
    hard = None
    if type(inner) is keras.layers.SimpleRNN and inner.cell.compute_dtype == "float64":
        hard = _FLOAT64_SIMPLE_RNN
    return fused + keras_ways.options(
        inner,
        unmasked_soft=(
            keras_ways.states_why(inner, want_states, has_fused_rnn_kernel)
            or cpu_why(inner)
        ),
        unmasked_hard=hard,
    )


def describe(way, inner, want_states, options):
    """The `kernel_info()` sentence for `way`."""
    if way == FUSED:
        text = (
            "one jax.experimental.rnn.lstm call for every direction over "
            "valid-first data with per-row sequence lengths (cuDNN's LSTM; "
            "exact final [h, c] from the kernel)"
        )
        why = dict(options).get(FUSED)
        if why is not None:
            text += f", here its pure-JAX reference lstm_ref ({why})"
        return text
    if way == TIERS:
        return jax_tiers.describe(inner)
    return keras_ways.describe(way, inner, options)


def run_fused(way, inners, x, steps, initial_states, training, want_states):
    """Every direction of a call in one call (`maskedrnn.backends`' one-call
    interface): `"jax-fused"`, one `jax_fused.lstm` call (cuDNN on a CUDA
    GPU, its reference `lstm_ref` elsewhere; outputs zeros at padded
    positions), or `"jax-tiers"`, one tiered recurrence
    (`jax_tiers.run_fused`)."""
    if way == TIERS:
        return jax_tiers.run_fused(inners, x, steps, initial_states, want_states)
    if way != FUSED:
        raise NotImplementedError(f"{way!r} is not a one-call way of JAX")
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


def run(way, inner, x, initial_state, training, steps, want_states):
    """Runs `way` over valid-first `x`; `(outputs, states or None)`. The
    one-call way runs one direction here (the plan's valid-first route:
    input dropout while training, or directions on different ways)."""
    if way == FUSED:
        y, states = run_fused(
            way, [inner], x, steps, [initial_state], training, want_states
        )
        return y, states[0] if want_states else []
    if way == TIERS:
        y, states = jax_tiers.run(inner, x, steps.lengths, initial_state)
        return y, states if want_states else []
    return keras_ways.run(way, inner, x, initial_state, training, steps)
