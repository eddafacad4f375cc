import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

# Keep compiler by-products of the test run out of other runs' way, and set the DSL's
# environment (PTX retention) before anything in the test run imports cutlass.
os.environ.setdefault("CSAGATE_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..",
                                                         ".csagate-cache"))

# The disk cache has its own tests (test_diskcache.py); elsewhere each test compiles what it
# checks (a probe test must see the compiler's PTX, not an entry of an earlier run).
os.environ.setdefault("CSAGATE_DISK_CACHE", "0")

# A pytest-xdist worker's share of the cores for torch's CPU threads (and for the processes it
# starts): with every worker on all the cores, OpenMP threads wait for cores the other workers
# hold (measured: a file of small CPU gate runs took 12.9 s beside one busy core, 5.0 s with one
# thread).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(
        1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

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
# test runs last and reads what the process wrote. Under pytest-xdist the controller, which runs
# no test, starts it once (when a worker's collection holds the test) in a folder named in
# BESIDE_ENV, and the worker that runs the test waits for its exit code file.
BESIDE_ARCH = "sm_103a"
BESIDE_TEST = "test_sm_103a_table_kernels_build_and_probe_clean"
BESIDE_ENV = "CSAGATE_TEST_BESIDE_PROBE"
_beside: dict = {}


def _start_beside_probe(folder: Path | None = None) -> None:
    folder = folder or Path(tempfile.mkdtemp(prefix="csagate-probe-beside-"))
    env = {**os.environ, "CSAGATE_CACHE_DIR": str(folder / "cache")}
    with open(folder / "probe.json", "w") as out, open(folder / "stderr.txt", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "csagate", "probe", "--ratio", "all", "--arch", BESIDE_ARCH,
             "--json"], stdout=out, stderr=err, env=env)
    _beside["proc"], _beside["folder"] = proc, folder

    def record_exit() -> None:   # for a worker process, which cannot wait on it
        code = proc.wait()
        (folder / "exit_code.tmp").write_text(str(code))
        (folder / "exit_code.tmp").rename(folder / "exit_code")

    threading.Thread(target=record_exit, daemon=True).start()


def _xdist_controller(config) -> bool:
    return (not hasattr(config, "workerinput")
            and bool(getattr(config.option, "numprocesses", None)))


def pytest_configure(config):
    if _xdist_controller(config):
        os.environ[BESIDE_ENV] = tempfile.mkdtemp(prefix="csagate-probe-beside-")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    if "proc" not in _beside and any(BESIDE_TEST in i for i in ids):
        _start_beside_probe(Path(os.environ[BESIDE_ENV]))


@pytest.hookimpl(trylast=True)   # after -k / -m deselect: the items that will run
def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.name == BESIDE_TEST)   # stable: the rest keep their order
    if BESIDE_ENV not in os.environ and any(item.name == BESIDE_TEST for item in items):
        _start_beside_probe()


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the work units of tests/xdist_units.py."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling
    from xdist_units import xdist_unit

    class Grouped(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

    return Grouped(config, log)


def pytest_unconfigure(config):
    proc = _beside.get("proc")
    if proc is not None and proc.poll() is None:   # the test run ended before its test
        proc.kill()
        proc.wait()
    shared = os.environ.get(BESIDE_ENV) if _xdist_controller(config) else None
    folder = _beside.get("folder") or shared
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def _wait_for_controller(folder: Path, timeout: float = 1800.0) -> int:
    deadline = time.monotonic() + timeout
    while not (folder / "exit_code").exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the sm_103a probe beside the suite wrote no exit code in {timeout:.0f} s")
        time.sleep(0.5)
    return int((folder / "exit_code").read_text())


@pytest.fixture(scope="session")
def beside_probe(ptxas):
    """``(exit code, the JSON of `csagate probe --ratio all --arch sm_103a --json`, stderr)``,
    from the process started beside the suite (started now if it was not)."""
    shared = os.environ.get(BESIDE_ENV)
    if shared and (Path(shared) / "probe.json").exists():   # the xdist controller started it
        folder = Path(shared)
        code = _wait_for_controller(folder)
    else:
        if "proc" not in _beside:
            _start_beside_probe()
        code = _beside["proc"].wait(timeout=1800)
        folder = _beside["folder"]
    text = (folder / "probe.json").read_text()
    return code, json.loads(text) if text.strip() else None, (folder / "stderr.txt").read_text()
