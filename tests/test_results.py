"""The committed results and the pages that quote them agree.

- docs/results/ holds exactly the files README.md and docs/*.md cite
  (`docs/results/NAME` or, from a page under docs/, `results/NAME`): every
  cited file exists and every file is cited (README.txt, the folder's
  index, aside).
- Every marked table is its JSON file: `<!-- bench-table FILE -->` is
  `python -m maskedrnn.bench.report FILE`; `<!-- bench-ratios -->` rows
  quote their file's ratios (with the verdict against a target, where the
  row has one) and 95% intervals; `<!-- bench-runs FILE -->` is
  `maskedrnn.bench.runs`' summary; `<!-- bucketing-table FILE -->` is
  `python scripts/bucketing_speed.py --table FILE`; the demo table of
  docs/quickstart.md quotes its JSON files.
  `python -m maskedrnn.bench.docs_tables --check` leaves README.md and
  docs/benchmarks.md as they are.
- Nothing a reader cannot resolve: no issue numbers, "the brief", "this
  session" or dated run times in the code, tests, scripts or pages.
- No module is over 600 lines.
"""

import pathlib
import re

import pytest

from maskedrnn import bench
from maskedrnn.bench import docs_tables
from tests.helpers import script

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A result file, possibly in a subfolder (e.g. `results/gpu/...` from a GPU
# run), named relative to docs/results.
CITED = re.compile(
    r"(?:docs/)?results/((?:[A-Za-z0-9_-]+/)?[A-Za-z0-9_.-]+\.(?:json|txt|png|log))"
)
NOT_RESULTS = {"README.txt"}


def _load(path):
    return docs_tables.load_results(path)


def _cited():
    cited = {}
    for page in PAGES:
        for match in CITED.finditer(page.read_text(encoding="utf-8")):
            cited.setdefault(match.group(1), set()).add(page.name)
    return cited


def _rows(table):
    lines = table.strip().splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        yield line, dict(zip(header, cells))


def _marked(pattern):
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(pattern, text):
            found.append((page.name, *match.groups()))
    return found


# ------------------------------------------------------------ both ways


def test_every_cited_result_exists():
    missing = {name: pages for name, pages in _cited().items()
               if not (RESULTS / name).is_file()}
    assert not missing, f"cited but not in docs/results: {missing}"


def test_every_result_is_cited():
    files = {
        p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file()
    } - NOT_RESULTS
    uncited = sorted(files - set(_cited()))
    assert not uncited, (
        f"docs/results holds files no page cites: {uncited}; cite each next "
        "to the command that wrote it, or delete it"
    )


# ------------------------------------------------------- marked tables


def test_bench_tables_are_their_json():
    found = _marked(r"<!-- bench-table (\S+) -->\n((?:\|.*\n)+)")
    for page, path, table in found:
        assert table.strip() == bench.report.markdown_table(_load(path)), (page, path)


def test_ratio_tables_quote_their_json():
    """Each row of a `bench-ratios` table quotes its JSON file's ratio,
    rounded to 2 digits; where the row has a target (`≤ X`; `–` for none),
    "met" exactly when the rounded ratio is at most X, else "missed by" the
    difference; a `95% interval` cell holds the run's intervals."""
    tables = _marked(r"<!-- bench-ratios -->\n((?:\|.*\n)+)")
    assert {page for page, _ in tables} == {"README.md", "benchmarks.md"}
    targets = 0
    for page, table in tables:
        for line, cells in _rows(table):
            results = _load(cells["JSON"].strip("`"))
            ratio = cells["ratio"].strip("`")
            if "95% interval" in cells:
                intervals = []
                for mode in ("train", "infer"):
                    interval = bench.report.ratio_interval(results["rows"], mode, ratio)
                    # A dash: timed fewer times (a slow layer), no paired interval.
                    intervals.append(
                        "–" if interval is None else "%.2f–%.2f" % interval
                    )
                assert cells["95% interval"] == "; ".join(intervals), (page, line)
            for column, mode in (("fwd+bwd", "train"), ("fwd", "infer")):
                value = f"{results['ratios'][mode][ratio]:.2f}"
                target = cells.get("target", "–")
                if target == "–":
                    assert cells[column] == value, (page, line, column)
                    continue
                targets += 1
                limit = float(target.removeprefix("≤ "))
                if float(value) <= limit:
                    assert cells[column] == f"{value} met", (page, line)
                else:
                    over = f"{float(value) - limit:.2f}"
                    assert cells[column] == f"{value} **missed** by {over}", line
    assert targets, "no ratio with a target is checked"


def test_runs_tables_are_their_json():
    module = docs_tables
    found = _marked(r"<!-- bench-runs (\S+) -->\n((?:\|.*\n)+)")
    assert found
    for page, path, table in found:
        assert table == module.runs_table(_load(path)), (page, path)


def test_bench_docs_script_reproduces_the_pages():
    """`maskedrnn.bench.docs_tables` (how the tables are rewritten after a
    measurement) leaves the pages as they are, and puts a wrong figure
    right."""
    module = docs_tables
    for page in module.PAGES:
        text = page.read_text(encoding="utf-8")
        assert module.rewrite(text) == text, page.name
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    first = re.search(r"<!-- bench-ratios -->\n(?:\|.*\n){2}(\|.*\n)", text)
    row = first.group(1)
    broken_row = re.sub(r"\| (\d\.\d\d)( met)? \|", "| 9.99 |", row, count=1)
    assert broken_row != row
    broken = text.replace(row, broken_row, 1)
    assert module.rewrite(broken) == text


def test_bucketing_tables_are_their_json():
    module = script("bucketing_speed")
    found = _marked(r"<!-- bucketing-table (\S+) -->\n((?:\|.*\n)+)")
    assert found
    for page, path, table in found:
        assert table.strip() == module.table([str(ROOT / path)]).strip(), path


def test_demo_table_quotes_its_json():
    text = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    table = re.search(r"(\| backend, padding .*\n(?:\|.*\n)+)", text).group(1)
    columns = {
        "MaskedBidirectional": ("masked_bidirectional", "accuracy"),
        "Keras masked": ("keras_masked", "accuracy"),
        "Keras, no mask": ("naive", "accuracy"),
    }
    rows = list(_rows(table))
    assert len(rows) == 4
    for line, cells in rows:
        results = _load(cells["JSON"].strip("`"))
        for column, (model, key) in columns.items():
            assert cells[column] == f"{100 * results['models'][model][key]:.2f} %"
        extra = [c for c in cells if c.startswith("no mask, +")]
        assert extra == [f"no mask, +{results['extra_padding']} padding steps"]
        value = results["models"]["naive"]["extra_padding_accuracy"]
        assert cells[extra[0]] == f"{100 * value:.2f} %", line


def _verdict(value, target):
    """A ratio cell: the value, with "met"/"**missed** by" for a target."""
    if target == "–":
        return value
    limit = float(target.removeprefix("≤ "))
    if float(value) <= limit:
        return f"{value} met"
    return f"{value} **missed** by {float(value) - limit:.2f}"


def test_first_call_tables_quote_their_json():
    """Each row of a `bench-first-call` table quotes its JSON file's
    first-call ratio (with its verdict) and both implementations' first-call
    medians; a file without first calls says "not measured"."""
    tables = _marked(r"<!-- bench-first-call -->\n((?:\|.*\n)+)")
    assert tables
    measured = 0
    for page, table in tables:
        for line, cells in _rows(table):
            results = _load(cells["JSON"].strip("`"))
            ratio = cells["ratio"].strip("`")
            rows = {(r["impl"], r["mode"]): r for r in results["rows"]}
            if "first_call_ratios" not in results:
                assert cells["fwd+bwd"] == cells["fwd"] == "not measured", line
                continue
            measured += 1
            for column, mode in (("fwd+bwd", "train"), ("fwd", "infer")):
                value = f"{results['first_call_ratios'][mode][ratio]:.2f}"
                assert cells[column] == _verdict(value, cells["target"]), line
            for column, impl in zip(("ours ms", "this ms"), ratio.split("/")):
                ms = [rows[impl, m]["first_call_ms"] for m in ("train", "infer")]
                assert cells[column] == "%.0f; %.0f" % tuple(ms), line
    assert measured


def test_demo_first_epoch_table_quotes_its_json_and_its_command():
    tables = _marked(r"<!-- demo-first-epoch -->\n((?:\|.*\n)+)")
    assert tables
    for page, table in tables:
        for line, cells in _rows(table):
            path = cells["JSON"].strip("`")
            results = _load(path)
            models = list(results["models"].values())
            ours, keras_masked = models[0], results["models"]["keras_masked"]
            assert cells["ours first epoch s"] == f"{ours['first_epoch_s']:.1f}"
            assert cells["Keras masked first epoch s"] == (
                f"{keras_masked['first_epoch_s']:.1f}"
            )
            ratio = f"{ours['first_epoch_s'] / keras_masked['first_epoch_s']:.2f}"
            assert cells["ours ÷ Keras masked"] == _verdict(ratio, cells["target"])
            command = cells["command"].strip("`").split()
            assert command[0] == f"KERAS_BACKEND={results['backend']}"
            assert command[1:] == results["command"]
            assert command[-2:] == ["--json", path], line


# ------------------------------------------- what a reader can resolve

# Words that point outside the repository: a tracker's issue numbers, the
# brief a task came with, the session that did the work, a day's run times.
UNRESOLVABLE = re.compile(
    r"\bissues? \d+\b|\bissue's\b|\bthe (project )?brief\b|\bthis session\b"
    r"|\d\d:\d\d(-\d\d:\d\d)? UTC\b|\b20\d\d-\d\d-\d\d \d\d:\d\d",
    re.IGNORECASE,
)


def _prose_files():
    for folder, pattern in (
        ("maskedrnn", "**/*.py"),
        ("tests", "*.py"),
        ("scripts", "*"),
        ("docs", "*.md"),
        ("colab", "*.ipynb"),
    ):
        yield from (p for p in sorted((ROOT / folder).glob(pattern)) if p.is_file())
    yield from (ROOT / name for name in ("README.md", "CHANGELOG.md"))


def test_nothing_points_outside_the_repository():
    found = []
    for path in _prose_files():
        if path.name == "test_results.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            if UNRESOLVABLE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number + 1}: {line.strip()}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "line, bad",
    [
        ("see issue 11's targets", True),
        ("the project brief says", True),
        ("This session has no GPU", True),
        ("measured 2026-11-23 19:13 UTC", True),
        ("keras-team/keras#23228", False),
        ("CPU target: <= 1.0x Keras masked", False),
    ],
)
def test_unresolvable_pattern(line, bad):
    assert bool(UNRESOLVABLE.search(line)) == bad


# ------------------------------------------------------- module sizes

LIMIT = 600


def test_no_module_is_over_600_lines():
    long = []
    for folder in ("maskedrnn", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > LIMIT:
                long.append(f"{rel}: {lines}")
    assert not long, f"over {LIMIT} lines: {long}"
