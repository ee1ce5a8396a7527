"""Compares bench results before and after a change, case by case.

    python -m maskedrnn.bench.compare BEFORE_DIR AFTER_DIR NAME [NAME ...]

reads `BEFORE_DIR/NAME.json` and `AFTER_DIR/NAME.json` (the bench's JSON,
e.g. `docs/results/cpu-torch-lstm.json` written by `maskedrnn.bench.cpu`
in two checkouts) and prints, for every ratio of ours to a baseline the
two runs share (`maskedrnn.bench.report.ratios`), the ratio before and
after with its 95% interval (`report.ratio_interval`, a paired bootstrap
over the run's own repeats) and whether the intervals overlap. A shift
whose intervals do not overlap is flagged "MOVED"; the exit status is 1
if any moved the slow kernel (after above before).
"""

import argparse
import json
import pathlib
import sys

from maskedrnn.bench import report


def compare(before, after):
    """Lines `(text, slower)` for each ratio both results have."""
    lines = []
    for mode, pairs in after["ratios"].items():
        for pair, ratio_after in pairs.items():
            ratio_before = before["ratios"].get(mode, {}).get(pair)
            if ratio_before is None:
                continue
            low_b, high_b = report.ratio_interval(before["rows"], mode, pair)
            low_a, high_a = report.ratio_interval(after["rows"], mode, pair)
            overlap = low_a <= high_b and low_b <= high_a
            verdict = "intervals overlap" if overlap else "MOVED"
            text = (
                f"  {mode} {pair:42s} {ratio_before:.2f} [{low_b:.2f}, {high_b:.2f}]"
                f" -> {ratio_after:.2f} [{low_a:.2f}, {high_a:.2f}]; {verdict}"
            )
            lines.append((text, not overlap and low_a > high_b))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=pathlib.Path)
    parser.add_argument("after", type=pathlib.Path)
    parser.add_argument("names", nargs="+", help="result names, without .json")
    args = parser.parse_args(argv)
    print("case, mode, ratio: before [95% interval] -> after [95% interval]")
    print("(ratio = ours' median time / the baseline's, in the same run)")
    slower = False
    for name in args.names:
        before = json.loads((args.before / f"{name}.json").read_text())
        after = json.loads((args.after / f"{name}.json").read_text())
        loads = [r["environment"].get("load_average_1m") for r in (before, after)]
        print(f"{name}: load (1 min) before {loads[0]}, after {loads[1]}")
        for text, moved_up in compare(before, after):
            print(text)
            slower |= moved_up
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
