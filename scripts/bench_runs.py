"""Runs `scripts/bench_cpu.sh` runs several times over and collects their
ratios: how much a figure moves between separate runs of the same code.

One bench run gives each ratio with a 95% interval from its own repeats
(`maskedrnn.bench.report.ratio_interval`), which does not see what changes
between runs (another process, other load on a shared machine, another
memory layout). Near a target (issue 11's JAX rows, within a few percent
of 1.0) that drift decides the verdict of a single run. This runs the
named runs in rounds (`--rounds`, every run once a round, in the order
given), and writes a JSON with, per run name and round, the ratios, their
intervals and the 1-minute load average, and per run name and ratio the
median, lowest and highest value over the rounds and how many rounds met
the target (`--target RATIO=LIMIT`, e.g. `maskedrnn/keras_masked=1.0`).
Each round rewrites `docs/results/cpu-<run>.json` / `.txt`: the last
round's files stay, as `scripts/bench_cpu.sh` leaves them.

    python scripts/bench_runs.py --rounds 10 \\
        --target maskedrnn/keras_masked=1.0 \\
        --out docs/results/runs-jax-rnn.json \\
        jax-rnn-lstm jax-rnn-gru
"""

import argparse
import datetime
import json
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from maskedrnn.bench.report import ratio_interval  # noqa: E402


def one_round(names):
    """Runs `scripts/bench_cpu.sh` once for `names`; returns, per name, its
    ratios, intervals and load."""
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "bench_cpu.sh"), *names],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    found = {}
    for name in names:
        with open(ROOT / "docs" / "results" / f"cpu-{name}.json") as f:
            results = json.load(f)
        found[name] = {
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
    parser.add_argument("names", nargs="+", help="runs of scripts/bench_cpu.sh")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--target", action="append", default=[])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    targets = {}
    for spec in args.target:
        pair, _, limit = spec.partition("=")
        targets[pair] = float(limit)
    started = datetime.datetime.now(datetime.timezone.utc)
    rounds = []
    for k in range(args.rounds):
        rounds.append(one_round(args.names))
        print(f"round {k + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    result = {
        "command": "python scripts/bench_runs.py " + " ".join(argv or sys.argv[1:]),
        "started_utc": started.isoformat(timespec="seconds"),
        "ended_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "names": args.names,
        "rounds": rounds,
        "summary": summarize(rounds, args.names, targets),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
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
