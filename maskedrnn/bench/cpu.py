"""The CPU suite: re-measures every CPU figure of docs/benchmarks.md and
README's speed section.

    python -m maskedrnn.bench.cpu            # every run
    python -m maskedrnn.bench.cpu rnn        # only the MaskedRNN runs, left-padded
    python -m maskedrnn.bench.cpu torch-lstm jax-rnn-gru   # named runs

Run from the project root: each run writes `docs/results/cpu-<name>.json`
(the bench's full results; its printed table goes to stdout), and the
`*-lstm` runs the plots `docs/img/bench_cpu_<backend>.png`. Then
`python -m maskedrnn.bench.docs_tables` rewrites the pages' tables from the
JSON. Each run is its own process (the Keras backend and the thread pools
are fixed at start). Takes about 55 minutes on a 2-core machine, plus the
first calls (`--first-call-repeats 3` by default, 7 on TensorFlow and
JAX: a minute or two more per run). `BENCH_ARGS`, if set, is added to every
run's options (`maskedrnn.bench.runs` passes each round's `--order-seed`
this way); `PYTHON` names the interpreter (default: this one).
"""

import os
import shlex
import subprocess
import sys
import tempfile

BACKENDS = ("tensorflow", "jax", "torch")
SIZES = (
    "--batch 32 --time 100 --features 64 --units 64 --lengths uniform:0.2 "
    "--mode both --repeats 20 --warmup 3 --threads 1 --no-progress"
)
# TensorFlow's fused LSTM kernel and JAX's tiers at a larger size.
BIG = SIZES.replace(
    "--batch 32 --time 100 --features 64 --units 64",
    "--batch 64 --time 200 --features 128 --units 128",
)
# Lines of a run's stderr not worth showing (framework start-up logs).
NOISE = ("I0000", "W0000", "E0000", "WARNING: All", "USDT")


def runs():
    """`{name: (backend, options)}` of every run of the suite."""
    found = {}
    for b in BACKENDS:
        found[f"{b}-lstm"] = (b, f"{SIZES} --plot docs/img/bench_cpu_{b}.png")
        found[f"{b}-gru"] = (b, f"{SIZES} --cell gru")
        found[f"{b}-lstm-state"] = (b, f"{SIZES} --return-state")
    # MaskedRNN (one direction, --layer rnn) against Keras' LSTM/GRU/SimpleRNN
    # and PyTorch's bidirectional=False, left-padded (the runs with CPU
    # targets); SimpleRNN (tanh; torch nn.RNN): no target, the same comparison.
    rnn = f"--layer rnn {SIZES} --padding pre"
    for b in BACKENDS:
        for c in ("lstm", "gru", "simplernn"):
            cell = "rnn" if c == "simplernn" else c
            found[f"{b}-rnn-{c}"] = (b, f"{rnn} --cell {cell}")
            found[f"{b}-rnn-{c}-state"] = (b, f"{rnn} --cell {cell} --return-state")
    big = "tensorflow-lstm-b64-t200-u128"
    found[big] = ("tensorflow", BIG)
    found[f"{big}-state"] = ("tensorflow", f"{BIG} --return-state")
    # On a JAX CPU a SimpleRNN runs Keras' masked loop: its tiers timed forced.
    for name in ("jax-rnn-simplernn", "jax-rnn-simplernn-state"):
        found[name] = ("jax", found[name][1] + " --kernel jax-tiers")
    # JAX's length tiers: the larger size, and the bidirectional GRU with states.
    found["jax-lstm-b64-t200-u128"] = ("jax", BIG)
    found["jax-gru-state"] = ("jax", f"{SIZES} --cell gru --return-state")
    # The first call's targets at the larger size: the GRU and MaskedRNN
    # (left-padded) on every backend.
    for b in BACKENDS:
        found[f"{b}-gru-b64-t200-u128"] = (b, f"{BIG} --cell gru")
        for c in ("lstm", "gru"):
            options = f"--layer rnn {BIG} --padding pre --cell {c}"
            found[f"{b}-rnn-{c}-b64-t200-u128"] = (b, options)
    # A first call on JAX (XLA compiling) or TensorFlow (tracing, optimising
    # the graph) spreads most on a shared machine: the median of 7, not 3.
    for name, (backend, options) in found.items():
        if backend in ("jax", "tensorflow"):
            found[name] = (backend, f"{options} --first-call-repeats 7")
    return found


def default_names():
    """The runs of a plain `python -m maskedrnn.bench.cpu`, in order."""
    names = [f"{b}-{k}" for k in ("lstm", "gru", "lstm-state") for b in BACKENDS]
    for b in BACKENDS:
        names += [f"{b}-rnn-{c}{s}" for c in ("lstm", "gru") for s in ("", "-state")]
        names += [f"{b}-rnn-simplernn", f"{b}-rnn-simplernn-state"]
    names += [
        "tensorflow-lstm-b64-t200-u128",
        "tensorflow-lstm-b64-t200-u128-state",
        "jax-lstm-b64-t200-u128",
        "jax-gru-state",
    ]
    return names + [
        f"{b}-{k}-b64-t200-u128"
        for b in BACKENDS
        for k in ("gru", "rnn-lstm", "rnn-gru")
    ]


def main(argv=None):
    names = list(sys.argv[1:] if argv is None else argv)
    if names == ["rnn"]:
        names = [
            f"{b}-rnn-{c}{s}"
            for b in BACKENDS
            for c in ("lstm", "gru")
            for s in ("", "-state")
        ]
    names = names or default_names()
    table = runs()
    unknown = [n for n in names if n not in table]
    if unknown:
        print(f"unknown run {unknown[0]}", file=sys.stderr)
        return 2
    python = os.environ.get("PYTHON", sys.executable)
    status = 0
    for name in names:
        backend, options = table[name]
        extra = os.environ.get("BENCH_ARGS", "")
        args = shlex.split(options) + shlex.split(extra)
        out = f"docs/results/cpu-{name}.json"
        print(
            f"=== {name}: KERAS_BACKEND={backend} python -m maskedrnn.bench "
            f"{' '.join(args)} --json {out}",
            flush=True,
        )
        with tempfile.TemporaryFile("w+") as err:
            done = subprocess.run(
                [python, "-m", "maskedrnn.bench", *args, "--json", out],
                env={**os.environ, "KERAS_BACKEND": backend},
                stderr=err,
            )
            err.seek(0)
            kept = [line for line in err if not line.startswith(NOISE)]
        sys.stderr.write("".join(kept[-5:]))
        status |= done.returncode != 0
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
