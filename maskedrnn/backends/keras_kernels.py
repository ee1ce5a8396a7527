"""The two kernels every backend has: Keras' inner layer unmasked, and masked.

- `"keras-unmasked"`: the inner layer with no mask on valid-first data, so
  that its backend may pick a fused kernel; the caller reads the final
  states at each row's length.
- `"keras-masked"`: Keras' masked step loop, for any RNN layer, exact, and
  returning the states itself.
"""

import keras

from maskedrnn import backends
from maskedrnn._keras_private import get_keras_mask
from maskedrnn.backends import Reason, preference
from maskedrnn.backends.gather import gather_time

# Layers whose output is their h, so their final states can be read off it.
UNMASKED_TYPES = (keras.layers.LSTM, keras.layers.GRU, keras.layers.SimpleRNN)

_NOT_FUSED = Reason(
    lambda: "recurrent_dropout > 0 (no fused kernel has it)",
)


def unmasked_reason(inner):
    """None when `inner` can run unmasked, else a blocking `Reason`."""
    if type(inner) not in UNMASKED_TYPES:
        name = type(inner).__name__
        return Reason(
            lambda: f"{name} is not LSTM, GRU or SimpleRNN (no fused kernel to keep)"
        )
    if inner.cell.recurrent_dropout:
        return _NOT_FUSED
    return None


_STATES_REASON = preference(
    "its final [h, c] are wanted and Keras has no fused LSTM kernel here "
    "(no GPU, or use_cudnn=False), so its masked loop costs what its "
    "unmasked loop does and carries the exact states to each row's last "
    "valid step (no cell-state recomputation)"
)


def states_reason(inner, want_states, has_fused_rnn_kernel):
    """A preference `Reason` for Keras' masked loop: an LSTM's states, no fused kernel.

    Without one, both of Keras' loops cost about the same, and the masked
    one carries the exact `[h, c]` with no recomputation of `c`.

    Args:
        inner: The inner RNN.
        want_states: Bool, whether the final states are wanted.
        has_fused_rnn_kernel: The backend's function of that name.
    """
    if not want_states or type(inner) is not keras.layers.LSTM:
        return None
    if inner.use_cudnn is not False and has_fused_rnn_kernel():
        return None
    return _STATES_REASON


def options(inner, unmasked_preference=None, unmasked_blocking=None):
    """`[("keras-unmasked", reason), ("keras-masked", None)]` for `inner`."""
    reason = unmasked_reason(inner) or unmasked_blocking or unmasked_preference
    return [("keras-unmasked", reason), ("keras-masked", None)]


def describe(kernel, inner, options):
    """The `kernel_info()` sentence for a Keras kernel, chosen from `options`."""
    name = type(inner).__name__
    if kernel == "keras-masked":
        reason = dict(options).get("keras-unmasked")
        return (
            f"Keras {name} in Keras' masked step loop, given the batch's mask "
            "as it is (mask=, no reordering) or the right-padded mask of "
            f"lengths=: {reason if reason is not None else 'asked for'}"
        )
    if getattr(inner, "use_cudnn", "auto") is False:
        return (
            f"Keras {name}, unmasked, in Keras' generic step loop (the wrapped "
            "layer has use_cudnn=False)"
        )
    if type(inner) is keras.layers.SimpleRNN:
        return (
            f"Keras {name}, unmasked, in Keras' generic step loop (no backend "
            "has a fused SimpleRNN kernel; the loop runs without a mask)"
        )
    return (
        f"Keras {name}, unmasked: its backend's fused kernel (cuDNN on "
        "GPU) when available, else Keras' step loop without a mask"
    )


def _without_keras_mask(x):
    """`x` with no Keras mask attached, which would cost the fused kernel."""
    if get_keras_mask(x) is not None:
        return keras.ops.copy(x)
    return x


def run_unmasked(inner, x, initial_state, training):
    """`(outputs, None)`: `inner` over valid-first `x` with no mask."""
    y, *_ = inner(
        _without_keras_mask(x), initial_state=initial_state, training=training
    )
    return y, None


def run_masked(inner, x, initial_state, training, steps):
    """`(outputs, states)`: `inner` over valid-first `x` in Keras' masked loop."""
    y, *states = inner(
        x, mask=steps.valid, initial_state=initial_state, training=training
    )
    return y, list(states)


def run(kernel, inner, x, initial_state, training, steps):
    """Runs a Keras kernel on valid-first `x`; `(outputs, states or None)`."""
    if kernel == "keras-unmasked":
        return run_unmasked(inner, x, initial_state, training)
    if kernel == "keras-masked":
        return run_masked(inner, x, initial_state, training, steps)
    raise NotImplementedError(f"{kernel!r} is not a Keras kernel")


def scalar(value, dtype):
    """A 0-d tensor of `value` in `dtype`, for TensorFlow and JAX."""
    return keras.ops.cast(value, dtype)


def gather_or_zero(y, index, keep):
    """`gather_time(y, index)` where the bool `(batch, time_out)` `keep` is
    True, zeros elsewhere, in `keras.ops`: a step of zeros appended to `y`
    is read where `keep` is False (cheaper than a select after the gather),
    so what `index` points at there is never read."""
    ops = keras.ops
    time = backends.current().scalar(ops.shape(y)[1], "int32")
    index = ops.where(keep, index, time)
    y = ops.concatenate([y, ops.zeros_like(y[:, :1])], axis=1)
    return gather_time(y, index)


def no_caller_order_kernel(*args, **kwargs):
    """`layout`/`run_direction` of a backend without caller's-order kernels."""
    raise NotImplementedError(
        f"the {keras.backend.backend()} backend has no caller's-order kernel "
        "(only torch's kernels run both directions from the caller's order)"
    )


def no_one_call_kernel(*args, **kwargs):
    """`run_one_call` of a backend without one-call kernels."""
    raise NotImplementedError(
        f"the {keras.backend.backend()} backend has no one-call kernel (no "
        "kernel here runs every direction of a call at once)"
    )


def no_in_place_kernel(*args, **kwargs):
    """`run_one_call_in_place` of a backend whose one-call kernels, if any,
    read valid-first data only."""
    raise NotImplementedError(
        f"the {keras.backend.backend()} backend has no one-call kernel that "
        "reads the caller's order (only JAX's length tiers do)"
    )


def one_call_reason(inners):
    """`one_call_reason` of a backend without one-call kernels: None."""
    return None
