"""The kernels' files stay code first: at most 15% of a file's non-blank lines are prose.

Prose is a line that holds only a comment or lies inside a docstring (of the module, a class or
a function); the designs, dispatch tables and measurements live in docs/KERNELS.md and
docs/PERF_NOTES.md. A file that holds no code (a package's docstring) has nothing to weigh.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_SHARE = 0.15
SCOPES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _docstring(node: ast.AST) -> ast.Expr | None:
    body = getattr(node, "body", None)
    if (isinstance(node, SCOPES) and body and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
        return body[0]
    return None


def prose_lines(source: str) -> tuple[int, int, bool]:
    """(prose lines, non-blank lines, whether any line is code) of a Python source."""
    lines = source.splitlines()
    prose = {i for i, line in enumerate(lines, 1) if line.strip().startswith("#")}
    for node in ast.walk(ast.parse(source)):
        doc = _docstring(node)
        if doc is not None:
            prose.update(range(doc.lineno, doc.end_lineno + 1))
    filled = {i for i, line in enumerate(lines, 1) if line.strip()}
    return len(prose & filled), len(filled), bool(filled - prose)


def test_the_measure_counts_comments_and_docstrings_not_code():
    source = ('"""Module.\n\nMore."""\n\n# a comment\nX = 1  # trailing: code\n\n\n'
              'def f():\n    """One line."""\n    return "not a docstring"\n')
    assert prose_lines(source) == (4, 7, True)  # docstring 2 (its blank line not), comment 1, f 1
    assert prose_lines('"""Only a docstring."""\n') == (1, 1, False)


@pytest.mark.parametrize("path", sorted((ROOT / "kernels").glob("*.py")), ids=lambda p: p.name)
def test_a_kernel_file_is_at_most_15_percent_prose(path):
    prose, filled, has_code = prose_lines(path.read_text())
    if not has_code:
        pytest.skip(f"{path.name} holds no code")
    assert prose <= MAX_SHARE * filled, (
        f"kernels/{path.name}: {prose} of {filled} non-blank lines are prose "
        f"({100 * prose / filled:.1f}% > {100 * MAX_SHARE:.0f}%)")
