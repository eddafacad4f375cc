"""The shape rule of the package's code: no function in kernels/, gates/, csagate/ or perf/ is
longer than 80 lines or takes more than 13 positional parameters (``self``/``cls`` not
counted). Read from the sources' syntax trees; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "gates", "csagate", "perf")
MAX_LINES = 80
MAX_POSITIONAL = 13


def functions():
    """(path, qualified name, lines, positional parameters) of every function and method."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            yield from _walk(tree, path.relative_to(ROOT).as_posix(), "")


def _walk(node, path: str, prefix: str):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + child.name
            params = [a.arg for a in child.args.posonlyargs + child.args.args]
            if params and params[0] in ("self", "cls") and prefix:
                params = params[1:]
            yield path, name, child.end_lineno - child.lineno + 1, len(params)
            yield from _walk(child, path, name + ".")
        elif isinstance(child, ast.ClassDef):
            yield from _walk(child, path, prefix + child.name + ".")
        else:
            yield from _walk(child, path, prefix)


def offenders() -> list[str]:
    found = []
    for path, name, lines, positional in functions():
        if lines > MAX_LINES:
            found.append(f"{path}:{name} {lines} lines")
        if positional > MAX_POSITIONAL:
            found.append(f"{path}:{name} {positional} positional parameters")
    return found


def test_the_walk_sees_functions_methods_and_nested_ones():
    seen = {(path, name) for path, name, _, _ in functions()}
    assert ("kernels/api.py", "run_forward") in seen
    assert ("kernels/cache.py", "KernelCache.executor") in seen
    assert any(path.startswith("csagate/") for path, _ in seen)
    assert any("." in name and not name[0].isupper() for _, name in seen)  # nested


def test_the_rule_measures_lines_and_positional_parameters(tmp_path):
    src = "def f(a, b, /, c, *args, d, **kw):\n" + "    x = 1\n" * 3
    tree = ast.parse("class C:\n    def m(self, a):\n        pass\n" + src)
    rows = {name: (lines, pos) for _, name, lines, pos in _walk(tree, "x.py", "")}
    assert rows == {"C.m": (2, 1), "f": (4, 3)}


def test_no_function_is_over_80_lines_or_13_positional_parameters():
    assert not offenders(), "\n".join(offenders())
