"""The `>>>` examples of maskedrnn's docstrings run as doctests on every backend.

Every module of the package is searched with `doctest.DocTestFinder`; each
docstring with examples is one test, run with the current Keras backend in
its module's namespace plus `np`, `keras` and `ops` (`keras.ops`). The oracle
is the output written in the docstring. Conventions of the examples:

- A backend tensor (and a list or tuple of them) is displayed as its values
  in nested Python lists, `ops.convert_to_numpy(t).tolist()`, so one expected
  output holds for TensorFlow, JAX and PyTorch (`[[3, 2, 1, 0, 0]]`, not
  `<tf.Tensor ...>`); NumPy arrays keep their own repr.
- Whitespace differences are ignored (an expected tensor may span lines), and
  a trailing `# comment` on an expected-output line explains it and is not
  compared.

Docstrings whose examples cannot run as written are listed, with the reason,
in `NOT_EXECUTABLE` (they still run, as non-strict xfails, so a fixed one
shows up as XPASS); `COVERED_ELSEWHERE` names the test that runs an example
that is too slow to repeat here.
"""

import doctest
import importlib
import pkgutil
import re
import sys

import keras
import numpy as np
import pytest
from keras import ops

import maskedrnn

# Qualified docstring name -> why its example does not run as written (none
# today; an entry runs as a non-strict xfail).
NOT_EXECUTABLE = {}
# Qualified docstring name -> the test that runs the same call.
COVERED_ELSEWHERE = {
    "maskedrnn.demo.experiment.run_demo": (
        "trains three models (20-40 s on TensorFlow and JAX); "
        "tests/test_demo.py runs the same quick distance run and checks more"
    ),
}
_SKIPPED_MODULES = ("maskedrnn.__main__",)  # runs the demo when imported
_COMMENT = re.compile(r"[ \t]+#[^\n]*$", re.MULTILINE)


def _modules():
    names = ["maskedrnn"] + [
        m.name for m in pkgutil.walk_packages(maskedrnn.__path__, "maskedrnn.")
    ]
    return [importlib.import_module(n) for n in names if n not in _SKIPPED_MODULES]


def _doctests():
    finder = doctest.DocTestFinder()
    found = {}
    for module in _modules():
        globs = {"np": np, "keras": keras, "ops": ops, **vars(module)}
        for test in finder.find(module, module.__name__, globs=globs):
            if test.examples and test.name not in found:
                found[test.name] = test
    return [found[name] for name in sorted(found)]


DOCTESTS = _doctests()


def _to_python(value):
    if isinstance(value, (list, tuple)):
        return type(value)(_to_python(v) for v in value)
    if ops.is_tensor(value) or isinstance(value, keras.Variable):
        return ops.convert_to_numpy(value).tolist()
    return value


def _display(value):
    """`sys.displayhook` for the examples: tensors as nested lists."""
    if value is None:
        return
    sys.stdout.write(repr(_to_python(value)) + "\n")


class _Checker(doctest.OutputChecker):
    """Ignores a trailing `# comment` on the lines of the expected output."""

    def check_output(self, want, got, optionflags):
        return super().check_output(_COMMENT.sub("", want), got, optionflags)


def _params():
    for test in DOCTESTS:
        marks = []
        if test.name in NOT_EXECUTABLE:
            marks.append(pytest.mark.xfail(reason=NOT_EXECUTABLE[test.name]))
        if test.name in COVERED_ELSEWHERE:
            marks.append(pytest.mark.skip(reason=COVERED_ELSEWHERE[test.name]))
        yield pytest.param(test, id=test.name, marks=marks)


def test_examples_are_found_in_every_documented_module():
    names = {t.name for t in DOCTESTS}
    for expected in (
        "maskedrnn.ops.reverse_sequence",
        "maskedrnn.losses.masked_loss",
        "maskedrnn.metrics.MaskedAccuracy",
        "maskedrnn.datasets.pad_batch",
        "maskedrnn.demo.checks.check_agreement",
        "maskedrnn.export.pad_batch_rows",
    ):
        assert expected in names
    # Every listed exception still names a real docstring with examples.
    assert set(NOT_EXECUTABLE) | set(COVERED_ELSEWHERE) <= names


def test_checker_and_display_hook(capsys):
    checker = _Checker()
    flags = doctest.NORMALIZE_WHITESPACE
    assert checker.check_output("[1.5]    # c1 = 1\n", "[1.5]\n", flags)
    assert not checker.check_output("[1.5]    # c1 = 1\n", "[2.5]\n", flags)
    _display(ops.convert_to_tensor([[1, 2], [3, 4]]))
    _display((ops.convert_to_tensor([True]), np.array([1.5])))
    _display(None)
    assert capsys.readouterr().out == "[[1, 2], [3, 4]]\n([True], array([1.5]))\n"


@pytest.mark.parametrize("test", _params())
def test_docstring_examples(test, monkeypatch):
    # DocTestRunner.run installs sys.__displayhook__ as the display hook for
    # the examples; point that at the tensor-to-list display.
    monkeypatch.setattr(sys, "__displayhook__", _display)
    runner = doctest.DocTestRunner(
        checker=_Checker(),
        optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS,
    )
    report = []
    test.globs = dict(test.globs)  # each run starts from the module's namespace
    result = runner.run(test, out=report.append, clear_globs=False)
    assert result.failed == 0, (
        f"{test.name} ({test.filename}:{test.lineno}) on the "
        f"{keras.backend.backend()} backend:\n" + "".join(report)
    )
