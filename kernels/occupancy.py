"""Resident CTAs per SM of a compiled kernel, asked of the CUDA driver with the kernel's own cubin:
the wave size behind ``small_schedule.bwd_rows_per_cta`` (docs/KERNELS.md section 4). The cubin is
read from a compiled function's object file (``diskcache``'s payload) with no GPU."""

from __future__ import annotations

import struct

EM_CUDA = 190            # ELF e_machine of a CUDA cubin
_ELF64_HEADER = 64
_SHT_NOBITS = 8        # a section with no bytes in the file (.bss, .nv.shared.*)
_SHDR = struct.Struct("<IIQQQQIIQQ")  # name, type, flags, addr, offset, size, link, info, ...


def _elf_end(blob: bytes, at: int) -> int:
    """End of the ELF64 image at ``at`` (furthest of section data and header tables), or 0."""
    if len(blob) < at + _ELF64_HEADER or blob[at + 4] != 2 or blob[at + 5] != 1:
        return 0  # not ELF64 little-endian
    phoff, shoff = struct.unpack_from("<QQ", blob, at + 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", blob, at + 0x36)
    end = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
    if shentsize != _SHDR.size or at + end > len(blob):
        return 0
    for i in range(shnum):
        h = _SHDR.unpack_from(blob, at + shoff + i * _SHDR.size)
        if h[1] != _SHT_NOBITS:
            end = max(end, h[4] + h[5])
    return at + end if at + end <= len(blob) else 0


def embedded_cubin(obj: bytes) -> bytes | None:
    """The first CUDA ELF image inside ``obj`` (an object file that embeds a fatbin), or None."""
    at = obj.find(b"\x7fELF", 1)
    while at >= 0:
        machine, = struct.unpack_from("<H", obj, at + 0x12) if len(obj) >= at + 0x14 else (0,)
        end = _elf_end(obj, at) if machine == EM_CUDA else 0
        if end:
            return obj[at:end]
        at = obj.find(b"\x7fELF", at + 1)
    return None


def kernel_names(cubin: bytes) -> list[str]:
    """The kernels a cubin defines: the names of its ``.text.<kernel>`` sections."""
    if not _elf_end(cubin, 0):
        return []
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shnum, shstrndx = struct.unpack_from("<HH", cubin, 0x3C)
    headers = [_SHDR.unpack_from(cubin, shoff + i * _SHDR.size) for i in range(shnum)]
    strtab = headers[shstrndx][4]
    names = []
    for h in headers:
        end = cubin.index(b"\0", strtab + h[0])
        name = cubin[strtab + h[0]:end].decode("ascii", "replace")
        if name.startswith(".text."):
            names.append(name[len(".text."):])
    return names


def _check(result, call: str):
    """The values of a cuda.bindings driver call; RuntimeError naming the call on an error."""
    from cuda.bindings import driver

    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{call} failed: {err.name}")
    return values[0] if len(values) == 1 else values


def resident_ctas(cubin: bytes, kernel: str, block: int, smem: int, device_index: int) -> int:
    """CTAs of ``block`` threads and ``smem`` bytes of dynamic shared memory resident on one SM:
    ``cuOccupancyMaxActiveBlocksPerMultiprocessor`` on ``cubin`` loaded into the device's primary
    context (torch's, made current for the query); RuntimeError names a failed driver call."""
    from cuda.bindings import driver

    _check(driver.cuInit(0), "cuInit")
    dev = _check(driver.cuDeviceGet(device_index), "cuDeviceGet")
    ctx = _check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    try:
        _check(driver.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
        try:
            mod = _check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
            try:
                fn = _check(driver.cuModuleGetFunction(mod, kernel.encode()),
                            "cuModuleGetFunction")
                return int(_check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    fn, block, smem), "cuOccupancyMaxActiveBlocksPerMultiprocessor"))
            finally:
                driver.cuModuleUnload(mod)
        finally:
            driver.cuCtxPopCurrent()
    finally:
        driver.cuDevicePrimaryCtxRelease(dev)
