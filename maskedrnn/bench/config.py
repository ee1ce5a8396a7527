"""What the benchmark times and on which data: names, presets, options.

The implementation names, the size presets, the command-line parser and
the synthetic data (per-row lengths, and where each row's valid steps sit:
`--padding post|pre|holes`).
"""

import argparse
import math
import sys

import numpy as np

from maskedrnn import backends

# Labels, formatted with the layer kind (`--layer`, see LAYERS) and the cell.
IMPLS = {
    "maskedrnn": "{ours}, mask=",
    "maskedrnn_lengths": "{ours}, lengths=",
    "keras_masked": "keras {keras}, mask=",
    "keras_unmasked": "keras {keras}, no mask (ceiling)",
    "torch_packed": "torch nn.{torch_cell}{torch}, PackedSequence",
    "torch_unpacked": "torch nn.{torch_cell}{torch}, padded (ceiling)",
}
# `--cell`: the Keras layer (`keras.layers.<keras>`) and PyTorch module
# (`torch.nn.<torch>`) of each cell; "rnn" is a tanh SimpleRNN / nn.RNN.
CELLS = {
    "lstm": {"keras": "LSTM", "torch": "LSTM"},
    "gru": {"keras": "GRU", "torch": "GRU"},
    "rnn": {"keras": "SimpleRNN", "torch": "RNN"},
}
# `--layer`: what ours and Keras' layers are, and PyTorch's direction flag.
LAYERS = {
    "bidirectional": {
        "ours": "MaskedBidirectional",
        "keras": "Bidirectional",
        "torch": " bidirectional",
        "directions": 2,
    },
    "rnn": {"ours": "MaskedRNN", "keras": "{cell}", "torch": "", "directions": 1},
}
OURS = ("maskedrnn", "maskedrnn_lengths")
BASELINES = ("keras_masked", "keras_unmasked", "torch_packed", "torch_unpacked")
TORCH_ONLY = ("torch_packed", "torch_unpacked")
# Compute the unmasked recurrence over the padding: expected to differ.
CEILINGS = ("keras_unmasked", "torch_unpacked")
# `lengths=` says "the first `lengths` steps of each row are valid": it
# describes right-padded data only.
POST_ONLY = ("maskedrnn_lengths",)
REFERENCE = "keras_masked"
MODES = ("train", "infer")
# `--kernel KERNEL`: ours again with KERNEL forced (`maskedrnn.backends.force`),
# as rows named "maskedrnn:KERNEL" (and "maskedrnn_lengths:KERNEL").
KERNEL_SEPARATOR = ":"


def split_impl(impl):
    """`(implementation, forced kernel or None)` of a row's `impl` name:
    `"maskedrnn:keras-masked"` is `("maskedrnn", "keras-masked")`."""
    base, _, kernel = impl.partition(KERNEL_SEPARATOR)
    return base, kernel or None


def is_ours(impl):
    """True for ours' rows, forced kernels included."""
    return split_impl(impl)[0] in OURS


def is_slow(impl):
    """True for the rows that run Keras' masked step loop (`keras_masked`,
    and ours forced to `"keras-masked"`): `--slow-repeats` caps them."""
    base, kernel = split_impl(impl)
    return base == REFERENCE or kernel == "keras-masked"


def label(impl, **names):
    """The table label of `impl` (`IMPLS`, formatted with `names`), with the
    forced kernel said."""
    base, kernel = split_impl(impl)
    text = IMPLS[base].format(**names)
    return text if kernel is None else f"{text}, forced {kernel}"
PADDINGS = ("post", "pre", "holes")

PRESETS = {
    # Finishes in about a minute per backend on a 2-core CPU.
    "cpu": {
        "batch": 16,
        "time": 50,
        "features": 32,
        "units": 32,
        "layers": 1,
        "repeats": 10,
        "warmup": 2,
    },
    # The size of the H100 reference figures of Keras' own layers
    # (docs/benchmarks.md): B=64 T=100 D=U=512, with the default lengths
    # uniform in [20, 100].
    "gpu": {
        "batch": 64,
        "time": 100,
        "features": 512,
        "units": 512,
        "layers": 1,
        "repeats": 50,
        "warmup": 5,
    },
    # Two stacked bidirectional layers at the GPU size (ours: two
    # MaskedBidirectional; Keras: two Bidirectional, each fed the mask;
    # PyTorch: one nn.LSTM/GRU(num_layers=2, bidirectional=True)).
    "stacked": {
        "batch": 64,
        "time": 100,
        "features": 512,
        "units": 512,
        "layers": 2,
        "repeats": 30,
        "warmup": 3,
    },
}


def parse_lengths(spec, batch, time, seed=0):
    """Per-row valid lengths from a distribution spec.

    Args:
        spec: `"uniform:F"` (integers uniform in `[ceil(F * time), time]`,
            `0 < F <= 1`), `"full"` (every row `time` long) or `"fixed:N"`
            (every row `N` long, `1 <= N <= time`).
        batch: Int, number of rows.
        time: Int, length of the padded time axis.
        seed: Int, seed of the random draw. Defaults to `0`.

    Returns:
        int32 numpy array of shape `(batch,)`, every entry in `[1, time]`.

    Example:

    >>> parse_lengths("fixed:3", batch=2, time=5)
    array([3, 3], dtype=int32)
    """
    kind, _, value = str(spec).partition(":")
    if kind == "full" and not value:
        return np.full((batch,), time, dtype="int32")
    try:
        number = float(value)
    except ValueError:
        number = None
    if kind == "uniform" and number is not None and 0 < number <= 1:
        low = max(1, math.ceil(number * time))
        rng = np.random.default_rng(seed)
        return rng.integers(low, time + 1, size=batch).astype("int32")
    if kind == "fixed" and number is not None and number == int(number):
        if 1 <= number <= time:
            return np.full((batch,), int(number), dtype="int32")
        raise ValueError(
            f"--lengths {spec!r}: N must be in [1, --time={time}] (PyTorch "
            "cannot pack empty rows)."
        )
    raise ValueError(
        f"Invalid --lengths {spec!r}: use 'uniform:F' with 0 < F <= 1 "
        "(lengths uniform in [ceil(F*T), T]), 'full', or 'fixed:N'."
    )


def make_mask(lengths, time, padding="post", seed=0):
    """Where each row's `lengths[i]` valid steps sit on a `time`-step axis.

    Args:
        lengths: int numpy array of shape `(batch,)`, entries in `[0, time]`.
        time: Int, length of the padded time axis.
        padding: `"post"` (valid steps first, padding after: right-padded),
            `"pre"` (padding first: `keras.utils.pad_sequences`' default) or
            `"holes"` (the valid steps at random sorted positions, drawn
            with `seed`). Defaults to `"post"`.
        seed: Int, seed of the `"holes"` draw. Defaults to `0`.

    Returns:
        bool numpy array of shape `(batch, time)` with `lengths[i]` True
        entries in row `i`.

    Example:

    >>> make_mask(np.array([2, 3]), 4, "pre").astype(int)
    array([[0, 0, 1, 1],
           [0, 1, 1, 1]])
    """
    lengths = np.asarray(lengths)
    steps = np.arange(time)[None, :]
    if padding == "post":
        return steps < lengths[:, None]
    if padding == "pre":
        return steps >= time - lengths[:, None]
    if padding == "holes":
        rng = np.random.default_rng(seed)
        mask = np.zeros((len(lengths), time), bool)
        for row, n in enumerate(lengths):
            mask[row, rng.choice(time, size=int(n), replace=False)] = True
        return mask
    raise ValueError(
        f"padding must be one of {', '.join(PADDINGS)}; got padding={padding!r}."
    )


def valid_first_permutation(mask):
    """Per-row time index that puts the valid steps first (in order).

    `x[i, order[i]]` is row `i` with its valid steps moved to the front,
    padding after; `inverse` (its inverse permutation) moves them back.
    NumPy, for the bench's own data (the PyTorch baselines' gathers); the
    layers use `maskedrnn.ops.valid_first_order`, in `keras.ops`.

    Returns:
        `(order, inverse)`, two int64 numpy arrays shaped like `mask`.
    """
    order = np.argsort(~np.asarray(mask, bool), axis=1, kind="stable")
    inverse = np.argsort(order, axis=1, kind="stable")
    return order, inverse


class _FormerKernelOption(argparse.Action):
    """`--way`, the former name of `--kernel`: works, with a notice."""

    def __call__(self, parser, namespace, values, option_string=None):
        print("--way is deprecated; use --kernel.", file=sys.stderr)
        setattr(namespace, "kernels", values)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m maskedrnn.bench",
        description=(
            "Time MaskedBidirectional against keras.layers.Bidirectional "
            "(with and without a mask) and, on the torch backend, "
            "torch.nn.LSTM/GRU(bidirectional=True). The Keras backend comes "
            "from KERAS_BACKEND."
        ),
    )
    parser.add_argument(
        "--cell",
        choices=tuple(CELLS),
        default="lstm",
        help="'lstm' (default), 'gru' or 'rnn' (keras SimpleRNN with its "
        "default tanh; torch nn.RNN)",
    )
    parser.add_argument(
        "--layer",
        choices=tuple(LAYERS),
        default="bidirectional",
        help="'bidirectional' (MaskedBidirectional against keras Bidirectional "
        "and torch bidirectional=True, default) or 'rnn' (MaskedRNN against "
        "the keras LSTM/GRU/SimpleRNN itself and torch bidirectional=False; the Keras "
        "layers get zero_output_for_mask=True, so padded steps are zeros as "
        "in PyTorch's packed output)",
    )
    parser.add_argument(
        "--preset",
        choices=("auto", "cpu", "gpu", "stacked"),
        default="auto",
        help="default sizes, repeats and warm-up: 'cpu' (B=16 T=50 D=32 U=32) "
        "or 'gpu' (B=64 T=100 D=512 U=512, the size of the layer-level H100 "
        "figures) or 'stacked' (the gpu sizes, --layers 2); 'auto' picks "
        "cpu or gpu by device. Explicit options win.",
    )
    for name, what in (
        ("batch", "rows per batch"),
        ("time", "padded time steps"),
        ("features", "input features"),
        ("units", "units per direction"),
        ("layers", "stacked bidirectional layers (default 1)"),
    ):
        parser.add_argument(f"--{name}", type=int, help=what)
    parser.add_argument(
        "--lengths",
        default="uniform:0.2",
        help="length distribution: 'uniform:F' (uniform in [ceil(F*T), T], "
        "default uniform:0.2), 'full' or 'fixed:N'",
    )
    parser.add_argument(
        "--padding",
        choices=PADDINGS,
        default="post",
        help="where the padding sits: 'post' (right-padded, default), 'pre' "
        "(left-padded, keras.utils.pad_sequences' default) or 'holes' (valid "
        "steps at random positions). maskedrnn_lengths needs 'post'; "
        "torch_packed moves the valid steps first and back inside its timing",
    )
    parser.add_argument("--mode", choices=("train", "infer", "both"), default="both")
    parser.add_argument(
        "--return-state",
        action="store_true",
        help="the layers also return their final states, which enter the "
        "timed output (and so the loss and the checks): adds ours' exact "
        "LSTM cell-state work",
    )
    parser.add_argument(
        "--kernel",
        nargs="+",
        dest="kernels",
        metavar="KERNEL",
        choices=backends.KERNELS,
        help="also time ours with each KERNEL forced (maskedrnn.backends.force), "
        "as rows 'maskedrnn:KERNEL' (and 'maskedrnn_lengths:KERNEL'), checked "
        "like the others; a kernel the backend declines for the layer in a "
        f"mode is left out and listed under 'declined'. One of {backends.KERNELS}",
    )
    parser.add_argument(
        "--way",
        nargs="+",
        choices=backends.KERNELS,
        action=_FormerKernelOption,
        help=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--slow-repeats",
        type=int,
        metavar="N",
        help="time keras_masked and ours forced to keras-masked (Keras' masked "
        "step loop, slow on a GPU) at most N times, after one warm-up call "
        "(default: --repeats and --warmup, as the rest)",
    )
    parser.add_argument("--repeats", type=int, help="timed runs per case")
    parser.add_argument(
        "--first-call-repeats",
        type=int,
        default=3,
        metavar="N",
        help="after the timing, time N first calls of each case, each on new "
        "layers in a new tf.function / jax.jit (trace and compilation "
        "included; on torch the first eager call): the rows' first_call_ms "
        "and the JSON's first_call_ratios (default 3; 0: none)",
    )
    parser.add_argument("--warmup", type=int, help="untimed runs first (>= 1)")
    parser.add_argument(
        "--impl",
        nargs="+",
        choices=tuple(IMPLS),
        help="implementations to time (default: all this backend has)",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    parser.add_argument(
        "--threads",
        type=int,
        help="CPU threads for the backend's ops (torch.set_num_threads; TF "
        "intra/inter-op pools; JAX: 1 only). Default on a CPU: 1 on torch "
        "(PyTorch's advice for small models on a shared machine), the "
        "backend's own on TensorFlow and JAX.",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after timing, run each case once more under the backend's "
        "profiler (torch.profiler / jax.profiler) and list the RNN kernels "
        "it ran (CUDA kernel names on a GPU) in the table and the JSON",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the lengths, the holes, the data and the weights "
        "(default 0)",
    )
    parser.add_argument(
        "--order-seed",
        type=int,
        default=0,
        help="seed of the order the cases are timed in: a new random order "
        "every repeat, the same sequence of orders for the same seed "
        "(default 0; maskedrnn.bench.runs gives each round its own, so "
        "that an order that favours one case does not repeat in every "
        "round)",
    )
    parser.add_argument("--json", metavar="FILE", help="write results as JSON")
    parser.add_argument(
        "--from-json",
        metavar="FILE",
        help="measure nothing: print the table of FILE (written by --json) "
        "and, with --plot, draw its chart",
    )
    parser.add_argument(
        "--plot", metavar="FILE.png", help="bar chart of the medians (matplotlib)"
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar on stderr"
    )
    return parser


def settings_from(args, gpu):
    """Sizes, repeats and warm-up: the preset, overridden by explicit options."""
    preset = args.preset
    if preset == "auto":
        preset = "gpu" if gpu else "cpu"
    settings = dict(PRESETS[preset])
    for key in ("batch", "time", "features", "units", "layers", "repeats", "warmup"):
        value = getattr(args, key, None)
        if value is not None:
            settings[key] = value
    for key in ("batch", "time", "features", "units", "layers", "repeats"):
        if settings[key] < 1:
            raise SystemExit(f"--{key} must be >= 1; got {settings[key]}.")
    if settings["warmup"] < 1:
        raise SystemExit(
            f"--warmup must be >= 1 (the first call compiles and is checked); "
            f"got {settings['warmup']}."
        )
    settings["preset"] = preset
    return settings
