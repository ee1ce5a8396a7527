"""Rewrites the benchmark tables of docs/benchmarks.md and README.md from JSON.

Two kinds of tables carry a marker line (tests/test_bench.py checks both
against the JSON):

- `<!-- bench-table docs/results/X.json -->`: the whole table is
  `python -m maskedrnn.bench.report docs/results/X.json`;
- `<!-- bench-ratios -->`: one row per JSON file (`FILE#CASE`: one timing
  case of a GPU check's JSON) and ratio; its `fwd+bwd`
  and `fwd` cells are the JSON's `ratios` rounded to 2 digits, followed,
  where the row has a `target` (`≤ X`), by "met" or "**missed** by D", and
  its `load 1 min` cell (where present) is the JSON's 1-minute load
  average, and its `95% interval` cell (where present) the ratio's interval
  from the run's own repeats (`maskedrnn.bench.report.ratio_interval`),
  fwd+bwd; fwd. The line `**Met: N of the M figures ...; missed: K ...**`
  is recounted from the tables above it, with how many of the missed
  figures have the target inside their interval;
- `<!-- bench-runs docs/results/runs-X.json -->`: the summary of
  `maskedrnn.bench.runs`' rounds, one row per run name, mode and ratio
  with a target (`runs_table`);
- `<!-- bench-first-call -->`: one row per JSON file and ratio; its
  `fwd+bwd` and `fwd` cells are the JSON's `first_call_ratios` (with the
  verdict where the row has a target), `ours ms` and `this ms` the first
  calls' medians of ours and of the other implementation (fwd+bwd; fwd),
  `load 1 min` the run's load average; "not measured" for a JSON written
  before the bench timed first calls;
- `<!-- demo-first-epoch -->`: one row per demo JSON (`python -m
  maskedrnn --json`): ours' and Keras' masked model's first epoch and
  later epochs, their ratio against a target, and the command that wrote
  the file (`demo_table`).

Run after `python -m maskedrnn.bench.cpu`:

    python -m maskedrnn.bench.docs_tables            # rewrites the pages
    python -m maskedrnn.bench.docs_tables --check    # exit 1 if it would change
"""

import argparse
import json
import pathlib
import re
import sys

from maskedrnn.bench import report

# The project's checkout (this module is maskedrnn/bench/docs_tables.py).
ROOT = pathlib.Path(__file__).resolve().parents[2]
# The pages whose marked tables come from docs/results.
PAGES = [ROOT / "docs" / "benchmarks.md", ROOT / "README.md"]

TABLE = re.compile(r"(<!-- bench-table (\S+) -->\n)((?:\|.*\n)+)")
RATIOS = re.compile(r"(<!-- bench-ratios -->\n)((?:\|.*\n)+)")
MET = re.compile(r"\*\*Met: \d+ of the (\d+) figures ([^;]*); missed: \d+[^*]*\.\*\*")
INTERVAL = "95% interval"
RUNS = re.compile(r"(<!-- bench-runs (\S+) -->\n)((?:\|.*\n)+)")
FIRST = re.compile(r"(<!-- bench-first-call -->\n)((?:\|.*\n)+)")
DEMO = re.compile(r"(<!-- demo-first-epoch -->\n)((?:\|.*\n)+)")
NOT_MEASURED = "not measured"
MODES = {"train": "fwd+bwd", "infer": "fwd"}


def runs_table(runs):
    """The Markdown table of a `maskedrnn.bench.runs` JSON: per run name,
    mode and ratio with a target, the median, lowest and highest ratio over
    the rounds and in how many rounds the rounded ratio met the target."""
    rounds = len(runs["rounds"])
    lines = [
        "| run | mode | ratio | target | median | lowest–highest | met in |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for name in runs["names"]:
        for mode, values in runs["summary"][name].items():
            for pair, entry in values.items():
                if "target" not in entry:
                    continue
                lines.append(
                    f"| `{name}` | {MODES[mode]} | `{pair}` | ≤ {entry['target']} | "
                    f"{entry['median']:.3f} | {entry['min']:.2f}–{entry['max']:.2f} | "
                    f"{entry['rounds_met']} of {rounds} |"
                )
    return "\n".join(lines) + "\n"


def load_results(path):
    """The bench JSON at `path` (relative to the checkout). `FILE#NAME` is
    the timing case `NAME` of a GPU check's JSON (`scripts/gpu_check.py`
    writes one bench JSON per case under `timings.cases`)."""
    path, _, case = path.partition("#")
    with open(ROOT / path) as f:
        results = json.load(f)
    if not case:
        return results
    for entry in results["timings"]["cases"]:
        if entry["name"] == case:
            return entry["results"]
    raise KeyError(f"{path} has no timing case {case!r}")


def _cell(value, limit):
    """The cell of a rounded ratio `value` (a string), with its verdict when
    the row has a target `limit` (a float, else None)."""
    if limit is None:
        return value
    if float(value) <= limit:
        return f"{value} met"
    return f"{value} **missed** by {float(value) - limit:.2f}"


def _rewrite_rows(table, fill):
    """`table` (header, rule, rows) with each row's cells set from its JSON:
    `fill(row, results)` gets the row (header -> cell) and the loaded JSON
    of its `JSON` cell and returns `{column: new cell}`."""
    lines = table.rstrip("\n").split("\n")
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    out = lines[:2]
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        row = dict(zip(header, cells))
        for column, value in fill(row, load_results(row["JSON"].strip("`"))).items():
            cells[header.index(column)] = value
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _limit(row):
    target = row.get("target")
    return None if target in (None, "–") else float(target.removeprefix("≤ "))


def _interval_cell(interval):
    """`low–high`, or a dash where the two were timed a different number of
    times (a slow implementation timed fewer times has no paired interval)."""
    return "–" if interval is None else "%.2f–%.2f" % interval


def _ratio_cells(row, results, counts):
    ratio = row["ratio"].strip("`")
    limit = _limit(row)
    values, intervals = {}, []
    for column, mode in (("fwd+bwd", "train"), ("fwd", "infer")):
        values[column] = _cell(f"{results['ratios'][mode][ratio]:.2f}", limit)
        interval = report.ratio_interval(results["rows"], mode, ratio)
        intervals.append(_interval_cell(interval))
        if limit is not None:
            inside = interval is not None and interval[0] <= limit
            counts.append((values[column].endswith("met"), inside))
    if INTERVAL in row:
        values[INTERVAL] = "; ".join(intervals)
    if "load 1 min" in row:
        values["load 1 min"] = f"{results['environment']['load_average_1m']:.1f}"
    return values


def _first_call_cells(row, results):
    ratio = row["ratio"].strip("`")
    first = results.get("first_call_ratios")
    rows = {(r["impl"], r["mode"]): r for r in results["rows"]}
    values = {}
    for column, mode in (("fwd+bwd", "train"), ("fwd", "infer")):
        values[column] = NOT_MEASURED
        if first is not None:
            values[column] = _cell(f"{first[mode][ratio]:.2f}", _limit(row))
    for column, impl in zip(("ours ms", "this ms"), ratio.split("/")):
        ms = [rows[impl, m].get("first_call_ms") for m in ("train", "infer")]
        values[column] = (
            NOT_MEASURED if None in ms else "; ".join(f"{v:.0f}" for v in ms)
        )
    values["load 1 min"] = f"{results['environment']['load_average_1m']:.1f}"
    return values


def _demo_cells(row, results):
    models = results["models"]
    ours = models[next(iter(models))]
    keras_masked = models["keras_masked"]
    return {
        "ours first epoch s": f"{ours['first_epoch_s']:.1f}",
        "Keras masked first epoch s": f"{keras_masked['first_epoch_s']:.1f}",
        "ours ÷ Keras masked": _cell(
            f"{ours['first_epoch_s'] / keras_masked['first_epoch_s']:.2f}",
            _limit(row),
        ),
        "s/epoch after (ours; Keras masked)": (
            f"{ours['epoch_s']:.2f}; {keras_masked['epoch_s']:.2f}"
        ),
        "command": "`KERAS_BACKEND=%s %s`"
        % (results["backend"], " ".join(results["command"])),
    }


def _ratio_table(table, counts):
    return _rewrite_rows(table, lambda row, res: _ratio_cells(row, res, counts))


def _first_call_table(table):
    return _rewrite_rows(table, _first_call_cells)


def demo_table(table):
    """The `demo-first-epoch` table with its cells from the demo JSON of
    each row: ours' (the first model) and Keras' masked model's first epoch
    and mean later epoch in seconds, ours ÷ Keras' first epoch (with its
    verdict against the row's target) and the command that wrote the file."""
    return _rewrite_rows(table, _demo_cells)


def rewrite(page):
    def table(match):
        results = load_results(match.group(2))
        return match.group(1) + report.markdown_table(results) + "\n"

    page = TABLE.sub(table, page)
    page = RUNS.sub(lambda m: m.group(1) + runs_table(load_results(m.group(2))), page)
    page = FIRST.sub(lambda m: m.group(1) + _first_call_table(m.group(2)), page)
    page = DEMO.sub(lambda m: m.group(1) + demo_table(m.group(2)), page)
    # The summary line counts the figures of the tables above it.
    summary_line = MET.search(page)
    summary_at = summary_line.start() if summary_line else 0
    counts = []

    def ratio_table(match):
        counted = counts if match.start() < summary_at else []
        return match.group(1) + _ratio_table(match.group(2), counted)

    page = RATIOS.sub(ratio_table, page)
    met = sum(m for m, _ in counts)
    level = sum(inside for m, inside in counts if not m)

    def summary(match):
        return (
            f"**Met: {met} of the {len(counts)} figures {match.group(2)}; "
            f"missed: {len(counts) - met}, of them {level} with the target "
            f"inside the run's 95% interval.**"
        )

    return MET.sub(summary, page, count=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing")
    args = parser.parse_args(argv)
    changed = 0
    for page in PAGES:
        old = page.read_text()
        new = rewrite(old)
        changed += new != old
        if not args.check:
            page.write_text(new)
    return int(bool(changed)) if args.check else 0


if __name__ == "__main__":
    sys.exit(main())
