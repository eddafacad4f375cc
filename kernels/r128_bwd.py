"""The dedicated ratio=128 backward kernel (docs/KERNELS.md section 2, docs/CONTRACT.md section 2).

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

regwin (``BwdSchedule.regwin``, kernel ``kernel_rw``): the same algorithm and numerics with
each thread's window chunk in registers instead of shared memory. A thread keeps its C raw
score and kv values (a bf16 pair per 32-bit word for vec 2) and recomputes s and e in each
pass; it issues the next row's C score and C kv loads right after the current row's max
barrier, so they fly during its exp pass, merge and stores. Shared memory holds the chunk
partials, the per-column 1/den and S, and the thread-private fp32 dAPE sums. 3 barriers per
row; 512 resident threads per SM (128 registers per thread, capped through ``.maxntid``).

Every (token, column) slot of dKV/dScore is written exactly once: consumed slots by the row
that consumes them, never-consumed slots (docs/CONTRACT.md section 2.4) with exact zeros, so the
gradient buffers may start uninitialized. Kernels take raw pointers and runtime Int32 sizes;
the schedule fields, d and coff are compile-time.
"""

import math

import cuda.bindings.driver as cuda
import torch
from csagate.kernels._dsl import compile_for, cute_modules, gmem_ptr, stream_arg
from csagate.kernels.schedule import RATIO, BwdSchedule, bwd_smem_bytes, config_problems, window
from csagate.kernels.schedule import rows_per_cta as _rows_per_cta

cutlass, cute = cute_modules()

F32 = cutlass.Float32
BF16 = cutlass.BFloat16
I32 = cutlass.Int32
RN = cute.math.RoundingMode.NEAREST_EVEN

# regwin: resident threads per SM that the register cap (.maxntid) and rows_per_cta assume.
REGWIN_THREADS_PER_SM = 512

# exp(x) = 2^(x log2 e) with log2 e split in two fp32 parts (hi: nearest fp32, lo: remainder).
L2E_HI = 1.4426950216293335  # 0x3FB8AA3B
L2E_LO = 1.925963033500011e-08  # 0x32A57060


def _mul(a, b):
    return cute.math.mul(a, b, rounding=RN)


def _add(a, b):
    return cute.math.add(a, b, rounding=RN)


def _fma(a, b, c):
    return cute.math.fma(a, b, c, rounding=RN)


def _half(w, j: int):
    """Exact f32 of bf16 number j of a packed pair (j=0: the low half, the lower address)."""
    if j == 0:
        return (w << 16).bitcast(F32)
    return (w & I32(-65536)).bitcast(F32)


def _raw_word_f32(w, j: int, vec: int):
    """Exact fp32 of value j of one raw register: a packed bf16 pair (vec 2) or a bf16."""
    return _half(w, j) if vec == 2 else w.to(F32)


def _opaque(x):
    """A copy of the Int32 x that the compiler cannot see through. The gradient pass converts
    its kv words through it, so go * f32(kv) is recomputed there rather than kept in fp32
    registers from the S' pass (two registers per word instead of one)."""
    from cutlass._mlir.dialects import llvm

    return I32(llvm.inline_asm(I32.mlir_type, [x.ir_value()], "mov.b32 $0, $1;", "=r,r",
                               has_side_effects=True))


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
        if sched.regwin and (window(coff) // sched.tchunks * sched.vec) % 4:
            problems.append("regwin moves dAPE sums as 4-slot vectors: C*vec must be a "
                            "multiple of 4")
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
        # regwin: 512 resident threads per SM (schedule.rows_per_cta assumes the same), so
        # ptxas caps registers at 65536 / 512 = 128 per thread through .maxntid.
        self.ctas_per_sm = (REGWIN_THREADS_PER_SM // (sched.threads_x * sched.tchunks)
                            if sched.regwin else None)

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
        if cutlass.const_expr(self.sched.regwin):
            self.kernel_rw(
                mKV, mScore, mApe, mCu, mCuc, mGO, mDKV, mDScore, mDApe,
                n_tokens, n_seq, rows_per_cta,
            ).launch(
                grid=(gx, self.gy, 1),
                block=(self.threads_x, self.tchunks, 1),
                max_number_threads=(self.threads_x, self.tchunks * self.ctas_per_sm, 1),
                stream=stream,
            )
        else:
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

    # --- regwin: each thread's window chunk in registers (docs/KERNELS.md section 2, regwin) ---

    def _raw_f32(self, raw, kk: int, j: int):
        """Exact fp32 of window value (kk, j) of a raw chunk: packed bf16 pairs or bf16."""
        return _raw_word_f32(raw[kk], j, self.vec)

    @cute.jit
    def _fetch(self, mScore, mKV, mGO, mCu, mCuc, n_seq, rScN, rKvN, rGoN, rSegN, bb, col,
               wgrp, k0, half):
        """Issue row bb's loads into registers: its grad_out vec and this thread's C score and
        C kv vecs, all independent of each other, so they are in flight together."""
        VEC = self.vec
        seg = I32(0)  # the segment of row bb: cuc[seg] <= bb < cuc[seg+1]
        for q in cutlass.range(n_seq):
            if mCuc[q + 1] <= bb:
                seg = q + 1
        rSegN[0] = seg
        blk = bb - mCuc[seg]
        tok_row0 = mCu[seg] + blk * RATIO + k0 - (self.coff - 1) * RATIO
        gov = cute.local_tile(mGO, (1, VEC), (bb, col)).load()
        for j in cutlass.range_constexpr(VEC):
            rGoN[j] = gov[j]
        chunk_ok = (blk + half) > 0 if self.coff == 2 else True
        if chunk_ok:
            for kk in cutlass.range_constexpr(self.chunk):
                sc = cute.local_tile(mScore, (1, VEC), (tok_row0 + kk, wgrp)).load()
                kv = cute.local_tile(mKV, (1, VEC), (tok_row0 + kk, wgrp)).load()
                if cutlass.const_expr(VEC == 2):  # one 32-bit register per bf16 pair
                    rScN[kk] = sc.bitcast(I32)[0]
                    rKvN[kk] = kv.bitcast(I32)[0]
                else:
                    rScN[kk] = sc[0]
                    rKvN[kk] = kv[0]

    @cute.kernel
    def kernel_rw(
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
        """The staged kernel's algorithm and numerics with the window chunk in registers.

        The raw score/kv chunk of the row stays in registers (a bf16 pair per 32-bit word
        for vec 2); each pass recomputes s = f32(score) + ape (ape from L1) and, after the
        max, e = exp(s - max): the same operations on the same values as the staged kernel,
        so the same bits, in half the registers of an fp32 e. Per row: 1. take over the
        fetched chunk, chunk max; barrier; issue the next row's loads; 2. den'/S' partials;
        barrier; 3. merge; barrier; 4. gradients, dAPE sums, last-block zeros. Each shared
        array is rewritten by the next row only after a barrier that follows its last read.
        """
        VEC = self.vec
        TCH = self.tchunks
        TX = self.threads_x
        C = self.chunk
        CV = C * VEC
        NT = TX * TCH
        COLS = self.cols_pc
        COFF = self.coff
        DV = self.d // VEC
        FAST = self.sched.fastexp
        ALL_HALVES = tuple(range(COFF))

        tx, ty, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        gdx, _, _ = cute.arch.grid_dim()
        tid = ty * TX + tx
        col = by * TX + tx  # column group: columns [col*VEC, col*VEC + VEC) of a half
        k0 = ty * C  # first window position of this thread's chunk
        half = ty // (TCH // 2) if COFF == 2 else 0
        wgrp = half * DV + col
        ape_row0 = k0 - half * RATIO

        # Partials (t, c) at t*COLS + c and per-column results, c = tx*VEC + j.
        smem = cutlass.memory.SmemAllocator()
        part_layout = cute.make_layout((TCH, COLS), stride=(COLS, 1))
        col_layout = cute.make_layout((COLS,), stride=(1,))
        sMax = smem.allocate_tensor(F32, part_layout, byte_alignment=16)
        sDenP = smem.allocate_tensor(F32, part_layout, byte_alignment=16)
        sSP = smem.allocate_tensor(F32, part_layout, byte_alignment=16)
        sDen = smem.allocate_tensor(F32, col_layout, byte_alignment=16)
        sS = smem.allocate_tensor(F32, col_layout, byte_alignment=16)
        # fp32 dScore sums for dAPE, thread-private (no barrier): slot i = kk*VEC + j of
        # thread tid at (i % 4, tid, i // 4), so a thread's slots move as 16 B vectors and a
        # warp's vectors are contiguous. In registers they would cost C*VEC more per thread.
        sDApe = smem.allocate_tensor(
            F32, cute.make_layout((4, NT, CV // 4), stride=(1, 4, 4 * NT)), byte_alignment=16)

        # Raw chunks, one register per window position: the current row and the next row
        # as loaded (packed bf16 pairs for vec 2, bf16 for vec 1).
        RAW = I32 if VEC == 2 else BF16
        rSc = cute.make_rmem_tensor((C,), RAW)
        rKv = cute.make_rmem_tensor((C,), RAW)
        rScN = cute.make_rmem_tensor((C,), RAW)
        rKvN = cute.make_rmem_tensor((C,), RAW)
        rGoN = cute.make_rmem_tensor((VEC,), BF16)
        rSegN = cute.make_rmem_tensor((1,), I32)
        rM = cute.make_rmem_tensor((VEC,), F32)  # chunk max, then the row max
        rDen = cute.make_rmem_tensor((VEC,), F32)
        rSp = cute.make_rmem_tensor((VEC,), F32)
        rGo = cute.make_rmem_tensor((VEC,), F32)
        rK = cute.make_rmem_tensor((1, VEC), F32)
        rS = cute.make_rmem_tensor((1, VEC), F32)

        for i in cutlass.range_constexpr(CV):
            sDApe[i % 4, tid, i // 4] = F32(0.0)
        nb_valid = mCuc[n_seq]
        tok_end = mCu[n_seq]
        fetch = (mScore, mKV, mGO, mCu, mCuc, n_seq, rScN, rKvN, rGoN, rSegN)

        # The first row's loads fly during the prologue's zero stores.
        if bx * rows_per_cta < nb_valid:
            self._fetch(*fetch, bx * rows_per_cta, col, wgrp, k0, half)

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
                seg = rSegN[0]  # fetched with the row
                blk = bb - mCuc[seg]
                tok_row0 = mCu[seg] + blk * RATIO + k0 - (COFF - 1) * RATIO  # position k0
                # coff=2: the previous half of a segment's first block is invalid; coff=1
                # chunks are always valid (a Python True: the branches below fold away).
                chunk_ok = (blk + half) > 0 if COFF == 2 else True

                # 1. Take over the fetched row; chunk max of s = f32(score) + ape.
                for j in cutlass.range_constexpr(VEC):
                    rGo[j] = rGoN[j].to(F32)
                    rM[j] = F32(-F32.inf)
                if chunk_ok:
                    for kk in cutlass.range_constexpr(C):
                        rSc[kk] = rScN[kk]
                        rKv[kk] = rKvN[kk]
                        ap = cute.local_tile(mApe, (1, VEC), (ape_row0 + kk, wgrp)).load()
                        for j in cutlass.range_constexpr(VEC):
                            rM[j] = cute.arch.fmax(rM[j], self._raw_f32(rSc, kk, j) + ap[j])
                for j in cutlass.range_constexpr(VEC):
                    sMax[ty, tx * VEC + j] = rM[j]
                cute.arch.sync_threads()
                # The next row's loads fly during this row's passes, merge and stores (issued
                # after the barrier, they cannot be hoisted above the take-over).
                if rr + 1 < rows_per_cta:
                    if bb + 1 < nb_valid:
                        self._fetch(*fetch, bb + 1, col, wgrp, k0, half)

                # 2. e = exp(s - max); chunk partials of den and S' = sum dp*e.
                for j in cutlass.range_constexpr(VEC):
                    mx = sMax[0, tx * VEC + j]
                    for t in cutlass.range_constexpr(1, TCH):
                        mx = cute.arch.fmax(mx, sMax[t, tx * VEC + j])
                    rM[j] = mx
                    rDen[j] = F32(0.0)
                    rSp[j] = F32(0.0)
                if chunk_ok:
                    for kk in cutlass.range_constexpr(C):
                        ap = cute.local_tile(mApe, (1, VEC), (ape_row0 + kk, wgrp)).load()
                        for j in cutlass.range_constexpr(VEC):
                            e = _exp(self._raw_f32(rSc, kk, j) + ap[j] - rM[j], FAST)
                            rDen[j] = _add(rDen[j], e)
                            dp = _mul(rGo[j], self._raw_f32(rKv, kk, j))
                            rSp[j] = _fma(dp, e, rSp[j])
                else:
                    # What the staged kernel's C steps over (e = 0, kv = 0) leave: den' = +0,
                    # S' = fma(go * 0, 0, +0) (+0, or NaN for a non-finite grad_out).
                    for j in cutlass.range_constexpr(VEC):
                        rSp[j] = _fma(_mul(rGo[j], F32(0.0)), F32(0.0), F32(0.0))
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

                # 4. Gradients of the chunk (e recomputed as in pass 2); last-block zeros.
                if cutlass.const_expr(not self.sched.goreuse):
                    gov2 = cute.local_tile(mGO, (1, VEC), (bb, col)).load().to(F32)
                    for j in cutlass.range_constexpr(VEC):
                        rGo[j] = gov2[j]
                if chunk_ok:
                    for j in cutlass.range_constexpr(VEC):
                        rDen[j] = sDen[tx * VEC + j]  # now 1/den
                        rSp[j] = sS[tx * VEC + j]  # now S
                    for kk in cutlass.range_constexpr(C):
                        ap = cute.local_tile(mApe, (1, VEC), (ape_row0 + kk, wgrp)).load()
                        # dp = go*kv is recomputed from the raw word, not kept from pass 2.
                        kv = _opaque(rKv[kk]) if VEC == 2 else rKv[kk]
                        for j in cutlass.range_constexpr(VEC):
                            i = kk * VEC + j
                            e = _exp(self._raw_f32(rSc, kk, j) + ap[j] - rM[j], FAST)
                            p = _mul(e, rDen[j])
                            dp = _mul(rGo[j], _raw_word_f32(kv, j, VEC))
                            ds = _fma(p, -rSp[j], _mul(dp, p))
                            rK[0, j] = _mul(rGo[j], p)
                            rS[0, j] = ds
                            sDApe[i % 4, tid, i // 4] = _add(sDApe[i % 4, tid, i // 4], ds)
                        cute.local_tile(mDKV, (1, VEC), (tok_row0 + kk, wgrp)).store(
                            rK.load().to(BF16))
                        cute.local_tile(mDScore, (1, VEC), (tok_row0 + kk, wgrp)).store(
                            rS.load().to(BF16))
                if bb + 1 == mCuc[seg + 1]:
                    tok0 = tok_row0 - k0 + (COFF - 1) * RATIO
                    if cutlass.const_expr(COFF == 2):
                        # class (b): the last block's own tokens are nobody's previous half.
                        for t in cutlass.range(tok0 + ty, tok0 + RATIO, TCH):
                            self._zero_token(mDKV, mDScore, t, col, (0,))
                    # class (a): the segment's tail tokens.
                    for t in cutlass.range(tok0 + RATIO + ty, mCu[seg + 1], TCH):
                        self._zero_token(mDKV, mDScore, t, col, ALL_HALVES)

        # Epilogue: one fp32 atomic per (window position, column); chunks that never ran add 0.
        # The barrier is not needed for the thread-private sums; it keeps the compiler from
        # carrying them in registers through the row loop (forwarding the last stores here).
        cute.arch.sync_threads()
        for kk in cutlass.range_constexpr(C):
            for j in cutlass.range_constexpr(VEC):
                i = kk * VEC + j
                ptr = mDApe.iterator + cute.crd2idx(
                    (ape_row0 + kk, wgrp * VEC + j), mDApe.layout)
                cute.arch.red(ptr, sDApe[i % 4, tid, i // 4], op="add", dtype=F32,
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
        sched.regwin,
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
