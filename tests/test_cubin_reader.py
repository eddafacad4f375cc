"""The cubin reader behind the backward's occupancy (kernels/occupancy.py): the CUDA ELF an
object file embeds and its kernels' names, read on the CPU; the driver's answer is checked on
the GPU (tests/gpu/test_resident_ctas.py)."""

import struct

import pytest
from csagate.kernels import occupancy as O
from csagate.kernels import small_schedule as SS


@pytest.fixture(scope="module")
def objects(dsl):
    """The object files of the r4 c1d128 backward and forward, compiled for sm_90a."""
    from csagate.kernels import registry
    from csagate.kernels.cache import compile_key
    from csagate.kernels.diskcache import export_object

    out = {}
    for direction in ("bwd", "fwd"):
        sched = SS.small_schedule(direction, 128, ratio=4, coff=1, arch="sm_90a")
        key = registry.make_key(direction, 4, 1, 128, sched, "sm_90a")
        out[direction] = export_object(compile_key(key))
    return out


def test_the_backward_cubin_names_one_backward_kernel(objects):
    """The embedded image is a whole CUDA ELF (machine 190, every section inside it); the
    backward's holds exactly one kernel named *BWD_KERNEL* (and its dAPE zeroing), the
    forward's none."""
    cubin = O.embedded_cubin(objects["bwd"])
    assert cubin is not None and cubin[:4] == b"\x7fELF"
    assert struct.unpack_from("<H", cubin, 0x12)[0] == O.EM_CUDA
    assert objects["bwd"].find(cubin) > 0  # inside the host object, not the object itself
    names = O.kernel_names(cubin)
    assert len([n for n in names if SS.BWD_KERNEL in n]) == 1 and len(names) == 2, names
    fwd = O.kernel_names(O.embedded_cubin(objects["fwd"]))
    assert fwd and not [n for n in fwd if SS.BWD_KERNEL in n]


def test_not_a_cubin(objects):
    """No CUDA ELF, or one cut short: None and no names, never a wrong slice."""
    assert O.embedded_cubin(b"") is None and O.embedded_cubin(b"\0" * 100) is None
    assert O.kernel_names(b"") == [] and O.kernel_names(b"\x7fELF" + b"\0" * 60) == []
    obj = objects["bwd"]
    cubin = O.embedded_cubin(obj)
    at = obj.find(cubin)
    assert O.embedded_cubin(obj[:at + len(cubin) - 1]) is None


def test_launch_shape_is_the_block_and_the_lanes_buffer():
    """(threads per CTA, dynamic shared bytes): a form of lanes keeps (lanes - 1) x window x
    columns fp32 sums; a one-lane form none."""
    v4 = SS.small_schedule("bwd", 128, ratio=4, coff=1, arch="sm_90a")
    assert v4.lanes > 1
    assert SS.bwd_launch_shape(v4, 4) == (v4.threads * v4.lanes,
                                          (v4.lanes - 1) * 4 * v4.threads * v4.vec * 4)
    v1 = SS.small_schedule("bwd", 512, ratio=2, coff=2, arch="sm_90a")
    assert v1.lanes == 1 and SS.bwd_launch_shape(v1, 4) == (v1.threads, 0)
