"""How the suite runs under pytest-xdist (tests/conftest.py, tests/xdist_units.py): the GPU
tests in one worker, the tests whose parameters name an arch in that arch's worker (one compile
of each kernel), and each worker's torch threads its share of the cores."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from xdist_units import xdist_unit


def test_units_follow_the_gpu_folder_and_the_arch_a_test_names():
    assert xdist_unit("tests/gpu/test_op_gpu.py::test_x[sm_90a]") == "gpu"
    assert xdist_unit("tests/test_small_build.py::test_ptxas_clean[r2fwd-sm_100a-c1d128]") == \
        "arch-sm_100a"
    assert xdist_unit("tests/test_cache_probe.py::test_probe_reports_clean_kernels[sm_90a]") == \
        "arch-sm_90a"
    # a name outside the parameters is no arch; an unparametrized test is a unit of its own
    plain = "tests/test_cli_build_probe.py::test_probe_ratio128_sm_100a_all_clean"
    assert xdist_unit(plain) == plain


def test_a_groups_tests_run_in_one_worker_with_their_share_of_the_threads(tmp_path):
    """A two-worker run of a small tree under this conftest: every test of the GPU folder ran in
    one worker, every test of one arch in one worker, and each saw OMP_NUM_THREADS = its share."""
    tests = tmp_path / "tests"
    (tests / "gpu").mkdir(parents=True)
    for helper in ("conftest.py", "xdist_units.py"):
        shutil.copy(Path(__file__).with_name(helper), tests / helper)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    share = max(1, (os.cpu_count() or 1) // 2)
    body = ("import os, pytest\n"
            "@pytest.mark.parametrize('i', range(6))\n"
            "@pytest.mark.parametrize('arch', ['sm_90a', 'sm_100a'])\n"
            "def test_t(arch, i):\n"
            f"    assert os.environ['OMP_NUM_THREADS'] == '{share}'\n")
    (tests / "gpu" / "test_g.py").write_text(body)
    (tests / "test_a.py").write_text(body)
    env = {**os.environ, "CSAGATE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("OMP_NUM_THREADS", None)
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                           "-n", "2", "--dist", "loadgroup", "tests"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    workers = defaultdict(set)
    for worker, nodeid in re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (\S+)", proc.stdout):
        workers[xdist_unit(nodeid)].add(worker)
    assert set(workers) == {"gpu", "arch-sm_90a", "arch-sm_100a"}, proc.stdout[-3000:]
    assert all(len(ran_in) == 1 for ran_in in workers.values()), dict(workers)
