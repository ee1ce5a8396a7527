"""The torch backend: PyTorch's own RNN kernels, on a CPU and in one call on CUDA.

Keras' torch backend hands an unmasked `LSTM`/`GRU` to PyTorch's fused
kernel (cuDNN) on CUDA only; on a CPU it steps through time in Python, one
small op at a time, and `SimpleRNN` always runs Keras' generic loop. So on
a CPU each direction runs PyTorch's own `torch.lstm`/`gru`/`rnn_tanh`/
`rnn_relu` instead (`maskedrnn.backends.torch_kernels`): a GRU's or
SimpleRNN's inference on the packed valid steps (`"torch-packed"`: padded
steps skipped, final states exact), everything else over the zero-padded
valid-first data (`"torch-unpacked"`: faster for training and for every
LSTM, whose unpacked kernel is PyTorch's fused oneDNN one; an LSTM's exact
final `c` then comes from the kernel itself, its padded steps made no-ops
for `c`, `torch_kernels.saturated_lstm`). A masked batch runs them from
the caller's order in one torch call per direction (`layout`,
`run_direction`, the plan's `"torch"` route); `run` serves valid-first
callers.

On CUDA an LSTM or GRU runs every direction of a call in one
`torch._VF.lstm` / `gru` call over the valid-first data (`"torch-fused"`,
`maskedrnn.backends.torch_fused`: cuDNN, both directions at once, the
padded steps made to hold the state); forced, the same call runs on a CPU.
Other layers on CUDA run Keras' unmasked inner layer.

Nothing is tried and caught: `unavailable_reason` checks every condition up
front and says in words why a layer cannot use these kernels; it then runs
Keras' inner layer as on the other backends (exact as well, slower on a
CPU), and `kernel_info()` says which runs.
"""

import keras
import torch
from keras import ops

from maskedrnn.backends import Why, keras_ways, soft, torch_fused
from maskedrnn.backends.torch_direction import Layout, _direction
from maskedrnn.backends.torch_direction import run_direction as _run_direction
from maskedrnn.backends.torch_kernels import (
    GRU,
    LSTM,
    TANH,
    SimpleRNN,
    _unpacked,
    as_tensor,
    autograd_function,
)

NAME = "torch"
WAYS = (
    "torch-packed",
    "torch-unpacked",
    "torch-fused",
    "keras-unmasked",
    "keras-masked",
)
FUSED_WAYS = ("torch-fused",)

_SIGMOID = (keras.activations.sigmoid, torch.sigmoid, keras.ops.sigmoid)
_TANH = TANH
_RELU = (keras.activations.relu, torch.relu, keras.ops.relu)


def is_concrete(x):
    """True when `x` holds values: eager torch, outside `torch.compile`
    tracing."""
    compiling = getattr(torch.compiler, "is_compiling", lambda: False)
    return not compiling() and not getattr(x, "_is_symbolic", False)


def host_readable(x):
    """True when `x`'s values can be read on the host with no device sync:
    concrete (`is_concrete`) and in CPU memory. Lengths on CUDA are checked
    on the device instead (`maskedrnn._checks.check_lengths`: bad rows
    come out NaN)."""
    return is_concrete(x) and _device_type(x) in HOST_DEVICE_TYPES


# Device types whose tensors `host_readable` reads on the host.
HOST_DEVICE_TYPES = ("cpu",)


def scalar(value, dtype):
    """A 0-d tensor of `value` (a Python number, or a scalar tensor) in
    `dtype`, on Keras' device, made by a fill: Keras' conversion of a Python
    number (`torch.as_tensor(value, device=...)`) copies it from the host,
    which on CUDA waits for every queued kernel first."""
    dtype = keras.backend.standardize_dtype(dtype)
    if isinstance(value, torch.Tensor):
        return value.to(getattr(torch, dtype))
    from maskedrnn._keras_private import keras_torch_device

    device = keras_torch_device()
    return torch.full((), value, dtype=getattr(torch, dtype), device=device)


def invert_permutation(perm):
    """`inverse[b, perm[b, t]] = t` for each row of an int32 `(batch, time)`
    tensor of permutations: an argsort (Keras' torch `scatter` is slow)."""
    return ops.cast(ops.argsort(perm, axis=1), "int32")


def take_rows(flat, index):
    """`flat[index]`: rows of `flat` (axis 0) gathered by an integer tensor
    `index` of any shape, giving `index.shape + flat.shape[1:]`.

    `index_select`, not `keras.ops.take`: Keras runs
    `torch.nn.functional.embedding` there, whose backward sorts the
    indices; `index_select` is the same gather with a plain scatter-add
    backward.
    """
    index = ops.convert_to_tensor(index)
    rows = torch.index_select(flat, 0, index.reshape(-1).to(torch.int64))
    return rows.reshape(tuple(index.shape) + tuple(flat.shape[1:]))


def has_fused_rnn_kernel():
    """False: on torch a CUDA device is checked per tensor
    (`unavailable_reason`), and its CPU kernels are PyTorch's own."""
    return False


def unavailable_reason(inner, where):
    """Why `inner` cannot run on PyTorch's native kernel here, or None if it can.

    Args:
        inner: The inner RNN layer (built).
        where: Where the data is: a tensor or Keras variable (its device), a
            `torch.device`, a device string such as `"cpu"` or `"cuda"`, or
            None (Keras' default device).

    Returns:
        None when the kernels may run; otherwise a sentence naming the
        condition that fails and what runs instead.
    """
    text = _unavailable(inner, where)
    return None if text is None else text()


def _unavailable(inner, where):
    """None, or a function of no arguments returning `unavailable_reason`'s
    sentence (built only when asked for)."""
    kind = type(inner)
    if kind not in (LSTM, GRU, SimpleRNN):
        return lambda: (
            f"{kind.__name__} has no PyTorch kernel (LSTM, GRU and SimpleRNN do)"
        )
    # The layer's own reasons first: they hold on every device (on CUDA a
    # device reason would hide that cuDNN cannot compute the layer either).
    why = _settings_unavailable(inner) or _equations_unavailable(inner)
    if why is not None:
        return why
    device_type = _device_type(where)
    if device_type == "cuda":
        return lambda: (
            "on CUDA, cuDNN runs through the one-call way ('torch-fused'); "
            "PyTorch's caller's-order kernels are the CPU's (they read the "
            "lengths on the host)"
        )
    if device_type != "cpu":
        return lambda: f"inputs are on a {device_type!r} device, not the CPU"
    cell = inner.cell
    if cell.variable_dtype not in ("float32", "float64") or (
        cell.compute_dtype != cell.variable_dtype
    ):
        return lambda: (
            f"dtype policy {cell.dtype_policy.name!r}: the native path is used "
            "for float32 and float64 only"
        )
    return None


def _settings_unavailable(inner):
    """None, or a function giving the sentence of the inner layer's setting
    that PyTorch's kernels do not have."""
    if getattr(inner, "use_cudnn", "auto") is False:
        return lambda: "the inner layer has use_cudnn=False, which asks for Keras' loop"
    compiling = getattr(torch.compiler, "is_compiling", lambda: False)
    if torch.jit.is_tracing() or compiling():
        return lambda: (
            "inside torch.jit tracing or torch.compile, Keras' loop is traced"
        )
    if inner.cell.recurrent_dropout:
        return lambda: "recurrent_dropout > 0 (PyTorch's kernels have none)"
    if inner.activity_regularizer is not None:
        return lambda: (
            "the inner layer has an activity_regularizer (applied by Keras' call)"
        )
    return None


def _equations_unavailable(inner):
    """None, or a function giving the sentence of why the inner layer's
    equations are not PyTorch's."""
    cell = inner.cell
    if type(inner) is SimpleRNN:
        if cell.activation not in _TANH + _RELU:
            return lambda: "SimpleRNN activation is not tanh or relu"
        return None
    if cell.activation not in _TANH or cell.recurrent_activation not in _SIGMOID:
        return lambda: "activation must be tanh and recurrent_activation sigmoid"
    if type(inner) is GRU and not cell.reset_after:
        return lambda: (
            "GRU with reset_after=False (PyTorch's and cuDNN's GRU compute "
            "reset_after=True)"
        )
    return None


def fused_unavailable_reason(inner, where):
    """Why `inner` cannot run the `"torch-fused"` way here, or None if it
    can (on CUDA, and forced on a CPU).

    Args:
        inner: The inner RNN layer (built).
        where: As in `unavailable_reason`.

    Returns:
        None, or a sentence naming the condition that fails.
    """
    text = _fused_unavailable(inner, where)
    return None if text is None else text()


def _fused_unavailable(inner, where):
    kind = type(inner)
    if kind not in torch_fused.KINDS:
        return lambda: (
            f"{kind.__name__} has no one-call kernel (LSTM and GRU do: their "
            "padded steps can be made to hold the state)"
        )
    device_type = _device_type(where)
    if device_type not in ("cpu", "cuda"):
        return lambda: f"inputs are on a {device_type!r} device, not CUDA or the CPU"
    why = _settings_unavailable(inner)
    if why is not None:
        return why
    if inner.unroll:
        # JAX's one-call way declines it too; Keras' own layer leaves
        # cuDNN for its unrolled loop.
        return lambda: "unroll=True asks for Keras' unrolled loop"
    dtype = inner.cell.compute_dtype
    if dtype not in ("float16", "bfloat16", "float32", "float64"):
        return lambda: f"compute dtype {dtype!r} is not a float PyTorch's RNNs take"
    return _equations_unavailable(inner)


def fused_why(inners):
    """None when `inners` can share one `"torch-fused"` call, else a hard
    `Why`: the two directions of one call need the same layer type, units,
    bias and compute dtype (one kernel call, one weight layout)."""
    first = inners[0]
    for other in inners[1:]:
        if (
            type(other) is not type(first)
            or other.cell.units != first.cell.units
            or other.cell.use_bias != first.cell.use_bias
            or other.cell.compute_dtype != first.cell.compute_dtype
        ):
            return _DIFFERENT_DIRECTIONS
    return None


_DIFFERENT_DIRECTIONS = Why(
    "the two directions differ in layer type, units, use_bias or dtype, "
    "and one kernel call runs directions of one kind"
)


def _device_type(where):
    """`"cpu"`, `"cuda"`, `"meta"`, ... for a device, tensor or variable."""
    if where is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if isinstance(where, keras.Variable):
        where = where.value
    if isinstance(where, str):
        where = torch.device(where)
    if isinstance(where, torch.device):
        return where.type
    if isinstance(where, torch.Tensor):
        return where.device.type
    return as_tensor(where).device.type  # numpy or lists: where Keras puts them


def packed_preferred(inner):
    """Whether `run` should use the packed kernel for `inner` now: when no
    gradient is being recorded (inference) and `inner` is a GRU or
    SimpleRNN, with or without final states (an LSTM's exact final states
    come from its unpacked kernel, `saturated_lstm`).

    PyTorch's packed CPU kernels skip the padded steps and return exact
    final states, but their backward pass is slower than the unpacked
    kernels', and an unpacked LSTM runs PyTorch's fused oneDNN kernel,
    which the packed one does not (docs/benchmarks.md). So training runs
    the unpacked kernel over the zero-padded valid-first data (a GRU's is
    `GRUFunction`), and so does every LSTM call: with its final states
    wanted, the padded steps are made to leave the cell state untouched
    (`saturated_lstm`), so the kernel's own final `c` is exact; `h` is
    read at each row's length. A GRU's or SimpleRNN's inference runs
    packed (their packed kernel is the faster one there).
    """
    if torch.is_grad_enabled():
        return False
    return type(inner) is not LSTM


_GRAD_RECORDED = Why(
    "gradients are recorded: the packed kernel serves inference (its "
    "backward pass is slower than the unpacked kernel's)"
)
_LSTM_UNPACKED = soft(
    "an unpacked LSTM runs PyTorch's fused oneDNN kernel, faster than the packed one"
)
_PACKED_FASTER = soft(
    "no gradient is recorded: the packed kernel skips the padded steps"
)
_FUSED_ON_CPU = soft(
    "on a CPU PyTorch's caller's-order kernels ('torch-unpacked', "
    "'torch-packed') are the default plan; the one-call way is the CUDA one"
)


def options(inner, where, want_states):
    """`[(way, why)]`, best first: on CUDA the one-call way
    (`"torch-fused"`); on a CPU PyTorch's kernels (packed or unpacked,
    `packed_preferred`), then the one-call way (forceable); else Keras'
    unmasked layer, else its masked loop."""
    fused = _fused_unavailable(inner, where)
    if fused is not None:
        fused = [("torch-fused", Why(fused))]
    elif _device_type(where) == "cuda":
        return [("torch-fused", None)] + _caller_order_options(inner, where) + (
            keras_ways.options(inner)
        )
    else:
        fused = [("torch-fused", _FUSED_ON_CPU)]
    return _caller_order_options(inner, where) + fused + keras_ways.options(inner)


def _caller_order_options(inner, where):
    """`[(way, why)]` of `"torch-packed"` and `"torch-unpacked"`."""
    native = _unavailable(inner, where)
    if native is not None:
        native = Why(native)
        torch_ways = [("torch-packed", native), ("torch-unpacked", native)]
    elif torch.is_grad_enabled():
        torch_ways = [("torch-unpacked", None), ("torch-packed", _GRAD_RECORDED)]
    elif type(inner) is LSTM:
        torch_ways = [("torch-unpacked", None), ("torch-packed", _LSTM_UNPACKED)]
    else:
        torch_ways = [("torch-packed", None), ("torch-unpacked", _PACKED_FASTER)]
    return torch_ways


def describe(way, inner, want_states, options):
    """The `kernel_info()` sentence for `way`."""
    if way == "torch-fused":
        return _describe_fused(inner, options)
    if not way.startswith("torch"):
        text = keras_ways.describe(way, inner, options)
        if way == "keras-unmasked":
            text += _not_native(options)
        return text
    name = type(inner).__name__
    kernel = f"PyTorch's native {name} kernel"
    function = autograd_function(inner)
    if function is not None and way == "torch-unpacked":
        kernel = (
            f"PyTorch's native {name} equations run by torch_kernels."
            f"{function.__name__} (torch ops with a cheaper backward pass "
            "than PyTorch's kernel's)"
        )
    text = (
        f"{kernel} (torch backend on CPU, where Keras would step through "
        "time in Python), "
    )
    if way == "torch-packed":
        return text + (
            "on the packed valid steps (no gradient recorded): padded "
            "steps are skipped and the final states are exact"
        )
    text += (
        "unmasked over the zero-padded valid-first data (faster here "
        "than the packed kernel: gradients are recorded, or an LSTM "
        "runs PyTorch's fused oneDNN kernel)"
    )
    if type(inner) is LSTM and want_states:
        text += (
            "; its padded steps leave the cell state untouched (forget "
            "gate 1, input gate 0), so the kernel's final c is exact"
        )
    return text


def _not_native(options):
    """What stops PyTorch's kernels (caller's-order and one-call), each
    reason said once, for a Keras way's sentence; "" when none is hard."""
    found = dict(options)
    reasons = []
    for way in ("torch-unpacked", "torch-fused"):
        why = found.get(way)
        if why is not None and why.hard and str(why) not in reasons:
            reasons.append(str(why))
    if not reasons:
        return ""
    return ". Not PyTorch's kernels: " + "; ".join(reasons)


def _describe_fused(inner, options):
    """The `kernel_info()` sentence of the `"torch-fused"` way."""
    name = type(inner).__name__
    holds = (
        "forget gate 1 and input gate 0, so c is kept"
        if type(inner) is LSTM
        else "update gate 1, so h is kept"
    )
    text = (
        f"PyTorch's fused {name} kernel (torch._VF.{name.lower()}: cuDNN on "
        "CUDA, PyTorch's CPU kernel otherwise), every direction of the call "
        "in one call (bidirectional=True for both directions) over the "
        "valid-first data, whose padded steps hold the state (a padding "
        f"flag feature: {holds}): exact outputs and final states with no "
        "reversal gather and no state recomputation"
    )
    if type(inner) is LSTM:
        text += (
            "; with an initial state for the backward direction (an LSTM's h "
            "is not held over the padded tail it crosses first), that "
            "direction runs in a call of its own over its reversed rows"
        )
    why = dict(options).get("torch-fused")
    if why is not None:
        text += f" (not the default here: {why})"
    return text


def run_fused(way, inners, x, steps, initial_states, training, want_states):
    """Every direction of a call in one kernel call (`"torch-fused"`):
    `maskedrnn.backends`' one-call interface, `torch_fused.run`."""
    if way != "torch-fused":
        raise NotImplementedError(f"{way!r} is not a one-call way of torch")
    return torch_fused.run(inners, x, steps, initial_states, want_states)


def run(way, inner, x, initial_state, training, steps, want_states):
    """Runs `way` over valid-first `x`; `(outputs, states or None)`.

    The torch ways: `"torch-packed"` runs only the valid steps, packed as
    `torch.nn.utils.rnn.pack_padded_sequence` packs them, and returns the
    exact final states; `"torch-unpacked"` runs every step of `x` (whose
    padded tail the caller has zeroed) and, with `want_states`, returns the
    states after each row's last valid step too (`h` read off the outputs,
    an LSTM's `c` from the kernel, its padded steps made no-ops for `c`).
    """
    if way == "torch-fused":
        # One direction per call (the plan's valid-first route: input
        # dropout, or directions on different ways).
        y, states = torch_fused.run([inner], x, steps, [initial_state], want_states)
        return y, states[0] if want_states else []
    if not way.startswith("torch"):
        return keras_ways.run(way, inner, x, initial_state, training, steps)
    return run_native(way, inner, x, initial_state, steps, want_states)


def run_native(way, inner, x, initial_state, steps, want_states):
    """`run` for the torch ways: PyTorch's kernel over valid-first `x`."""
    packed = way == "torch-packed"
    if packed or want_states:
        layout = Layout(steps.valid, steps.lengths)
        return _direction(inner, x, initial_state, layout, False, "zeros", packed, True)
    dtype = as_tensor(inner.cell.kernel).dtype
    x = as_tensor(x).to(dtype)
    states = [as_tensor(state).to(dtype) for state in initial_state]
    return _unpacked(inner, x, states), None


def layout(steps):
    """The `Layout` of a batch for `run_direction` (computed once per call,
    shared by both directions), from its `Steps` in the reading order: the
    mask, and the lengths where the call knows them already."""
    return Layout(steps.mask, steps.known_lengths)


def run_direction(
    way,
    inner,
    x,
    layout,
    initial_state=None,
    reverse=False,
    place="zeros",
    want_states=True,
):
    """One direction on PyTorch's kernel `way`, from and back to the
    caller's order (`torch_direction.run_direction`)."""
    return _run_direction(
        inner,
        x,
        initial_state,
        layout,
        reverse,
        place,
        way == "torch-packed",
        want_states,
    )
