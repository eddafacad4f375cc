import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Keep compiler by-products of the test run out of other runs' way, and set the DSL's
# environment (PTX retention) before anything in the test run imports cutlass.
os.environ.setdefault("CSAGATE_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..",
                                                         ".csagate-cache"))

# The disk cache has its own tests (test_diskcache.py); elsewhere each test compiles what it
# checks (a probe test must see the compiler's PTX, not an entry of an earlier run).
os.environ.setdefault("CSAGATE_DISK_CACHE", "0")

from csagate.kernels._dsl import _prepare_env  # noqa: E402

_prepare_env()


@pytest.fixture(scope="session")
def dsl():
    """Skip (with the reason) where nvidia-cutlass-dsl does not import."""
    from csagate.kernels._dsl import dsl_available

    ok, why = dsl_available()
    if not ok:
        pytest.skip(why)


@pytest.fixture(scope="session")
def ptxas(dsl):
    """The ptxas the probe will use (the wheel's, then PATH, then CUDA_HOME). Where there is
    none: skip, except under CI=true, where a missing ptxas fails the run (the probe tests
    must not pass by probing nothing)."""
    from csagate.perf.probe import PtxasNotFound, find_ptxas

    try:
        return find_ptxas()
    except PtxasNotFound as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {exc}", pytrace=False)
        pytest.skip(str(exc))


# The sm_103a table kernels are built by no other test, so their probe runs as `csagate probe` in
# a process of its own, started when collection is done, on another core than the suite; its
# test runs last and reads what the process wrote.
BESIDE_ARCH = "sm_103a"
BESIDE_TEST = "test_sm_103a_table_kernels_build_and_probe_clean"
_beside: dict = {}


def _start_beside_probe() -> None:
    folder = Path(tempfile.mkdtemp(prefix="csagate-probe-beside-"))
    env = {**os.environ, "CSAGATE_CACHE_DIR": str(folder / "cache")}
    with open(folder / "probe.json", "w") as out, open(folder / "stderr.txt", "w") as err:
        _beside["proc"] = subprocess.Popen(
            [sys.executable, "-m", "csagate", "probe", "--ratio", "all", "--arch", BESIDE_ARCH,
             "--json"], stdout=out, stderr=err, env=env)
    _beside["folder"] = folder


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.name == BESIDE_TEST)   # stable: the rest keep their order


def pytest_collection_finish(session):
    if any(item.name == BESIDE_TEST for item in session.items):
        _start_beside_probe()


def pytest_sessionfinish(session, exitstatus):
    proc = _beside.get("proc")
    if proc is not None and proc.poll() is None:   # the test run ended before its test
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def beside_probe(ptxas):
    """``(exit code, the JSON of `csagate probe --ratio all --arch sm_103a --json`, stderr)``,
    from the process started beside the suite (started now if it was not)."""
    if "proc" not in _beside:
        _start_beside_probe()
    code = _beside["proc"].wait(timeout=1800)
    folder = _beside["folder"]
    text = (folder / "probe.json").read_text()
    return code, json.loads(text) if text.strip() else None, (folder / "stderr.txt").read_text()
