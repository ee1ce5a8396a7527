"""The two ways every backend has: Keras' inner layer unmasked, and masked.

- `"keras-unmasked"` (`run_unmasked`): the Keras inner layer called with no
  mask on valid-first data, so its backend may pick a fused kernel (cuDNN
  LSTM/GRU on GPU; on a JAX GPU a GRU runs Keras' `lax.scan` GRU kernel,
  JAX having no cuDNN GRU). No backend has a fused SimpleRNN kernel: an
  unmasked SimpleRNN runs Keras' generic step loop. The final states are
  then read at each row's length by the caller (`final_state`).
- `"keras-masked"` (`run_masked`): the Keras inner layer with a mask, in
  Keras' masked step loop: any RNN layer (`keras.layers.RNN(cell)`, custom
  cells, `recurrent_dropout > 0`), exact, and it returns the states itself.
  Given `mask=`, that loop reads the caller's mask as it is (the plan's
  `"masked_loop"` route, `maskedrnn.layers.direction.run_masked_loop`); here
  it reads valid-first data with the right-padded mask of the lengths.

`unmasked_why(inner)` says why an inner layer cannot run unmasked at all,
on any backend; each backend module adds its own reasons.
"""

import keras

from maskedrnn._keras_private import get_keras_mask
from maskedrnn.backends import Why, soft

# Layers whose per-step output *is* their hidden state h: for them the final
# state can be read off the unmasked output sequence at each row's last valid
# step (LSTM's cell state c is recomputed, see `final_state`).
UNMASKED_TYPES = (keras.layers.LSTM, keras.layers.GRU, keras.layers.SimpleRNN)

_NOT_FUSED = Why(
    lambda: "recurrent_dropout > 0 (no fused kernel has it)",
)


def unmasked_why(inner):
    """None when `inner` can run unmasked, else a hard `Why`."""
    if type(inner) not in UNMASKED_TYPES:
        name = type(inner).__name__
        return Why(
            lambda: f"{name} is not LSTM, GRU or SimpleRNN (no fused kernel to keep)"
        )
    if inner.cell.recurrent_dropout:
        return _NOT_FUSED
    return None


_STATES_WHY = soft(
    "its final [h, c] are wanted and Keras has no fused LSTM kernel here "
    "(no GPU, or use_cudnn=False), so its masked loop costs what its "
    "unmasked loop does and carries the exact states to each row's last "
    "valid step (no cell-state recomputation)"
)


def states_why(inner, want_states, has_fused_rnn_kernel):
    """None, or a soft `Why`: on TensorFlow and JAX, an LSTM whose final
    states are wanted, where Keras has no fused LSTM kernel (no GPU, or
    `use_cudnn=False`), runs Keras' masked loop (on TensorFlow, where
    TensorFlow's `BlockLSTMV2` does not run:
    `maskedrnn.backends.tensorflow_block_lstm`).

    Without a fused kernel Keras' unmasked and masked LSTM both run its
    generic step loop, at nearly the same cost, and the masked loop carries
    the exact `[h, c]` of each row to its last valid step; running unmasked
    would then cost a recomputation of the cell state (`final_state`) on
    top. Where cuDNN may run (a GPU) the LSTM stays unmasked and `c` is
    recomputed.

    Args:
        inner: The inner RNN.
        want_states: Bool, whether the final states are wanted.
        has_fused_rnn_kernel: The backend's function of that name.
    """
    if not want_states or type(inner) is not keras.layers.LSTM:
        return None
    if inner.use_cudnn is not False and has_fused_rnn_kernel():
        return None
    return _STATES_WHY


def options(inner, unmasked_soft=None, unmasked_hard=None):
    """`[("keras-unmasked", why), ("keras-masked", None)]` for `inner`:
    unmasked unless `unmasked_why` or the backend's `unmasked_hard` stops
    it, or its `unmasked_soft` prefers the masked loop."""
    why = unmasked_why(inner) or unmasked_hard or unmasked_soft
    return [("keras-unmasked", why), ("keras-masked", None)]


def describe(way, inner, options):
    """The `kernel_info()` sentence for a Keras way, chosen from `options`."""
    name = type(inner).__name__
    if way == "keras-masked":
        why = dict(options).get("keras-unmasked")
        return (
            f"Keras {name} in Keras' masked step loop, given the batch's mask "
            "as it is (mask=, no reordering) or the right-padded mask of "
            f"lengths=: {why if why is not None else 'asked for'}"
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
    """`x`, or a copy of it with no Keras mask attached.

    Keras fills a layer's `mask` argument from a mask attached to its input
    tensor; the inner RNNs must not get one, or they leave the fused kernel.
    """
    if get_keras_mask(x) is not None:
        return keras.ops.copy(x)
    return x


def run_unmasked(inner, x, initial_state, training):
    """`(outputs, None)`: `inner` over valid-first `x` with no mask (the
    caller reads the states at each row's length)."""
    y, *_ = inner(
        _without_keras_mask(x), initial_state=initial_state, training=training
    )
    return y, None


def run_masked(inner, x, initial_state, training, steps):
    """`(outputs, states)`: `inner` over valid-first `x` in Keras' masked
    loop, with the right-padded mask `steps.valid`."""
    y, *states = inner(
        x, mask=steps.valid, initial_state=initial_state, training=training
    )
    return y, list(states)


def run(way, inner, x, initial_state, training, steps):
    """Runs a Keras way on valid-first `x`; `(outputs, states or None)`."""
    if way == "keras-unmasked":
        return run_unmasked(inner, x, initial_state, training)
    if way == "keras-masked":
        return run_masked(inner, x, initial_state, training, steps)
    raise NotImplementedError(f"{way!r} is not a Keras way")


def scalar(value, dtype):
    """`scalar` of TensorFlow and JAX: a 0-d tensor of `value` (a Python
    number or a scalar tensor) in `dtype` (`keras.ops.cast`; no host copy
    to wait for there)."""
    return keras.ops.cast(value, dtype)


def no_caller_order_kernel(*args, **kwargs):
    """`layout` / `run_direction` of a backend without caller's-order
    kernels: it never offers a way that needs them."""
    raise NotImplementedError(
        f"the {keras.backend.backend()} backend has no caller's-order kernel "
        "(only torch's ways run both directions from the caller's order)"
    )


def no_fused_kernel(*args, **kwargs):
    """`run_fused` of a backend without one-call ways (`FUSED_WAYS = ()`):
    its plans never take the `"fused"` route."""
    raise NotImplementedError(
        f"the {keras.backend.backend()} backend has no one-call way (no "
        "kernel here runs every direction of a call at once)"
    )


def fused_why(inners):
    """`fused_why` of a backend without one-call ways: None (nothing to
    decline)."""
    return None
