"""What judging a case costs in memory, estimated before any work, against what the machine has.

The gate holds, per case, the inputs, run 1 of the implementation's outputs (the later runs are
compared as they come), the fp32 reference's and the fp64 oracle's outputs and the comparators'
temporaries: about ``BYTES_PER_SLOT`` bytes per (token, column) slot of kv and
``BYTES_PER_OUT`` per output element; the references' row chunks
(``reference.compressor.row_chunks``), whose working set is bounded whatever the pack, and the
interpreter with torch take ``WORKING_BYTES``. Measured on the CPU (peak resident size of
``run_case`` over the reference, torch 2.13, 2026-12-05): 1.40 GB at 16.8 M slots and 2.24 GB
at 33.6 M (r128 c2d512): 50 bytes a slot above 0.6 GB; the largest case of each family 0.81 to
6.90 GiB (README, Memory; ``tests/test_memory.py`` measures them again). The constants round
those up, so the estimate is an upper bound of the gate's own share (an implementation's own
buffers come on top).

Pure Python: no torch until a device is asked how much it has.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from csagate.gates.cases import Case

BYTES_PER_SLOT = 56         # per (token, column) slot of kv: measured 47-48
BYTES_PER_OUT = 64          # per output element (N x d), the references' and three runs'
WORKING_BYTES = 768 << 20   # the interpreter with torch (0.25-0.35 GB), the references' row
#                             chunks (up to 0.4 GB): measured 0.4-0.46 GB above the slots' share
GB = 1 << 30


def case_bytes(case: Case) -> int:
    """The estimated peak bytes of judging ``case`` on one device (the gate's share)."""
    return (WORKING_BYTES + BYTES_PER_SLOT * case.tokens * case.coff * case.d
            + BYTES_PER_OUT * case.rows * case.d)


def available_bytes(device) -> int | None:
    """What ``device`` has free now: the GPU's free memory, or the CPU's available memory
    (``MemAvailable``, else the physical pages); None when it cannot be told."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        try:
            free, _ = torch.cuda.mem_get_info(dev)
            return int(free)
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
