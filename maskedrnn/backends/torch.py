"""The torch backend: PyTorch's own RNN kernels on a CPU, Keras' layers elsewhere.

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

Nothing is tried and caught: `unavailable_reason` checks every condition up
front and says in words why a layer cannot use these kernels; it then runs
Keras' inner layer as on the other backends (exact as well, slower on a
CPU), and `kernel_info()` says which runs.
"""

import keras
import torch
from keras import ops

from maskedrnn.backends import Why, keras_ways, soft
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
WAYS = ("torch-packed", "torch-unpacked", "keras-unmasked", "keras-masked")
FUSED_WAYS = ()
run_fused = keras_ways.no_fused_kernel
fused_why = keras_ways.fused_why

_SIGMOID = (keras.activations.sigmoid, torch.sigmoid, keras.ops.sigmoid)
_TANH = TANH
_RELU = (keras.activations.relu, torch.relu, keras.ops.relu)


def is_concrete(x):
    """True when `x` holds values: eager torch, outside `torch.compile`
    tracing."""
    compiling = getattr(torch.compiler, "is_compiling", lambda: False)
    return not compiling() and not getattr(x, "_is_symbolic", False)


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
    device_type = _device_type(where)
    if device_type == "cuda":
        return lambda: (
            "on CUDA, Keras' backend already calls PyTorch's cuDNN kernel for "
            "an unmasked LSTM/GRU"
        )
    if device_type != "cpu":
        return lambda: f"inputs are on a {device_type!r} device, not the CPU"
    if getattr(inner, "use_cudnn", "auto") is False:
        return lambda: "the inner layer has use_cudnn=False, which asks for Keras' loop"
    compiling = getattr(torch.compiler, "is_compiling", lambda: False)
    if torch.jit.is_tracing() or compiling():
        return lambda: (
            "inside torch.jit tracing or torch.compile, Keras' loop is traced"
        )
    cell = inner.cell
    if cell.recurrent_dropout:
        return lambda: "recurrent_dropout > 0 (PyTorch's kernels have none)"
    if inner.activity_regularizer is not None:
        return lambda: (
            "the inner layer has an activity_regularizer (applied by Keras' call)"
        )
    if cell.variable_dtype not in ("float32", "float64") or (
        cell.compute_dtype != cell.variable_dtype
    ):
        return lambda: (
            f"dtype policy {cell.dtype_policy.name!r}: the native path is used "
            "for float32 and float64 only"
        )
    if kind is SimpleRNN:
        if cell.activation not in _TANH + _RELU:
            return lambda: "SimpleRNN activation is not tanh or relu"
        return None
    if cell.activation not in _TANH or cell.recurrent_activation not in _SIGMOID:
        return lambda: "activation must be tanh and recurrent_activation sigmoid"
    if kind is GRU and not cell.reset_after:
        return lambda: "GRU with reset_after=False (PyTorch's GRU is reset-after)"
    return None


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


def options(inner, where, want_states):
    """`[(way, why)]`, best first: PyTorch's kernels on a CPU (packed or
    unpacked, `packed_preferred`), else Keras' unmasked layer, else its
    masked loop."""
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
    return torch_ways + keras_ways.options(inner)


def describe(way, inner, want_states, options):
    """The `kernel_info()` sentence for `way`."""
    if not way.startswith("torch"):
        text = keras_ways.describe(way, inner, options)
        native = dict(options)["torch-unpacked"]
        if way == "keras-unmasked" and native is not None and native.hard:
            text += f". Not PyTorch's native kernel: {native}"
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


def run(way, inner, x, initial_state, training, steps, want_states):
    """Runs `way` over valid-first `x`; `(outputs, states or None)`.

    The torch ways: `"torch-packed"` runs only the valid steps, packed as
    `torch.nn.utils.rnn.pack_padded_sequence` packs them, and returns the
    exact final states; `"torch-unpacked"` runs every step of `x` (whose
    padded tail the caller has zeroed) and, with `want_states`, returns the
    states after each row's last valid step too (`h` read off the outputs,
    an LSTM's `c` from the kernel, its padded steps made no-ops for `c`).
    """
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
