"""The shared-reciprocal division against ``div.rn.f32``, on the GPU:
``python -m csagate.perf.div_check [--y-step N] [--x-binade E ...] [--y-binades B]``.

The small kernels divide a window's e_k by its den as ``div_by(e, den, div_seed(den))``
(``kernels/device.py``) where every e_k >= DIV_FAST_MIN, so e in [2^-64, 1], den in [1, 64].
This launches both on the same operands and counts the quotients whose bits differ: every x
of each ``--x-binade`` [2^E, 2^(E+1)) (all 2^23 significands), against y = (1 + j*step*2^-23)
* 2^b for every j and b < ``--y-binades``, and y = 2^B. Absent overflow and underflow both
compute the same instructions on scaled operands, so one x binade against the y binade [1, 2)
at step 1 covers every significand pair of the domain (about 7e13 quotients). Nothing here
prints but ``main``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch
from csagate.kernels._dsl import compile_for, cute_modules, device_arch, env_stream, fake_vec, sym
from csagate.kernels.device import DIV_FAST_MIN, F32, I32, div_by, div_seed

cutlass, cute = cute_modules()

THREADS = 256
SIGNIFICANDS = 1 << 23


@cute.kernel
def _count_kernel(mX: cute.Tensor, mY: cute.Tensor, mBad: cute.Tensor, n_x: I32, n_y: I32):
    tx, _, _ = cute.arch.thread_idx()
    bx, _, _ = cute.arch.block_idx()
    i = bx * THREADS + tx
    if i < n_x:
        x = mX[i]
        bad = I32(0)
        for j in cutlass.range(n_y, unroll=4):
            y = mY[j]
            if x / y != div_by(x, y, div_seed(y)):
                bad = bad + 1
        mBad[i] = bad


@cute.jit
def _count(mX: cute.Tensor, mY: cute.Tensor, mBad: cute.Tensor, stream):
    n_x, n_y = mX.shape[0], mY.shape[0]
    _count_kernel(mX, mY, mBad, n_x, n_y).launch(
        grid=(cute.ceil_div(n_x, THREADS), 1, 1), block=(THREADS, 1, 1), stream=stream)


_COMPILED: dict = {}


def _counter():
    arch = device_arch()
    if arch not in _COMPILED:
        n_x = sym()
        _COMPILED[arch] = compile_for(arch, _count, fake_vec(F32, n_x), fake_vec(F32, sym()),
                                      fake_vec(I32, n_x), env_stream())
    return _COMPILED[arch]


def binade(e: int, step: int = 1, device="cuda") -> torch.Tensor:
    """The fp32 values (1 + j*step*2^-23) * 2^e, j = 0, 1, ... below 2^23/step."""
    if not -126 <= e <= 127:
        raise ValueError(f"binade 2^{e} is not a normal fp32 binade")
    m = torch.arange(0, SIGNIFICANDS, step, dtype=torch.int32, device=device)
    return (m | ((e + 127) << 23)).view(torch.float32)


def divisors(step: int, binades: int, device="cuda") -> torch.Tensor:
    """den's domain [1, 2^binades], sampled: every ``step``-th significand of each binade."""
    return torch.cat([*(binade(b, step, device) for b in range(binades)),
                      torch.tensor([2.0 ** binades], device=device)])


@dataclass(frozen=True)
class Result:
    x_binade: int
    quotients: int          # pairs compared
    mismatches: int         # quotients whose bits differ from div.rn.f32's
    first: float | None     # an x with a mismatching divisor, or None


def check(x_binade: int, ys: torch.Tensor) -> Result:
    """Every x of binade ``x_binade`` against every y of ``ys``."""
    if 2.0 ** x_binade < DIV_FAST_MIN or x_binade >= 0:
        raise ValueError(f"x binade 2^{x_binade} is outside the fast path's [2^-64, 1)")
    xs = binade(x_binade, 1, ys.device)
    bad = torch.empty(xs.numel(), dtype=torch.int32, device=ys.device)
    _counter()(xs, ys, bad)
    torch.cuda.synchronize()
    total = int(bad.sum(dtype=torch.int64))
    first = xs[int(torch.nonzero(bad)[0])].item() if total else None
    return Result(x_binade, xs.numel() * ys.numel(), total, first)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m csagate.perf.div_check")
    parser.add_argument("--x-binade", type=int, action="append",
                        help="x in [2^E, 2^(E+1)), E in [-64, -1] (repeatable; default -1)")
    parser.add_argument("--y-step", type=int, default=1,
                        help="every N-th divisor significand (default 1: all)")
    parser.add_argument("--y-binades", type=int, default=1, choices=range(1, 7),
                        help="divisors in [1, 2^B] (default 1: [1, 2])")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("div_check: needs a CUDA GPU", file=sys.stderr)
        return 3
    ys = divisors(args.y_step, args.y_binades)
    failed = False
    for e in args.x_binade or [-1]:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        res = check(e, ys)
        end.record()
        torch.cuda.synchronize()
        failed |= res.mismatches > 0
        example = "" if res.first is None else f" (e.g. x = {res.first!r})"
        print(f"x in [2^{e}, 2^{e + 1}) x {ys.numel()} divisors: {res.quotients:.3e} quotients, "
              f"{res.mismatches} mismatches{example} ({start.elapsed_time(end) / 1e3:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
