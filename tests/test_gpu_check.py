"""`scripts/gpu_check.py`: the GPU check, rehearsed on a CPU.

The check runs on a CUDA GPU, which CI does not have, within a time budget and
a limit on the files it may return. Its rehearsal (`--device cpu --quick`:
every section at tiny sizes) runs here once per backend, in a fresh
process, and must: exit 0, write at most 6 files, fill every section
(environment, correctness of every kernel the backend offers, timings in the
bench's JSON form, the test subset), and write JSON that the bench's own
readers (`format_table`, `markdown_table`, `--from-json`) read. A second
run with a budget too small for the work must stop before the budget,
say what it skipped and why, and still exit 0 with its JSON written.
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import keras
import pytest

from maskedrnn import backends, bench
from tests.helpers import script

BACKEND = keras.backend.backend()
ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
SECTIONS = ("environment", "correctness", "timings", "tests")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        BACKEND not in ("torch", "jax"),
        reason="the GPU check runs on torch and JAX, not TensorFlow",
    ),
]


def rehearse(folder, budget):
    """Runs the rehearsal into `folder`; `(process, wall seconds, JSON)`."""
    env = dict(os.environ, KERAS_BACKEND=BACKEND, PYTHONPATH=str(ROOT))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--backend", BACKEND, "--budget-s",
         str(budget), "--out", str(folder), "--device", "cpu", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=budget + 120,
    )
    wall = time.monotonic() - started
    path = folder / f"gpu_check-{BACKEND}.json"
    results = json.loads(path.read_text()) if path.exists() else None
    return done, wall, results


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu_check")
    # Ample: it finishes long before on any machine; only a loaded one
    # needs more than a few minutes (JAX compiles every case).
    return (*rehearse(folder, 900), folder)


def test_rehearsal_passes_within_the_file_limit(rehearsal):
    done, wall, results, folder = rehearsal
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) <= 6, files
    assert f"gpu_check-{BACKEND}.json" in files and f"gpu_check-{BACKEND}.log" in files
    assert results["status"] == "passed" and results["failures"] == []
    assert all(section in results for section in SECTIONS)
    assert results["elapsed_s"] < results["budget_s"]
    log = (folder / f"gpu_check-{BACKEND}.log").read_text()
    assert "[tests] exit 0" in log and "passed" in log  # pytest's output is there


def test_environment_says_versions_device_and_precision(rehearsal):
    env = rehearsal[2]["environment"]
    assert env["device"] == "cpu" and env["keras_backend"] == BACKEND
    assert env["kernels"] == list(backends.current().KERNELS)
    if BACKEND == "torch":
        assert {"torch", "tf32_matmul", "tf32_cudnn"} <= set(env)
    else:
        assert {"jax", "jaxlib", "jax_default_matmul_precision"} <= set(env)


def test_correctness_checks_every_kernel_of_every_case(rehearsal):
    section = rehearsal[2]["correctness"]
    assert section["skipped"] == []
    assert section["precision"] == (
        {"tf32_matmul": False, "tf32_cudnn": False,
         "float32_matmul_precision": section["precision"].get(
             "float32_matmul_precision")}
        if BACKEND == "torch"
        else {"jax_default_matmul_precision": "highest"}
    )
    cases = section["cases"]
    # --quick: each value of each factor (LSTM, GRU x MaskedBidirectional,
    # MaskedRNN x mask=/lengths= x states x the check's size and the edge
    # batch) in 2 of the 32 cases.
    assert sorted(c["name"] for c in cases) == sorted(script("gpu_parity").QUICK)
    for factor in ("cell", "layer", "how", "states", "edge"):
        assert len({str(c["case"][factor]) for c in cases}) == 2, factor
    for case in cases:
        assert case["ok"], case
        kernels = {w["kernel"] for w in case["kernels"]}
        assert kernels == {"default", *backends.current().KERNELS}
        checked = [w for w in case["kernels"] if "diffs" in w]
        assert checked and all(w["ok"] for w in checked)
        for w in case["kernels"]:
            assert ("diffs" in w) != ("declined" in w or "skipped" in w), w
        train = [w for w in checked if w["mode"] == "train"]
        assert train and all(
            {"grad_inputs", "grad_weights", "grad_initial_state"} <= set(w["diffs"])
            for w in train
        )
        if BACKEND == "torch" and case["case"]["edge"] is False:
            assert case["torch_packed_vs_keras_masked"]["ok"]
            assert all("diffs_torch_packed" in w for w in checked)


def test_timings_are_bench_results_with_every_kernel(rehearsal, tmp_path, capsys):
    """The headline case (LSTM, pre-padded, ours' default plan) first, then
    the rest with every kernel forced, each in the bench's JSON form."""
    section = rehearsal[2]["timings"]
    assert section["skipped"] == [] and len(section["cases"]) == 2
    headline, with_kernels = section["cases"]
    assert headline["name"] == "lstm-pre" and "--kernel" not in headline["argv"]
    assert not any(":" in r["impl"] for r in headline["results"]["rows"])
    assert "--profile" in headline["argv"]
    assert "--kernel" in with_kernels["argv"]
    kernels = backends.current().KERNELS
    paddings = set()
    for case in section["cases"]:
        results = case["results"]
        assert set(results) >= {"config", "environment", "rows", "ratios"}
        assert results["environment"]["device"] == "cpu"
        assert results["config"]["modes"] == ["train", "infer"]
        paddings.add(results["config"]["padding"])
        # The bench's own readers take it as they take its --json files.
        table = bench.format_table(results)
        bench.report.markdown_table(results)
        path = tmp_path / f"{case['name']}.json"
        path.write_text(json.dumps(results))
        capsys.readouterr()
        bench.main(["--from-json", str(path)])
        assert capsys.readouterr().out.strip() == table.strip()
        rows = {(r["impl"], r["mode"]) for r in results["rows"]}
        declined = {(d["impl"], d["mode"]) for d in results.get("declined", [])}
        for kernel in kernels if case is with_kernels else ():
            for mode in ("train", "infer"):
                assert (f"maskedrnn:{kernel}", mode) in rows | declined, (kernel, mode)
        assert {"keras_masked", "keras_unmasked"} <= {impl for impl, _ in rows}
        if BACKEND == "torch":
            assert {"torch_packed", "torch_unpacked"} <= {impl for impl, _ in rows}
        for row in results["rows"]:
            if bench.config.is_slow(row["impl"]):
                assert len(row["times_ms"]) <= 3
    assert paddings == {"pre", "post"}
    assert any(c["results"]["config"]["time"] > 6 for c in section["cases"])  # long


def test_the_smoke_subset_runs_the_one_call_kernel_tests_first():
    """The test subset starts with the one-call kernel's tests; on torch
    what it collects covers float16 and bfloat16, go_backwards,
    return_sequences=False, initial states and every merge mode (pytest's
    own collection of the selection is the oracle); on JAX it runs cuDNN's
    LSTM on both of its paths and leaves out the device-independent grids."""
    check = script("gpu_check")
    selection = check.smoke_selection(BACKEND, quick=False)
    smoke = script("gpu_smoke")
    if BACKEND == "jax":
        # cuDNN's LSTM on both of its paths first; what a device does not
        # change is left to the CPU jobs.
        assert selection[0].endswith("::test_cudnn_matches_reference")
        assert set(check.SMOKE) - set(selection) == set(smoke.SMOKE_JAX_LEAVES_OUT)
        return
    assert set(check.SMOKE) <= set(selection)
    if BACKEND != "torch":
        return
    assert selection[0] == "tests/test_torch_fused.py"
    assert check.smoke_selection(BACKEND, quick=True)[0].startswith(selection[0])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q",
         "-p", "no:cacheprovider", *selection],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = [line for line in done.stdout.splitlines() if "test_torch_fused.py::" in line]
    joined = "\n".join(ids)
    for policy in ("mixed_float16", "mixed_bfloat16"):
        assert f"test_mixed_precision_matches_keras_masked[lstm-{policy}]" in joined
    assert "test_masked_rnn_go_backwards_matches_keras" in joined
    for merge_mode in ("concat", "sum", "mul", "ave", "None"):
        for sequences in ("True", "False"):
            case = f"{merge_mode}-{sequences}"
            assert f"test_merge_modes_without_states[{case}]" in joined
    # wrapper-kind-data-return_sequences-initial
    grid = "test_matches_keras_masked_outputs_states_and_gradients"
    assert f"{grid}[bidirectional-lstm-pre-False-True]" in joined
    assert f"{grid}[rnn-gru-lengths-False-False]" in joined


def test_the_headline_timing_runs_before_the_correctness_section(rehearsal):
    """The headline timing case runs first, with the timings' whole share
    before it: a section of compilations (JAX's correctness) can never
    leave the timings empty. The log's order is the oracle."""
    log = (rehearsal[3] / f"gpu_check-{BACKEND}.log").read_text()
    headline = log.index("[timings] lstm-pre:")
    assert headline < log.index("[correctness]") < log.index("[timings] gru-long")


@pytest.mark.skipif(BACKEND != "jax", reason="the oracle's jitted function: JAX")
def test_the_oracle_compiles_once_per_layer_and_shape():
    """The `mask=` and `lengths=` cases of one layer and size share the
    oracle's jitted function (one compilation), and each case is still
    checked against an oracle with its own weights: ours agrees with it
    (were the first case's weights reused, ours would not)."""
    parity = script("gpu_parity")
    runner = parity.Runner(BACKEND, "cpu")
    found = dict(parity.cases(parity.EDGE, parity.EDGE))
    names = ["edge-lstm-rnn-mask_pre", "edge-lstm-rnn-lengths_post"]
    records = [
        parity.run_case(name, found[name], runner, BACKEND, "cpu", seed=i)
        for i, name in enumerate(names)
    ]
    assert all(r["ok"] for r in records), records
    assert len(runner.jitted) == 1
    (step,) = runner.jitted.values()
    assert step._cache_size() == 1


def test_a_small_budget_stops_early_and_says_what_it_skipped(tmp_path):
    # The tests section runs only with 10 s or more left before the end
    # (0.95 x the budget), so at 12 s it is skipped however fast the rest is.
    budget = 12
    done, wall, results = rehearse(tmp_path, budget)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert results is not None and all(s in results for s in SECTIONS)
    assert results["elapsed_s"] < budget
    assert wall < budget + 15  # the interpreter's start and exit
    if results["status"] == "out of time" and "watchdog" in results:
        # A case did not return after its deadline: cut off, and said.
        case = results["watchdog"]["case"]
        assert case.split()[0] in SECTIONS and "watchdog" in done.stdout, results
    elif results["status"] == "out of time":  # while Keras started (a busy machine)
        assert all(results[s]["skipped"] for s in SECTIONS), results
    else:
        assert results["status"] == "passed"
        skipped = (
            results["correctness"]["skipped"]
            + results["timings"]["skipped"]
            + ([results["tests"]["skipped"]] if "skipped" in results["tests"] else [])
        )
        assert skipped, results
        for entry in results["correctness"]["skipped"] + results["timings"]["skipped"]:
            assert entry["why"] and entry["name"]
    assert len(list(tmp_path.iterdir())) <= 6


def test_a_case_that_ignores_its_deadline_is_cut_off_by_the_watchdog(tmp_path):
    """The timer's exception reaches Python code only; a case stuck in
    native code, or in a library that swallows the exception (here: the
    first correctness case swallows it every time), must not keep the check
    past its budget: the watchdog ends the process a grace period after the
    case's deadline, with the case, the reason and where it was stuck
    written to the JSON, exit 0."""
    budget = 20
    code = f"""
import importlib.util, sys, time
sys.path.insert(0, {str(ROOT / "scripts")!r})
import gpu_parity

def stuck_case(*args, **kwargs):
    while True:
        try:
            time.sleep(0.05)
        except BaseException:
            pass

gpu_parity.run_case = stuck_case
spec = importlib.util.spec_from_file_location("gpu_check", {str(SCRIPT)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.timing_cases = lambda quick: []  # straight to the stuck case
sys.exit(module.main({["--backend", BACKEND, "--budget-s", str(budget), "--out",
                      str(tmp_path), "--device", "cpu", "--quick"]!r}))
"""
    env = dict(os.environ, KERAS_BACKEND=BACKEND, PYTHONPATH=str(ROOT))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=budget + 120,
    )
    wall = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert wall < budget + 15
    results = json.loads((tmp_path / f"gpu_check-{BACKEND}.json").read_text())
    assert results["status"] == "out of time" and results["elapsed_s"] < budget
    assert "watchdog" in results, results  # else the stuck case never ran
    watchdog = results["watchdog"]
    first = results["correctness"]["skipped"][0]
    assert watchdog["case"] == f"correctness {first['name']}"
    assert "did not return" in first["why"] and "watchdog" in first["why"]
    assert "stuck_case" in watchdog["main_thread_stack"]
    assert results["tests"]["skipped"].startswith("not run: correctness")
    # The timings section had begun (its headline first): the rest not run.
    assert results["timings"]["not_run"].startswith("the rest: correctness")
    log = (tmp_path / f"gpu_check-{BACKEND}.log").read_text()
    assert "[watchdog]" in log and "stuck_case" in log


def test_the_watchdog_waits_longer_at_a_section_deadline_than_at_the_end():
    """A case still running at a section's deadline (a long first
    compilation) gets a quarter of the later sections' time, where that is
    more than the grace; at the budget's end, the grace up to the hard end."""
    budget = script("gpu_budget").Budget(300, start=1000.0)
    assert (budget.end, budget.blocking_end, budget.grace) == (1295.0, 1297.0, 20.0)
    # 160 s left after the deadline: 40 s past it, not 20.
    assert budget.cut_off_at(1135.0) == 1175.0
    # 60 s left after it: a quarter is 15 s, the grace is longer.
    assert budget.cut_off_at(1235.0) == 1255.0
    # Never past the hard end.
    assert budget.cut_off_at(1290.0) == budget.blocking_end
    assert budget.cut_off_at(budget.end) == budget.blocking_end


def test_a_wrong_result_fails_its_case(monkeypatch):
    """The correctness section's comparisons catch a wrong layer: ours
    given other weights than the oracles' differs beyond the tolerances,
    for every kernel that runs, and the case is not ok."""
    parity = script("gpu_parity")
    build_pair = parity.build_pair

    def wrong_pair(case):
        ours, ref = build_pair(case)
        ours.set_weights([w * 1.5 for w in ref.get_weights()])
        return ours, ref

    monkeypatch.setattr(parity, "build_pair", wrong_pair)
    name = "edge-lstm-bidirectional-mask_pre-states"
    case = dict(parity.cases(parity.EDGE, parity.EDGE))[name]
    runner = parity.Runner(BACKEND, "cpu")
    record = parity.run_case(name, case, runner, BACKEND, "cpu")
    assert record["ok"] is False
    checked = [w for w in record["kernels"] if "diffs" in w]
    assert checked and not any(w["ok"] for w in checked)
    for w in checked:
        assert w["diffs"]["outputs"] > parity.TOLERANCE["outputs"]


def test_tests_stopped_at_their_limit_fail_the_check(tmp_path, monkeypatch):
    """A test subset cut off at its limit is not a pass: the check records a
    failure that says so, with what passed and failed before the cut."""
    smoke = script("gpu_smoke")
    slow = tmp_path / "test_slow_subset.py"
    slow.write_text(
        "import time\n\n\ndef test_quick():\n    pass\n\n\n"
        "def test_fails():\n    assert False\n\n\n"
        "def test_slow():\n    time.sleep(60)\n"
    )
    monkeypatch.setattr(smoke, "smoke_selection", lambda backend, quick: [str(slow)])
    # Without pytest-timeout's per-test limit, where installed, the slow
    # test is cut by the subset's own limit only.
    find_spec = smoke.importlib.util.find_spec
    monkeypatch.setattr(
        smoke.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pytest_timeout" else find_spec(name, *a),
    )

    class Budget:
        def left(self):
            return 100.0

    class Args:
        quick = False

    class Check:
        args, budget, results, failures = Args(), Budget(), {}, []
        log_path = tmp_path / "check.log"

        def log(self, text):
            with open(self.log_path, "a") as f:
                f.write(text + "\n")

    check = Check()
    check.log_path.write_text("")
    smoke.smoke_tests(check, BACKEND, "cpu", tests_s=15)
    record = check.results["tests"]
    assert record["returncode"] is None
    assert record["counts"] == {"passed": 1, "failed": 1}
    assert check.failures == [
        "tests: stopped at the 15 s limit (1 passed, 1 failed before it)"
    ]
