"""The GPU check of maskedrnn: one command per backend, within a time budget.

On any machine with a CUDA GPU, from a checkout of this repository, with
the backend's CUDA build and pytest installed (no TensorFlow needed;
docs/benchmarks.md, "Measuring on a GPU"), one command per backend:

    KERAS_BACKEND=torch python scripts/gpu_check.py --backend torch \\
        --budget-s 300 --out DIR
    KERAS_BACKEND=jax python scripts/gpu_check.py --backend jax \\
        --budget-s 250 --out DIR

and on any machine the rehearsal of every section at tiny sizes (CI,
tests/test_gpu_check.py):

    python scripts/gpu_check.py --backend torch --budget-s 120 --out DIR \\
        --device cpu --quick

Sections, each written to the JSON as soon as it ends (the first timing
case runs before the correctness section, the other timing cases after
it, see the budget below):

- `environment`: versions, the device, cuDNN, the TF32 flags (torch) or
  JAX's default matmul precision, the kernels the backend offers;
- `correctness` (TF32 off / JAX `"highest"`): every kernel of ours against
  Keras' masked layer and PyTorch's packed module (`scripts/gpu_parity.py`),
  tolerances asserted;
- `timings` (the default TF32 setting, recorded): `maskedrnn.bench` cases,
  each in the bench's JSON form (`config`, `environment`, `rows`,
  `ratios`); first the headline (an LSTM, pre-padded: ours against Keras'
  unmasked and masked layers, profiled), then every case with every kernel
  the backend offers forced as rows of its own (`--kernel`); Keras' masked
  layer timed at most 3 times (`--slow-repeats`);
- `tests`: a GPU smoke subset of the test suite in a subprocess (at most
  2 minutes; pytest-timeout where installed; `scripts/gpu_smoke.py`), on
  torch the one-call kernel's tests (tests/test_torch_fused.py) first.

Sizes: B=64 T=100 D=U=512 (correctness and timings, pre-padded with
`mask=` and post-padded with `lengths=`), B=64 T=1000 D=U=256 (the long
timing case), B=6 T=7 D=3 U=4 (the edge batch). `--quick`: every section
at tiny sizes, 2 of the 32 correctness cases (each value of each factor)
and 2 timing cases (the headline, pre-padded; post-padded and long with
every kernel).

The budget: the check stops itself before `--budget-s` seconds (counted
from its start). The tests get up to min(120 s, 30% of the budget) at the
end; of the time before them, correctness gets up to 45%, the timings the
rest. The headline timing case runs first, with the timings' whole share
before it: a backend that compiles every case (JAX) spends the correctness
section's time on compiling, and the headline must never be what is left
out. On JAX each correctness case compiles its oracle (Keras' masked
layer) once per layer and shape, reused across the cases that share them
(`gpu_parity.Runner`). Before each case it estimates the case's time from the
cases before it and skips what would not fit; a case still running at its
section's deadline is interrupted (a timer); both are recorded under the
section's `skipped`. A case that does not return within a grace period
after its deadline is cut off by a watchdog (`scripts/gpu_budget.py`): the
JSON says which case and where it was stuck, with status "out of time".
The JSON is rewritten (atomically) after every case,
so a check killed from outside still leaves its results.

Files in `--out` (at most 3): `gpu_check-<backend>.json` (everything),
`gpu_check-<backend>.log` (what was printed, the bench tables and the
tests' output) and `gpu_check-<backend>-profile.txt` (the kernels the
profiler saw in the first timing case).

Exit status: 0 when every comparison passed and the tests passed (timing
and correctness cases skipped for the budget included); 1 when a
comparison failed, a case raised, a test failed or the test subset was cut
at its limit; 2 for bad arguments.
"""

import argparse
import contextlib
import importlib.util
import json
import os
import pathlib
import platform
import subprocess
import sys
import threading
import time
import traceback

START = time.monotonic()
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's package, not an installed one
sys.path.insert(0, str(ROOT / "scripts"))

from gpu_budget import Budget, OutOfTime, start_watchdog  # noqa: E402
from gpu_smoke import SMOKE, smoke_selection, smoke_tests  # noqa: E402, F401

# Sizes of the cases (batch, time, features, units), repeats and warm-up.
SIZES = {
    False: {
        "main": dict(batch=64, time=100, features=512, units=512),
        "long": dict(batch=64, time=1000, features=256, units=256),
        "edge": dict(batch=6, time=7, features=3, units=4),
        "repeats": {"main": (30, 3), "long": (10, 2)},
        "slow_repeats": {"main": 3, "long": 1},
        "tests_s": 120,
    },
    True: {  # --quick
        "main": dict(batch=4, time=6, features=3, units=4),
        "long": dict(batch=4, time=20, features=3, units=4),
        "edge": dict(batch=6, time=7, features=3, units=4),
        "repeats": {"main": (2, 1), "long": (2, 1)},
        "slow_repeats": {"main": 1, "long": 1},
        "tests_s": 120,
    },
}
SECTIONS = ("environment", "correctness", "timings", "tests")
# Share of the time before the tests that the correctness section may use.
CORRECTNESS_SHARE = 0.45


class Check:
    """The results (one JSON, rewritten after every case) and the log."""

    def __init__(self, args):
        self.args = args
        self.out = pathlib.Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        stem = f"gpu_check-{args.backend}"
        self.json_path = self.out / f"{stem}.json"
        self.log_path = self.out / f"{stem}.log"
        self.profile_path = self.out / f"{stem}-profile.txt"
        self.log_path.write_text("")
        self.budget = Budget(args.budget_s, START)
        self.failures = []
        # Seconds per cost unit measured so far, per section (its estimates).
        self.per_unit = {}
        # Sections whose every case ran or was skipped.
        self.done = set()
        # (section, case name, deadline) of the case that runs, for the watchdog.
        self.running = None
        self.lock = threading.Lock()
        self.results = {
            "command": sys.argv,
            "budget_s": args.budget_s,
            "device": args.device,
            "quick": args.quick,
            "status": "running",
        }

    def log(self, text):
        text = f"{time.monotonic() - START:6.1f}s {text}"
        print(text, flush=True)
        with open(self.log_path, "a") as f:
            f.write(text + "\n")

    def flush(self):
        with self.lock:
            self.results["elapsed_s"] = round(time.monotonic() - START, 2)
            self.results["failures"] = self.failures
            tmp = self.json_path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(self.results, indent=1, default=str))
            os.replace(tmp, self.json_path)

    def start_watchdog(self):
        """Starts the watchdog (`gpu_budget.start_watchdog`): a case
        that does not return after its deadline ends the check."""
        self.fault_log = open(self.log_path, "a")
        start_watchdog(self.budget, lambda: self.running, self.cut_off, self.fault_log)

    def cut_off(self, running, stack):
        """Records the case that did not return (or the budget's end) and
        marks every section not run yet as skipped."""
        now = time.monotonic()
        if running is not None:
            section, name, deadline = running
            reason = (
                f"did not return {now - deadline:.0f} s after its deadline; "
                "the watchdog ended the check"
            )
            record = self.results.setdefault(section, {})
            if isinstance(record.get("skipped"), list):
                record["skipped"].append({"name": name, "why": reason})
            else:
                record["skipped"] = reason
            where = f"{section} {name}"
        else:
            where = "outside a case"
            reason = "the budget ran out; the watchdog ended the check"
        for section in SECTIONS:
            if section not in self.results:
                self.results[section] = {"skipped": f"not run: {where} {reason}"}
            elif section not in self.done:  # some of its cases ran
                self.results[section]["not_run"] = f"the rest: {where} {reason}"
        self.results["status"] = "out of time"
        self.results["watchdog"] = {
            "case": where,
            "why": reason,
            "at_s": round(now - START, 1),
            "main_thread_stack": stack,
        }
        self.log(f"[watchdog] {where}: {reason}; the main thread was at:\n{stack}")
        for attempt in range(3):  # the main thread may be changing the results
            try:
                self.flush()
                break
            except RuntimeError:
                time.sleep(0.05)

    def run_cases(self, section, cases, run_one, deadline, cost):
        """Runs `run_one(name, case)` for each `(name, case)` before
        `deadline`, skipping a case whose estimated time (`cost(case)`
        units at the measured seconds per unit so far) would not fit. A
        section may run in parts: its records and estimates carry over."""
        record = self.results[section]
        record.setdefault("cases", [])
        record.setdefault("skipped", [])
        per_unit = self.per_unit.get(section)
        for name, case in cases:
            left = self.budget.left(deadline)
            estimate = None if per_unit is None else 1.2 * per_unit * cost(case)
            if left <= 0 or (estimate is not None and estimate > left):
                reason = (
                    f"estimated {estimate:.0f} s, {max(left, 0):.0f} s left"
                    if estimate is not None
                    else "no time left"
                )
                record["skipped"].append({"name": name, "why": reason})
                self.log(f"[{section}] skipped {name}: {reason}")
                continue
            started = time.monotonic()
            self.running = (section, name, min(deadline, self.budget.end))
            try:
                try:
                    with self.budget.limit(deadline):
                        result = run_one(name, case)
                finally:
                    self.running = None
            except OutOfTime:
                seconds = time.monotonic() - started
                reason = f"interrupted at the section's deadline after {seconds:.0f} s"
                record["skipped"].append({"name": name, "why": reason})
                self.log(f"[{section}] {name}: {reason}")
                self.flush()
                continue
            except Exception:  # recorded, counted as a failure
                text = traceback.format_exc()
                record["cases"].append({"name": name, "error": text})
                self.failures.append(f"{section} {name}: raised")
                self.log(f"[{section}] {name} raised:\n{text}")
                self.flush()
                continue
            seconds = time.monotonic() - started
            per_unit = seconds / max(cost(case), 1e-9)
            self.per_unit[section] = per_unit
            result["seconds"] = round(seconds, 2)
            record["cases"].append(result)
            self.flush()
        self.flush()


def environment(check, backend, gpu):
    """The `environment` section (the bench's, plus the precision flags)."""
    import keras

    from maskedrnn import backends
    from maskedrnn.bench import report, timing

    harness = timing.backend_module(backend).Harness(gpu)
    env = report.environment(backend, harness)
    env["kernels"] = list(backends.current().KERNELS)
    env["python_executable"] = sys.executable
    env["keras_backend"] = keras.backend.backend()
    env["pytest_timeout"] = importlib.util.find_spec("pytest_timeout") is not None
    env["hypothesis"] = importlib.util.find_spec("hypothesis") is not None
    env.update(precision(backend))
    env["nvidia_smi"] = _command(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"]
    )
    env["git_head"] = _command(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    return env


def _command(argv):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"not run: {type(e).__name__}: {e}"
    return (done.stdout + done.stderr).strip()


def precision(backend):
    """The settings that decide float32 matmul precision."""
    if backend == "torch":
        import torch

        return {
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "tf32_cudnn": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        }
    import jax

    return {"jax_default_matmul_precision": jax.config.jax_default_matmul_precision}


@contextlib.contextmanager
def exact_float32(backend):
    """TF32 off (torch) / JAX's `"highest"` matmul precision in the block."""
    if backend == "torch":
        import torch

        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved[0]
            torch.backends.cudnn.allow_tf32 = saved[1]
        return
    import jax

    saved = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", "highest")
    try:
        yield
    finally:
        jax.config.update("jax_default_matmul_precision", saved)


def correctness(check, backend, device, deadline):
    import gpu_parity

    sizes = SIZES[check.args.quick]
    runner = gpu_parity.Runner(backend, device)
    check.results["correctness"] = {
        "tolerance": gpu_parity.TOLERANCE,
        "oracles": ["keras_masked"] + (["torch_packed"] if backend == "torch" else []),
    }
    with exact_float32(backend):
        check.results["correctness"]["precision"] = precision(backend)

        def run_one(name, case):
            record = gpu_parity.run_case(name, case, runner, backend, device)
            verdict = "ok" if record["ok"] else "FAILED"
            declined = [w for w in record["kernels"] if "declined" in w]
            check.log(
                f"[correctness] {name}: {verdict} ({len(record['kernels'])} "
                f"kernel/mode runs, {len(declined)} declined)"
            )
            if not record["ok"]:
                check.failures.append(f"correctness {name}")
                for entry in record["kernels"]:
                    if entry.get("ok") is False:
                        check.log(f"  {json.dumps(entry)}")
            return record

        def cost(case):
            return relative_cost(case, sizes["main"])

        cases = gpu_parity.cases(sizes["main"], sizes["edge"], check.args.quick)
        check.run_cases("correctness", cases, run_one, deadline, cost)
    check.done.add("correctness")


def relative_cost(size, main):
    """A case's expected time, in units of a fixed part (compiling, Keras'
    Python, launching: about as much as the arithmetic of the check's
    size) plus its arithmetic relative to the check's size."""

    def work(s):
        return s["batch"] * s["time"] * s["units"] * (s["features"] + s["units"])

    return 1 + work(size) / work(main)


def timing_cases(quick):
    """`(name, bench options, size, profile, kernels)`, most telling first: the
    headline (an LSTM, pre-padded, profiled, ours' default plan only: the
    case that must fit), then each case with every kernel forced (`kernels`)
    (`quick`: the headline, and post-padded and long in one case)."""
    headline = ("lstm-pre", [], "main", True, False)
    if quick:
        return [headline, ("gru-long-post", [], "long", False, True)]
    found = [headline, ("lstm-pre-kernels", [], "main", False, True)]
    for padding in ("pre", "post"):
        for cell in ("lstm", "gru"):
            if (cell, padding) != ("lstm", "pre"):
                found.append((f"{cell}-{padding}", [], "main", False, True))
    for cell in ("lstm", "gru"):
        found.append((f"{cell}-pre-state", ["--return-state"], "main", False, True))
    for cell in ("lstm", "gru"):
        found.append((f"{cell}-long-pre", [], "long", False, True))
    for cell in ("lstm", "gru"):
        found.append((f"rnn-{cell}-pre", ["--layer", "rnn"], "main", False, True))
    return found


def timing_plan(check, backend, device):
    """Starts the `timings` section; its cases as `(name, {"argv", "cost",
    "profile"})`, in `timing_cases` order."""
    from maskedrnn import backends

    sizes = SIZES[check.args.quick]
    check.results["timings"] = {
        "precision": precision(backend),
        "kernels": list(backends.current().KERNELS),
    }
    cases = []
    for name, extra, size, profile, kernels in timing_cases(check.args.quick):
        cell = name.split("-")[1] if name.startswith("rnn-") else name.split("-")[0]
        padding = "post" if "-post" in name else "pre"
        repeats, warmup = sizes["repeats"][size]
        argv = ["--cell", cell, "--padding", padding, "--mode", "both"]
        argv += [f"--{k}={v}" for k, v in sizes[size].items()]
        argv += ["--repeats", str(repeats), "--warmup", str(warmup)]
        argv += ["--slow-repeats", str(sizes["slow_repeats"][size])]
        # The budget is sized for the steady-state timings: a first call
        # (trace and compilation) of every case and kernel would not fit.
        argv += ["--first-call-repeats", "0"]
        argv += ["--kernel", *backends.current().KERNELS] if kernels else []
        argv += ["--no-progress", "--device", device, *extra]
        argv += ["--profile"] if profile else []
        # Every kernel forced: about twice the rows of the bench's default.
        cost = relative_cost(sizes[size], sizes["main"]) * (2 if kernels else 1)
        cases.append((name, {"argv": argv, "cost": cost, "profile": profile}))
    return cases


def timings(check, cases, deadline):
    """Runs timing `cases` (a part of `timing_plan`'s) before `deadline`."""
    from maskedrnn.bench import build_parser, format_table
    from maskedrnn.bench import run as bench_run

    def run_one(name, case):
        results = bench_run(build_parser().parse_args(case["argv"]))
        table = format_table(results)
        command = " ".join(case["argv"])
        check.log(f"[timings] {name}: python -m maskedrnn.bench {command}")
        check.log(table)
        if case["profile"]:
            write_profile(check, name, results)
        return {"name": name, "argv": case["argv"], "results": results}

    check.run_cases("timings", cases, run_one, deadline, lambda c: c["cost"])


def write_profile(check, name, results):
    """The profiler's view of one timing case, every kernel by name."""
    from maskedrnn.bench import kernels

    lines = [f"profile of timing case {name} ({results['environment']['device']})"]
    for row in results["rows"]:
        p = row.get("profile", {})
        lines.append(f"\n{row['mode']} {row['impl']}: {p.get('tool')} {p.get('note')}")
        if "cuda_kernels" in p:
            cudnn = ", ".join(kernels.cudnn_rnn_kernels(p)) or "none"
            lines.append(f"  cuDNN RNN kernels: {cudnn}")
        for kind in ("cuda_kernels", "cuda_kernels_top", "rnn_ops"):
            for k in p.get(kind, []):
                lines.append(f"  {kind:<17} x{k['count']:<5} {k['name']}")
    check.profile_path.write_text("\n".join(lines) + "\n")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="scripts/gpu_check.py",
        description="The GPU check: environment, correctness, timings and a "
        "test subset on one backend, within a time budget.",
    )
    parser.add_argument("--backend", choices=("torch", "jax"), required=True)
    parser.add_argument("--budget-s", type=float, required=True,
                        help="stop before this many seconds from the start")
    parser.add_argument("--out", required=True, help="folder for the (<= 3) files")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="auto (default): the GPU if the backend sees one")
    parser.add_argument("--quick", action="store_true",
                        help="every section at tiny sizes (the CI rehearsal)")
    args = parser.parse_args(argv)
    if args.budget_s <= 0:
        parser.error(f"--budget-s must be > 0; got {args.budget_s}.")
    asked = os.environ.get("KERAS_BACKEND")
    if asked and asked != args.backend:
        parser.error(
            f"--backend {args.backend} but KERAS_BACKEND={asked}: set them alike "
            "(or leave KERAS_BACKEND unset)."
        )
    return args


def start(check, args):
    """Imports Keras, picks the device and fills `environment`; returns
    `"gpu"` or `"cpu"`, or None when `--device gpu` finds none."""
    import keras

    from maskedrnn.bench import gpu_available

    keras.utils.set_random_seed(0)
    gpu_here = gpu_available(args.backend)
    if args.device == "gpu" and not gpu_here:
        check.results["status"] = "no GPU visible"
        check.log(f"--device gpu: the {args.backend} backend sees no GPU.")
        check.flush()
        return None
    device = "gpu" if gpu_here and args.device != "cpu" else "cpu"
    check.results["device"] = device
    check.results["environment"] = environment(check, args.backend, device == "gpu")
    check.log(f"[environment] {json.dumps(check.results['environment'])}")
    check.flush()
    check.done.add("environment")
    return device


def main(argv=None):
    args = parse_args(argv)
    os.environ["KERAS_BACKEND"] = args.backend
    check = Check(args)
    check.log(f"gpu_check {args.backend}: budget {args.budget_s} s, {platform.node()}")
    check.flush()
    check.start_watchdog()
    check.running = ("environment", "start", check.budget.end)
    try:
        with check.budget.limit(check.budget.end):
            device = start(check, args)
    except OutOfTime:
        reason = "the budget ran out while Keras and the backend started"
        check.results["status"] = "out of time"
        for section in SECTIONS:
            check.results.setdefault(section, {})["skipped"] = reason
        check.log(f"gpu_check {args.backend}: {reason}")
        check.flush()
        return 0
    finally:
        check.running = None
    if device is None:
        return 2
    tests_s = min(SIZES[args.quick]["tests_s"], 0.3 * args.budget_s)
    before_tests = check.budget.end - tests_s
    available = before_tests - time.monotonic()
    import keras

    with keras.device(device):
        # The headline timing case first, with the timings' whole share:
        # the correctness section then still gets its share in full.
        cases = timing_plan(check, args.backend, device)
        headline = time.monotonic() + (1 - CORRECTNESS_SHARE) * available
        timings(check, cases[:1], headline)
        split = min(time.monotonic() + CORRECTNESS_SHARE * available, before_tests)
        correctness(check, args.backend, device, split)
        timings(check, cases[1:], before_tests)
        check.done.add("timings")
    smoke_tests(check, args.backend, device, SIZES[args.quick]["tests_s"])
    check.results["status"] = "failed" if check.failures else "passed"
    check.flush()
    check.log(
        f"gpu_check {args.backend}: {check.results['status']} in "
        f"{time.monotonic() - START:.0f} s of {args.budget_s} s"
        + "".join(f"\n  failure: {f}" for f in check.failures)
    )
    return 1 if check.failures else 0


if __name__ == "__main__":
    status = main()
    # Everything is on disk by now (the JSON after every case, the log line
    # by line). A computation interrupted at its deadline (SIGALRM raised
    # inside the backend's call) can leave the backend's threads in a state
    # that crashes the interpreter's teardown (a segfault seen with JAX on a
    # CPU): the exit skips that teardown, so the status is this check's.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
