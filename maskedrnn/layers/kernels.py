"""Which code computes one direction of a masked RNN, and why.

`choose(inner, where)` returns `(runner, reason)`: the function that runs the
inner RNN over valid-first data and a sentence saying what it is and why it
was chosen (what `kernel_info()` reports). The runners, fastest first:

- `run_torch_packed` / `run_torch_native`: PyTorch's own `torch.lstm`/`gru`/
  `rnn_tanh`/`rnn_relu` (torch backend on CPU, where Keras would step through
  time in Python; `maskedrnn._torch_kernels`, the one torch-specific module):
  a GRU's or SimpleRNN's inference on the packed valid steps (padded steps
  skipped, final states exact), everything else over the zero-padded
  valid-first data (faster for training and for every LSTM, whose unpacked
  kernel is PyTorch's fused oneDNN one, `_torch_kernels.packed_preferred`;
  an LSTM's exact final `c` then comes from the kernel itself, its padded
  steps made no-ops for `c`, `_torch_kernels.saturated_lstm`; a GRU or
  SimpleRNN with gradients recorded runs PyTorch's equations in
  `_torch_kernels.GRUFunction` / `SimpleRNNFunction`, whose backward pass
  is cheaper). A masked batch runs them from the caller's order in one
  torch call (`direction.run_in_torch`); these runners serve valid-first
  callers;
- `run_keras_unmasked`: the Keras inner layer called with no mask, so its
  backend may pick a fused kernel (cuDNN LSTM/GRU on GPU; on a JAX GPU a
  GRU runs Keras' `lax.scan` GRU kernel, JAX having no cuDNN GRU). No
  backend has a fused SimpleRNN kernel: an unmasked SimpleRNN runs Keras'
  generic step loop;
- `run_keras_masked`: the Keras inner layer with a right-padded mask, for
  layers that have no fused kernel to keep (`keras.layers.RNN(cell)`, custom
  cells, `recurrent_dropout > 0`), for an LSTM whose final states are wanted
  where Keras has no fused LSTM kernel (TensorFlow and JAX without a GPU,
  `states_reason`), for every RNN on a JAX CPU (no fused kernel there at
  all, `jax_cpu_reason`), and for one Keras bug (float64 SimpleRNN on JAX). Exact,
  and it returns the states itself. Since that loop reads any mask, a batch
  given with `mask=` skips the valid-first reordering for these layers and
  runs `direction.run_masked_loop` on the caller's order instead
  (`direction.loops_over_mask`); this runner serves `lengths=`.

Every runner takes `(inner, x, initial_state, training, steps, want_states)`,
where `x` is valid-first, `steps` the batch's `direction.Steps`
(`steps.valid` is its right-padded `(batch, time)` mask, `steps.lengths` the
lengths) and `want_states` whether the caller needs the final states, and
returns `(outputs, states)`: `states` is None when the caller must compute
them at each row's length (`final_state.states_at_length`).
"""

import keras

from maskedrnn import _backend
from maskedrnn._keras_private import get_keras_mask

# Layers whose per-step output *is* their hidden state h: for them the final
# state can be read off the unmasked output sequence at each row's last valid
# step (LSTM's cell state c is recomputed, see `final_state`).
UNMASKED_TYPES = (keras.layers.LSTM, keras.layers.GRU, keras.layers.SimpleRNN)


def torch_kernels():
    """The torch-only module, imported on the torch backend only."""
    from maskedrnn import _torch_kernels

    return _torch_kernels


def native_reason(inner, where):
    """None when `inner` runs on PyTorch's native kernel for data on the
    device of `where` (a tensor or variable), else a sentence saying why not."""
    if keras.backend.backend() != "torch":
        return f"the {keras.backend.backend()} backend (PyTorch kernels: torch only)"
    return torch_kernels().unavailable_reason(inner, where)


def masked_reason(inner):
    """None when `inner` can run unmasked, else why it gets a mask."""
    name = type(inner).__name__
    if type(inner) not in UNMASKED_TYPES:
        return f"{name} is not LSTM, GRU or SimpleRNN (no fused kernel to keep)"
    if inner.cell.recurrent_dropout:
        return "recurrent_dropout > 0 (no fused kernel has it)"
    if (
        keras.backend.backend() == "jax"
        and type(inner) is keras.layers.SimpleRNN
        and inner.cell.compute_dtype == "float64"
    ):
        return (
            "float64 SimpleRNN on JAX: Keras' unmasked loop mixes a float32 "
            "step into the float64 carry and fails ('scan body function carry "
            "input and carry output must have equal types'); its masked loop "
            "does not"
        )
    return None


def _without_keras_mask(x):
    """`x`, or a copy of it with no Keras mask attached.

    Keras fills a layer's `mask` argument from a mask attached to its input
    tensor; the inner RNNs must not get one, or they leave the fused kernel.
    """
    if get_keras_mask(x) is not None:
        return keras.ops.copy(x)
    return x


def run_torch_native(inner, x, initial_state, training, steps, want_states):
    # Unpacked, over the zero-padded valid-first data; with `want_states`
    # the states at each row's length (an LSTM's c from the kernel itself,
    # `_torch_kernels.saturated_lstm`).
    return torch_kernels().run(
        inner, x, initial_state, steps.lengths, False, want_states
    )


def run_torch_packed(inner, x, initial_state, training, steps, want_states):
    # Packed: only the valid steps run, and the final states come out exact.
    return torch_kernels().run(inner, x, initial_state, steps.lengths, True)


def run_keras_unmasked(inner, x, initial_state, training, steps, want_states):
    y, *_ = inner(
        _without_keras_mask(x), initial_state=initial_state, training=training
    )
    return y, None


def run_keras_masked(inner, x, initial_state, training, steps, want_states):
    y, *states = inner(
        x, mask=steps.valid, initial_state=initial_state, training=training
    )
    return y, list(states)


def states_reason(inner):
    """None, or why an LSTM whose final states are wanted runs Keras' masked
    loop (on the batch as it is, `direction.run_masked_loop`) instead of
    running unmasked.

    On TensorFlow and JAX without a GPU Keras has no fused LSTM kernel: its
    unmasked and masked LSTM both run its generic step loop, at nearly the
    same cost (CPU benchmark, B=32 T=100 D=U=64: 1.65 / 1.79 ms forward on
    JAX), and the masked loop carries the exact `[h, c]` of each row to its
    last valid step. Running unmasked would then cost a recomputation of the
    cell state (`final_state`) on top. Where cuDNN may run (a GPU) the LSTM
    stays unmasked and `c` is recomputed.
    """
    if type(inner) is not keras.layers.LSTM:
        return None
    if keras.backend.backend() not in ("tensorflow", "jax"):
        return None
    if _backend.has_fused_rnn_kernel() and inner.use_cudnn is not False:
        return None
    return (
        "its final [h, c] are wanted and Keras has no fused LSTM kernel here "
        "(no GPU, or use_cudnn=False), so its masked loop costs what its "
        "unmasked loop does and carries the exact states to each row's last "
        "valid step (no cell-state recomputation)"
    )


def jax_cpu_reason(inner):
    """None, or why `inner` runs Keras' masked loop on a JAX CPU.

    JAX has no fused RNN kernel without a GPU: Keras' JAX backend reaches
    cuDNN only on one, and its unmasked GRU kernel (a `lax.scan` over input
    projections computed up front) runs the forward pass 1.6-2.8x slower
    than its generic loop on a CPU (docs/results/jax-scan-paths.txt). So
    there every Keras RNN runs a `lax.scan` step loop, masked or not, at
    nearly the same cost: the mask adds a fused select per step. Ours'
    valid-first gathers and per-row reversals would cost extra on top
    (1.01-1.13x Keras masked at B=32 T=100 D=U=64 left-padded for a GRU or
    SimpleRNN; 1.74x in the forward pass of a bidirectional GRU at B=64
    T=200 D=U=128; docs/benchmarks.md). Keras' masked loop on the caller's
    order is exact and does none of it. Not where the wrapped layer says
    `use_cudnn=True` (the user asked for Keras' kernel: it runs unmasked).
    """
    if keras.backend.backend() != "jax" or _backend.has_fused_rnn_kernel():
        return None
    if getattr(inner, "use_cudnn", "auto") is True:
        return None
    return (
        "JAX has no fused RNN kernel without a GPU, so Keras' masked loop "
        "costs about what its unmasked loop does, and running it on the "
        "batch as it is saves the valid-first reordering"
    )


def choose(inner, where, want_states=False):
    """The runner for `inner` with data on the device of `where`, and why.

    Args:
        inner: The built inner RNN (returns sequences and states, reads
            forward).
        where: A tensor or variable whose device decides on torch.
        want_states: Whether the caller needs the final states (an LSTM on
            TensorFlow or JAX without a GPU then runs Keras' masked loop,
            see `states_reason`). Defaults to `False`.

    Returns:
        A tuple `(runner, reason)`: one of the `run_*` functions of this
        module and the sentence `kernel_info()` reports.
    """
    name = type(inner).__name__
    masked = masked_reason(inner)
    if masked is None and want_states:
        masked = states_reason(inner)
    if masked is None:
        masked = jax_cpu_reason(inner)
    if masked is not None:
        return run_keras_masked, (
            f"Keras {name} in Keras' masked step loop, given the batch's mask "
            "as it is (mask=, no reordering) or the right-padded mask of "
            f"lengths=: {masked}"
        )
    reason = native_reason(inner, where)
    if reason is None:
        kernel = f"PyTorch's native {name} kernel"
        function = torch_kernels().autograd_function(inner)
        if function is not None:
            kernel = (
                f"PyTorch's native {name} equations run by _torch_kernels."
                f"{function.__name__} (torch ops with a cheaper backward pass "
                "than PyTorch's kernel's)"
            )
        text = (
            f"{kernel} (torch backend on CPU, where Keras would step through "
            "time in Python), "
        )
        if torch_kernels().packed_preferred(inner):
            return run_torch_packed, text + (
                "on the packed valid steps (no gradient recorded): padded "
                "steps are skipped and the final states are exact"
            )
        text += (
            "unmasked over the zero-padded valid-first data (faster here "
            "than the packed kernel: gradients are recorded, or an LSTM "
            "runs PyTorch's fused oneDNN kernel)"
        )
        if type(inner) is keras.layers.LSTM and want_states:
            text += (
                "; its padded steps leave the cell state untouched (forget "
                "gate 1, input gate 0), so the kernel's final c is exact"
            )
        return run_torch_native, text
    if getattr(inner, "use_cudnn", "auto") is False:
        text = (
            f"Keras {name}, unmasked, in Keras' generic step loop (the wrapped "
            "layer has use_cudnn=False)"
        )
    elif type(inner) is keras.layers.SimpleRNN:
        text = (
            f"Keras {name}, unmasked, in Keras' generic step loop (no backend "
            "has a fused SimpleRNN kernel; the loop runs without a mask)"
        )
    else:
        text = (
            f"Keras {name}, unmasked: its backend's fused kernel (cuDNN on "
            "GPU) when available, else Keras' step loop without a mask"
        )
    if keras.backend.backend() == "torch":
        text += f". Not PyTorch's native kernel: {reason}"
    return run_keras_unmasked, text
