"""`scripts/test_gpu.sh`: the GPU check's wrapper (wheels here, the install there).

It runs `scripts/gpu_check.py` (tests/test_gpu_check.py rehearses that) after
installing the carried wheels; here: the command it would run, with the
options passed through, its refusals of bad arguments, and that it really
hands over to the check (`--help` reaches `gpu_check.py`).
"""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "test_gpu.sh"

# The same shell script under every backend: checked once.
pytestmark = pytest.mark.on_backends("torch")


def wrapper(*args, **env):
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHON=sys.executable, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_dry_run_prints_the_check_with_the_options_passed_through():
    done = wrapper("--dry-run", "torch", "300", "/tmp/out", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.endswith(
        f"KERAS_BACKEND=torch {sys.executable} scripts/gpu_check.py --backend "
        "torch --budget-s 300 --out /tmp/out --device cpu"
    )
    assert "PYTHONPATH=" in last and f"{ROOT} " in last.replace(":", " ")
    assert "PYTHONUNBUFFERED=1" in last


def test_out_defaults_to_the_out_variable():
    done = wrapper("--dry-run", "jax", "240", OUT="/tmp/elsewhere")
    assert done.returncode == 0, done.stderr
    assert "--backend jax --budget-s 240 --out /tmp/elsewhere" in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (("tensorflow", "300", "/tmp/out"), "BACKEND must be torch or jax"),
        (("torch",), "usage: scripts/test_gpu.sh"),
        (("torch", "300"), "give an output folder"),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(args, message):
    env = {"OUT": ""}
    done = wrapper("--dry-run", *args, **env)
    assert done.returncode == 2
    assert message in done.stderr


def test_it_hands_over_to_the_check(tmp_path):
    """Without `--dry-run` the wrapper runs `gpu_check.py` (here `--help`,
    which measures nothing)."""
    if (ROOT / ".whl").is_dir():
        pytest.skip(".whl/ is here: the wrapper would install its wheels")
    done = wrapper("torch", "10", str(tmp_path), "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: scripts/gpu_check.py" in done.stdout


def test_help_describes_both_machines():
    done = wrapper("--help")
    assert done.returncode == 0
    assert "--fetch-wheels" in done.stdout and "scripts/gpu_check.py" in done.stdout
