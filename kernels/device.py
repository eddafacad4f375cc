"""Device helpers shared by the kernels: types, pinned arithmetic, exp, segments, zero classes.
Each ``@cute.jit`` helper is traced inline (no call, no symbol). Semantics: docs/CONTRACT.md
sections 1-2; the exp forms: docs/KERNELS.md section 1."""

from __future__ import annotations

from csagate.kernels._dsl import cute_modules

cutlass, cute = cute_modules()

F32 = cutlass.Float32
BF16 = cutlass.BFloat16
I32 = cutlass.Int32
RN = cute.math.RoundingMode.NEAREST_EVEN
NEG_INF = -cutlass.Float32.inf

# exp(x) = 2^(x log2 e) with log2 e split in two fp32 parts (hi: nearest fp32, lo: remainder).
L2E_HI = 1.4426950216293335  # 0x3FB8AA3B: the fp32 nearest to log2(e)
L2E_LO = 1.925963033500011e-08  # 0x32A57060: the fp32 of log2(e) - L2E_HI


def mul_rn(a, b):
    """a * b rounded to nearest even, never contracted into an FMA."""
    return cute.math.mul(a, b, rounding=RN)


def add_rn(a, b):
    """a + b rounded to nearest even, never contracted into an FMA."""
    return cute.math.add(a, b, rounding=RN)


def fma_rn(a, b, c):
    """fma(a, b, c) with one rounding to nearest even (``fma.rn``)."""
    return cute.math.fma(a, b, c, rounding=RN)


# p = e / den, bitwise ``div.rn.f32``. On sm_90a, sm_100a and sm_103a ``div.rn.f32`` compiles to
# MUFU.RCP of the divisor and two FFMAs refining it, then q = x*r + 0, rem = fma(-y, q, x),
# q' = fma(r, rem, q), with FCHK sending operands out of its fast range to a slow subroutine.
# A window divides all its e_k by one den: ``div_seed`` computes the refined reciprocal once
# and ``div_by`` takes each quotient in the same three FFMAs, the same instructions on the same
# values. It is used where every dividend is at least DIV_FAST_MIN and the divisor in [1, 64]
# (a softmax window: e_k <= 1 <= den <= window), far inside FCHK's fast range; elsewhere the
# caller divides (docs/KERNELS.md section 4).
DIV_FAST_MIN = 2.0 ** -64


def div_seed(y):
    """The refined reciprocal of y that ``div.rn.f32``'s fast path computes."""
    r = cute.arch.rcp_approx(y)
    return fma_rn(r, fma_rn(-y, r, F32(1.0)), r)


def div_by(x, y, r):
    """x / y rounded to nearest even, r = ``div_seed(y)``: ``div.rn.f32``'s fast path."""
    q = fma_rn(x, r, F32(0.0))
    return fma_rn(r, fma_rn(-y, q, x), q)


def exp_exact(x):
    """The accurate expf (bit-identical to ``torch.exp`` on fp32)."""
    return cute.math.exp(x)


def exp_fast(x):
    """exp(x) = 2^(x*log2 e): pinned mul.rn + fma.rn, then ex2.approx.ftz (+0 at -inf)."""
    y = fma_rn(x, F32(L2E_LO), mul_rn(x, F32(L2E_HI)))
    return cute.math.exp2(y, approx=True, ftz=True)


def exp_of(x, fast: bool):
    """The fast or the accurate exp, a compile-time choice."""
    return exp_fast(x) if fast else exp_exact(x)


def segment_bits(n_seq: int) -> int:
    """Binary-search steps over cuc[0..n_seq]: ceil(log2(n_seq + 1)) == n_seq.bit_length()."""
    return n_seq.bit_length()


@cute.jit
def segment_search(mCu: cute.Tensor, mCuc: cute.Tensor, row, n_seq, seg_bits):
    """(s, cuc[s], cu[s]) for the largest s in [0, n_seq] with cuc[s] <= row (binary lifting):
    n_seq for padding. Each probe loads cu[s] beside cuc[s] and keeps both where it moves, so
    a row's first block and token need no load after the search (on a cold short grid that
    load is a DRAM round trip of its own: docs/PERF_NOTES.md section 14.10)."""
    seg = I32(0)
    first_block = mCuc[0]
    first_token = mCu[0]
    for it in cutlass.range(seg_bits, unroll=1):
        nxt = seg + (I32(1) << (seg_bits - 1 - it))
        if nxt <= n_seq:
            block = mCuc[nxt]
            token = mCu[nxt]
            if block <= row:
                seg = nxt
                first_block = block
                first_token = token
    return seg, first_block, first_token


@cute.jit
def segment_scan(mCuc: cute.Tensor, row, first, stop, offset: cutlass.Constexpr,
                 unroll: cutlass.Constexpr):
    """The largest s = q + offset, q in [first, stop), with cuc[s] <= row; 0 if none."""
    seg = I32(0)
    for q in cutlass.range(first, stop, 1, unroll=unroll):
        if mCuc[q + offset] <= row:
            seg = q + offset
    return seg


@cute.jit
def zero_short_segments(mCu: cute.Tensor, mCuc: cute.Tensor, n_seq, seg0, seg_step, lane,
                        lanes, zero_token: cutlass.Constexpr, unroll: cutlass.Constexpr):
    """Zero class (c): every token of a segment with no block (len < ratio, empty included)."""
    for s in cutlass.range(seg0, n_seq, seg_step, unroll=unroll):
        if mCuc[s + 1] == mCuc[s]:
            for t in cutlass.range(mCu[s] + lane, mCu[s + 1], lanes, unroll=unroll):
                zero_token(t)


@cute.jit
def zero_padding_tokens(first, n_tokens, step, zero_token: cutlass.Constexpr,
                        unroll: cutlass.Constexpr):
    """Zero class (d): token-capacity padding [cu[B], T); this thread's tokens first, +step."""
    for t in cutlass.range(first, n_tokens, step, unroll=unroll):
        zero_token(t)


def red_add_f32(mDst: cute.Tensor, coord, src, src_coord):
    """dst[coord] += src[src_coord] with one relaxed fp32 atomic (``red.global.add.f32``)."""
    ptr = mDst.iterator + cute.crd2idx(coord, mDst.layout)
    cute.arch.red(ptr, src[src_coord], op="add", dtype=F32, sem="relaxed", scope="gpu")


def red_add_f32_vec(mDst: cute.Tensor, coord, values: list):
    """dst[coord + (0, e)] += values[e] for every e: one relaxed fp32 reduction of 1, 2 or 4
    values (``red.global.add.f32``, ``.v2.f32`` / ``.v4.f32`` on sm_90+, PTX ISA 8.1); the
    vector forms need ``coord`` aligned to the vector (4 B times its length)."""
    n = len(values)
    ptr = mDst.iterator + cute.crd2idx(coord, mDst.layout)
    if n == 1:
        cute.arch.red(ptr, values[0], op="add", dtype=F32, sem="relaxed", scope="gpu")
        return
    if n not in (2, 4):
        raise ValueError(f"a vector fp32 reduction takes 2 or 4 values, not {n}")
    from cutlass._mlir.dialects import llvm

    regs = ", ".join(f"${i + 1}" for i in range(n))
    llvm.inline_asm(None, [ptr.toint().ir_value(), *(F32(v).ir_value() for v in values)],
                    "{ .reg .u64 g; cvta.to.global.u64 g, $0; "
                    f"red.relaxed.gpu.global.add.v{n}.f32 [g], {{{regs}}}; }}",
                    "l" + ",f" * n, has_side_effects=True)


def store_partial_f32(mDst: cute.Tensor, part, coord, src, src_coord):
    """dst[part * size(dst) + coord] = src[src_coord]: a store into CTA ``part``'s slice."""
    ptr = (mDst.iterator + part * cute.size(mDst.layout)
           + cute.crd2idx(coord, mDst.layout))
    cute.make_tensor(ptr, cute.make_layout(1))[0] = src[src_coord]


def cp_async_to_shared(sDst: cute.Tensor, dst_coord, mSrc: cute.Tensor, src_coord,
                       nbytes: int):
    """``sDst[dst_coord] = mSrc[src_coord]`` (``nbytes`` 4, 8 or 16) by ``cp.async.ca``."""
    from cutlass._mlir.dialects import llvm

    if nbytes not in (4, 8, 16):
        raise ValueError(f"cp.async.ca copies 4, 8 or 16 bytes, not {nbytes}")
    dst = (sDst.iterator + cute.crd2idx(dst_coord, sDst.layout)).toint()  # shared: 32-bit
    src = (mSrc.iterator + cute.crd2idx(src_coord, mSrc.layout)).toint()
    llvm.inline_asm(None, [dst.ir_value(), src.ir_value()],
                    "{ .reg .u64 g; cvta.to.global.u64 g, $1; "
                    f"cp.async.ca.shared.global [$0], [g], {nbytes}; }}",
                    "r,l", has_side_effects=True)


ZERO_THREADS = 256  # threads per CTA of the zeroing kernel
ZERO_VEC = 4  # fp32 per store (16 bytes; dAPE has ratio*W elements, ratio in {4, 128})
ZERO_STORES = 4  # stores per thread: a c2d512 dAPE (131072 fp32) takes 32 CTAs


@cute.kernel
def _zero_f32_kernel(mVec: cute.Tensor, n_vec: I32):
    # PDL: wait for the kernel before (the buffer is free), then let the backward after start.
    cute.arch.griddepcontrol_wait()
    cute.arch.griddepcontrol_launch_dependents()
    tx, _, _ = cute.arch.thread_idx()
    bx, _, _ = cute.arch.block_idx()
    zeros = cute.make_rmem_tensor((1, ZERO_VEC), F32)
    zeros.fill(0.0)
    for it in cutlass.range_constexpr(ZERO_STORES):
        i = (bx * ZERO_STORES + it) * ZERO_THREADS + tx
        if i < n_vec:
            cute.local_tile(mVec, (1, ZERO_VEC), (i, 0)).store(zeros.load())


def launch_zero_f32(mDst: cute.Tensor, stream, pdl: bool = True):
    """Host side, in a ``@cute.jit`` launcher: a kernel writing +0.0 into the compact fp32
    ``mDst`` ahead of the launcher's next kernel (with ``pdl``: a programmatic dependent)."""
    n_vec = cute.size(mDst.layout) // ZERO_VEC
    vecs = cute.make_tensor(mDst.iterator, cute.make_layout((n_vec, ZERO_VEC),
                                                            stride=(ZERO_VEC, 1)))
    per_cta = ZERO_THREADS * ZERO_STORES
    _zero_f32_kernel(vecs, n_vec).launch(grid=((n_vec + per_cta - 1) // per_cta, 1, 1),
                                         block=(ZERO_THREADS, 1, 1), stream=stream,
                                         use_pdl=pdl)
