"""The dedicated ratio=128 backward kernel (design: docs/KERNELS.md section 2; semantics:
docs/CONTRACT.md section 2).

``_R128BwdBase`` holds what both forms share: the launch, the row loop, the merge, the
gradients and the dAPE epilogue. ``R128BwdStaged`` stages the row's window in shared memory;
``R128BwdRegwin`` holds it in registers and fetches the next row during the current one.
The schedule fields, d and coff are compile-time.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import cuda.bindings.driver as cuda
from csagate.kernels._dsl import (
    compile_for,
    cute_modules,
    env_stream,
    fake_rows,
    fake_vec,
    sm_count,
    sym,
)
from csagate.kernels.device import (
    BF16,
    F32,
    I32,
    add_rn,
    cp_async_to_shared,
    exp_of,
    fma_rn,
    launch_zero_f32,
    mul_rn,
    red_add_f32,
    segment_scan,
    store_partial_f32,
    zero_padding_tokens,
    zero_short_segments,
)
from csagate.kernels.schedule import (
    RATIO,
    REGWIN_THREADS_PER_SM,
    ApeCopy,
    BwdSchedule,
    GradOut,
    R128Geometry,
    bwd_smem_bytes,
    config_problems,
)
from csagate.kernels.schedule import rows_per_cta as _rows_per_cta

cutlass, cute = cute_modules()


def _half(w, j: int):
    """Exact f32 of bf16 number j of a packed pair (j=0: the low half, the lower address)."""
    if j == 0:
        return (w << 16).bitcast(F32)
    return (w & I32(-65536)).bitcast(F32)


def _raw_word_f32(w, j: int, vec: int):
    """Exact fp32 of value j of one raw register: a packed bf16 pair (vec 2) or a bf16."""
    return _half(w, j) if vec == 2 else w.to(F32)


def _opaque(x):
    """The Int32 x, opaque to the compiler: go * f32(kv) is recomputed, not kept in fp32."""
    from cutlass._mlir.dialects import llvm

    return I32(llvm.inline_asm(I32.mlir_type, [x.ir_value()], "mov.b32 $0, $1;", "=r,r",
                               has_side_effects=True))


class Regs(SimpleNamespace):
    """The thread's register arrays by name (None where a form has none)."""


class _R128BwdBase(R128Geometry):
    """What the staged and the register-window backward share (every field compile-time)."""

    def __init__(self, d: int, coff: int, sched: BwdSchedule, deterministic: bool = False):
        problems = config_problems(coff, d, sched)
        if problems:
            raise ValueError(f"r128 backward c{coff}d{d} {sched}: " + "; ".join(problems))
        super().__init__(d, coff, sched)
        self.regwin = sched.regwin
        self.keepdp = sched.keepdp
        self.vsm = sched.vsm
        self.apesm = sched.ape is not ApeCopy.GLOBAL  # the APE copied into shared memory
        self.apeasync = sched.ape is ApeCopy.ASYNC
        self.gopack = sched.go is GradOut.PACKED
        self.gosm = sched.go is GradOut.SHARED
        self.fast = sched.fastexp
        # deterministic: dAPE stored per CTA into partials (kernels/reduce.py sums them);
        # default mode: the kernel and the dAPE zeroing launch as programmatic dependents (PDL)
        self.deterministic = deterministic
        self.pdl_zero = not deterministic
        self.cols_pc = sched.threads_x * sched.vec
        self.nthreads = sched.threads_x * sched.tchunks
        self.smem_bytes = bwd_smem_bytes(coff, sched)
        self.ctas_per_sm = None

    def __repr__(self) -> str:  # names the kernel symbol: r128bwd_c{coff}d{d}_<schedule tag>
        return (f"r128bwd_c{self.coff}d{self.d}_{self.sched.tag}"
                + ("_deterministic" if self.deterministic else ""))

    def _launch_bounds(self) -> dict:
        return {}

    @cute.jit
    def __call__(self, mKV: cute.Tensor, mScore: cute.Tensor, mApe: cute.Tensor,
                 mCu: cute.Tensor, mCuc: cute.Tensor, mGO: cute.Tensor, mDKV: cute.Tensor,
                 mDScore: cute.Tensor, mDApe: cute.Tensor, rows_per_cta: cutlass.Int32,
                 zero_dape: cutlass.Int32, stream: cuda.CUstream):
        # TVM-FFI: row-major, T, B+1, N symbolic; zero_dape != 0: dape zeroed first.
        n_tokens = mKV.shape[0]
        n_rows = mGO.shape[0]
        n_seq = mCu.shape[0] - 1
        gx = (n_rows + rows_per_cta - 1) // rows_per_cta
        if cutlass.const_expr(not self.deterministic):
            if zero_dape != 0:
                launch_zero_f32(mDApe, stream, self.pdl_zero)
        kernel = self.kernel(mKV, mScore, mApe, mCu, mCuc, mGO, mDKV, mDScore, mDApe,
                             n_tokens, n_seq, rows_per_cta, zero_dape)
        block = (self.threads_x, self.tchunks, 1)
        kernel.launch(grid=(gx, self.gy, 1), block=block, stream=stream, use_pdl=self.pdl_zero,
                      **self._launch_bounds())

    @cute.kernel
    def kernel(self, mKV: cute.Tensor, mScore: cute.Tensor, mApe: cute.Tensor,
               mCu: cute.Tensor, mCuc: cute.Tensor, mGO: cute.Tensor, mDKV: cute.Tensor,
               mDScore: cute.Tensor, mDApe: cute.Tensor, n_tokens: cutlass.Int32,
               n_seq: cutlass.Int32, rows_per_cta: cutlass.Int32, zero_dape: cutlass.Int32):
        """Zero prologue, the rows (``_row``), the dAPE epilogue."""
        TCH, COFF = self.tchunks, self.coff
        if cutlass.const_expr(self.pdl_zero):
            # PDL: behind this launch's dAPE zeroing it waits before its atomics, else here.
            if zero_dape == 0:
                cute.arch.griddepcontrol_wait()
        if cutlass.const_expr(self.deterministic):
            # the dAPE reduction that follows may be scheduled now (PDL)
            cute.arch.griddepcontrol_launch_dependents()
        tx, ty, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        gdx, _, _ = cute.arch.grid_dim()
        # The chunk's half (chunks never straddle it), column group and first APE row.
        tid = ty * self.threads_x + tx
        col = by * self.threads_x + tx  # column group: columns [col*VEC, col*VEC + VEC)
        k0 = ty * self.chunk  # first window position of this thread's chunk
        half = ty // (TCH // 2) if COFF == 2 else 0
        wgrp = half * (self.d // self.vec) + col
        g = SimpleNamespace(tx=tx, ty=ty, tid=tid, col=col, k0=k0, half=half, wgrp=wgrp,
                            ape_row0=k0 - half * RATIO, col0=by * self.cols_pc)
        m = SimpleNamespace(kv=mKV, score=mScore, ape=mApe, cu=mCu, cuc=mCuc, go=mGO,
                            dkv=mDKV, dscore=mDScore, dape=mDApe)
        sh = self._shared(cutlass.memory.SmemAllocator())
        r = self._registers(sh, tid)
        nb_valid = mCuc[n_seq]
        tok_end = mCu[n_seq]
        self._prologue(m, sh, g, r, n_seq, bx * rows_per_cta, nb_valid)
        zero = functools.partial(self._zero_token, mDKV, mDScore, col=col,
                                 halves=tuple(range(COFF)))
        if bx == 0:  # class (c) by CTA 0, its threads striding the tokens
            zero_short_segments(mCu, mCuc, n_seq, 0, 1, ty, TCH, zero, 0)
        zero_padding_tokens(tok_end + bx * TCH + ty, n_tokens, gdx * TCH, zero, 0)
        self._prologue_wait()

        for rr in cutlass.range(rows_per_cta):
            bb = bx * rows_per_cta + rr
            # bb depends on (bx, rr) only: every thread or none reaches the barriers below.
            if bb < nb_valid:
                self._row(m, sh, g, r, n_seq, nb_valid, rows_per_cta, rr, bb, zero)
        self._dape_epilogue(m, g, r.dape)

    @cute.jit
    def _row(self, m, sh, g, r, n_seq, nb_valid, rows_per_cta, rr, bb, zero):
        """One row bb (the rr-th of the CTA): the four passes and the last block's zeros."""
        TCH, COFF = self.tchunks, self.coff
        seg, blk, seg_end = self._row_segment(m, r, n_seq, bb)
        tok0 = m.cu[seg] + blk * RATIO
        tok_row0 = tok0 + g.k0 - (COFF - 1) * RATIO  # token of window position k0
        # coff=2: the previous half of a segment's first block is invalid (coff=1: always valid)
        chunk_ok = (blk + g.half) > 0 if COFF == 2 else True

        self._pass_max(m, sh, g, r, tok_row0, chunk_ok, rr & 1)
        cute.arch.sync_threads()
        self._after_max(m, sh, g, r, n_seq, nb_valid, rows_per_cta, rr, bb)
        self._pass_partials(m, sh, g, r, bb, chunk_ok)
        cute.arch.sync_threads()
        self._merge(sh, g)
        cute.arch.sync_threads()
        self._gradients(m, sh, g, r, bb, tok_row0, chunk_ok)
        if bb + 1 == m.cuc[seg + 1]:  # the segment's last block
            first = self._last_block_tok0(g, tok0, tok_row0)
            if cutlass.const_expr(COFF == 2):
                # class (b): the last block's own tokens are nobody's previous half.
                for t in cutlass.range(first + g.ty, first + RATIO, TCH):
                    self._zero_token(m.dkv, m.dscore, t, g.col, (0,))
            # class (a): the segment's tail tokens.
            for t in cutlass.range(first + RATIO + g.ty, self._segment_end(m, seg, seg_end),
                                   TCH):
                zero(t)
        self._row_end()

    def _last_block_tok0(self, g, tok0, tok_row0):
        """The first token of a segment's last block (staged: held from the row's start)."""
        return tok0

    def _segment_end(self, m, seg, seg_end):
        """cu[seg + 1] (staged: held from the row's start)."""
        return seg_end

    def _shared(self, smem):
        """Shared arrays ((k, c) at k*COLS + c): chunk partials, per-column 1/den and S."""
        COLS = self.cols_pc
        part_layout = cute.make_layout((self.tchunks, COLS), stride=(COLS, 1))
        col_layout = cute.make_layout((COLS,), stride=(1,))
        sh = SimpleNamespace()
        self._shared_window(smem, sh)
        sh.max = smem.allocate_tensor(F32, part_layout, byte_alignment=16)
        sh.den_p = smem.allocate_tensor(F32, part_layout, byte_alignment=16)
        sh.s_p = smem.allocate_tensor(F32, part_layout, byte_alignment=16)
        sh.den = smem.allocate_tensor(F32, col_layout, byte_alignment=16)
        sh.s = smem.allocate_tensor(F32, col_layout, byte_alignment=16)
        self._shared_extra(smem, sh)
        return sh

    def _shared_window(self, smem, sh) -> None:
        """The arrays allocated before the partials (staged: the window tiles)."""

    def _shared_extra(self, smem, sh) -> None:
        """The arrays allocated after the per-column results (regwin: its private arrays)."""

    def _registers(self, sh, tid) -> Regs:
        """The per-column arrays of both forms around the form's own (``_window_registers``)."""
        VEC = self.vec
        r = self._window_registers()
        r.m = cute.make_rmem_tensor((VEC,), F32)  # chunk max, then the row max
        r.den = cute.make_rmem_tensor((VEC,), F32)
        r.sp = cute.make_rmem_tensor((VEC,), F32)
        r.go = cute.make_rmem_tensor((VEC,), F32)
        r.k = cute.make_rmem_tensor((1, VEC), F32)
        r.s = cute.make_rmem_tensor((1, VEC), F32)
        self._zero_dape_sums(sh, r, tid)
        return r

    def _zero_dape_sums(self, sh, r, tid) -> None:
        """regwin: the shared-memory dAPE sums start at zero (staged: zeroed as allocated)."""

    def _zero_token(self, mDKV, mDScore, token, col, halves):
        """Exact zeros into dKV and dScore at one token, this thread's columns of `halves`."""
        zeros = cute.full((1, self.vec), 0.0, BF16)
        for h in halves:
            grp = h * (self.d // self.vec) + col
            cute.local_tile(mDKV, (1, self.vec), (token, grp)).store(zeros)
            cute.local_tile(mDScore, (1, self.vec), (token, grp)).store(zeros)

    @cute.jit
    def _prologue(self, m, sh, g, r, n_seq, row0, nb_valid):
        """Before the zero classes (regwin: the first fetch, the APE copy)."""

    def _prologue_wait(self) -> None:
        """After the zero classes (regwin: the APE copy awaited)."""

    @cute.jit
    def _after_max(self, m, sh, g, r, n_seq, nb_valid, rows_per_cta, rr, bb):
        """After the max barrier (regwin: the next row's fetch)."""

    def _row_end(self) -> None:
        """After the row's stores (staged: a barrier)."""

    def _ape(self, m, sh, g, kk: int):
        """The vec APE values of the thread's window position kk (apesm: its shared copy)."""
        if self.apesm:
            return cute.local_tile(sh.ape, (1, self.vec), (kk * self.nthreads + g.tid, 0)).load()
        return cute.local_tile(m.ape, (1, self.vec), (g.ape_row0 + kk, g.wgrp)).load()

    @cute.jit
    def _pass_max(self, m, sh, g, r, tok_row0, chunk_ok, slot):
        """1. The chunk max of s = f32(score) + ape into sMax[ty] (``_max_window``)."""
        VEC = self.vec
        self._max_window(m, sh, g, r, tok_row0, chunk_ok, slot)
        if cutlass.const_expr(self.vsm):
            cute.local_tile(sh.max, (1, VEC), (g.ty, g.tx)).store(r.m.load())
        else:
            for j in cutlass.range_constexpr(VEC):
                sh.max[g.ty, g.tx * VEC + j] = r.m[j]

    @cute.jit
    def _pass_partials(self, m, sh, g, r, bb, chunk_ok):
        """2. e = exp(s - max) and the chunk partials den' and S' = sum dp*e."""
        VEC = self.vec
        rM, rDen, rSp, rGo = r.m, r.den, r.sp, r.go
        gov = self._row_grad_out(m, g, bb)
        if cutlass.const_expr(self.vsm):  # the same fmax order, vec columns per load
            mx0 = cute.local_tile(sh.max, (1, VEC), (0, g.tx)).load()
            for j in cutlass.range_constexpr(VEC):
                rM[j] = mx0[j]
            for t in cutlass.range_constexpr(1, self.tchunks):
                mxt = cute.local_tile(sh.max, (1, VEC), (t, g.tx)).load()
                for j in cutlass.range_constexpr(VEC):
                    rM[j] = cute.arch.fmax(rM[j], mxt[j])
            for j in cutlass.range_constexpr(VEC):
                rDen[j] = F32(0.0)
                rSp[j] = F32(0.0)
        else:
            for j in cutlass.range_constexpr(VEC):
                if cutlass.const_expr(gov is not None):
                    rGo[j] = gov[j]
                mx = sh.max[0, g.tx * VEC + j]
                for t in cutlass.range_constexpr(1, self.tchunks):
                    mx = cute.arch.fmax(mx, sh.max[t, g.tx * VEC + j])
                rM[j] = mx
                rDen[j] = F32(0.0)
                rSp[j] = F32(0.0)
        self._partials_window(sh, g, r, chunk_ok)
        if cutlass.const_expr(self.vsm):
            cute.local_tile(sh.den_p, (1, VEC), (g.ty, g.tx)).store(rDen.load())
            cute.local_tile(sh.s_p, (1, VEC), (g.ty, g.tx)).store(rSp.load())
        else:
            for j in cutlass.range_constexpr(VEC):
                sh.den_p[g.ty, g.tx * VEC + j] = rDen[j]
                sh.s_p[g.ty, g.tx * VEC + j] = rSp[j]

    def _row_grad_out(self, m, g, bb):
        """The row's grad_out as fp32 values for pass 2 (staged), or None (regwin: fetched)."""
        return None

    @cute.jit
    def _merge(self, sh, g):
        """3. One thread per CTA column, chunks in ascending order: 1/den and S = S'/den."""
        if g.ty < self.vec:
            c = g.ty * self.threads_x + g.tx
            den = F32(0.0)
            sp = F32(0.0)
            for t in cutlass.range_constexpr(self.tchunks):
                den = add_rn(den, sh.den_p[t, c])
                sp = add_rn(sp, sh.s_p[t, c])
            sh.den[c] = F32(1.0) / den
            sh.s[c] = sp / den

    @cute.jit
    def _gradients(self, m, sh, g, r, bb, tok_row0, chunk_ok):
        """4. dKV, dScore of the chunk and its fp32 dScore sums for dAPE (e from pass 2)."""
        VEC = self.vec
        rKv, rDen, rSp, rGo, rK, rS = r.kv, r.den, r.sp, r.go, r.k, r.s
        if cutlass.const_expr(not self.sched.goreuse):
            gov2 = cute.local_tile(m.go, (1, VEC), (bb, g.col)).load().to(F32)
            for j in cutlass.range_constexpr(VEC):
                rGo[j] = gov2[j]
        elif cutlass.const_expr(self.gopack):
            # reconverted from the held grad_out word, opaque so one register lives, not vec
            w = _opaque(r.go_next[1]) if VEC == 2 else r.go_next[1]
            for j in cutlass.range_constexpr(VEC):
                rGo[j] = _raw_word_f32(w, j, VEC)
        if chunk_ok:
            if cutlass.const_expr(self.vsm):
                dv = cute.local_tile(sh.den, (VEC,), (g.tx,)).load()
                sv2 = cute.local_tile(sh.s, (VEC,), (g.tx,)).load()
                for j in cutlass.range_constexpr(VEC):
                    rDen[j] = dv[j]  # now 1/den
                    rSp[j] = sv2[j]  # now S
            else:
                for j in cutlass.range_constexpr(VEC):
                    rDen[j] = sh.den[g.tx * VEC + j]  # now 1/den
                    rSp[j] = sh.s[g.tx * VEC + j]  # now S
            for kk in cutlass.range_constexpr(self.chunk):
                kv = self._kv_word(r, kk)
                for j in cutlass.range_constexpr(VEC):
                    e, u = self._e_u(sh, g, r, kk, j)
                    p = mul_rn(e, rDen[j])
                    if cutlass.const_expr(self.keepdp):
                        dp = rKv[kk, j]
                    else:
                        if cutlass.const_expr(u is None):
                            u = _raw_word_f32(kv, j, VEC)
                        dp = mul_rn(rGo[j], u)
                    ds = fma_rn(p, -rSp[j], mul_rn(dp, p))
                    rK[0, j] = mul_rn(rGo[j], p)
                    rS[0, j] = ds
                    self._dape_add(g, r.dape, kk * VEC + j, ds)
                cute.local_tile(m.dkv, (1, VEC), (tok_row0 + kk, g.wgrp)).store(
                    rK.load().to(BF16))
                cute.local_tile(m.dscore, (1, VEC), (tok_row0 + kk, g.wgrp)).store(
                    rS.load().to(BF16))

    def _dape_slot(self, g, i):
        """The coordinate of slot i = kk*VEC + j of the thread's dAPE sums (see _shared)."""
        return i

    def _dape_barrier(self) -> None:
        """Before the dAPE epilogue (staged: none, the sums are in registers)."""

    def _partials_rolled(self) -> bool:
        """Whether the deterministic epilogue stores window positions in a rolled loop."""
        return False

    def _dape_add(self, g, rDApe, i, ds):
        """Sum one fp32 dScore into the thread's dAPE slot i."""
        rDApe[self._dape_slot(g, i)] = add_rn(rDApe[self._dape_slot(g, i)], ds)

    @cute.jit
    def _dape_epilogue(self, m, g, rDApe):
        """One fp32 atomic per (window position, column), or a store into CTA bx's partials
        slice; regwin: the barrier keeps the sums out of registers."""
        self._dape_barrier()
        if cutlass.const_expr(self.deterministic):
            bx, _, _ = cute.arch.block_idx()
            if cutlass.const_expr(self._partials_rolled()):
                for kk in cutlass.range(self.chunk, unroll=1):
                    self._store_partials(m, g, rDApe, bx, kk)
            else:
                for kk in cutlass.range_constexpr(self.chunk):
                    self._store_partials(m, g, rDApe, bx, kk)
        else:
            if cutlass.const_expr(self.pdl_zero):
                # behind the zeroing kernel its zeros land first (no-op if already waited)
                cute.arch.griddepcontrol_wait()
            for kk in cutlass.range_constexpr(self.chunk):
                for j in cutlass.range_constexpr(self.vec):
                    coord = (g.ape_row0 + kk, g.wgrp * self.vec + j)
                    red_add_f32(m.dape, coord, rDApe, self._dape_slot(g, kk * self.vec + j))

    @cute.jit
    def _store_partials(self, m, g, rDApe, bx, kk):
        """Deterministic: window position kk's vec dAPE sums into CTA bx's partials slice."""
        for j in cutlass.range_constexpr(self.vec):
            store_partial_f32(m.dape, bx, (g.ape_row0 + kk, g.wgrp * self.vec + j), rDApe,
                              self._dape_slot(g, kk * self.vec + j))


class R128BwdStaged(_R128BwdBase):
    """The staged backward: the window in shared memory, dAPE sums in registers; 4 barriers."""

    def _shared_window(self, smem, sh) -> None:
        win_layout = cute.make_layout((self.win, self.cols_pc), stride=(self.cols_pc, 1))
        sh.e = smem.allocate_tensor(F32, win_layout, byte_alignment=16)
        sh.kv = smem.allocate_tensor(BF16, win_layout, byte_alignment=16)

    def _window_registers(self) -> Regs:
        dape = cute.make_rmem_tensor((self.chunk * self.vec,), F32)  # (kk, j) at kk*VEC + j
        dape.fill(0.0)
        return Regs(dape=dape, sc=None, kv=None, sc_next=None, kv_next=None, go_next=None,
                    seg_next=None)

    @cute.jit
    def _row_segment(self, m, r, n_seq, bb):
        seg = segment_scan(m.cuc, bb, 0, n_seq, 1, 0)
        blk = bb - m.cuc[seg]
        seg_end = m.cu[seg + 1]
        return seg, blk, seg_end

    @cute.jit
    def _max_window(self, m, sh, g, r, tok_row0, chunk_ok, slot):
        """s and kv staged (-inf and 0 for an invalid chunk), the chunk max."""
        VEC = self.vec
        for j in cutlass.range_constexpr(VEC):
            r.m[j] = F32(-F32.inf)
        if chunk_ok:
            self._stage(m, sh, g, tok_row0, r.m)
        else:
            for kk in cutlass.range(self.chunk, unroll=4):
                for j in cutlass.range_constexpr(VEC):
                    sh.e[g.k0 + kk, g.tx * VEC + j] = F32(-F32.inf)
                    sh.kv[g.k0 + kk, g.tx * VEC + j] = BF16(0.0)

    @cute.jit
    def _stage(self, m, sh, g, tok_row0, rM):
        """s = f32(score) + ape and kv of the chunk into shared memory, the max."""
        VEC = self.vec
        for kk in cutlass.range(self.chunk, unroll=4):
            sc = cute.local_tile(m.score, (1, VEC), (tok_row0 + kk, g.wgrp)).load()
            ap = self._ape(m, sh, g, kk)
            kv = cute.local_tile(m.kv, (1, VEC), (tok_row0 + kk, g.wgrp)).load()
            scf = sc.to(F32)
            for j in cutlass.range_constexpr(VEC):
                sv = scf[j] + ap[j]
                sh.e[g.k0 + kk, g.tx * VEC + j] = sv
                sh.kv[g.k0 + kk, g.tx * VEC + j] = kv[j]
                rM[j] = cute.arch.fmax(rM[j], sv)

    def _row_grad_out(self, m, g, bb):
        return cute.local_tile(m.go, (1, self.vec), (bb, g.col)).load().to(F32)

    @cute.jit
    def _partials_window(self, sh, g, r, chunk_ok):
        """e = exp(s - max) back into sE, the chunk partials."""
        VEC = self.vec
        rM, rDen, rSp, rGo = r.m, r.den, r.sp, r.go
        for kk in cutlass.range(self.chunk, unroll=8):
            for j in cutlass.range_constexpr(VEC):
                e = exp_of(sh.e[g.k0 + kk, g.tx * VEC + j] - rM[j], self.fast)
                sh.e[g.k0 + kk, g.tx * VEC + j] = e
                rDen[j] = add_rn(rDen[j], e)
                dp = mul_rn(rGo[j], sh.kv[g.k0 + kk, g.tx * VEC + j].to(F32))
                rSp[j] = fma_rn(dp, e, rSp[j])

    def _kv_word(self, r, kk):
        return None

    def _e_u(self, sh, g, r, kk, j):
        """e and f32(kv) of window value (kk, j), from the tiles."""
        e = sh.e[g.k0 + kk, g.tx * self.vec + j]
        u = sh.kv[g.k0 + kk, g.tx * self.vec + j].to(F32)
        return e, u

    def _row_end(self) -> None:
        cute.arch.sync_threads()  # the tiles are rewritten by the next row


class R128BwdRegwin(_R128BwdBase):
    """The register-window backward: the next row's chunk fetched into registers during the
    current row, dAPE sums in thread-private shared memory; 3 barriers per row."""

    def __init__(self, d: int, coff: int, sched: BwdSchedule, deterministic: bool = False):
        super().__init__(d, coff, sched, deterministic)
        # .maxntid caps registers at 65536 / REGWIN_THREADS_PER_SM = 128 per thread.
        self.ctas_per_sm = REGWIN_THREADS_PER_SM // self.nthreads

    def _launch_bounds(self) -> dict:
        return {"max_number_threads": (self.threads_x, self.tchunks * self.ctas_per_sm, 1)}

    def _shared_extra(self, smem, sh) -> None:
            # thread-private dAPE sums: slot i of thread tid at (i % 4, tid, i // 4) (16 B moves)
        nt, cv = self.nthreads, self.chunk * self.vec
        sh.dape = smem.allocate_tensor(
            F32, cute.make_layout((4, nt, cv // 4), stride=(1, 4, 4 * nt)), byte_alignment=16)
        if self.gosm:
            # grad_out words double-buffered by row parity
            sh.go = smem.allocate_tensor(
                I32, cute.make_layout((2, nt), stride=(nt, 1)), byte_alignment=16)
        if self.apesm:
            # APE (kk, j) of thread tid at row kk*nt + tid: a warp reads contiguous vectors
            sh.ape = smem.allocate_tensor(
                F32, cute.make_layout((self.chunk * nt, self.vec), stride=(self.vec, 1)),
                byte_alignment=16)

    def _window_registers(self) -> Regs:
        """Raw chunks of the next row as loaded; the current row's s (then e), dp (keepdp)."""
        VEC, C = self.vec, self.chunk
        raw = I32 if VEC == 2 else BF16
        sc = cute.make_rmem_tensor((C, VEC), F32)
        kv = (cute.make_rmem_tensor((C, VEC), F32) if self.keepdp
              else cute.make_rmem_tensor((C,), raw))
        sc_next = cute.make_rmem_tensor((C,), raw)
        kv_next = cute.make_rmem_tensor((C,), raw)
        if self.gosm:
            go_next = None  # grad_out goes to shared memory (sh.go)
        elif self.gopack:
            # grad_out as loaded: [0] the next row's, [1] the current row's (goreuse)
            go_next = cute.make_rmem_tensor((2,), raw)
        else:
            go_next = cute.make_rmem_tensor((VEC,), BF16)
        seg_next = cute.make_rmem_tensor((1,), I32)
        return Regs(dape=None, sc=sc, kv=kv, sc_next=sc_next, kv_next=kv_next,
                    go_next=go_next, seg_next=seg_next)

    # regwin re-derives tok0 and cu[s+1] at a segment's last block (register budget)
    def _last_block_tok0(self, g, tok0, tok_row0):
        return tok_row0 - g.k0 + (self.coff - 1) * RATIO

    def _segment_end(self, m, seg, seg_end):
        return m.cu[seg + 1]

    def _dape_slot(self, g, i):
        return (i % 4, g.tid, i // 4)

    def _dape_barrier(self) -> None:
        cute.arch.sync_threads()  # the sums are in shared memory

    def _partials_rolled(self) -> bool:
        # at the register cap: rolled for coff=1, unrolled for coff=2 (PERF_NOTES section 6.1)
        return self.coff == 1 and self.chunk * self.vec >= 32

    def _zero_dape_sums(self, sh, r, tid) -> None:
        r.dape = sh.dape  # the sums live in shared memory
        for i in range(self.chunk * self.vec):
            r.dape[i % 4, tid, i // 4] = F32(0.0)

    @cute.jit
    def _prologue(self, m, sh, g, r, n_seq, row0, nb_valid):
        """The first row's loads fly during the prologue; the thread's own APE is copied once."""
        if row0 < nb_valid:
            self._fetch(m, sh, g, r, n_seq, row0, 0)
        if cutlass.const_expr(self.apesm):
            for kk in cutlass.range_constexpr(self.chunk):
                if cutlass.const_expr(self.apeasync):  # nothing waits here; before the loop
                    cp_async_to_shared(sh.ape, (kk * self.nthreads + g.tid, 0), m.ape,
                                       (g.ape_row0 + kk, g.wgrp * self.vec), 4 * self.vec)
                else:
                    cute.local_tile(sh.ape, (1, self.vec), (kk * self.nthreads + g.tid, 0)
                                    ).store(cute.local_tile(m.ape, (1, self.vec),
                                                            (g.ape_row0 + kk, g.wgrp)).load())
            if cutlass.const_expr(self.apeasync):
                cute.arch.cp_async_commit_group()

    def _prologue_wait(self) -> None:
        if self.apeasync:
            cute.arch.cp_async_wait_group(0)  # the APE copy (and go=shared: the first row's)

    @cute.jit
    def _row_segment(self, m, r, n_seq, bb):
        seg = r.seg_next[0]  # fetched with the row
        blk = bb - m.cuc[seg]
        return seg, blk, None

    @cute.jit
    def _after_max(self, m, sh, g, r, n_seq, nb_valid, rows_per_cta, rr, bb):
        # The next row's loads fly during this row (issued after the barrier: not hoisted).
        if rr + 1 < rows_per_cta:
            if bb + 1 < nb_valid:
                self._fetch(m, sh, g, r, n_seq, bb + 1, (rr + 1) & 1)

    @cute.jit
    def _fetch(self, m, sh, g, r, n_seq, bb, slot):
        """Issue row bb's loads (grad_out, C score and C kv vecs), in flight together."""
        VEC = self.vec
        rScN, rKvN, rGoN = r.sc_next, r.kv_next, r.go_next  # written through these names
        seg = segment_scan(m.cuc, bb, 0, n_seq, 1, 0)
        r.seg_next[0] = seg
        blk = bb - m.cuc[seg]
        tok_row0 = m.cu[seg] + blk * RATIO + g.k0 - (self.coff - 1) * RATIO
        if cutlass.const_expr(self.gosm):  # into shared memory slot `slot`, no register
            cp_async_to_shared(sh.go, (slot, g.tid), m.go, (bb, g.col * VEC), 2 * VEC)
            cute.arch.cp_async_commit_group()
        else:
            gov = cute.local_tile(m.go, (1, VEC), (bb, g.col)).load()
            if cutlass.const_expr(self.gopack):
                rGoN[0] = gov.bitcast(I32)[0] if VEC == 2 else gov[0]
            else:
                for j in cutlass.range_constexpr(VEC):
                    rGoN[j] = gov[j]
        chunk_ok = (blk + g.half) > 0 if self.coff == 2 else True
        if chunk_ok:
            for kk in cutlass.range_constexpr(self.chunk):
                sc = cute.local_tile(m.score, (1, VEC), (tok_row0 + kk, g.wgrp)).load()
                kv = cute.local_tile(m.kv, (1, VEC), (tok_row0 + kk, g.wgrp)).load()
                if cutlass.const_expr(VEC == 2):  # one 32-bit register per bf16 pair
                    rScN[kk] = sc.bitcast(I32)[0]
                    rKvN[kk] = kv.bitcast(I32)[0]
                else:
                    rScN[kk] = sc[0]
                    rKvN[kk] = kv[0]

    def _raw_f32(self, raw, kk: int, j: int):
        """Exact fp32 of window value (kk, j) of a raw chunk: packed bf16 pairs or bf16."""
        return _raw_word_f32(raw[kk], j, self.vec)

    @cute.jit
    def _max_window(self, m, sh, g, r, tok_row0, chunk_ok, slot):
        """The fetched row taken over (go=shared: from slot ``slot``): s into r.sc, the max."""
        VEC = self.vec
        rSc, rKv, rScN, rKvN, rGoN, rM, rGo = r.sc, r.kv, r.sc_next, r.kv_next, r.go_next, r.m, r.go
        if cutlass.const_expr(self.gopack and self.sched.goreuse):
            rGoN[1] = rGoN[0]
        if cutlass.const_expr(self.gosm):
            cute.arch.cp_async_wait_group(0)
            wgo = sh.go[slot, g.tid]
        for j in cutlass.range_constexpr(VEC):
            if cutlass.const_expr(self.gosm):
                rGo[j] = _half(wgo, j)
            elif cutlass.const_expr(self.gopack):
                rGo[j] = _raw_word_f32(rGoN[0], j, VEC)
            else:
                rGo[j] = rGoN[j].to(F32)
            rM[j] = F32(-F32.inf)
        if chunk_ok:
            for kk in cutlass.range_constexpr(self.chunk):
                if cutlass.const_expr(not self.keepdp):
                    rKv[kk] = rKvN[kk]
                ap = self._ape(m, sh, g, kk)
                for j in cutlass.range_constexpr(VEC):
                    if cutlass.const_expr(self.keepdp):  # rKv holds dp = go * kv
                        rKv[kk, j] = mul_rn(rGo[j], self._raw_f32(rKvN, kk, j))
                    sv = self._raw_f32(rScN, kk, j) + ap[j]
                    rSc[kk, j] = sv
                    rM[j] = cute.arch.fmax(rM[j], sv)

    @cute.jit
    def _partials_window(self, sh, g, r, chunk_ok):
        """e = exp(s - max) over s in r.sc (kept there for the gradients), the partials."""
        VEC = self.vec
        rSc, rKv, rM, rDen, rSp, rGo = r.sc, r.kv, r.m, r.den, r.sp, r.go
        if chunk_ok:
            for kk in cutlass.range_constexpr(self.chunk):
                for j in cutlass.range_constexpr(VEC):
                    e = exp_of(rSc[kk, j] - rM[j], self.fast)
                    rSc[kk, j] = e
                    rDen[j] = add_rn(rDen[j], e)
                    if cutlass.const_expr(self.keepdp):
                        dp = rKv[kk, j]
                    else:
                        dp = mul_rn(rGo[j], self._raw_f32(rKv, kk, j))
                    rSp[j] = fma_rn(dp, e, rSp[j])
        else:
            # what the staged kernel's skipped steps leave: den' = +0, S' = fma(go * 0, 0, +0)
            for j in cutlass.range_constexpr(VEC):
                rSp[j] = fma_rn(mul_rn(rGo[j], F32(0.0)), F32(0.0), F32(0.0))

    def _kv_word(self, r, kk):
        """The raw kv word of position kk for dp (opaque: converted again, not kept)."""
        if self.keepdp:
            return None
        return _opaque(r.kv[kk]) if self.vec == 2 else r.kv[kk]

    def _e_u(self, sh, g, r, kk, j):
        """e kept from pass 2; f32(kv) is converted from the raw word after p."""
        return r.sc[kk, j], None


def bwd_kernel(d: int, coff: int, sched: BwdSchedule, deterministic: bool = False
               ) -> _R128BwdBase:
    """The backward kernel object of (d, coff, sched): staged or register-window;
    ``deterministic``: dAPE stored per CTA into partials instead of atomics."""
    return (R128BwdRegwin if sched.regwin else R128BwdStaged)(d, coff, sched, deterministic)


def fake_args(d: int, coff: int):
    """The compile-time arguments: T, B+1 and N symbolic, so one build serves every size."""
    W = coff * d
    T, B1, N = sym(), sym(), sym()
    return (fake_rows(BF16, T, W), fake_rows(BF16, T, W), fake_rows(F32, RATIO, W),
            fake_vec(I32, B1), fake_vec(I32, B1), fake_rows(BF16, N, d),
            fake_rows(BF16, T, W), fake_rows(BF16, T, W), fake_rows(F32, RATIO, W),
            I32(1), I32(0), env_stream())


def build_bwd(*, d: int, coff: int, sched: BwdSchedule, arch: str, deterministic: bool = False):
    """Compile the r128 backward for (d, coff, sched) and arch (``deterministic``: the
    partials form); no GPU needed."""
    return compile_for(arch, bwd_kernel(d, coff, sched, deterministic), *fake_args(d, coff))


def launch_bwd(fn, *, sched: BwdSchedule, kv, score, ape, cu, cuc, grad_out, dkv, dscore,
               dape, rows_per_cta: int | None = None, zero_dape: bool = False) -> None:
    """Launch a compiled r128 backward on torch's current stream, unvalidated (kernels/api.py
    validates); ``zero_dape``: dape is zeroed inside the launch first, else accumulated into."""
    n_rows = grad_out.shape[0]
    if n_rows == 0:
        return
    if rows_per_cta is None:
        d = grad_out.shape[1]
        rows_per_cta = _rows_per_cta(n_rows, d, kv.shape[1] // d, sched,
                                     sm_count(kv.get_device()))
    if rows_per_cta < 1:
        raise ValueError(f"rows_per_cta must be >= 1, got {rows_per_cta}")
    fn(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, int(rows_per_cta), int(zero_dape))
