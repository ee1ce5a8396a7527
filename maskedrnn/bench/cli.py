"""`python -m maskedrnn.bench`: parse, run, print the table, write JSON/plot."""

import json

from maskedrnn.bench.config import build_parser
from maskedrnn.bench.report import format_table, plot
from maskedrnn.bench.timing import run


def main(argv=None):
    """Command-line entry point; returns the results dict."""
    args = build_parser().parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
    else:
        results = run(args)
    print(format_table(results))
    if args.json and not args.from_json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)
    return results
