"""The install has one import name: the wheel holds only ``csagate``, and the repository's
``kernels``/``gates``/``reference``/``perf`` folders are importable only as ``csagate.*`` (one copy,
one compile cache). Builds the wheel from the checkout with pip (no network: no isolation)."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(out), str(ROOT)],
        capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = list(out.glob("csagate-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_top_level_is_csagate_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"csagate"}, sorted(top)
    for sub in ("kernels/api.py", "gates/runner.py", "reference/compressor.py",
                "commands/run.py", "perf/bench.py", "perf/ptx_hashes.py"):
        assert f"csagate/{sub}" in names, sub
    dist_info = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    if dist_info:  # setuptools writes it; when present it must name csagate alone
        text = zipfile.ZipFile(wheel).read(dist_info[0]).decode().split()
        assert text == ["csagate"], text


def test_the_folders_are_not_importable_top_level(tmp_path):
    """From a neutral directory the installed package resolves its subpackages into the
    repository's folders, and the bare folder names are not importable."""
    code = ("import importlib.util as u, csagate.kernels, csagate.gates, csagate.reference,"
            " csagate.perf;"
            "print(csagate.kernels.__file__);"
            "print([str(u.find_spec(n).origin) for n in ('kernels', 'gates', 'reference', "
            "'perf') if u.find_spec(n) is not None])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert Path(first).resolve() == (ROOT / "kernels" / "__init__.py").resolve()
    for origin in eval(second):  # another distribution's top-level package may exist
        assert not Path(origin).resolve().is_relative_to(ROOT), origin


def test_no_source_imports_the_bare_names():
    bad = []
    for path in ROOT.glob("**/*.py"):
        if any(part in (".venv", "build", ".git") for part in path.parts):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            s = line.strip()
            if s.startswith(("from kernels", "from gates", "from reference", "from perf",
                             "import kernels", "import gates", "import reference",
                             "import perf")):
                bad.append(f"{path.relative_to(ROOT)}:{i}: {s}")
    assert not bad, "\n".join(bad)
