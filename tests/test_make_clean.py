"""`make clean` removes every ignored output and keeps the ignored inputs (.dsl/, .whl/, out/)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# every .gitignore pattern -> a path it ignores, and whether `make clean` removes it
IGNORED = {
    ".venv/": (".venv/bin/python", True),
    "__pycache__/": ("pkg/__pycache__/m.cpython-311.pyc", True),
    "*.pyc": ("stray.pyc", True),
    ".pytest_cache/": (".pytest_cache/v", True),
    ".ruff_cache/": (".ruff_cache/x", True),
    "*.egg-info/": ("csagate.egg-info/PKG-INFO", True),
    "build/": ("build/lib/x.py", True),
    "dist/": ("dist/csagate-0.1.0.whl", True),
    ".csagate-cache/": (".csagate-cache/ptx/k.ptx", True),
    "/.dsl/": (".dsl/__pycache__/kept.pyc", False),
    "/.whl/": (".whl/kept.whl", False),
    "/out/": ("out/kept.json", False),
}


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_clean_removes_every_ignored_output(tmp_path):
    patterns = [ln.strip() for ln in (REPO / ".gitignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    assert sorted(patterns) == sorted(IGNORED), "a new ignore pattern: decide whether clean " \
                                                "removes it, here and in the Makefile"
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    for path, _ in IGNORED.values():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    (tmp_path / "pkg" / "m.py").write_text("source")
    proc = subprocess.run(["make", "clean"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for pattern, (path, removed) in IGNORED.items():
        assert (tmp_path / path).exists() != removed, pattern
        if removed and pattern.endswith("/") and "__pycache__" not in pattern:
            assert not (tmp_path / Path(path).parts[0]).exists(), pattern
    assert not (tmp_path / "pkg" / "__pycache__").exists()
    assert (tmp_path / ".dsl" / "__pycache__" / "kept.pyc").exists()
    assert (tmp_path / "pkg" / "m.py").read_text() == "source"
