"""How the suite is split among pytest-xdist workers (``--dist loadgroup``, tests/conftest.py).

A group's tests run in one worker, one at a time. The GPU tests share the device (timings, the
DDP processes); the tests whose parameters name an arch share the kernels the worker's
process-wide compile cache holds (each kernel of the suite is compiled once, not once a
worker). The groups are read from the node ids: pytest 9 ignores the node id suffix that
pytest-xdist's ``xdist_group`` marker relies on.
"""

from __future__ import annotations

from csagate.kernels.schedule import ARCHES


def xdist_unit(nodeid: str) -> str:
    """The work unit of a test: its group, or its own node id."""
    if nodeid.startswith("tests/gpu/"):
        return "gpu"
    params = nodeid.partition("[")[2]
    return next((f"arch-{arch}" for arch in ARCHES if arch in params), nodeid)
