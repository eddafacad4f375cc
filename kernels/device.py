"""Device helpers shared by the kernels, traced inline. Semantics: docs/CONTRACT.md sections 1-2;
the exp forms: docs/KERNELS.md section 1."""

from __future__ import annotations

from csagate.kernels._dsl import cute_modules

cutlass, cute = cute_modules()

F32 = cutlass.Float32
BF16 = cutlass.BFloat16
I32 = cutlass.Int32
RN = cute.math.RoundingMode.NEAREST_EVEN
NEG_INF = -cutlass.Float32.inf

L2E_HI = 1.4426950216293335  # 0x3FB8AA3B: the fp32 nearest to log2(e)
L2E_LO = 1.925963033500011e-08  # 0x32A57060: the fp32 of log2(e) - L2E_HI


# Pinned arithmetic: one rounding to nearest even; mul_rn and add_rn never contract into an FMA.
def mul_rn(a, b):
    return cute.math.mul(a, b, rounding=RN)


def add_rn(a, b):
    return cute.math.add(a, b, rounding=RN)


def fma_rn(a, b, c):
    return cute.math.fma(a, b, c, rounding=RN)


# div_by(x, y, div_seed(y)) == div.rn.f32 bit for bit (its sm_90a/100a/103a fast path) for
# x >= DIV_FAST_MIN, y in [1, 64] (a softmax window: e_k <= 1 <= den), within FCHK's fast range;
# else the caller uses div.rn.f32 (docs/KERNELS.md section 4, PERF_NOTES.md section 14.3).
DIV_FAST_MIN = 2.0 ** -64


def div_seed(y):
    r = cute.arch.rcp_approx(y)
    return fma_rn(r, fma_rn(-y, r, F32(1.0)), r)


def div_by(x, y, r):
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
    return exp_fast(x) if fast else exp_exact(x)


def segment_bits(n_seq: int) -> int:
    """Binary-search steps over cuc[0..n_seq]: ceil(log2(n_seq + 1)) == n_seq.bit_length()."""
    return n_seq.bit_length()


@cute.jit
def segment_search(mCu: cute.Tensor, mCuc: cute.Tensor, row, n_seq, seg_bits):
    """(s, cuc[s], cu[s]) for the largest s in [0, n_seq] with cuc[s] <= row (n_seq: padding),
    by binary lifting; each probe loads cu[s] beside cuc[s] (docs/PERF_NOTES.md section 14.4)."""
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
    ptr = mDst.iterator + cute.crd2idx(coord, mDst.layout)
    cute.arch.red(ptr, src[src_coord], op="add", dtype=F32, sem="relaxed", scope="gpu")


def red_add_f32_vec(mDst: cute.Tensor, coord, values: list):
    """dst[coord + (0, e)] += values[e]: one relaxed ``red`` of 1, 2 or 4 fp32 (``.v2``/``.v4``:
    sm_90+, PTX ISA 8.1, ``coord`` aligned to 4 B times the length)."""
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
    """Host side, in a ``@cute.jit`` launcher: a kernel filling the compact fp32 ``mDst`` with
    +0.0 (``pdl``: launched as a programmatic dependent of the kernel before)."""
    n_vec = cute.size(mDst.layout) // ZERO_VEC
    vecs = cute.make_tensor(mDst.iterator, cute.make_layout((n_vec, ZERO_VEC),
                                                            stride=(ZERO_VEC, 1)))
    per_cta = ZERO_THREADS * ZERO_STORES
    _zero_f32_kernel(vecs, n_vec).launch(grid=((n_vec + per_cta - 1) // per_cta, 1, 1),
                                         block=(ZERO_THREADS, 1, 1), stream=stream,
                                         use_pdl=pdl)
