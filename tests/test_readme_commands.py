"""README.md's two commands, and `.ci/run`, which runs them as a user would:
in a fresh virtual environment, in order (scripts/readme_commands.py)."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from tests.helpers import script

ROOT = pathlib.Path(__file__).resolve().parents[1]
readme_commands = script("readme_commands").readme_commands


def test_readme_has_the_demo_then_the_test_command():
    commands = readme_commands((ROOT / "README.md").read_text())
    assert commands == [
        'pip install -e ".[tensorflow-cpu]" && python -m maskedrnn',
        "bash scripts/test.sh",
    ]


def test_comments_and_other_blocks_are_left_out():
    text = (
        "```bash\necho not this\n```\n"
        "## The two commands\n\n"
        "```bash\n# a note\nmake demo   # the demo\nmake test\n```\n"
        "```bash\necho nor this\n```\n"
    )
    assert readme_commands(text) == ["make demo", "make test"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("# Title\n", "no heading"),
        ("## The two commands\n\nplain text\n", "no ```bash"),
    ],
)
def test_a_readme_without_the_block_is_an_error(text, message):
    with pytest.raises(ValueError, match=message):
        readme_commands(text)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_ci_runs_both_commands_in_order_inside_a_fresh_venv(tmp_path):
    """A copy of `.ci/run` whose README's commands record the interpreter
    they run under: both run, in order, from the fresh `.venv` (not the
    interpreter that started CI), and a failing command fails CI."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    shutil.copy(ROOT / "scripts" / "readme_commands.py", tmp_path / "scripts")
    record = 'python -c "import sys; print(sys.prefix)" >> log.txt'
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "stale").write_text("from an earlier run")
    readme = "## The two commands\n\n```bash\n{}   # first\n{}\n```\n"
    (tmp_path / "README.md").write_text(
        readme.format(
            f"echo demo >> log.txt && {record}", f"echo tests >> log.txt && {record}"
        )
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")
    }
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}:{env.get('PATH', '')}"
    done = subprocess.run(
        ["bash", ".ci/run"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    venv = str((tmp_path / ".venv").resolve())
    assert (tmp_path / "log.txt").read_text().split() == ["demo", venv, "tests", venv]
    assert not (tmp_path / ".venv" / "stale").exists()

    (tmp_path / "README.md").write_text(
        readme.format("exit 3", "echo never >> log.txt")
    )
    (tmp_path / "log.txt").unlink()
    failed = subprocess.run(
        ["bash", ".ci/run"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert failed.returncode != 0
    assert not (tmp_path / "log.txt").exists()
