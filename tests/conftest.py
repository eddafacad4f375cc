import os

# Keep compiler by-products of the test run out of other runs' way, and set the DSL's
# environment (PTX retention) before anything in the session imports cutlass.
os.environ.setdefault("CSAGATE_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..",
                                                         ".csagate-cache"))

from kernels._dsl import _prepare_env  # noqa: E402

_prepare_env()
