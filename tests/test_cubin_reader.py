"""The cubin reader behind the backward's occupancy (kernels/occupancy.py): the CUDA ELF an
object file embeds and its kernels' names, read on the CPU; the driver's answer is checked on
the GPU (tests/gpu/test_resident_ctas.py)."""

import dataclasses
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


def test_launch_shape_is_the_block_the_lanes_buffer_and_the_stages():
    """(threads per CTA, dynamic shared bytes): a form of lanes keeps (lanes - 1) x window x
    columns fp32 sums; a one-lane form none; a staged form adds per stage the bf16 score and
    kv of a window and the grad_out of a row for every thread, and three int32 per thread."""
    v4 = dataclasses.replace(SS.small_schedule("bwd", 128, ratio=4, coff=1, arch="sm_90a"),
                             stages=0)
    assert v4.lanes > 1
    lanes_buffer = (v4.lanes - 1) * 4 * v4.threads * v4.vec * 4
    assert SS.bwd_launch_shape(v4, 4) == (v4.threads * v4.lanes, lanes_buffer)
    v1 = SS.small_schedule("bwd", 512, ratio=2, coff=2)
    assert v1.lanes == 1 and SS.bwd_launch_shape(v1, 4) == (v1.threads, 0)
    for stages in SS.BWD_STAGES:
        staged = dataclasses.replace(v4, stages=stages)
        threads = v4.threads * v4.lanes
        per_stage = threads * (2 * 4 * v4.vec * 2 + v4.vec * 2 + 3 * 4)
        assert SS.bwd_launch_shape(staged, 4) == (threads, lanes_buffer + stages * per_stage)


@pytest.mark.parametrize("ratio,coff,d,stages", ((4, 1, 128, 2), (4, 2, 128, 3), (2, 2, 512, 0)))
def test_the_compiled_launch_asks_for_the_launch_shapes_bytes(dsl, ratio, coff, d, stages):
    """The DSL sizes the launch's dynamic shared memory from the kernel's allocations: its host
    code holds the byte count ``bwd_launch_shape`` gives the occupancy query (a kernel without
    shared allocations declares none)."""
    from csagate.kernels import small

    sched = SS.bwd_form(4 if coff == 1 or d == 512 else 2, d, ratio * coff, stages=stages)
    smem = SS.bwd_launch_shape(sched, ratio * coff)[1]
    fn = small.build_bwd(d=d, coff=coff, arch="sm_90a", sched=sched, ratio=ratio)
    if smem:
        assert f"llvm.mlir.constant({smem} : i64)" in str(fn.ir_module), (sched.tag, smem)
    else:  # no shared allocation: none declared
        assert "__dynamic_shmem__" not in fn.__ptx__, sched.tag


@pytest.fixture
def bwd_key():
    from csagate.kernels import registry

    sched = SS.small_schedule("bwd", 128, ratio=4, coff=1, arch="sm_90a")
    # the table's form unstaged: its rows follow the waves (a staged form keeps its aim)
    return registry.make_key("bwd", 4, 1, 128, dataclasses.replace(sched, stages=0), "sm_90a")


def _cache_on(objects, monkeypatch, resident):
    """A compile cache without a disk cache whose kernel exports the real r4 c1d128 backward's
    object, the driver's answer replaced by ``resident`` (a function of the query)."""
    from csagate.kernels import cache as C
    from csagate.kernels import diskcache, launch

    monkeypatch.setattr(diskcache, "export_object", lambda fn: objects["bwd"])
    monkeypatch.setattr(O, "resident_ctas", resident)
    monkeypatch.setattr(launch, "sm_count", lambda device_index: 132)
    cache = C.KernelCache(compiler=lambda key: object())
    monkeypatch.setattr(launch, "CACHE", cache)
    return cache


def test_loading_a_backward_asks_the_driver_with_its_launch_shape(objects, monkeypatch, bwd_key):
    """The first load on a device asks once, for the cubin's backward kernel at the launch's
    block and shared memory; the launch's rows then follow the rule with that answer."""
    from csagate.kernels import launch

    asked = []

    def driver(cubin, kernel, block, smem, device_index):
        asked.append((kernel, block, smem, device_index))
        return 5
    cache = _cache_on(objects, monkeypatch, driver)
    cache.executor(bwd_key, 0)
    cache.executor(bwd_key, 0)
    assert cache.resident_ctas(bwd_key, 0) == 5 and cache.resident_ctas(bwd_key, 1) == 0
    (kernel, block, smem, dev), = asked
    assert SS.BWD_KERNEL in kernel and dev == 0
    assert (block, smem) == SS.bwd_launch_shape(bwd_key.schedule, 4)
    n = 32768
    _, rows = launch.bwd_ctas(bwd_key, n, None, 0)
    assert rows == SS.bwd_rows_per_cta(n, 128, 1, bwd_key.schedule, 132, 5)
    assert rows != SS.bwd_rows_per_cta(n, 128, 1, bwd_key.schedule)
    fwd = dataclasses.replace(bwd_key, direction="fwd", schedule=SS.small_schedule(
        "fwd", 128, ratio=4, coff=1, arch="sm_90a"))
    cache.executor(fwd, 0)  # a family without a launch shape is not asked
    assert len(asked) == 1 and cache.resident_ctas(fwd, 0) == 0


def test_a_failed_driver_query_keeps_the_aim_and_the_reason(objects, monkeypatch, bwd_key):
    """Where the driver cannot answer, the count is 0, the entry keeps why, and the launch
    takes the rule's aim."""
    from csagate.kernels import launch

    def driver(cubin, kernel, block, smem, device_index):
        raise RuntimeError("cuModuleLoadData failed: CUDA_ERROR_INVALID_CONTEXT")
    cache = _cache_on(objects, monkeypatch, driver)
    cache.executor(bwd_key, 0)
    assert cache.resident_ctas(bwd_key, 0) == 0
    assert "CUDA_ERROR_INVALID_CONTEXT" in cache._entries[bwd_key].resident_error
    _, rows = launch.bwd_ctas(bwd_key, 32768, None, 0)
    assert rows == SS.bwd_rows_per_cta(32768, 128, 1, bwd_key.schedule)
