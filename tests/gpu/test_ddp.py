"""Two GPUs: a DDP training step through ``csagate.kernels.ops.csa_compress`` under
``torchrun --nproc_per_node=2`` (tests/gpu/ddp_worker.py), ratio 4 and 128, coff 1 and 2,
eager and torch.compile, against the same step on one GPU: dKV and dScore bitwise per rank,
the all-reduced dAPE within the contract's 1e-3 (bitwise in deterministic mode) and bitwise
equal on both ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2,
                                 reason="needs 2 CUDA GPUs (torchrun --nproc_per_node=2)")]

WORKER = Path(__file__).with_name("ddp_worker.py")
DAPE_ABS = 1e-3  # docs/CONTRACT.md G2
EXPECTED = {(ratio, coff, mode) for ratio, coff in ((4, 1), (4, 2), (128, 1), (128, 2))
            for mode in ("eager", "compiled")}


def _torchrun(out: Path, *extra: str) -> subprocess.CompletedProcess:
    # NVLink multicast (NVLS, symmetric memory) off: the lent machines refuse it.
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(WORKER), "--out", str(out), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomics", "deterministic"])
def test_ddp_step_equals_one_gpu(tmp_path, deterministic):
    proc = _torchrun(tmp_path, *(["--deterministic"] if deterministic else []))
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
    assert proc.returncode == 0, tail
    for rank in (0, 1):
        records = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert {(r["ratio"], r["coff"], r["mode"]) for r in records} == EXPECTED
        for r in records:
            where = f"rank {rank} r{r['ratio']} c{r['coff']} {r['mode']}"
            assert r["rank"] == rank and r["dape_nonzero"], where
            assert r["dkv_bitwise"] and r["dscore_bitwise"], where
            assert r["dape_same_on_every_rank"], where
            assert r["dape_max_abs"] <= DAPE_ABS, (where, r["dape_max_abs"])
            if deterministic:
                assert r["dape_bitwise"], (where, r["dape_max_abs"])
