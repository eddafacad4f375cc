"""The dedicated ratio=128 backward kernel (spec: KERNELS.md section 2, CONTRACT.md section 2).

One CTA handles R consecutive output rows (R = ``rows_per_cta``, a runtime argument) for one
slice of ``cols_pc = threads_x * vec`` head-dim columns. Thread (tx, ty) owns the column group
``col = by * threads_x + tx`` (columns ``[col * vec, col * vec + vec)``) and the window chunk
``[ty * C, ty * C + C)``, C = win / tchunks. The window of a row is staged in shared memory,
so registers stay flat in the window length. Per row, with 4 CTA barriers:

1. stage     s_k = f32(score) + ape -> sE, kv -> sKV, chunk max -> sMax[ty];
2. e-pass    e_k = exp(s_k - max) back into sE, chunk partials den' and S' = sum dp*e;
3. merge     one thread per column: 1/den and S = S'/den (IEEE divisions) -> sDen, sS;
4. store     p = e * (1/den), dKV = bf16(go * p), dScore = bf16(fma(p, -S, dp * p)),
             fp32 dScore summed per (k, column) in registers for dAPE; last-block zeros.

After the row loop every thread adds its C * vec dAPE partials with fp32 ``red.add``.
Window position k maps to (token, column, ape row):
coff=1: (tok0 + k, col, k); coff=2: (tok0 - 128 + k, h * d + col, k - 128 h), h = k // 128.

Every (token, column) slot of dKV/dScore is written exactly once: consumed slots by the row
that consumes them, never-consumed slots (CONTRACT.md classes a-d) with exact zeros, so the
gradient buffers may start uninitialized. Kernels take raw pointers and runtime Int32 sizes;
the schedule fields, d and coff are compile-time.
"""

import math

import cuda.bindings.driver as cuda
import torch

from kernels._dsl import compile_for, cute_modules, gmem_ptr, stream_arg
from kernels.schedule import RATIO, BwdSchedule, bwd_smem_bytes, config_problems, window
from kernels.schedule import rows_per_cta as _rows_per_cta

cutlass, cute = cute_modules()

F32 = cutlass.Float32
BF16 = cutlass.BFloat16
I32 = cutlass.Int32
RN = cute.math.RoundingMode.NEAREST_EVEN

# exp(x) = 2^(x log2 e) with log2 e split in two fp32 parts (hi: nearest fp32, lo: remainder).
L2E_HI = 1.4426950216293335  # 0x3FB8AA3B
L2E_LO = 1.925963033500011e-08  # 0x32A57060


def _mul(a, b):
    return cute.math.mul(a, b, rounding=RN)


def _add(a, b):
    return cute.math.add(a, b, rounding=RN)


def _fma(a, b, c):
    return cute.math.fma(a, b, c, rounding=RN)


def _exp(x, fast: bool):
    """exp(x): the accurate expf, or the 3-instruction fast form (mul.rn, fma.rn, ex2.approx)."""
    if fast:
        y = _fma(x, F32(L2E_LO), _mul(x, F32(L2E_HI)))
        return cute.math.exp2(y, approx=True, ftz=True)
    return cute.math.exp(x)


class R128Bwd:
    """The r128 backward for one (d, coff, schedule); every field here is compile-time."""

    def __init__(self, d: int, coff: int, sched: BwdSchedule):
        problems = config_problems(coff, d, sched)
        dv = d // sched.vec
        if dv % sched.threads_x:
            # Full column coverage makes every `col < d/vec` predicate statically true.
            problems.append(f"d/vec={dv} is not a multiple of threads_x={sched.threads_x}")
        if sched.vec > sched.tchunks:
            problems.append(f"the merge needs vec <= tchunks, got {sched.vec} > {sched.tchunks}")
        if problems:
            raise ValueError(f"r128 backward c{coff}d{d} {sched}: " + "; ".join(problems))
        self.d = d
        self.coff = coff
        self.sched = sched
        self.vec = sched.vec
        self.tchunks = sched.tchunks
        self.threads_x = sched.threads_x
        self.win = window(coff)
        self.chunk = self.win // sched.tchunks
        self.cols_pc = sched.threads_x * sched.vec
        self.width = coff * d
        self.gy = dv // sched.threads_x
        self.smem_bytes = bwd_smem_bytes(coff, sched)

    def __repr__(self) -> str:  # names the kernel symbol: r128bwd_c{coff}d{d}_<schedule tag>
        return f"r128bwd_c{self.coff}d{self.d}_{self.sched.tag}"

    @cute.jit
    def __call__(
        self,
        p_kv: cute.Pointer,
        p_score: cute.Pointer,
        p_ape: cute.Pointer,
        p_cu: cute.Pointer,
        p_cuc: cute.Pointer,
        p_go: cute.Pointer,
        p_dkv: cute.Pointer,
        p_dscore: cute.Pointer,
        p_dape: cute.Pointer,
        n_tokens: cutlass.Int32,
        n_rows: cutlass.Int32,
        n_seq: cutlass.Int32,
        rows_per_cta: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        W = self.width
        tok_layout = cute.make_layout((n_tokens, W), stride=(W, 1))
        ape_layout = cute.make_layout((RATIO, W), stride=(W, 1))
        seg_layout = cute.make_layout((n_seq + 1,), stride=(1,))
        mKV = cute.make_tensor(p_kv, tok_layout)
        mScore = cute.make_tensor(p_score, tok_layout)
        mDKV = cute.make_tensor(p_dkv, tok_layout)
        mDScore = cute.make_tensor(p_dscore, tok_layout)
        mApe = cute.make_tensor(p_ape, ape_layout)
        mDApe = cute.make_tensor(p_dape, ape_layout)
        mCu = cute.make_tensor(p_cu, seg_layout)
        mCuc = cute.make_tensor(p_cuc, seg_layout)
        mGO = cute.make_tensor(p_go, cute.make_layout((n_rows, self.d), stride=(self.d, 1)))
        gx = (n_rows + rows_per_cta - 1) // rows_per_cta
        self.kernel(
            mKV, mScore, mApe, mCu, mCuc, mGO, mDKV, mDScore, mDApe,
            n_tokens, n_seq, rows_per_cta,
        ).launch(
            grid=(gx, self.gy, 1),
            block=(self.threads_x, self.tchunks, 1),
            stream=stream,
        )

    def _zero_token(self, mDKV, mDScore, token, col, halves):
        """Exact zeros into dKV and dScore at one token, this thread's columns of `halves`."""
        zeros = cute.full((1, self.vec), 0.0, BF16)
        for h in halves:
            grp = h * (self.d // self.vec) + col
            cute.local_tile(mDKV, (1, self.vec), (token, grp)).store(zeros)
            cute.local_tile(mDScore, (1, self.vec), (token, grp)).store(zeros)

    @cute.kernel
    def kernel(
        self,
        mKV: cute.Tensor,
        mScore: cute.Tensor,
        mApe: cute.Tensor,
        mCu: cute.Tensor,
        mCuc: cute.Tensor,
        mGO: cute.Tensor,
        mDKV: cute.Tensor,
        mDScore: cute.Tensor,
        mDApe: cute.Tensor,
        n_tokens: cutlass.Int32,
        n_seq: cutlass.Int32,
        rows_per_cta: cutlass.Int32,
    ):
        VEC = self.vec
        TCH = self.tchunks
        TX = self.threads_x
        C = self.chunk
        COLS = self.cols_pc
        COFF = self.coff
        DV = self.d // VEC
        FAST = self.sched.fastexp
        ALL_HALVES = tuple(range(COFF))

        tx, ty, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        gdx, _, _ = cute.arch.grid_dim()
        col = by * TX + tx  # column group: columns [col*VEC, col*VEC + VEC) of a half
        k0 = ty * C  # first window position of this thread's chunk
        # The chunk's half (coff=2: chunks never straddle the half boundary), the column group
        # it reads in a W-wide row, and its first APE row.
        half = ty // (TCH // 2) if COFF == 2 else 0
        wgrp = half * DV + col
        ape_row0 = k0 - half * RATIO

        # Shared tiles; element (k, c) at k*COLS + c, c = tx*VEC + j. Up to 104,960 B (B4, B6):
        # the launch passes the allocator's total as dynamic smem, and the DSL gives every
        # kernel max_dynamic_shared_size_bytes = the device's opt-in maximum at module load.
        smem = cutlass.memory.SmemAllocator()
        win_layout = cute.make_layout((self.win, COLS), stride=(COLS, 1))
        part_layout = cute.make_layout((TCH, COLS), stride=(COLS, 1))
        col_layout = cute.make_layout((COLS,), stride=(1,))
        sE = smem.allocate_tensor(F32, win_layout, byte_alignment=16)
        sKV = smem.allocate_tensor(BF16, win_layout, byte_alignment=16)
        sMax = smem.allocate_tensor(F32, part_layout, byte_alignment=16)
        sDenP = smem.allocate_tensor(F32, part_layout, byte_alignment=16)
        sSP = smem.allocate_tensor(F32, part_layout, byte_alignment=16)
        sDen = smem.allocate_tensor(F32, col_layout, byte_alignment=16)
        sS = smem.allocate_tensor(F32, col_layout, byte_alignment=16)

        rDApe = cute.make_rmem_tensor((C * VEC,), F32)  # fp32 dScore sums, (kk, j) at kk*VEC+j
        rDApe.fill(0.0)
        rM = cute.make_rmem_tensor((VEC,), F32)  # chunk max, then the row max
        rDen = cute.make_rmem_tensor((VEC,), F32)
        rSp = cute.make_rmem_tensor((VEC,), F32)
        rGo = cute.make_rmem_tensor((VEC,), F32)
        rK = cute.make_rmem_tensor((1, VEC), F32)
        rS = cute.make_rmem_tensor((1, VEC), F32)

        nb_valid = mCuc[n_seq]
        tok_end = mCu[n_seq]

        # Prologue, class (c): every token of a segment without rows (len < ratio, or empty).
        if bx == 0:
            for s in cutlass.range(n_seq):
                if mCuc[s + 1] == mCuc[s]:
                    for t in cutlass.range(mCu[s] + ty, mCu[s + 1], TCH):
                        self._zero_token(mDKV, mDScore, t, col, ALL_HALVES)
        # Prologue, class (d): token-capacity padding [cu[B], T), strided over grid rows.
        for t in cutlass.range(tok_end + bx * TCH + ty, n_tokens, gdx * TCH):
            self._zero_token(mDKV, mDScore, t, col, ALL_HALVES)

        for rr in cutlass.range(rows_per_cta):
            bb = bx * rows_per_cta + rr
            # bb depends on (bx, rr) only: the whole CTA agrees, so the barriers below are
            # reached by every thread or by none.
            if bb < nb_valid:
                seg = I32(0)  # the segment of row bb: cuc[seg] <= bb < cuc[seg+1]
                for q in cutlass.range(n_seq):
                    if mCuc[q + 1] <= bb:
                        seg = q + 1
                blk = bb - mCuc[seg]
                seg_end = mCu[seg + 1]
                tok0 = mCu[seg] + blk * RATIO
                tok_row0 = tok0 + k0 - (COFF - 1) * RATIO  # token of window position k0
                # coff=2: the previous half of a segment's first block is invalid; coff=1
                # chunks are always valid (a Python True: the branches below fold away).
                chunk_ok = (blk + half) > 0 if COFF == 2 else True

                # 1. Stage s and kv, chunk max.
                for j in cutlass.range_constexpr(VEC):
                    rM[j] = F32(-F32.inf)
                if chunk_ok:
                    for kk in cutlass.range(C, unroll=4):
                        sc = cute.local_tile(mScore, (1, VEC), (tok_row0 + kk, wgrp)).load()
                        ap = cute.local_tile(mApe, (1, VEC), (ape_row0 + kk, wgrp)).load()
                        kv = cute.local_tile(mKV, (1, VEC), (tok_row0 + kk, wgrp)).load()
                        scf = sc.to(F32)
                        for j in cutlass.range_constexpr(VEC):
                            sv = scf[j] + ap[j]
                            sE[k0 + kk, tx * VEC + j] = sv
                            sKV[k0 + kk, tx * VEC + j] = kv[j]
                            rM[j] = cute.arch.fmax(rM[j], sv)
                else:
                    for kk in cutlass.range(C, unroll=4):
                        for j in cutlass.range_constexpr(VEC):
                            sE[k0 + kk, tx * VEC + j] = F32(-F32.inf)
                            sKV[k0 + kk, tx * VEC + j] = BF16(0.0)
                for j in cutlass.range_constexpr(VEC):
                    sMax[ty, tx * VEC + j] = rM[j]
                cute.arch.sync_threads()

                # 2. e = exp(s - max) back into sE; chunk partials of den and S' = sum dp*e.
                gov = cute.local_tile(mGO, (1, VEC), (bb, col)).load().to(F32)
                for j in cutlass.range_constexpr(VEC):
                    rGo[j] = gov[j]
                    mx = sMax[0, tx * VEC + j]
                    for t in cutlass.range_constexpr(1, TCH):
                        mx = cute.arch.fmax(mx, sMax[t, tx * VEC + j])
                    rM[j] = mx
                    rDen[j] = F32(0.0)
                    rSp[j] = F32(0.0)
                for kk in cutlass.range(C, unroll=8):
                    for j in cutlass.range_constexpr(VEC):
                        e = _exp(sE[k0 + kk, tx * VEC + j] - rM[j], FAST)
                        sE[k0 + kk, tx * VEC + j] = e
                        rDen[j] = _add(rDen[j], e)
                        dp = _mul(rGo[j], sKV[k0 + kk, tx * VEC + j].to(F32))
                        rSp[j] = _fma(dp, e, rSp[j])
                for j in cutlass.range_constexpr(VEC):
                    sDenP[ty, tx * VEC + j] = rDen[j]
                    sSP[ty, tx * VEC + j] = rSp[j]
                cute.arch.sync_threads()

                # 3. Merge: one thread per CTA column, chunks in ascending order.
                if ty < VEC:
                    c = ty * TX + tx
                    den = F32(0.0)
                    sp = F32(0.0)
                    for t in cutlass.range_constexpr(TCH):
                        den = _add(den, sDenP[t, c])
                        sp = _add(sp, sSP[t, c])
                    sDen[c] = F32(1.0) / den
                    sS[c] = sp / den
                cute.arch.sync_threads()

                # 4. Gradients of the chunk; last-block zeros.
                if cutlass.const_expr(not self.sched.goreuse):
                    gov2 = cute.local_tile(mGO, (1, VEC), (bb, col)).load().to(F32)
                    for j in cutlass.range_constexpr(VEC):
                        rGo[j] = gov2[j]
                if chunk_ok:
                    for j in cutlass.range_constexpr(VEC):
                        rDen[j] = sDen[tx * VEC + j]  # now 1/den
                        rSp[j] = sS[tx * VEC + j]  # now S
                    for kk in cutlass.range_constexpr(C):
                        for j in cutlass.range_constexpr(VEC):
                            e = sE[k0 + kk, tx * VEC + j]
                            u = sKV[k0 + kk, tx * VEC + j].to(F32)
                            p = _mul(e, rDen[j])
                            dp = _mul(rGo[j], u)
                            ds = _fma(p, -rSp[j], _mul(dp, p))
                            rK[0, j] = _mul(rGo[j], p)
                            rS[0, j] = ds
                            rDApe[kk * VEC + j] = _add(rDApe[kk * VEC + j], ds)
                        cute.local_tile(mDKV, (1, VEC), (tok_row0 + kk, wgrp)).store(
                            rK.load().to(BF16))
                        cute.local_tile(mDScore, (1, VEC), (tok_row0 + kk, wgrp)).store(
                            rS.load().to(BF16))
                if bb + 1 == mCuc[seg + 1]:
                    if cutlass.const_expr(COFF == 2):
                        # class (b): the last block's own tokens are nobody's previous half.
                        for t in cutlass.range(tok0 + ty, tok0 + RATIO, TCH):
                            self._zero_token(mDKV, mDScore, t, col, (0,))
                    # class (a): the segment's tail tokens.
                    for t in cutlass.range(tok0 + RATIO + ty, seg_end, TCH):
                        self._zero_token(mDKV, mDScore, t, col, ALL_HALVES)
                cute.arch.sync_threads()  # the tiles are rewritten by the next row

        # Epilogue: one fp32 atomic per (window position, column); chunks that never ran add 0.
        for kk in cutlass.range_constexpr(C):
            for j in cutlass.range_constexpr(VEC):
                ptr = mDApe.iterator + cute.crd2idx(
                    (ape_row0 + kk, wgrp * VEC + j), mDApe.layout)
                cute.arch.red(ptr, rDApe[kk * VEC + j], op="add", dtype=F32,
                              sem="relaxed", scope="gpu")


def _placeholders():
    return (
        gmem_ptr(BF16), gmem_ptr(BF16), gmem_ptr(F32),
        gmem_ptr(I32, align=4), gmem_ptr(I32, align=4),
        gmem_ptr(BF16), gmem_ptr(BF16), gmem_ptr(BF16), gmem_ptr(F32),
    )


def build_bwd(*, d: int, coff: int, sched: BwdSchedule, arch: str):
    """Compile the r128 backward for (d, coff, sched) and arch; no GPU needed."""
    op = R128Bwd(d, coff, sched)
    one = I32(1)
    return compile_for(arch, op, *_placeholders(), one, one, one, one, stream_arg())


def flipped(sched: BwdSchedule, *, goreuse: bool | None = None,
            fastexp: bool | None = None) -> BwdSchedule:
    """The same schedule with goreuse and/or fastexp replaced (just another BwdSchedule)."""
    return BwdSchedule(
        sched.vec, sched.tchunks, sched.threads_x,
        sched.fastexp if fastexp is None else fastexp,
        sched.goreuse if goreuse is None else goreuse,
    )


_SM_COUNT: dict[int, int] = {}


def _sm_count(device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def _stream(stream, device):
    if stream is None:
        return stream_arg(torch.cuda.current_stream(device))
    if isinstance(stream, torch.cuda.Stream):
        return stream_arg(stream)
    return stream  # already a CUstream


def launch_bwd(fn, *, sched: BwdSchedule, kv, score, ape, cu, cuc, grad_out, dkv, dscore,
               dape, rows_per_cta: int | None = None, stream=None) -> None:
    """Launch a compiled r128 backward; no validation (kernels/api.py validates).

    ``rows_per_cta`` None derives R from N and the device's SM count
    (``schedule.rows_per_cta``). Launches nothing when grad_out has no rows.
    """
    n_rows = grad_out.shape[0]
    if n_rows == 0:
        return
    d = grad_out.shape[1]
    if rows_per_cta is None:
        rows_per_cta = _rows_per_cta(n_rows, d, kv.shape[1] // d, sched, _sm_count(kv.device))
    if rows_per_cta < 1:
        raise ValueError(f"rows_per_cta must be >= 1, got {rows_per_cta}")
    with torch.cuda.device(kv.device):
        fn(*_arguments(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, n_rows,
                       int(rows_per_cta), _stream(stream, kv.device)))


def _arguments(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, n_rows, rows, stream):
    return (
        gmem_ptr(BF16, kv.data_ptr()), gmem_ptr(BF16, score.data_ptr()),
        gmem_ptr(F32, ape.data_ptr()),
        gmem_ptr(I32, cu.data_ptr(), align=4), gmem_ptr(I32, cuc.data_ptr(), align=4),
        gmem_ptr(BF16, grad_out.data_ptr()),
        gmem_ptr(BF16, dkv.data_ptr()), gmem_ptr(BF16, dscore.data_ptr()),
        gmem_ptr(F32, dape.data_ptr()),
        I32(kv.shape[0]), I32(n_rows), I32(cu.numel() - 1), I32(rows),
        stream,
    )


def grid_of(*, d: int, sched: BwdSchedule, n_rows: int, rows_per_cta: int) -> tuple:
    """The launch grid (gx, gy, 1) for N rows: for tests and the docs."""
    gy = math.ceil((d // sched.vec) / sched.threads_x)
    return (math.ceil(n_rows / rows_per_cta), gy, 1)
