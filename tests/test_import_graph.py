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
