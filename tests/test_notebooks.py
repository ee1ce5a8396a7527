"""The Colab notebooks in `colab/` run top to bottom and are committed clean.

- Every notebook executes without error in a real Jupyter kernel (nbclient +
  ipykernel, the interpreter running pytest) with `MASKEDRNN_NOTEBOOK_SMALL=1`
  (tiny sizes) on the CPU. The kernel inherits the environment, including
  `KERAS_BACKEND`. The notebooks target Colab, whose Keras runs on
  TensorFlow, so they run in the TensorFlow pytest run only. Their own
  `assert`s check results against oracles (Keras' masked `Bidirectional`,
  PyTorch, tf-keras' legacy-weight loader, numpy, a CPU-only process).
- Committed notebooks carry no outputs (`execution_count` null), open with
  an "Open in Colab" badge pointing at their own path in the repository
  setup.cfg declares (`url`), and have an install cell that is skipped when
  maskedrnn is importable and otherwise installs
  `maskedrnn @ git+<that url>`, or the pip requirement in
  `MASKEDRNN_PIP_SPEC`. `scripts/check_wheel.sh` (run by `scripts/test.sh`)
  executes that cell for real: it installs the built wheel in fresh
  virtual environments and runs `01_quickstart` there, outside the source
  tree (so `scripts/test.sh` deselects that one here).

The executions are marked slow (about a minute in all on a 2-core CPU).
"""

import configparser
import importlib.util
import json
import os
import pathlib

import keras
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "colab").glob("*.ipynb"))
_SETUP = configparser.ConfigParser()
_SETUP.read(ROOT / "setup.cfg")
REPO_URL = _SETUP["metadata"]["url"]  # https://github.com/<owner>/<name>
COLAB_URL = (
    "https://colab.research.google.com/github/"
    + REPO_URL.removeprefix("https://github.com/")
    + "/blob/main/"
)
DEFAULT_SPEC = f"maskedrnn @ git+{REPO_URL}"
INSTALL = '%pip install -q "{MASKEDRNN_PIP_SPEC}"'

ids = [path.stem for path in NOTEBOOKS]


def _cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell):
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def test_there_are_six_notebooks():
    assert [p.name for p in NOTEBOOKS] == [
        "01_quickstart.ipynb",
        "02_speed.ipynb",
        "03_gpu_train_cpu_infer.ipynb",
        "04_weight_conversion.ipynb",
        "05_masked_loss_custom_loop.ipynb",
        "06_ctc.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_committed_without_outputs(path):
    for index, cell in enumerate(_cells(path)):
        if cell["cell_type"] != "code":
            continue
        assert cell["outputs"] == [], f"{path.name} cell {index} has outputs"
        assert cell["execution_count"] is None, (
            f"{path.name} cell {index} has an execution count; strip outputs "
            "before committing (jupyter nbconvert --clear-output --inplace)"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_colab_badge_and_guarded_install(path):
    cells = _cells(path)
    first = _source(cells[0])
    assert cells[0]["cell_type"] == "markdown"
    assert f"({COLAB_URL}colab/{path.name})" in first, "badge link is wrong"
    assert "colab-badge.svg" in first
    code = [_source(c) for c in cells if c["cell_type"] == "code"]
    install = [c for c in code if INSTALL in c]
    assert len(install) == 1, "one install cell expected"
    # The install runs only when maskedrnn cannot be imported.
    lines = [line.strip() for line in install[0].splitlines()]
    try_line = lines.index("try:")
    assert lines[try_line + 1] == "import maskedrnn"
    assert lines[try_line + 2] == "except ImportError:"
    assert lines[try_line + 3 : try_line + 8] == [
        "MASKEDRNN_PIP_SPEC = os.environ.get(",
        f'"MASKEDRNN_PIP_SPEC", "{DEFAULT_SPEC}"',
        ")",
        INSTALL,
        "import maskedrnn",
    ]
    # The backend is chosen before the install cell imports Keras.
    assert "KERAS_BACKEND" in code[0] and code.index(install[0]) == 1


def test_declared_url_is_the_one_docs_link():
    assert REPO_URL.startswith("https://github.com/")
    assert f"Source = {REPO_URL}" in (ROOT / "setup.cfg").read_text()
    assert f"repo_url: {REPO_URL}" in (ROOT / "mkdocs.yml").read_text()


def test_ci_runs_the_wheel_check():
    """`.ci/run` -> README.md's test command, scripts/test.sh ->
    scripts/check_wheel.sh, which executes the install cell against the
    built wheel (see its header)."""
    assert "scripts/readme_commands.py" in (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in (ROOT / "README.md").read_text()
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    assert "bash scripts/check_wheel.sh" in test_sh
    check = (ROOT / "scripts" / "check_wheel.sh").read_text()
    for needle in ("python -m build", "python -m venv", 'MASKEDRNN_PIP_SPEC="$WHEEL"'):
        assert needle in check


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_notebook_runs(path, tmp_path, monkeypatch):
    if keras.backend.backend() != "tensorflow":
        pytest.skip(
            "the notebooks target Colab, whose Keras backend is TensorFlow; "
            "they run in the TensorFlow run only"
        )
    missing = [
        m
        for m in ("nbclient", "nbformat", "ipykernel")
        if not importlib.util.find_spec(m)
    ]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not installed: pip install nbclient ipykernel "
            "nbformat (CI installs them)"
        )
    import nbclient
    import nbformat

    monkeypatch.setenv("MASKEDRNN_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("KERAS_BACKEND", keras.backend.backend())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    # The notebooks import the maskedrnn of this checkout even where it is not
    # installed (the install cell would fetch it from GitHub otherwise).
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    notebook = nbformat.read(str(path), as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},  # working directory
    )
    client.execute()  # raises CellExecutionError with the traceback on failure
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors
