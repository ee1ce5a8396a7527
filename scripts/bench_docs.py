"""Rewrites the benchmark tables of docs/benchmarks.md from their JSON files.

Two kinds of tables carry a marker line (tests/test_bench.py checks both
against the JSON):

- `<!-- bench-table docs/results/X.json -->`: the whole table is
  `python -m maskedrnn.bench.report docs/results/X.json`;
- `<!-- bench-ratios -->`: one row per JSON file and ratio; its `fwd+bwd`
  and `fwd` cells are the JSON's `ratios` rounded to 2 digits, followed,
  where the row has a `target` (`≤ X`), by "met" or "**missed** by D", and
  its `load 1 min` cell (where present) is the JSON's 1-minute load
  average. The line `**Met: N of the M figures ...**` after the first such
  table is recounted.

Run after `scripts/bench_cpu.sh`:

    python scripts/bench_docs.py            # rewrites docs/benchmarks.md
    python scripts/bench_docs.py --check    # exit 1 if it would change
"""

import argparse
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
sys.path.insert(0, str(ROOT))

from maskedrnn.bench import report  # noqa: E402

TABLE = re.compile(r"(<!-- bench-table (\S+) -->\n)((?:\|.*\n)+)")
RATIOS = re.compile(r"(<!-- bench-ratios -->\n)((?:\|.*\n)+)")
MET = re.compile(r"\*\*Met: \d+ of the (\d+) figures ([^;]*); missed: \d+\.\*\*")


def _load(path):
    with open(ROOT / path) as f:
        return json.load(f)


def _cell(value, target):
    if target is None:
        return value
    limit = float(target.removeprefix("≤ "))
    if float(value) <= limit:
        return f"{value} met"
    return f"{value} **missed** by {float(value) - limit:.2f}"


def _ratio_table(table, counts):
    lines = table.rstrip("\n").split("\n")
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    out = lines[:2]
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        row = dict(zip(header, cells))
        results = _load(row["JSON"].strip("`"))
        ratio = row["ratio"].strip("`")
        target = row.get("target")
        for column, mode in (("fwd+bwd", "train"), ("fwd", "infer")):
            value = f"{results['ratios'][mode][ratio]:.2f}"
            cells[header.index(column)] = _cell(value, target)
            if target is not None:
                counts.append(cells[header.index(column)].endswith("met"))
        if "load 1 min" in header:
            load = results["environment"]["load_average_1m"]
            cells[header.index("load 1 min")] = f"{load:.1f}"
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def rewrite(page):
    def table(match):
        results = _load(match.group(2))
        return match.group(1) + report.markdown_table(results) + "\n"

    page = TABLE.sub(table, page)
    counts = []
    page = RATIOS.sub(
        lambda m: m.group(1) + _ratio_table(m.group(2), counts), page
    )
    met = sum(counts)

    def summary(match):
        return (
            f"**Met: {met} of the {len(counts)} figures {match.group(2)}; "
            f"missed: {len(counts) - met}.**"
        )

    return MET.sub(summary, page, count=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing")
    args = parser.parse_args(argv)
    old = PAGE.read_text()
    new = rewrite(old)
    if args.check:
        return int(new != old)
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
