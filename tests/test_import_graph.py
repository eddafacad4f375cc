"""No import circle in the installed layout: the top-level folders install as ``csagate.*``
(pyproject's package-dir), and the module-level ``import`` / ``from ... import`` statements of
every module, read with ``ast`` (imports inside functions run late and are left out; so are
those under ``if TYPE_CHECKING:``), must form no cycle.

The CLI's command modules (``csagate.commands.*``) import no other command module, at any
level: what two commands share lives in a module of ``csagate`` named for what it holds."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The installed package of each top-level folder (pyproject.toml [tool.setuptools.package-dir]).
FOLDERS = {"csagate": "csagate", "kernels": "csagate.kernels", "gates": "csagate.gates",
           "reference": "csagate.reference", "perf": "csagate.perf"}


def modules() -> dict[str, Path]:
    """Installed module name -> file, for every module of the installed layout."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _module_level(body):
    """The statements that run when the module is imported (not in functions, not under
    ``if TYPE_CHECKING``)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if test.endswith("TYPE_CHECKING"):
                yield from _module_level(node.orelse)
                continue
            yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody,
                          *(h.body for h in node.handlers)):
                yield from _module_level(block)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _module_level(node.body)
        else:
            yield node


def imports(name: str, path: Path, known: set[str], *, anywhere: bool = False) -> set[str]:
    """The modules of ``known`` that module ``name`` imports at module level (``anywhere``:
    also inside functions and under ``if TYPE_CHECKING``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree) if anywhere else _module_level(tree.body):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read_from_the_installed_layout():
    edges = graph()
    assert "csagate.gates.runner" in edges and "csagate.kernels.api" in edges
    assert "csagate.gates.plugin" in edges["csagate.gates.builtin_impls"]
    assert "csagate.gates.plugin" in edges["csagate.gates.implementation"]


def test_no_import_cycle():
    # kernels/cache.py -> registry.py -> reduce.py -> cache.py closes only through imports
    # inside functions (reduce's of the cache, registry's importlib), so no cycle is allowed.
    found = cycles(graph())
    assert not found, f"import cycles: {sorted(sorted(c) for c in found)}"


def test_a_cycle_is_found():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [frozenset("abc")]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_plugin_interface_and_the_builtins_do_not_import_each_other():
    edges = graph()
    assert "csagate.gates.builtin_impls" not in edges["csagate.gates.implementation"]
    assert "csagate.gates.implementation" not in edges["csagate.gates.builtin_impls"]


COMMANDS = "csagate.commands"


def command_imports() -> dict[str, set[str]]:
    """Each command module -> the other modules of ``csagate.commands`` it imports anywhere."""
    found = modules()
    return {name: {m for m in imports(name, path, set(found), anywhere=True)
                   if m == COMMANDS or m.startswith(COMMANDS + ".")}
            for name, path in found.items() if name.startswith(COMMANDS + ".")}


def test_the_walk_sees_imports_inside_functions(tmp_path):
    known = {"csagate.commands", "csagate.commands.run", "csagate.commands.cases"}
    path = tmp_path / "cases.py"
    path.write_text("def f():\n    from csagate.commands import run as run_cmd\n")
    assert imports("csagate.commands.cases", path, known) == set()
    assert imports("csagate.commands.cases", path, known, anywhere=True) == \
        {"csagate.commands.run"}
    assert "csagate.perf.probe" in imports("csagate.commands.probe", modules()[
        "csagate.commands.probe"], set(modules()), anywhere=True)   # imported in the command


def test_no_command_module_imports_another():
    found = command_imports()
    assert {"csagate.commands.run", "csagate.commands.probe"} <= set(found)
    offenders = {name: sorted(others) for name, others in found.items() if others}
    assert not offenders, f"command modules importing other command modules: {offenders}"


# The layers of the installed layout, lowest first: a module may import its own layer and the
# ones below. The package root (``csagate/__init__.py``: the version) is everyone's parent.
LAYERS = ("csagate.reference", "csagate.kernels", "csagate.gates", "csagate.perf", "csagate")


def layer(name: str) -> int:
    return next(i for i, top in enumerate(LAYERS) if name == top or name.startswith(top + "."))


def test_no_layer_imports_a_higher_one():
    """Anywhere in a module (functions too): the kernels never reach up into the gate or the
    CLI, the gate never into the CLI or perf, the reference into nothing of csagate."""
    found = modules()
    up = []
    for name, path in found.items():
        for other in imports(name, path, set(found), anywhere=True):
            if other != "csagate" and layer(other) > layer(name):
                up.append(f"{name} -> {other}")
    assert not up, up


def test_the_cli_package_holds_the_cli_and_its_presentation():
    """The op and the environment reader sit beside the kernels, the judging of an
    implementation in the gate: what ``csagate/`` holds is commands, options and renderers."""
    names = {n for n in modules() if layer(n) == len(LAYERS) - 1}
    assert "csagate.kernels.ops" in modules() and "csagate.kernels.env" in modules()
    assert not {"csagate.ops", "csagate.env"} & names
    assert "csagate.gates.judging" in modules()
    assert not [n for n in names if n.endswith("_choice")]


def defined_names(path: Path) -> set[str] | None:
    """The names a module defines at its top level (functions, classes, assignments, imports,
    ``global`` declarations anywhere); None where a module ``__getattr__`` serves any name."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()

    def top(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t)
                             if isinstance(n, ast.Name))
            elif isinstance(node, ast.If):
                top(node.body)
                top(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody,
                              *(h.body for h in node.handlers)):
                    top(block)
            elif isinstance(node, ast.With):
                top(node.body)

    top(tree.body)
    names.update(n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names)
    return None if "__getattr__" in names else names


def unresolved(path: Path, found: dict[str, Path]) -> list[str]:
    """The ``csagate`` imports of a file, at any level, that name no module of the layout or a
    name their module does not define."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            bad += [f"import {a.name}" for a in node.names
                    if a.name.split(".")[0] == "csagate" and a.name not in found]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                node.module.split(".")[0] == "csagate":
            if node.module not in found:
                bad.append(f"from {node.module} import ...: no such module")
                continue
            defined = defined_names(found[node.module])
            for a in node.names:
                if (defined is not None and a.name not in defined
                        and f"{node.module}.{a.name}" not in found):
                    bad.append(f"from {node.module} import {a.name}")
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    return [f"{where}: {b}" for b in bad]


def test_every_csagate_import_resolves():
    """Every import of csagate, in functions too (the ones no CPU test runs: a GPU bench's),
    in the package, the tests and the mutation scripts, names a module of the installed layout
    and a name that module defines."""
    found = modules()
    files = [*found.values(), *sorted((ROOT / "tests").rglob("*.py")),
             *sorted((ROOT / "mutants").rglob("*.py"))]
    bad = [b for path in files for b in unresolved(path, found)]
    assert not bad, bad


def test_a_stale_import_inside_a_function_is_found(tmp_path):
    path = tmp_path / "bench.py"
    path.write_text("import csagate.kernels.api\n"
                    "def f():\n    from csagate.kernels.gone import FAST\n"
                    "    from csagate.kernels.launch import FAST, NOPE\n"
                    "    from csagate.kernels import launch, gone\n")
    assert unresolved(path, modules()) == [
        "bench.py: from csagate.kernels.gone import ...: no such module",
        "bench.py: from csagate.kernels.launch import NOPE",
        "bench.py: from csagate.kernels import gone"]
