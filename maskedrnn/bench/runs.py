"""Runs `maskedrnn.bench.cpu` runs several times over and collects their
ratios: how much a figure moves between separate runs of the same code.

One bench run gives each ratio with a 95% interval from its own repeats
(`maskedrnn.bench.report.ratio_interval`), which does not see what changes
between runs (another process, other load on a shared machine, another
memory layout). Near a target (a ratio within a few percent of its
target) that drift decides the verdict of a single run. This runs the
named runs in rounds (`--rounds`, every run once a round, in the order
given), and writes a JSON with, per run name and round, the ratios, their
intervals and the 1-minute load average, and per run name and ratio the
median, lowest and highest value over the rounds and how many rounds met
the target (`--target RATIO=LIMIT`, e.g. `maskedrnn/keras_masked=1.0`).
Each round rewrites `docs/results/cpu-<run>.json`: the last round's files
stay, as `maskedrnn.bench.cpu` leaves them. Run from the project root.

Round k (from 0) times its cases in the orders of `--order-seed k`: one
bench run takes a new random order each repeat, but the same sequence of
orders for the same seed, so with one seed for every round an order that
happens to favour one case would favour it in every round (`--same-order`
runs every round with `--order-seed 0`, the bench's own default: the
control). Before each
round, `python_probe_ms` times a fixed pure-Python workload in this
process (`python_probe`): how fast the shared machine runs Python at the
time, which moves the torch figures that Python overhead decides.

    python -m maskedrnn.bench.runs --rounds 10 \\
        --target maskedrnn/torch_packed=1.0 \\
        --out docs/results/runs-torch-rnn-gru-state.json \\
        torch-rnn-gru-state
"""

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

from maskedrnn.bench.report import ratio_interval


def python_probe(repeats=5):
    """Milliseconds a fixed pure-Python workload takes here now (median of
    `repeats`): function calls, attribute and dict lookups, as the Python
    around a kernel does."""

    class Box:
        def __init__(self, value):
            self.value = value

    def step(box, table):
        table[box.value % 7] = table.get(box.value % 7, 0) + 1
        return Box(box.value + 1)

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        box, table = Box(0), {}
        for _ in range(20_000):
            box = step(box, table)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def one_round(names, order_seed=0):
    """Runs `maskedrnn.bench.cpu` once for `names`, its cases timed in the
    orders of `order_seed`; returns, per name, its ratios, intervals and
    load."""
    subprocess.run(
        [sys.executable, "-m", "maskedrnn.bench.cpu", *names],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "BENCH_ARGS": f"--order-seed {order_seed}"},
    )
    found = {}
    for name in names:
        with open(pathlib.Path("docs", "results", f"cpu-{name}.json")) as f:
            results = json.load(f)
        found[name] = {
            "order_seed": results["config"]["order_seed"],
            "load_average_1m": results["environment"]["load_average_1m"],
            "ratios": results["ratios"],
            "intervals": {
                mode: {
                    pair: ratio_interval(results["rows"], mode, pair)
                    for pair in values
                }
                for mode, values in results["ratios"].items()
            },
        }
    return found


def summarize(rounds, names, targets):
    """Per name, mode and ratio: the median, min and max over the rounds,
    and (for a ratio with a target) how many rounds met it, rounded to 2
    digits as the docs' verdicts are."""
    summary = {}
    for name in names:
        summary[name] = {}
        for mode, values in rounds[0][name]["ratios"].items():
            summary[name][mode] = {}
            for pair in values:
                series = np.array([r[name]["ratios"][mode][pair] for r in rounds])
                entry = {
                    "median": float(np.median(series)),
                    "min": float(series.min()),
                    "max": float(series.max()),
                }
                if pair in targets:
                    met = np.round(series, 2) <= targets[pair]
                    entry["target"] = targets[pair]
                    entry["rounds_met"] = int(met.sum())
                summary[name][mode][pair] = entry
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", help="runs of maskedrnn.bench.cpu")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--target", action="append", default=[])
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--same-order",
        action="store_true",
        help="every round with --order-seed 0 (default: round k with k)",
    )
    args = parser.parse_args(argv)
    targets = {}
    for spec in args.target:
        pair, _, limit = spec.partition("=")
        targets[pair] = float(limit)
    started = datetime.datetime.now(datetime.timezone.utc)
    rounds, probes = [], []
    for k in range(args.rounds):
        probes.append(python_probe())
        rounds.append(one_round(args.names, order_seed=0 if args.same_order else k))
        print(f"round {k + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    result = {
        "command": "python -m maskedrnn.bench.runs " + " ".join(argv or sys.argv[1:]),
        "started_utc": started.isoformat(timespec="seconds"),
        "ended_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "names": args.names,
        "python_probe_ms": probes,
        "rounds": rounds,
        "summary": summarize(rounds, args.names, targets),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(
        f"python probe: median {np.median(probes):.1f} ms "
        f"(min {min(probes):.1f}, max {max(probes):.1f})"
    )
    for name in args.names:
        for mode, values in result["summary"][name].items():
            for pair, s in values.items():
                met = (
                    f", met in {s['rounds_met']} of {args.rounds}"
                    if "rounds_met" in s
                    else ""
                )
                print(
                    f"{name:24s} {mode:5s} {pair:28s} median {s['median']:.3f} "
                    f"(min {s['min']:.3f}, max {s['max']:.3f}){met}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
