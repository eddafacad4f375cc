import pytest
import torch

NO_GPU = "needs a CUDA GPU (gpu marker): run on an H100 or H200"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def needs_dsl():
    """Skip the module without a CUDA GPU or an importable nvidia-cutlass-dsl (the reason
    says which). ``dsl_available`` also prepares CUTE_DSL_KEEP before cutlass loads."""
    if not torch.cuda.is_available():
        pytest.skip(NO_GPU)
    from csagate.kernels._dsl import dsl_available

    ok, why = dsl_available()
    if not ok:
        pytest.skip(why)
