"""Dispatch of the host API (kernels/api.py): the kernel a call launches (:func:`kernel_for`)
and the build of what a configuration can select (:func:`build`, before a CUDA-graph capture).
Design: docs/KERNELS.md section 5.
"""

from __future__ import annotations

import torch
from csagate.kernels import registry
from csagate.kernels.cache import CACHE, BuildRecord
from csagate.kernels.registry import KernelKey, keys_for, make_key
from csagate.kernels.schedule import ARCHES
from csagate.kernels.validate import check_ratio_coff, device_arch


def kernel_for(direction: str, ratio: int, coff: int, d: int, n_rows: int, arch: str,
               deterministic: bool = False) -> KernelKey | None:
    """The kernel a call would launch (no compile); None for N == 0 (nothing launches)."""
    registry.family(ratio, direction)
    check_ratio_coff(ratio, coff)
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    return select(direction, ratio, coff, d, n_rows, arch, deterministic) if n_rows else None


def select(direction: str, ratio: int, coff: int, d: int, n_rows: int, arch: str,
           deterministic: bool = False) -> KernelKey:
    """:func:`kernel_for` of a validated launch (N > 0): the launch path's one dispatch."""
    return make_key(direction, ratio, coff, d,
                    registry.FAMILIES[ratio, direction].select(coff, d, n_rows, arch), arch,
                    deterministic)


def _build_arch(arch: str | None) -> tuple[str, int | None]:
    """(the arch to build for, the current device to load onto, or None)."""
    if arch is not None and arch not in ARCHES:
        raise ValueError(f"arch must be one of {ARCHES}, got {arch!r}")
    load_on = None
    if torch.cuda.is_available():
        current = torch.cuda.current_device()
        if arch is None:
            arch = device_arch(current)
            load_on = current
        else:
            try:
                load_on = current if device_arch(current) == arch else None
            except RuntimeError:  # a GPU we do not build for: cross-compiling is still fine
                load_on = None
    if arch is None:
        raise RuntimeError("no CUDA device to take the arch from: pass arch= one of "
                           f"{', '.join(ARCHES)}")
    return arch, load_on


def build(ratio: int, *, arch: str | None = None, coff: int | None = None,
          d: int | None = None, n_rows: int | None = None, progress=None
          ) -> list[BuildRecord]:
    """Compile every kernel the configuration can select (or the bucket of ``n_rows``); for the
    current device they are also loaded."""
    if coff is not None:
        check_ratio_coff(ratio, coff)
    arch, load_on = _build_arch(arch)
    if n_rows is None:
        keys = keys_for(ratio, arch, coff=coff, d=d)
    else:
        keys = []
        for c, hd in registry.family(ratio, "fwd").configs(coff, d):
            for direction in registry.DIRECTIONS:
                key = kernel_for(direction, ratio, c, hd, n_rows, arch)
                if key is not None and key not in keys:
                    keys.append(key)
    records = CACHE.build(keys, progress=progress)
    if load_on is not None:
        device = torch.device("cuda", load_on)
        for key in keys:
            _warm(key, device)
        torch.cuda.current_stream(device).synchronize()
    return records


def _warm(key: KernelKey, device: torch.device) -> None:
    """One tiny launch of ``key`` on ``device``, so its module is loaded before a capture."""
    ratio, width, d = key.ratio, key.coff * key.d, key.d
    bf16 = dict(dtype=torch.bfloat16, device=device)
    with torch.cuda.device(device):
        kv = torch.zeros(ratio, width, **bf16)
        tensors = dict(kv=kv, score=torch.zeros_like(kv),
                       ape=torch.zeros(ratio, width, dtype=torch.float32, device=device),
                       cu=torch.tensor([0, ratio], dtype=torch.int32, device=device),
                       cuc=torch.tensor([0, 1], dtype=torch.int32, device=device))
        if key.direction == "fwd":
            tensors["out"] = torch.empty(1, d, **bf16)
        else:
            tensors.update(grad_out=torch.zeros(1, d, **bf16), dkv=torch.empty_like(kv),
                           dscore=torch.empty_like(kv), dape=torch.zeros_like(tensors["ape"]))
        key.family.launch(CACHE.executor(key, device.index), key, **tensors)
