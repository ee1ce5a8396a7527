"""The documentation is executable and builds.

- Every ```python block of `docs/*.md` and `README.md` runs under PyTorch
  (every backend with `MASKEDRNN_TEST_EVERY_BACKEND=1`: TensorFlow traces
  and JAX compiles every model of every page, minutes in all on a 2-core
  CPU), in one fresh Python process: the blocks
  of one file run in order, sharing one namespace (a fresh one per file,
  each file in its own working directory). The pages' own `assert`s
  compare maskedrnn with Keras' masked `Bidirectional`, numpy or known
  values. A block preceded by the line `<!-- skip-test -->` is not run;
  the quickstart and the user guide have none.
- `mkdocs build --strict` passes (TensorFlow run only: the site does not
  depend on the backend). CI installs mkdocs (`pip install -e ".[docs]"`), so
  a missing mkdocs is a failure, not a skip.
- The griffe extension that renders Keras-style docstrings
  (`docs/griffe_keras_docstrings.py`) rewrites their sections as documented.
"""

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import keras
import pytest

from tests.helpers import jax_cache_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SKIP_MARKER = "<!-- skip-test -->"
# Pages whose examples must all run (no skip marker allowed).
NO_SKIP_PAGES = ("quickstart.md", "guide.md")
# Pages written with this test: each must have runnable examples.
EXAMPLE_PAGES = ("index.md", "quickstart.md", "guide.md", "faq.md")

_FENCE_OPEN = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$"
)


def extract_python_blocks(text):
    """Returns the ```python blocks of a Markdown text.

    A block may be indented (inside a list or an admonition); its common
    indentation is removed. A block counts as skipped when the nearest
    non-blank line before its opening fence is `<!-- skip-test -->`.

    Returns:
        A list of dicts `{"line": int, "code": str, "skip": bool}`, where
        `line` is the 1-based line number of the block's first code line.
    """
    lines = text.split("\n")
    blocks = []
    i = 0
    while i < len(lines):
        match = _FENCE_OPEN.match(lines[i])
        if not match:
            i += 1
            continue
        fence, indent = match.group("fence"), match.group("indent")
        info = match.group("info").strip().split()
        language = info[0].lower() if info else ""
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = i + 1
        while end < len(lines) and not close.match(lines[end]):
            end += 1
        if language in ("python", "py"):
            before = [line.strip() for line in lines[:i] if line.strip()]
            code = "\n".join(
                line[len(indent) :] if line.startswith(indent) else line.lstrip()
                for line in lines[i + 1 : end]
            )
            blocks.append(
                {
                    "line": i + 2,
                    "code": code + "\n",
                    "skip": bool(before) and before[-1] == SKIP_MARKER,
                }
            )
        i = end + 1
    return blocks


def doc_files():
    files = sorted(DOCS.glob("*.md"))
    readme = ROOT / "README.md"
    if readme.exists():
        files.append(readme)
    return files


# Runs the blocks of every file in one process (one Keras import for all),
# each file in a fresh namespace and its own working directory, in order. Each
# block is compiled with the Markdown file as its filename and its real line
# numbers, so a traceback points at (and shows) the failing line of the page.
_RUNNER = """
import json, os, sys, traceback
import keras
jobs, results = json.load(open(sys.argv[1])), {}
for path, blocks in jobs.items():
    workdir = os.path.join(sys.argv[3], str(len(results)))
    os.makedirs(workdir)
    os.chdir(workdir)
    namespace = {"__name__": "__main__"}
    try:
        for block in blocks:
            source = "\\n" * (block["line"] - 1) + block["code"]
            exec(compile(source, path, "exec"), namespace)
        results[path] = None
    except BaseException:
        results[path] = traceback.format_exc()
    keras.backend.clear_session()
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)
"""


@pytest.fixture(scope="module")
def doc_results(tmp_path_factory):
    """Runs every documentation file's blocks; maps path -> traceback or None."""
    tmp = tmp_path_factory.mktemp("docs_run")
    jobs = {
        str(path): [
            b
            for b in extract_python_blocks(path.read_text(encoding="utf-8"))
            if not b["skip"]
        ]
        for path in doc_files()
    }
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    (tmp / "work").mkdir()
    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend(), **jax_cache_env())
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # The blocks run in a scratch directory: import this checkout's package,
    # not whichever copy is installed.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    )
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _RUNNER,
            str(tmp / "jobs.json"),
            str(tmp / "results.json"),
            str(tmp / "work"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    results = {}
    if (tmp / "results.json").exists():
        results = json.loads((tmp / "results.json").read_text())
    for path in jobs:
        if path not in results:
            # The process died (or stopped) before finishing this file.
            results[path] = (
                f"the documentation runner exited with code {result.returncode} "
                f"before finishing this file:\n{result.stderr[-6000:]}"
            )
    return jobs, results


def test_extract_python_blocks_finds_fences_skips_and_indentation():
    text = textwrap.dedent(
        """\
        # Title

        ```python
        a = 1
        ```

        <!-- skip-test -->

        ```python
        raise RuntimeError("skipped")
        ```

        ```bash
        pip install x
        ```

        1. In a list:

            ```python
            if a:
                b = 2
            ```

        ```text
        ```python is not a fence inside a fence
        ```
        """
    )
    assert extract_python_blocks(text) == [
        {"line": 4, "code": "a = 1\n", "skip": False},
        {"line": 10, "code": 'raise RuntimeError("skipped")\n', "skip": True},
        {"line": 20, "code": "if a:\n    b = 2\n", "skip": False},
    ]


@pytest.mark.parametrize("name", EXAMPLE_PAGES)
def test_pages_have_runnable_examples(name):
    path = DOCS / name
    assert path.exists(), f"{path} is missing"
    blocks = extract_python_blocks(path.read_text(encoding="utf-8"))
    assert [b for b in blocks if not b["skip"]], f"{name} has no runnable block"
    if name in NO_SKIP_PAGES:
        skipped = [b["line"] for b in blocks if b["skip"]]
        assert not skipped, f"{name}: main examples must run; skipped at {skipped}"


@pytest.mark.on_backends("torch")
@pytest.mark.slow
@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.name)
def test_doc_python_blocks_run(path, doc_results):
    jobs, results = doc_results
    if not jobs[str(path)]:
        pytest.skip(f"{path.name} has no runnable python block")
    error = results[str(path)]
    assert error is None, (
        f"a python block of {path.relative_to(ROOT)} failed on the "
        f"{keras.backend.backend()} backend (mark a block that must not run "
        f"with {SKIP_MARKER} on the line before it):\n{error}"
    )


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    if keras.backend.backend() != "tensorflow":
        pytest.skip(
            "the site does not depend on the Keras backend; built in the "
            "TensorFlow run only"
        )
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            pytest.fail(
                f"{module} is not installed; install the docs tools with "
                "pip install -e '.[docs]'"
            )
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,  # mkdocs.yml names the griffe extension relative to the root
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    # The API page is generated from the docstrings.
    for anchor in (
        "maskedrnn.MaskedBidirectional",
        "maskedrnn.ops.reverse_sequence",
        "maskedrnn.losses.masked_loss",
        "maskedrnn.metrics.MaskedAccuracy",
        "maskedrnn.datasets.pad_batch",
    ):
        assert f'id="{anchor}"' in api, f"{anchor} missing from the API page"


def _load_griffe_extension():
    if importlib.util.find_spec("griffe") is None:
        pytest.fail("griffe is not installed; pip install -e '.[docs]'")
    spec = importlib.util.spec_from_file_location(
        "griffe_keras_docstrings", DOCS / "griffe_keras_docstrings.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_griffe_extension_rewrites_keras_sections():
    rewrite = _load_griffe_extension().rewrite
    keras_style = textwrap.dedent(
        """\
        Summary.

        Args:
            x: The input.

        Call arguments:
            inputs: A tensor
                of shape `(b, t)`.
            mask: Optional mask.

        Example:

        >>> f([1, 2])
        [2, 1]

        ```python
        y = f(x)
        ```

        Returns:
            A tensor."""
    )
    assert rewrite(keras_style) == textwrap.dedent(
        """\
        Summary.

        Args:
            x: The input.

        Call arguments: Call arguments
            - `inputs`: A tensor
              of shape `(b, t)`.
            - `mask`: Optional mask.

        Examples:
            >>> f([1, 2])
            [2, 1]

            ```python
            y = f(x)
            ```

        Returns:
            A tensor."""
    )
    # A qualified title is kept; Google-style text passes through unchanged.
    assert rewrite("Call arguments (`update_state`):\n    y: Labels.") == (
        "Call arguments: Call arguments (`update_state`)\n    - `y`: Labels."
    )
    google = "Summary.\n\nArgs:\n    x: The input.\n\nReturns:\n    y."
    assert rewrite(google) == google


def _module_map(path):
    text = path.read_text(encoding="utf-8")
    start = text.index("## Module map")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_module_map_names_every_module(page):
    """The module map (one line per module) lists every module of the
    package: a new module that is not on it fails here."""
    section = _module_map(ROOT / page)
    package = ROOT / "maskedrnn"
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel.endswith("__init__.py"):
            continue
        top = rel.split("/")[0]
        if top in ("bench", "convert", "demo"):
            # Subpackages with their own docstrings: named once, as a folder.
            if f"`{top}/`" not in section:
                missing.append(f"{top}/")
        elif f"`{rel}`" not in section:
            missing.append(rel)
    assert not missing, f"{page}'s module map lacks {sorted(set(missing))}"
