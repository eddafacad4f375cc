"""The small backward's resident CTAs per SM, as the driver computes them from each kernel's
cubin when it loads (kernels/occupancy.py, kernels/cache.py), and the rows per CTA the api
launch takes from them (small_schedule.bwd_rows_per_cta)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_dsl")]

CONFIGS = ((1, 128), (2, 128), (1, 512), (2, 512))
SM90_SMEM_PER_SM = 228 * 1024  # shared memory of an SM (sm_90) ...
SM90_SMEM_PER_CTA = 1024       # ... of which each resident CTA takes this much for the system


def _table_key(ratio, coff, d, deterministic=False):
    from csagate.kernels import registry
    from csagate.kernels import small_schedule as SS
    from csagate.kernels._dsl import device_arch

    arch = device_arch()
    sched = SS.small_schedule("bwd", d, ratio=ratio, coff=coff, arch=arch)
    return registry.make_key("bwd", ratio, coff, d, sched, arch, deterministic)


def _registers(cubin: bytes, kernel: str, tmp_path) -> int | None:
    """The kernel's registers as cuobjdump reads them from the cubin (None: no cuobjdump)."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        return None
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    out = subprocess.run([tool, "--dump-resource-usage", str(path)], capture_output=True,
                         text=True, check=True).stdout
    block = out[out.index(kernel):]
    return int(re.search(r"REG:(\d+)", block).group(1))


@pytest.mark.parametrize("deterministic", (False, True), ids=("atomic", "deterministic"))
@pytest.mark.parametrize("ratio", (2, 4, 8, 16, 32))
def test_every_table_backward_knows_its_resident_ctas(ratio, deterministic, tmp_path):
    """Loading a table backward asks the driver: at least one CTA per SM, no error kept; where
    cuobjdump reads the cubin's registers, the answer is what the register file, the threads
    and the shared memory allow (64K registers, a warp's allocated in 256s, 2048 threads and
    32 CTAs per SM; sm_90: 228 KiB of shared memory per SM, 1 KiB of it reserved per CTA)."""
    from csagate.kernels import occupancy
    from csagate.kernels import small_schedule as SS
    from csagate.kernels.cache import CACHE, disk_key
    from csagate.kernels.diskcache import export_object

    dev = torch.cuda.current_device()
    for coff, d in CONFIGS:
        if SS.config_problems(ratio, coff, d):
            continue
        key = _table_key(ratio, coff, d, deterministic)
        fn = CACHE.executor(key, dev)
        got = CACHE.resident_ctas(key, dev)
        entry = CACHE._entries[key]
        assert got >= 1 and entry.resident_error == "", (key.tag, entry.resident_error)
        disk = CACHE._disk.object_bytes(disk_key(key)) if CACHE._disk is not None else None
        cubin = occupancy.embedded_cubin(disk if disk is not None else export_object(fn))
        name = [n for n in occupancy.kernel_names(cubin) if SS.BWD_KERNEL in n][0]
        regs = _registers(cubin, name, tmp_path)
        if regs is None:
            continue
        threads, smem = SS.bwd_launch_shape(key.schedule, ratio * coff)
        warps = -(-threads // 32)
        per_warp = -(-regs * 32 // 256) * 256
        by_smem = SM90_SMEM_PER_SM // (smem + SM90_SMEM_PER_CTA) if smem else 32
        assert got == min(65536 // (per_warp * warps), 2048 // (warps * 32), 32, by_smem), (
            key.tag, regs, threads, smem, got)


@pytest.mark.parametrize("ratio,coff,d,tokens", ((4, 1, 128, 131072), (4, 1, 512, 131072),
                                                  (2, 2, 512, 8192), (2, 1, 128, 8192)))
def test_the_launch_takes_the_wave_rule(ratio, coff, d, tokens):
    """The api's default launch (remembered by the fast path) takes the rows the rule picks
    from this GPU's SMs and the kernel's resident CTAs, in both modes."""
    from csagate.kernels import api
    from csagate.kernels import small_schedule as SS
    from csagate.kernels._dsl import sm_count
    from csagate.kernels.cache import CACHE
    from csagate.kernels.launch import FAST
    from csagate.reference import make_grad_out, make_pack

    pack = make_pack((tokens,), ratio=ratio, coff=coff, d=d, seed=5, device="cuda")
    go = make_grad_out(pack.n_rows, d, device="cuda")
    kv, score, ape, cu, cuc = pack.inputs()
    dkv, dscore, dape = torch.empty_like(kv), torch.empty_like(score), torch.zeros_like(ape)
    dev = kv.get_device()
    for det in (False, True):
        key = api.run_backward(kv, score, ape, cu, cuc, go, dkv, dscore, dape, ratio=ratio,
                               coff=coff, deterministic=det)
        per_sm = CACHE.resident_ctas(key, dev)
        want = SS.bwd_rows_per_cta(pack.n_rows, d, coff, key.schedule, sm_count(dev), per_sm)
        entry = FAST[("bwd", det, ratio, coff, kv.shape[1], dev, pack.n_rows)]
        assert per_sm >= 1 and entry.tail[-1] == want, (key.tag, per_sm, entry.tail, want)
