"""The PTX hash of every kernel: ``python -m csagate.perf.ptx_hashes [--arch A,B] OUT.json
[PTX_DIR]``.

Compiles (no GPU needed) every kernel the dispatch can select at every ratio of the registry,
the deterministic backwards too, for every build target (``schedule.ARCHES``, or those named
with ``--arch``), and writes
``{"<kind>_c<coff>d<d>_<tag>@<arch>": sha256[:16]}``. Before hashing, comment lines (paths,
tool versions) are dropped and the entry symbols are renamed by position: a symbol embeds the
Python module path and the kernel function's name, which say nothing about the code. A
refactor that should not change the kernels compares two of these files; with PTX_DIR the
normalized PTX is written too, to diff.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path


def normalize(ptx: str) -> str:
    """The PTX without comment lines, its entry symbols renamed KERNEL0, KERNEL1, ..."""
    for i, name in enumerate(re.findall(r"\.entry\s+(\w+)", ptx)):
        ptx = ptx.replace(name, f"KERNEL{i}")
    return "\n".join(line for line in ptx.splitlines() if not line.startswith("//"))


def kernel_keys(arch: str) -> list:
    """Every kernel the dispatch can select on ``arch``, at every ratio, and the deterministic
    form of each backward."""
    from dataclasses import replace

    from csagate.kernels.registry import RATIOS, keys_for

    keys = [key for ratio in RATIOS for key in keys_for(ratio, arch)]
    return keys + [replace(key, deterministic=True) for key in keys if key.direction == "bwd"]


def name_of(key) -> str:
    mode = "_deterministic" if key.deterministic else ""
    return f"{key.kind}_{key.config}_{key.schedule.tag}{mode}@{key.arch}"


def hashes(arches=None, ptx_dir: Path | None = None) -> dict[str, str]:
    """``{name: sha256[:16]}`` of every kernel of ``arches`` (default: every build target)."""
    from csagate.kernels._dsl import ptx_of
    from csagate.kernels.cache import compile_key
    from csagate.kernels.schedule import ARCHES

    out = {}
    for arch in arches or ARCHES:
        for key in kernel_keys(arch):
            ptx = ptx_of(compile_key(key))
            if ptx is None:
                raise RuntimeError(f"no PTX retained for {name_of(key)}")
            text = normalize(ptx)
            out[name_of(key)] = hashlib.sha256(text.encode()).hexdigest()[:16]
            if ptx_dir is not None:
                (ptx_dir / f"{name_of(key)}.ptx").write_text(text)
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    arches = None
    if "--arch" in args:
        i = args.index("--arch")
        arches = args[i + 1].split(",")
        del args[i:i + 2]
    if len(args) not in (1, 2):
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    ptx_dir = Path(args[1]) if len(args) == 2 else None
    if ptx_dir is not None:
        ptx_dir.mkdir(parents=True, exist_ok=True)
    result = hashes(arches, ptx_dir=ptx_dir)
    Path(args[0]).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
