"""The public surface is defined once: `maskedrnn.__all__`.

docs/api.md documents every name of it (the name itself, or the module that
defines it, behind a `:::` directive), and every directive there resolves.
"""

import importlib
import pathlib
import re
import types

import pytest

import maskedrnn

API_PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api.md"


def _directives():
    return re.findall(r"^::: (\S+)$", API_PAGE.read_text(), re.MULTILINE)


def _resolve(path):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def test_all_names_exist_and_the_version_is_a_string():
    assert sorted(maskedrnn.__all__) == sorted(set(maskedrnn.__all__))
    for name in maskedrnn.__all__:
        assert hasattr(maskedrnn, name), name
    assert re.fullmatch(r"\d+\.\d+\.\d+", maskedrnn.__version__)


def test_every_directive_of_the_api_page_resolves():
    for path in _directives():
        _resolve(path)


@pytest.mark.parametrize("name", maskedrnn.__all__)
def test_every_public_name_is_on_the_api_page(name):
    directives = set(_directives())
    obj = getattr(maskedrnn, name)
    if isinstance(obj, types.ModuleType):
        assert obj.__name__ in directives, f"docs/api.md lacks ::: {obj.__name__}"
        return
    home = obj.__module__
    assert {f"maskedrnn.{name}", f"{home}.{name}", home} & directives, (
        f"docs/api.md documents neither maskedrnn.{name} nor {home}"
    )


def test_no_module_shadows_a_public_function():
    """No public function shares its name with a module of the package
    (`import maskedrnn.X as m` would give the function, not the module)."""
    package = pathlib.Path(maskedrnn.__file__).parent
    for name in maskedrnn.__all__:
        if isinstance(getattr(maskedrnn, name), types.ModuleType):
            continue
        assert not (package / f"{name}.py").exists(), name
        assert not (package / name).is_dir(), name
