"""The command line of `python -m maskedrnn`."""

import argparse
import json
import sys

from maskedrnn.demo.bucket import run_bucket_demo
from maskedrnn.demo.checks import check_agreement, summarize
from maskedrnn.demo.experiment import run_demo
from maskedrnn.demo.settings import LAYERS, TASKS, check_settings


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m maskedrnn",
        description=(
            "Train MaskedBidirectional, keras Bidirectional with a mask and "
            "keras Bidirectional without a mask (with --layer rnn: MaskedRNN, "
            "keras LSTM with and without a mask) from the same initial weights "
            "and compare accuracy, speed and predictions. The backend is "
            "chosen with the KERAS_BACKEND environment variable."
        ),
    )
    parser.add_argument(
        "--task",
        choices=TASKS,
        default="vowels",
        help="vowels: UCI Japanese Vowels speaker recognition (default); "
        "distance: synthetic distance-to-end tagging.",
    )
    parser.add_argument(
        "--layer",
        choices=LAYERS,
        default="bidirectional",
        help="bidirectional: MaskedBidirectional vs keras Bidirectional "
        "(default); rnn: MaskedRNN(LSTM) vs keras LSTM, one direction.",
    )
    parser.add_argument(
        "--epochs", type=int, help="training epochs (default: 40 vowels, 10 distance)"
    )
    parser.add_argument(
        "--batch-size", type=int, help="batch size (default: 32 vowels, 64 distance)"
    )
    parser.add_argument(
        "--padding",
        choices=("pre", "post"),
        default="pre",
        help="pre: pad before the data (keras.utils.pad_sequences' default); "
        "post: pad after it. Default: pre.",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--units", type=int, help="LSTM units per direction (default 64 / 32)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny run for tests and CI"
    )
    parser.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch backend: PyTorch CPU threads (default: OMP_NUM_THREADS if "
        "set, else 1, best for these small models)",
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the numbers of the run (settings, accuracies, "
        "timings, differences, checks) to PATH as JSON",
    )
    parser.add_argument(
        "--save",
        metavar="PATH",
        help="save our model (MaskedBidirectional, or MaskedRNN with --layer "
        "rnn) to PATH (.keras); default: a "
        "temporary file, deleted afterwards",
    )
    parser.add_argument(
        "--bucket",
        action="store_true",
        help="instead of the comparison, print seconds per epoch of "
        "MaskedBidirectional with and without length bucketing",
    )
    return parser


def main(argv=None):
    """Command-line entry point of `python -m maskedrnn`.

    Args:
        argv: List of argument strings, or `None` (default) for
            `sys.argv[1:]`. Run with `--help` for the options.

    Returns:
        Exit status: `0` when every promise of `check_agreement` holds, `1`
        otherwise (each broken one is printed to stderr). Invalid options
        exit with status 2.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    kwargs = {
        "task": args.task,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "padding": args.padding,
        "seed": args.seed,
        "units": args.units,
        "quick": args.quick,
        "save_path": args.save,
        "threads": args.threads,
        "layer": args.layer,
    }
    try:
        check_settings(**kwargs)
    except ValueError as error:
        parser.error(str(error))
    if args.bucket:
        if args.save is not None:
            parser.error("--save has no effect with --bucket; got both.")
        del kwargs["save_path"]
        run_bucket_demo(**kwargs)
        return 0
    results = run_demo(**kwargs)
    problems = check_agreement(results)
    if args.json:
        summary = dict(summarize(results), command=["python", "-m", "maskedrnn"])
        summary["command"] += list(sys.argv[1:] if argv is None else argv)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        print(
            f"error: {len(problems)} check(s) of the demo failed (see above); "
            "exit status 1.",
            file=sys.stderr,
        )
        return 1
    return 0
