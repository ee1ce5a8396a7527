"""Private Keras APIs are imported in one module only, each with its reason.

`maskedrnn._keras_private` lists every `keras.src.*` name maskedrnn uses, so a
Keras upgrade that moves one breaks in one place. Oracle: the import
statements of every module, read with `ast` (no module needs to be imported
for that, so a broken import elsewhere cannot hide one).
"""

import ast
import pathlib

import keras
import pytest

import maskedrnn._keras_private as keras_private

PACKAGE = pathlib.Path(keras_private.__file__).resolve().parent
PRIVATE = PACKAGE / "_keras_private.py"
TESTS = PACKAGE.parent / "tests"


def _private_imports(path):
    """(line, module) of every import of `keras.src` in the file at `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            # importlib.import_module("keras.src...") is an import too.
            modules = [str(node.args[0].value)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules = [node.module or ""]
            if node.module == "keras":
                modules += [f"keras.{alias.name}" for alias in node.names]
        else:
            continue
        for module in modules:
            if module == "keras.src" or module.startswith("keras.src."):
                found.append((node.lineno, module))
    return found


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if p != PRIVATE)


def _offenders(paths):
    return {
        str(p.relative_to(PACKAGE.parent)): _private_imports(p)
        for p in paths
        if _private_imports(p)
    }


def test_finder_sees_every_import_form(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "import keras\n"
        "import keras.src.backend as b\n"
        "from keras.src.losses import loss\n"
        "from keras import src\n"
        "from keras import ops\n"
        "def f():\n"
        "    from keras.src import backend\n"
        "importlib.import_module('keras.src.backend.torch.rnn')\n"
    )
    assert _private_imports(path) == [
        (2, "keras.src.backend"),
        (3, "keras.src.losses"),
        (4, "keras.src"),
        (7, "keras.src"),
        (8, "keras.src.backend.torch.rnn"),
    ]


def test_no_module_but_keras_private_imports_keras_src():
    assert _offenders(_modules()) == {}, (
        "import private Keras APIs from maskedrnn._keras_private (add them "
        "there, one per line with the reason)"
    )


def test_no_test_imports_keras_src():
    # The tests run against several Keras versions too: a private name that
    # moves must be fixed in one place, for the package and its tests alike.
    tests = sorted(p for p in TESTS.rglob("*.py") if p.name != "test_keras_private.py")
    assert tests and _offenders(tests) == {}, (
        "tests import private Keras APIs from maskedrnn._keras_private"
    )


def test_each_private_import_has_its_reason_and_order():
    text = PRIVATE.read_text(encoding="utf-8")
    lines = text.splitlines()
    imports = [
        n for n in ast.parse(text).body if isinstance(n, (ast.Import, ast.ImportFrom))
    ]
    assert imports, "maskedrnn._keras_private imports nothing"
    import_lines = {n.lineno for n in imports}
    keys = []
    for node in imports:
        assert len(node.names) == 1, f"line {node.lineno}: one import per line"
        alias = node.names[0]
        module = node.module if isinstance(node, ast.ImportFrom) else alias.name
        assert module.startswith("keras.src"), f"line {node.lineno}: {module}"
        # The reason: the comment above it (or above its group of imports).
        above = node.lineno - 1
        while above in import_lines:
            above -= 1
        assert above >= 1 and lines[above - 1].lstrip().startswith("#"), (
            f"line {node.lineno}: say why this private API is needed in a "
            "comment on the line before"
        )
        keys.append((module, alias.name))
        # The name really exists in the installed Keras.
        name = alias.asname or alias.name.split(".")[0]
        assert hasattr(keras_private, name), name
    assert keys == sorted(keys), "keep the imports sorted by module, then name"


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's device")
def test_keras_torch_device_is_where_keras_puts_new_tensors():
    """`keras_torch_device` resolves on this Keras (its home moved in
    3.16) and names the device of a tensor Keras makes."""
    from maskedrnn._keras_private import keras_torch_device

    made = keras.ops.zeros((2,))
    assert str(made.device).startswith(str(keras_torch_device()).split(":")[0])
