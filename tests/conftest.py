import os

import pytest

# Keep compiler by-products of the test run out of other runs' way, and set the DSL's
# environment (PTX retention) before anything in the session imports cutlass.
os.environ.setdefault("CSAGATE_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..",
                                                         ".csagate-cache"))

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
    """The ptxas the probe will use; skip where there is none."""
    from csagate.perf.probe import PtxasNotFound, find_ptxas

    try:
        return find_ptxas()
    except PtxasNotFound as exc:
        pytest.skip(str(exc))
