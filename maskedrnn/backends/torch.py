"""The torch backend: PyTorch's own RNN kernels, on a CPU and in one call on CUDA.

On a CPU, where Keras steps through time in Python, each direction runs
PyTorch's kernels from the caller's order: packed for a GRU's or
SimpleRNN's inference (`"torch-packed"`), else unpacked over valid-first
data (`"torch-unpacked"`). On CUDA an LSTM or GRU runs every direction in
one cuDNN call (`"torch-fused"`). `unavailable_reason` checks every
condition up front; a layer that fails one runs Keras' own layer, and
`kernel_info()` says which runs.
"""

import keras
import torch
from keras import ops

from maskedrnn._keras_private import keras_torch_device
from maskedrnn.backends import Reason, keras_kernels, preference, torch_fused
from maskedrnn.backends.gather import flat_gather_time
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
KERNELS = (
    "torch-packed",
    "torch-unpacked",
    "torch-fused",
    "keras-unmasked",
    "keras-masked",
)
ONE_CALL_KERNELS = ("torch-fused",)
# No kernel of a call reads the caller's order and places its outputs itself.
IN_PLACE_KERNELS = ()
run_one_call_in_place = keras_kernels.no_in_place_kernel

_SIGMOID = (keras.activations.sigmoid, torch.sigmoid, keras.ops.sigmoid)
_TANH = TANH
_RELU = (keras.activations.relu, torch.relu, keras.ops.relu)


def is_concrete(x):
    """True when `x` holds values: outside `torch.compile` tracing."""
    compiling = getattr(torch.compiler, "is_compiling", lambda: False)
    return not compiling() and not getattr(x, "_is_symbolic", False)


def host_readable(x):
    """True when `x`'s values can be read on the host with no device sync."""
    return is_concrete(x) and _device_type(x) in HOST_DEVICE_TYPES


HOST_DEVICE_TYPES = ("cpu",)


def scalar(value, dtype):
    """A 0-d `dtype` tensor of `value` on Keras' device, made by a fill.

    Keras' conversion copies from the host, which on CUDA waits for every
    queued kernel.
    """
    dtype = keras.backend.standardize_dtype(dtype)
    if isinstance(value, torch.Tensor):
        return value.to(getattr(torch, dtype))
    device = keras_torch_device()
    return torch.full((), value, dtype=getattr(torch, dtype), device=device)


def invert_permutation(perm):
    """Inverts each row of int32 `(batch, time)` permutations (an argsort)."""
    return ops.cast(ops.argsort(perm, axis=1), "int32")


def take_rows(flat, index):
    """`flat[index]`, shape `index.shape + flat.shape[1:]`.

    Not `keras.ops.take`, whose `embedding` backward sorts the indices.
    """
    index = ops.convert_to_tensor(index)
    rows = torch.index_select(flat, 0, index.reshape(-1).to(torch.int64))
    return rows.reshape(tuple(index.shape) + tuple(flat.shape[1:]))


def gather_time(x, index):
    """`x[b, index[b, t], ...]` for int32 `index` in range: one row gather
    of the `(batch * time, ...)` view (`take_rows`)."""
    return flat_gather_time(x, index, take_rows)


def gather_or_zero(y, index, keep):
    """`gather_time(y, index)` where `keep` is True, zeros elsewhere, in a
    few torch calls: each `keras.ops` call adds Keras' dispatch, which the
    host pays before cuDNN's call is queued.

    Where `keep` is False the row's step 0 is gathered (`index` may be out
    of range there, as a rank of -1 is) and replaced by zeros
    (`torch.where`), so neither its values (inf or NaN in padding) nor a
    gradient reach the result.
    """
    y = ops.convert_to_tensor(y)
    batch, time = y.shape[0], y.shape[1]
    keep = ops.convert_to_tensor(keep)
    index = ops.convert_to_tensor(index).to(torch.int64)
    index = torch.where(keep, index, 0)
    # On Keras' device, as `scalar`'s fill and Keras' own ops make tensors.
    offsets = torch.arange(batch, device=keras_torch_device()) * time
    flat = y.reshape((batch * time,) + tuple(y.shape[2:]))
    out = take_rows(flat, index + offsets[:, None])
    keep = keep.reshape(tuple(keep.shape) + (1,) * (out.dim() - keep.dim()))
    return torch.where(keep, out, 0.0)


def has_fused_rnn_kernel():
    """False: torch checks the device per tensor (`unavailable_reason`)."""
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
    """None, or a function building `unavailable_reason`'s sentence."""
    kind = type(inner)
    if kind not in (LSTM, GRU, SimpleRNN):
        return lambda: (
            f"{kind.__name__} has no PyTorch kernel (LSTM, GRU and SimpleRNN do)"
        )
    # The layer's reasons first: a device reason would hide them.
    reason = _settings_unavailable(inner) or _equations_unavailable(inner)
    if reason is not None:
        return reason
    device_type = _device_type(where)
    if device_type == "cuda":
        return lambda: (
            "on CUDA, cuDNN runs through the one-call kernel ('torch-fused'); "
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
    """None, or a function naming a setting PyTorch's kernels lack."""
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
    """None, or a function saying why the equations are not PyTorch's."""
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
    """Why `inner` cannot run the `"torch-fused"` kernel here, or None if it
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
    reason = _settings_unavailable(inner)
    if reason is not None:
        return reason
    if inner.unroll:
        # JAX's one-call kernel declines it too; Keras' own layer leaves
        # cuDNN for its unrolled loop.
        return lambda: "unroll=True asks for Keras' unrolled loop"
    dtype = inner.cell.compute_dtype
    if dtype not in ("float16", "bfloat16", "float32", "float64"):
        return lambda: f"compute dtype {dtype!r} is not a float PyTorch's RNNs take"
    return _equations_unavailable(inner)


def one_call_reason(inners):
    """None when `inners` match enough to share one `"torch-fused"` call."""
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


_DIFFERENT_DIRECTIONS = Reason(
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
    """Whether `run` uses the packed kernel: a GRU's or SimpleRNN's inference.

    The packed kernels train slower, and an unpacked LSTM runs PyTorch's
    fused oneDNN kernel.
    """
    if torch.is_grad_enabled():
        return False
    return type(inner) is not LSTM


_GRAD_RECORDED = Reason(
    "gradients are recorded: the packed kernel serves inference (its "
    "backward pass is slower than the unpacked kernel's)"
)
_LSTM_UNPACKED = preference(
    "an unpacked LSTM runs PyTorch's fused oneDNN kernel, faster than the packed one"
)
_PACKED_FASTER = preference(
    "no gradient is recorded: the packed kernel skips the padded steps"
)
_FUSED_ON_CPU = preference(
    "on a CPU PyTorch's caller's-order kernels ('torch-unpacked', "
    "'torch-packed') are the default plan; the one-call kernel is the CUDA one"
)


def options(inner, where, want_states):
    """`[(kernel, reason)]`, best first: `"torch-fused"` first on CUDA only."""
    fused = _fused_unavailable(inner, where)
    if fused is not None:
        fused = [("torch-fused", Reason(fused))]
    elif _device_type(where) == "cuda":
        return [("torch-fused", None)] + _caller_order_options(inner, where) + (
            keras_kernels.options(inner)
        )
    else:
        fused = [("torch-fused", _FUSED_ON_CPU)]
    return _caller_order_options(inner, where) + fused + keras_kernels.options(inner)


def _caller_order_options(inner, where):
    """`[(kernel, reason)]` of `"torch-packed"` and `"torch-unpacked"`."""
    native = _unavailable(inner, where)
    if native is not None:
        native = Reason(native)
        torch_kernels = [("torch-packed", native), ("torch-unpacked", native)]
    elif torch.is_grad_enabled():
        torch_kernels = [("torch-unpacked", None), ("torch-packed", _GRAD_RECORDED)]
    elif type(inner) is LSTM:
        torch_kernels = [("torch-unpacked", None), ("torch-packed", _LSTM_UNPACKED)]
    else:
        torch_kernels = [("torch-packed", None), ("torch-unpacked", _PACKED_FASTER)]
    return torch_kernels


def describe(kernel, inner, want_states, options):
    """The `kernel_info()` sentence for `kernel`."""
    if kernel == "torch-fused":
        return _describe_fused(inner, options)
    if not kernel.startswith("torch"):
        text = keras_kernels.describe(kernel, inner, options)
        if kernel == "keras-unmasked":
            text += _not_native(options)
        return text
    name = type(inner).__name__
    what = f"PyTorch's native {name} kernel"
    function = autograd_function(inner)
    if function is not None and kernel == "torch-unpacked":
        what = (
            f"PyTorch's native {name} equations run by torch_kernels."
            f"{function.__name__} (torch ops with a cheaper backward pass "
            "than PyTorch's kernel's)"
        )
    text = (
        f"{what} (torch backend on CPU, where Keras would step through "
        "time in Python), "
    )
    if kernel == "torch-packed":
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
    """The blocking reasons that stop PyTorch's kernels, or ""."""
    found = dict(options)
    reasons = []
    for kernel in ("torch-unpacked", "torch-fused"):
        reason = found.get(kernel)
        if reason is not None and reason.blocking and str(reason) not in reasons:
            reasons.append(str(reason))
    if not reasons:
        return ""
    return ". Not PyTorch's kernels: " + "; ".join(reasons)


def _describe_fused(inner, options):
    """The `kernel_info()` sentence of the `"torch-fused"` kernel."""
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
    reason = dict(options).get("torch-fused")
    if reason is not None:
        text += f" (not the default here: {reason})"
    return text


def run_one_call(kernel, inners, x, steps, initial_states, want_states):
    """Every direction of a call in one kernel call (`torch_fused.run`)."""
    if kernel != "torch-fused":
        raise NotImplementedError(f"{kernel!r} is not a one-call kernel of torch")
    return torch_fused.run(inners, x, steps, initial_states, want_states)


def run(kernel, inner, x, initial_state, training, steps, want_states):
    """Runs `kernel` over valid-first `x`; `(outputs, states or None)`."""
    if kernel == "torch-fused":
        # One direction alone: input dropout, or directions on other kernels.
        y, states = torch_fused.run([inner], x, steps, [initial_state], want_states)
        return y, states[0] if want_states else []
    if not kernel.startswith("torch"):
        return keras_kernels.run(kernel, inner, x, initial_state, training, steps)
    return run_native(kernel, inner, x, initial_state, steps, want_states)


def run_native(kernel, inner, x, initial_state, steps, want_states):
    """`run` for the torch kernels: PyTorch's kernel over valid-first `x`."""
    packed = kernel == "torch-packed"
    if packed or want_states:
        layout = Layout(steps.valid, steps.lengths)
        return _direction(inner, x, initial_state, layout, False, "zeros", packed, True)
    dtype = as_tensor(inner.cell.kernel).dtype
    x = as_tensor(x).to(dtype)
    states = [as_tensor(state).to(dtype) for state in initial_state]
    return _unpacked(inner, x, states), None


def layout(steps):
    """The `Layout` of a batch, shared by both directions of a call."""
    return Layout(steps.mask, steps.known_lengths)


def run_direction(
    kernel,
    inner,
    x,
    layout,
    initial_state=None,
    reverse=False,
    place="zeros",
    want_states=True,
):
    """One direction on PyTorch's kernel `kernel`, in the caller's order."""
    return _run_direction(
        inner,
        x,
        initial_state,
        layout,
        reverse,
        place,
        kernel == "torch-packed",
        want_states,
    )
