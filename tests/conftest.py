import os

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
