"""The package's import graph: no cycle between modules, no upward import.

Every module of `maskedrnn/` is parsed with `ast` (nothing is imported), and
every `import` / `from ... import` in it counts, at module level or inside a
function, absolute or relative (`from . import x`). `from pkg import name`
is an edge to the submodule `pkg.name` when that file exists, else to `pkg`.

Rules:

* Layers (`LAYERS`, bottom to top): a module may import its own unit and
  any unit of a lower layer, never one of a higher layer. A unit is the
  first name under `maskedrnn` (`maskedrnn.backends.jax` -> `backends`);
  the root package's `__init__` is the unit `maskedrnn`, the public surface
  that re-exports the layers below it.
* No cycle between modules. A package `__init__` importing its own
  submodules (re-exports, `backends`' per-backend loader) is how a package
  is built, so those edges are left out; a submodule importing its own
  package's `__init__` is an ordinary edge. Importing `a.b` also runs
  `a/__init__`, which Python does for every import: not counted either.
* No cycle between units either (e.g. `ops` -> `backends` -> `ops`, even
  through different modules of `backends`).

`importlib.import_module` calls (the `backends` loader) are not parsed:
they are a package loading its own submodules.
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "maskedrnn"

#: Bottom to top. A unit imports only its own layer's units and lower ones.
LAYERS = (
    # Leaves: Keras internals, masks, gate orders, the demo's log quieting.
    ("_keras_private", "masking", "_gate_layout", "_quiet_demo"),
    ("backends",),  # the plan and each backend's kernels
    ("ops", "_checks"),  # keras.ops sequence ops; argument checks
    ("steps",),
    ("layers",),
    ("losses", "metrics", "ctc", "export", "datasets", "bucketing"),
    ("convert",),
    ("maskedrnn",),  # the root package: the public surface
    ("demo", "bench", "__main__"),  # programs built on the package
)


def module_files(package=PACKAGE):
    """`{dotted module name: path}` for every `.py` file under `package`."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name, source, modules):
    """The package modules that module `name` (source text) imports."""
    is_package = name not in modules or modules[name].name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    root = name.split(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base += f".{node.module}" if node.module else ""
            else:
                base = node.module
            sub = [f"{base}.{alias.name}" for alias in node.names]
            targets = [s if s in modules else base for s in sub]
        else:
            continue
        for target in targets:
            # `import a.b.c` / `from a.b import c` where c is a name: the
            # deepest module that exists.
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target.split(".")[0] == root:
                found.add(target)
    found.discard(name)
    return found


def import_graph(modules):
    """`{module: set of package modules it imports}`, parsed, not imported."""
    return {
        name: imports_of(name, path.read_text(), modules)
        for name, path in modules.items()
    }


def unit_of(module):
    parts = module.split(".")
    return parts[0] if len(parts) == 1 else parts[1]


def is_package_building(graph, importer, imported, packages):
    """Whether the edge is a package `__init__` importing its own submodule."""
    return importer in packages and imported.startswith(importer + ".")


def find_cycle(graph):
    """One cycle of `graph` as a list `[a, b, ..., a]`, or None."""
    state = {}  # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt, path)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [])
            if cycle:
                return cycle
    return None


def module_cycle(graph, packages):
    """A module cycle, leaving out a package's imports of its submodules."""
    kept = {
        a: {b for b in bs if not is_package_building(graph, a, b, packages)}
        for a, bs in graph.items()
    }
    return find_cycle(kept)


def unit_cycle(graph):
    units = {}
    for a, bs in graph.items():
        units.setdefault(unit_of(a), set()).update(
            unit_of(b) for b in bs if unit_of(b) != unit_of(a)
        )
    return find_cycle(units)


def upward_imports(graph, layers=LAYERS):
    """`(importer, imported)` pairs that import a higher layer, and the
    units missing from `layers` (every unit must be placed)."""
    rank = {unit: i for i, row in enumerate(layers) for unit in row}
    missing = sorted({unit_of(m) for m in graph} - set(rank))
    upward = sorted(
        (a, b)
        for a, bs in graph.items()
        for b in bs
        if unit_of(a) in rank
        and unit_of(b) in rank
        and rank[unit_of(b)] > rank[unit_of(a)]
    )
    return upward, missing


def _packages(modules):
    return {name for name, path in modules.items() if path.name == "__init__.py"}


def test_every_unit_has_a_layer_and_no_import_goes_up():
    graph = import_graph(module_files())
    upward, missing = upward_imports(graph)
    assert not missing, f"place these units in LAYERS: {missing}"
    assert not upward, "imports of a higher layer:\n" + "\n".join(
        f"{a} -> {b}" for a, b in upward
    )


def test_no_import_cycle_between_modules():
    modules = module_files()
    cycle = module_cycle(import_graph(modules), _packages(modules))
    assert cycle is None, " -> ".join(cycle)


def test_no_import_cycle_between_units():
    cycle = unit_cycle(import_graph(module_files()))
    assert cycle is None, " -> ".join(cycle)


def test_parser_sees_relative_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg import low\n")
    (pkg / "low.py").write_text("def f():\n    from .sub import deep\n")
    (pkg / "sub" / "__init__.py").write_text("from . import deep\n")
    (pkg / "sub" / "deep.py").write_text("from .. import low\nimport os\n")
    (pkg / "other.py").write_text("from pkg.low import f\nfrom pkg.sub import *\n")
    graph = import_graph(module_files(pkg))
    assert graph == {
        "pkg": {"pkg.low"},
        "pkg.low": {"pkg.sub.deep"},
        "pkg.sub": {"pkg.sub.deep"},
        "pkg.sub.deep": {"pkg.low"},
        "pkg.other": {"pkg.low", "pkg.sub"},
    }
    assert module_cycle(graph, {"pkg", "pkg.sub"}) == [
        "pkg.low",
        "pkg.sub.deep",
        "pkg.low",
    ]


def test_checker_catches_a_planted_cycle_and_upward_import():
    clean = {
        "m": {"m.layers", "m.ops"},  # the root re-exports
        "m.layers": {"m.ops", "m.backends"},
        "m.ops": {"m.backends"},
        "m.backends": {"m.backends.jax"},  # a package loads its own module
        "m.backends.jax": {"m.backends"},
    }
    layers = (("backends",), ("ops",), ("layers",), ("m",))
    packages = {"m", "m.backends"}
    assert module_cycle(clean, packages) is None
    assert unit_cycle(clean) is None
    assert upward_imports(clean, layers) == ([], [])

    planted = {**clean, "m.backends.jax": {"m.backends", "m.ops"}}
    assert upward_imports(planted, layers) == ([("m.backends.jax", "m.ops")], [])
    # Not a module cycle (m.backends does not import m.ops), but a unit one.
    assert module_cycle(planted, packages) is None
    assert unit_cycle(planted) == ["backends", "ops", "backends"]

    planted = {**clean, "m.ops": {"m.backends", "m.layers"}}
    assert module_cycle(planted, packages) == ["m.layers", "m.ops", "m.layers"]
    assert upward_imports(planted, layers)[0] == [("m.ops", "m.layers")]
    assert upward_imports(clean, layers[1:])[1] == ["backends"]
