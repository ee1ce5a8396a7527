"""Benchmark `MaskedBidirectional` against Keras' and PyTorch's bidirectional RNNs.

Run as `python -m maskedrnn.bench` (`--help` lists the options). The backend is
Keras' (`KERAS_BACKEND=tensorflow|jax|torch`). One process times, side by
side and in round-robin order (so machine noise hits all alike):

- `maskedrnn`: `MaskedBidirectional(LSTM/GRU)` called with `mask=`;
- `maskedrnn_lengths`: the same layer called with `lengths=` instead
  (right-padded data only: `--padding post`);
- `keras_masked`: `keras.layers.Bidirectional` with the same mask;
- `keras_unmasked`: `keras.layers.Bidirectional` with no mask: the speed
  ceiling (it runs over the padding, so its results on padded rows are wrong);
- `torch_packed` (torch backend only): `torch.nn.LSTM/GRU(bidirectional=True)`
  on a `PackedSequence`, packing and unpacking included (with
  `--padding pre|holes`, also the gather of each row's valid steps to the
  front and back);
- `torch_unpacked` (torch backend only): the same module on the padded
  tensor (wrong results: its ceiling).

All share one set of weights. What is timed is the layer alone, on inputs
put on the device once before timing: `"infer"` is the forward pass,
`"train"` the forward pass plus the gradients of a scalar loss
`sum(outputs * w)` (fixed random `w`) with respect to the inputs and all the
weights. Each implementation is compiled the same way per backend (see the
harness modules): TensorFlow, a `tf.function` (no XLA); JAX, `jax.jit` of
`layer.stateless_call`; PyTorch, eager.

Before timing, each implementation's outputs (and in `"train"` mode its
input gradient, plus its weight gradients when it has Keras' weight layout)
are compared with `keras_masked` on the same data; the largest absolute
differences go in the table and the JSON (`max_abs_diff`,
`max_abs_grad_diff`, and on torch `max_abs_diff_torch_packed`). The two
ceilings are expected to differ wherever rows are padded.

Which code computed each implementation is recorded on its first call (the
trace, under `tf.function` / `jax.jit`) by spies (`kernels.KernelRecorder`):
Keras' backend RNN functions (`lstm`, `gru`, `rnn`, the fused
`bidirectional_lstm/gru`), on torch Keras' cuDNN call (`_cudnn_lstm/gru`)
apart from its Python fallback (`_fallback_lstm/gru`) and PyTorch's native
kernels (`maskedrnn.backends.torch.run_native`), on JAX `jax.experimental.rnn.lstm`.
Each row gets `kernels` (a summary line), `kernel_calls` (the records) and
`cudnn` (`"computed"`, `"failed, fell back"` or `"not called"`).
`--profile` also lists the RNN kernels the backend's profiler saw (CUDA
kernel names on a GPU).

`--kernel KERNEL [KERNEL ...]` also times ours under `maskedrnn.backends.force(KERNEL)`
for each KERNEL (e.g. `torch-fused`, the one-call kernel, forceable on a CPU), as
rows `maskedrnn:KERNEL` beside the default plan's; the JSON's `config.kernels`
lists them, and `declined` the kernels the backend declines for the layer.

`--layer rnn` times `MaskedRNN` the same way, against the Keras `LSTM`/`GRU`
with and without the mask and PyTorch's unidirectional module; `--layers N`
stacks N layers (`--preset stacked`: the GPU sizes, 2 layers).

After the timing, each case's first call is timed `--first-call-repeats`
times (default 3): a fresh step on new layers, in a new `tf.function` /
`jax.jit` (on torch the first eager call), trace and compilation included;
rows get `first_call_ms`, the JSON `first_call_ratios` (`first_call`).

Layout: `config` (names, presets, options, data), `harness_tensorflow`,
`harness_jax`, `harness_torch` (compiling, syncing, devices, threads),
`layers` (the timed layers), `kernels` (spies and profiles), `timing` (the
run), `first_call` (first calls of fresh steps), `report` (table, JSON
fields, plot), `cli` (`main`).

Example:

```
KERAS_BACKEND=torch python -m maskedrnn.bench --preset gpu --padding pre \\
    --mode both --profile --json bench.json --plot bench.png
```
"""

from maskedrnn.bench.cli import main
from maskedrnn.bench.config import (
    BASELINES,
    CEILINGS,
    IMPLS,
    MODES,
    OURS,
    PADDINGS,
    POST_ONLY,
    PRESETS,
    REFERENCE,
    TORCH_ONLY,
    build_parser,
    make_mask,
    parse_lengths,
    valid_first_permutation,
)
from maskedrnn.bench.kernels import KernelRecorder, cudnn_verdict
from maskedrnn.bench.report import format_table, markdown_table, plot
from maskedrnn.bench.timing import gpu_available, run, states_into_sequence

__all__ = [
    "BASELINES",
    "CEILINGS",
    "IMPLS",
    "MODES",
    "OURS",
    "PADDINGS",
    "POST_ONLY",
    "PRESETS",
    "REFERENCE",
    "TORCH_ONLY",
    "KernelRecorder",
    "build_parser",
    "cudnn_verdict",
    "format_table",
    "gpu_available",
    "main",
    "make_mask",
    "markdown_table",
    "parse_lengths",
    "plot",
    "run",
    "states_into_sequence",
    "valid_first_permutation",
]
