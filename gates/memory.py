"""What judging a case costs in memory, estimated before any work, against what the machine has.

The gate holds, per case, the inputs (kv and score, 4 bytes a (token, column) slot), run 1 of
the implementation's outputs (4) and the run being compared with it (4; the later runs are
compared as they come and dropped): about ``BYTES_PER_SLOT`` bytes per slot of kv, and
``BYTES_PER_OUT`` per output element (the runs', the references' and the forward check's
temporaries, whole). It never holds a reference's gradients whole: the fp32 reference and the
fp64 oracle come a row chunk at a time (``reference.compressor.backward_pieces``) and dKV and
dScore are judged a token range at a time (``gates.piecewise``); those chunks, the interpreter
and torch take ``WORKING_BYTES``. Measured on the CPU (peak resident size of ``run_case`` over
a reference-backed implementation in a fresh process, ``tests/test_memory.py``, torch 2.13,
2026-12-06): the largest case of each family 1.89 GiB at r128 ``c2d512/1x131072``
(134 M slots: 1.5 GiB of inputs and two runs, torch 0.23 GiB, the references' chunks of 8
rows x 256 positions x 512 columns), 1.28 GiB at ``r4/c2d512/1x65536``, 0.47-0.53 GiB for the
other small ratios (README, Memory). The constants round those up, so the estimate is an
upper bound of the gate's own share (an implementation's own buffers come on top).

Pure Python: no torch until a device is asked how much it has.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from csagate.gates.cases import Case

BYTES_PER_SLOT = 12         # per (token, column) slot of kv: inputs, run 1, the run compared
BYTES_PER_OUT = 64          # per output element (N x d), the references' and the runs'
WORKING_BYTES = 640 << 20   # the interpreter with torch (0.23 GiB) and the references' row
#                             chunks: measured 0.03-0.46 GB above the slots' and outputs' share
GB = 1 << 30


def tensor_bytes(case: Case) -> int:
    """The estimated bytes of ``case``'s own tensors: the slots' and the outputs' share."""
    return BYTES_PER_SLOT * case.tokens * case.coff * case.d + BYTES_PER_OUT * case.rows * case.d


def case_bytes(case: Case) -> int:
    """The estimated peak bytes of judging ``case`` on one device (the gate's share)."""
    return WORKING_BYTES + tensor_bytes(case)


def available_bytes(device) -> int | None:
    """What ``device`` has free now: the GPU's free memory with the blocks torch's caching
    allocator holds unused (this process reuses them), or the CPU's available memory
    (``MemAvailable``, else the physical pages); None when it cannot be told."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        try:
            free, _ = torch.cuda.mem_get_info(dev)
            cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
            return int(free) + int(cached)
        except Exception:
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def too_large(cases: Iterable[Case], device, available: int | None = None) -> str | None:
    """One line naming the largest of ``cases`` when its estimate exceeds what ``device`` has
    (``available`` bytes, default: asked now), else None."""
    cases = list(cases)
    if not cases:
        return None
    biggest = max(cases, key=case_bytes)
    need = case_bytes(biggest)
    have = available_bytes(device) if available is None else available
    if have is None or need <= have:
        return None
    return (f"{biggest.name} needs about {need / GB:.1f} GB to judge ({biggest.tokens} tokens "
            f"x {biggest.coff * biggest.d} columns), and {device} has {have / GB:.1f} GB "
            "available")
