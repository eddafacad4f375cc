"""The small-ratio kernels of the CSA compressor (forward and backward, CuTe DSL): every
power-of-two ratio in ``small_schedule.SMALL_RATIOS``, the ratio compile-time, the whole
window of a row in registers. dKV and dScore are bitwise equal to torch's fp32 eager autograd:
each value follows torch's expression tree and rounding, every step pinned (``mul.rn`` /
``add.rn`` / ``fma.rn``). Semantics: docs/CONTRACT.md sections 1-2; design and numerics:
docs/KERNELS.md section 4. At ratio 4 these are the production ratio=4 kernels.
"""

from __future__ import annotations

import functools

import cuda.bindings.driver as cuda
from csagate.kernels._dsl import compile_for, cute_modules, env_stream, fake_rows, fake_vec, sym
from csagate.kernels.device import (
    BF16,
    F32,
    I32,
    NEG_INF,
    add_rn,
    fma_rn,
    launch_zero_f32,
    mul_rn,
    red_add_f32,
    segment_bits,
    segment_search,
    store_partial_f32,
    zero_padding_tokens,
    zero_short_segments,
)
from csagate.kernels.small_schedule import (
    SmallSchedule,
    bwd_schedule_problems,
    check_config,
    fwd_schedule_problems,
    small_schedule,
)

cutlass, cute = cute_modules()


class SmallGeometry:
    """The static geometry of one small-ratio kernel: every field is compile-time."""

    def __init__(self, ratio: int, d: int, coff: int):
        check_config(ratio, coff, d)
        self.ratio, self.d, self.coff = ratio, d, coff
        self.win = coff * ratio  # WIN: positions of one row's window

    def window_slot(self, k: int):
        """Static placement of window position k: (token offset from tok0, column offset,
        APE row k mod ratio); coff=2: k < ratio is the previous block, columns [0, d)."""
        if self.coff == 1:
            return k, 0, k
        return k - self.ratio, (self.d if k >= self.ratio else 0), k % self.ratio


# --- forward: one CTA per (rows_per_cta rows, threads*vec columns); a thread owns vec columns
# of rows_per_cta rows and loads every one of their windows before their arithmetic --------


def _fwd_load(mKV, mS, mApe, rS, rU, k, tok, ctile, ape_row, vec):
    """Window position k of this thread's vec columns: s = f32(score) + ape, u = f32(kv)."""
    sv = cute.local_tile(mS, (1, vec), (tok, ctile)).load().to(F32)
    uv = cute.local_tile(mKV, (1, vec), (tok, ctile)).load().to(F32)
    av = cute.local_tile(mApe, (1, vec), (ape_row, ctile)).load()
    for e in range(vec):
        rS[k, e] = add_rn(sv[e], av[e])
        rU[k, e] = uv[e]


def _fwd_invalid(rS, rU, k, vec):
    """The previous half of a segment's first block (coff=2): score -inf, kv 0."""
    for e in range(vec):
        rS[k, e] = F32(NEG_INF)
        rU[k, e] = F32(0.0)


def _windows(rows: int, win: int, vec: int) -> list:
    """(s, u) register tensors, (window, vec) fp32 each, for every row a thread holds."""
    return [(cute.make_rmem_tensor((win, vec), F32), cute.make_rmem_tensor((win, vec), F32))
            for _ in range(rows)]


class SmallFwdKernel(SmallGeometry):
    """The forward for one (ratio, d, coff, schedule)."""

    def __init__(self, ratio: int, d: int, coff: int, sched: SmallSchedule | None = None):
        super().__init__(ratio, d, coff)
        sched = sched or small_schedule("fwd", d, ratio=ratio, coff=coff)
        problems = fwd_schedule_problems(ratio, coff, d, sched)
        if problems:
            raise ValueError(f"ratio={ratio} c{coff}d{d} {sched.tag}: " + "; ".join(problems))
        self.vec, self.threads, self.rows = sched.vec, sched.threads, sched.rows_per_cta
        self.gy = -(-(d // self.vec) // self.threads)

    @cute.jit
    def __call__(self, mKV: cute.Tensor, mS: cute.Tensor, mApe: cute.Tensor, mCu: cute.Tensor,
                 mCuc: cute.Tensor, mOut: cute.Tensor, seg_bits: I32, stream: cuda.CUstream):
        n_rows = mOut.shape[0]
        n_seq = mCu.shape[0] - 1
        self.kernel(mKV, mS, mApe, mCu, mCuc, mOut, n_seq, seg_bits).launch(
            grid=(cute.ceil_div(n_rows, self.rows), self.gy, 1), block=(self.threads, 1, 1),
            stream=stream)

    @cute.kernel
    def kernel(self, mKV: cute.Tensor, mS: cute.Tensor, mApe: cute.Tensor, mCu: cute.Tensor,
               mCuc: cute.Tensor, mOut: cute.Tensor, n_seq: I32, seg_bits: I32):
        ROWS = self.rows
        tx, _, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        col = by * self.threads + tx  # this thread's column group: [col*VEC, col*VEC+VEC)
        if col < self.d // self.vec:
            wins = _windows(ROWS, self.win, self.vec)
            ins = (mKV, mS, mApe, mCu, mCuc)
            for r in cutlass.range_constexpr(ROWS):
                if cutlass.const_expr(ROWS == 1):  # the grid holds exactly the rows
                    self.load_row(ins, wins[r], bx, col, n_seq, seg_bits)
                elif bx * ROWS + r < mOut.shape[0]:
                    self.load_row(ins, wins[r], bx * ROWS + r, col, n_seq, seg_bits)
            for r in cutlass.range_constexpr(ROWS):
                if cutlass.const_expr(ROWS == 1):
                    self.softmax_sum(*wins[r], mOut, bx, col)
                elif bx * ROWS + r < mOut.shape[0]:
                    self.softmax_sum(*wins[r], mOut, bx * ROWS + r, col)

    @cute.jit
    def load_row(self, ins: tuple, win: tuple, row: I32, col: I32, n_seq: I32, seg_bits: I32):
        """Row ``row``'s window of column group col into (s, u); a capacity padding row is a
        first block at token 0."""
        mKV, mS, mApe, mCu, mCuc = ins
        rS, rU = win
        RATIO, WIN, VEC = self.ratio, self.win, self.vec
        seg = segment_search(mCuc, row, n_seq, seg_bits)
        blk = I32(0)  # block index in the segment; capacity padding rows: a first block
        tok0 = I32(0)  # at token 0
        if seg < n_seq:
            blk = row - mCuc[seg]
            tok0 = mCu[seg] + blk * RATIO
        if cutlass.const_expr(self.coff == 2):
            if blk > 0:
                for k in cutlass.range_constexpr(RATIO):
                    _fwd_load(mKV, mS, mApe, rS, rU, k, tok0 - RATIO + k, col, k, VEC)
            else:
                for k in cutlass.range_constexpr(RATIO):
                    _fwd_invalid(rS, rU, k, VEC)
        for k in cutlass.range_constexpr(WIN - RATIO, WIN):
            tok_off, col_off, ape_row = self.window_slot(k)
            _fwd_load(mKV, mS, mApe, rS, rU, k, tok0 + tok_off, col + col_off // VEC,
                      ape_row, VEC)

    @cute.jit
    def softmax_sum(self, rS: cute.Tensor, rU: cute.Tensor, mOut: cute.Tensor, row: I32,
                    col: I32):
        """out[row, col-group] = bf16(sum_k u_k * e_k / den), each column serially."""
        WIN, VEC = self.win, self.vec
        rOut = cute.make_rmem_tensor((1, VEC), F32)
        for e in cutlass.range_constexpr(VEC):
            mx = rS[0, e]
            for k in cutlass.range_constexpr(1, WIN):
                if rS[k, e] > mx:
                    mx = rS[k, e]
            den = F32(0.0)
            for k in cutlass.range_constexpr(WIN):
                ek = cute.math.exp(rS[k, e] - mx)  # invalid: exp(-inf) = +0
                rS[k, e] = ek
                den = add_rn(den, ek)
            acc = F32(0.0)
            for k in cutlass.range_constexpr(WIN):
                pk = rS[k, e] / den
                acc = add_rn(acc, mul_rn(rU[k, e], pk))
            rOut[0, e] = acc
        cute.local_tile(mOut, (1, VEC), (row, col)).store(rOut.load().to(BF16))


# --- backward: one CTA per (rows_per_cta rows, threads*vec columns); a thread owns vec
# adjacent columns (vec 1: 2-byte accesses; 2 and 4: 4/8-byte bf16, 8/16-byte APE). Every
# column goes through the same fp32 operations in the same order at every vec and with rows
# in flight, so dKV, dScore and each CTA's dAPE partial are the same bits. --------------------


def _load_f32(m, tok, cg, vec):
    """The vec fp32 values of m[tok, cg*vec : cg*vec+vec] (vec 1: the one element at cg)."""
    if vec == 1:
        return [m[tok, cg].to(F32)]
    v = cute.local_tile(m, (1, vec), (tok, cg)).load().to(F32)
    return [v[e] for e in range(vec)]


def _store_bf16(m, tok, cg, vals, vec):
    """m[tok, cg*vec : cg*vec+vec] = bf16(vals) in one store (vec 1: one element at cg)."""
    if vec == 1:
        m[tok, cg] = vals[0].to(BF16)
    else:
        r = cute.make_rmem_tensor((1, vec), F32)
        for e in range(vec):
            r[0, e] = vals[e]
        cute.local_tile(m, (1, vec), (tok, cg)).store(r.load().to(BF16))


def _store_zero(m, tok, cg, vec):
    """Exact bf16 zeros into m[tok, cg*vec : cg*vec+vec]."""
    if vec == 1:
        m[tok, cg] = BF16(0.0)
    else:
        _store_bf16(m, tok, cg, [F32(0.0)] * vec, vec)


def _zero_token(mDKV, mDS, tok, j, d, coff, vec=1):
    """Exact zeros into every dKV/dScore slot of token tok owned by column group j."""
    for h in range(coff):
        _store_zero(mDKV, tok, j + h * (d // vec), vec)
        _store_zero(mDS, tok, j + h * (d // vec), vec)


def _bwd_store(mDKV, mDS, rP, rT, rG, k, go, dot, tok, c, vec):
    """dKV/dScore of window position k into slots (tok, column group c); dAPE partials += the
    fp32 ds_k of each column."""
    dkv, ds = [], []
    for e in range(vec):
        pk = rP[k, e]
        ds.append(fma_rn(pk, -dot[e], rT[k, e]))
        dkv.append(mul_rn(go[e], pk))
    _store_bf16(mDKV, tok, c, dkv, vec)
    _store_bf16(mDS, tok, c, ds, vec)
    for e in range(vec):
        rG[k, e] = rG[k, e] + ds[e]


class SmallBwdKernel(SmallGeometry):
    """The backward for one (ratio, d, coff, schedule)."""

    def __init__(self, ratio: int, d: int, coff: int, sched: SmallSchedule):
        super().__init__(ratio, d, coff)
        problems = bwd_schedule_problems(ratio, coff, d, sched)
        if problems:
            raise ValueError(f"ratio={ratio} c{coff}d{d} {sched.tag}: " + "; ".join(problems))
        self.vec, self.rows, self.threads = sched.vec, sched.rows_per_cta, sched.threads
        self.in_flight = sched.rows_in_flight
        self.det, self.ape_regs = sched.deterministic, sched.ape_regs
        self.groups = d // self.vec  # column groups of a row: one thread each

    @cute.jit
    def __call__(self, mKV: cute.Tensor, mS: cute.Tensor, mApe: cute.Tensor, mCu: cute.Tensor,
                 mCuc: cute.Tensor, mGo: cute.Tensor, mDKV: cute.Tensor, mDS: cute.Tensor,
                 mDApe: cute.Tensor, seg_bits: I32, zero_dape: I32, stream: cuda.CUstream):
        # zero_dape != 0: dape is zeroed first, else accumulated into (or a partials slice).
        n_tok = mKV.shape[0]
        n_rows = mGo.shape[0]
        n_seq = mCu.shape[0] - 1
        if cutlass.const_expr(not self.det):
            if zero_dape != 0:
                launch_zero_f32(mDApe, stream)
        # The default mode launches as a programmatic dependent (PDL), as the r128 backward.
        self.kernel((mKV, mS, mApe), (mCu, mCuc), mGo, (mDKV, mDS), mDApe, n_tok, n_rows, n_seq,
                    seg_bits, zero_dape).launch(
            grid=(cute.ceil_div(n_rows, self.rows), -(-self.groups // self.threads), 1),
            block=(self.threads, 1, 1), stream=stream, use_pdl=not self.det)

    @cute.kernel
    def kernel(self, ins: tuple, cu: tuple, mGo: cute.Tensor, outs: tuple, mDApe: cute.Tensor,
               n_tok: I32, n_rows: I32, n_seq: I32, seg_bits: I32, zero_dape: I32):
        # ins = (kv, score, ape), cu = (cu_seqlens, cu_compressed), outs = (dkv, dscore).
        (_, _, mApe), (mCu, mCuc), (mDKV, mDS) = ins, cu, outs
        D, COFF, WIN, VEC = self.d, self.coff, self.win, self.vec
        if cutlass.const_expr(not self.det):
            # PDL: behind the launch's dAPE zeroing it waits before its atomics, else here.
            if zero_dape == 0:
                cute.arch.griddepcontrol_wait()
        if cutlass.const_expr(self.det):  # the dAPE reduction may be scheduled (PDL, reduce.py)
            cute.arch.griddepcontrol_launch_dependents()
        tx, _, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        gdx, _, _ = cute.arch.grid_dim()
        j = by * self.threads + tx  # this thread's column group: [j*VEC, j*VEC+VEC)
        if j < self.groups:
            # Zero classes (c) and (d): segments and padding tokens strided over gridDim.x.
            zero = functools.partial(_zero_token, mDKV, mDS, j=j, d=D, coff=COFF, vec=VEC)
            zero_short_segments(mCu, mCuc, n_seq, bx, gdx, 0, 1, zero, 1)
            zero_padding_tokens(mCu[n_seq] + bx, n_tok, gdx, zero, 1)

            rA = cute.make_rmem_tensor((WIN if self.ape_regs else 1, VEC), F32)  # APE, hoisted
            rG = cute.make_rmem_tensor((WIN, VEC), F32)  # dAPE partials over this CTA's rows
            rS = cute.make_rmem_tensor((WIN, VEC), F32)  # s_k, then e_k, then p_k
            rU = cute.make_rmem_tensor((WIN, VEC), F32)  # u_k, then t_k
            for k in cutlass.range_constexpr(WIN):
                if cutlass.const_expr(self.ape_regs):
                    _, col_off, ape_row = self.window_slot(k)
                    av = _load_f32(mApe, ape_row, j + col_off // VEC, VEC)
                    for e in cutlass.range_constexpr(VEC):
                        rA[k, e] = av[e]
                for e in cutlass.range_constexpr(VEC):
                    rG[k, e] = F32(0.0)

            n_valid = cutlass.min(mCuc[n_seq], n_rows)  # capacity padding rows: ignored
            if cutlass.const_expr(self.in_flight == 1):
                for rr in cutlass.range(self.rows, unroll=1):
                    row = bx * self.rows + rr
                    if row < n_valid:
                        seg, tok0, has_prev = self.locate(cu, row, n_seq, seg_bits)
                        self.load_window(ins, rA, (rS, rU), tok0, has_prev, j)
                        self.finish_row(cu, mGo, outs, rG, (rS, rU), row, seg, tok0, has_prev, j)
            else:
                self.row_pairs(ins, cu, mGo, outs, (rA, rG, rS, rU), bx, n_valid, n_seq,
                               seg_bits, j)
            self.dape_out(mDApe, rG, bx, j)

    @cute.jit
    def row_pairs(self, ins: tuple, cu: tuple, mGo: cute.Tensor, outs: tuple, regs: tuple,
                  bx: I32, n_valid: I32, n_seq: I32, seg_bits: I32, j: I32):
        """Two rows in flight: both windows loaded before either row's arithmetic, which then
        runs in row order (rG sums the rows in the same order as one at a time). A row past
        n_valid is located (the search gives n_seq) but neither loaded nor finished."""
        rA, rG, rS, rU = regs
        second = _windows(1, self.win, self.vec)[0]
        for rp in cutlass.range(self.rows // 2, unroll=1):
            row = bx * self.rows + 2 * rp
            seg, tok0, has_prev = self.locate(cu, row, n_seq, seg_bits)
            seg2, tok2, has_prev2 = self.locate(cu, row + 1, n_seq, seg_bits)
            if row < n_valid:
                self.load_window(ins, rA, (rS, rU), tok0, has_prev, j)
            if row + 1 < n_valid:
                self.load_window(ins, rA, second, tok2, has_prev2, j)
            if row < n_valid:
                self.finish_row(cu, mGo, outs, rG, (rS, rU), row, seg, tok0, has_prev, j)
            if row + 1 < n_valid:
                self.finish_row(cu, mGo, outs, rG, second, row + 1, seg2, tok2, has_prev2, j)

    def locate(self, cu: tuple, row, n_seq, seg_bits):
        """(segment, first token, has a previous block) of a valid row."""
        mCu, mCuc = cu
        seg = segment_search(mCuc, row, n_seq, seg_bits)
        blk = row - mCuc[seg]
        return seg, mCu[seg] + blk * self.ratio, blk > 0

    @cute.jit
    def load_window(self, ins: tuple, rA: cute.Tensor, win: tuple, tok0: I32, has_prev, j: I32):
        """A row's window of column group j into (s = score + ape, u = kv); the previous half
        of a segment's first block (coff=2): s = -inf, u = 0."""
        RATIO, WIN, VEC = self.ratio, self.win, self.vec
        rS, rU = win
        if cutlass.const_expr(self.coff == 2):
            if has_prev:
                for k in cutlass.range_constexpr(RATIO):
                    self.load(ins, rA, win, k, tok0 - RATIO + k, j)
            else:
                for k in cutlass.range_constexpr(RATIO):
                    for e in cutlass.range_constexpr(VEC):
                        rS[k, e] = F32(NEG_INF)
                        rU[k, e] = F32(0.0)
        for k in cutlass.range_constexpr(WIN - RATIO, WIN):
            tok_off, col_off, _ = self.window_slot(k)
            self.load(ins, rA, win, k, tok0 + tok_off, j + col_off // VEC)

    @cute.jit
    def finish_row(self, cu: tuple, mGo: cute.Tensor, outs: tuple, rG: cute.Tensor, win: tuple,
                   row: I32, seg: I32, tok0: I32, has_prev, j: I32):
        """From a loaded window: dKV/dScore of the row in column group j, its zero classes
        (a) and (b), and its ds into the dAPE partials rG."""
        (mCu, mCuc), (mDKV, mDS) = cu, outs
        rS, rU = win
        RATIO, WIN, VEC = self.ratio, self.win, self.vec
        go, dot = self.softmax_grads(mGo, rS, rU, row, j)
        if cutlass.const_expr(self.coff == 2):
            if has_prev:
                for k in cutlass.range_constexpr(RATIO):
                    _bwd_store(mDKV, mDS, rS, rU, rG, k, go, dot, tok0 - RATIO + k, j, VEC)
        for k in cutlass.range_constexpr(WIN - RATIO, WIN):
            tok_off, col_off, _ = self.window_slot(k)
            _bwd_store(mDKV, mDS, rS, rU, rG, k, go, dot, tok0 + tok_off, j + col_off // VEC,
                       VEC)

        if row + 1 == mCuc[seg + 1]:  # the segment's last block
            if cutlass.const_expr(self.coff == 2):
                # Zero class (b): columns [0, d) of the last block's own tokens.
                for k in cutlass.range_constexpr(RATIO):
                    _store_zero(mDKV, tok0 + k, j, VEC)
                    _store_zero(mDS, tok0 + k, j, VEC)
            # Zero class (a): the tail tokens after the last block, all columns.
            for tok in cutlass.range(tok0 + RATIO, mCu[seg + 1], unroll=1):
                _zero_token(mDKV, mDS, tok, j, self.d, self.coff, VEC)

    @cute.jit
    def softmax_grads(self, mGo: cute.Tensor, rS: cute.Tensor, rU: cute.Tensor, row: I32,
                      j: I32):
        """Per column: s -> p in rS, u -> t = (go*u)*p in rU; returns go and S = sum_k t_k."""
        WIN, VEC = self.win, self.vec
        den = []
        for e in cutlass.range_constexpr(VEC):
            mx = rS[0, e]
            for k in cutlass.range_constexpr(1, WIN):
                if rS[k, e] > mx:
                    mx = rS[k, e]
            de = F32(0.0)
            for k in cutlass.range_constexpr(WIN):
                ek = cute.math.exp(rS[k, e] - mx)  # invalid: exp(-inf) = +0
                rS[k, e] = ek
                de = add_rn(de, ek)
            den.append(de)
        go = _load_f32(mGo, row, j, VEC)
        dot = []
        for e in cutlass.range_constexpr(VEC):
            de = F32(0.0)  # S = sum_k t_k
            for k in cutlass.range_constexpr(WIN):
                pk = rS[k, e] / den[e]
                tk = mul_rn(mul_rn(go[e], rU[k, e]), pk)
                rS[k, e] = pk
                rU[k, e] = tk
                de = add_rn(de, tk)
            dot.append(de)
        return go, dot

    def load(self, ins, rA, win, k, tok, c):
        """Window position k of column group c: s = f32(score) + ape (hoisted or re-read),
        u = f32(kv)."""
        mKV, mS, mApe = ins
        rS, rU = win
        sv = _load_f32(mS, tok, c, self.vec)
        if self.ape_regs:
            for e in range(self.vec):
                rS[k, e] = add_rn(sv[e], rA[k, e])
        else:  # vec 1 only (bwd_schedule_problems)
            rS[k, 0] = add_rn(sv[0], mApe[self.window_slot(k)[2], c])
        uv = _load_f32(mKV, tok, c, self.vec)
        for e in range(self.vec):
            rU[k, e] = uv[e]

    @cute.jit
    def dape_out(self, mDApe: cute.Tensor, rG: cute.Tensor, bx: I32, j: I32):
        """One fp32 atomic per (window position, column) per CTA; deterministic: the same
        values stored into CTA bx's partials slice (every slot written once)."""
        if cutlass.const_expr(not self.det):
            cute.arch.griddepcontrol_wait()  # the zeros land first (else already waited)
        for k in cutlass.range_constexpr(self.win):
            _, col_off, ape_row = self.window_slot(k)
            for e in cutlass.range_constexpr(self.vec):
                c = j + col_off if self.vec == 1 else (j + col_off // self.vec) * self.vec + e
                if cutlass.const_expr(self.det):
                    store_partial_f32(mDApe, bx, (ape_row, c), rG, (k, e))
                else:
                    red_add_f32(mDApe, (ape_row, c), rG, (k, e))


# --- build and launch (plain Python) ------------------------------------------------------


def _fake_io(ratio: int, d: int, coff: int, grads: bool) -> list:
    """The compile-time tensors: T, B+1 and N symbolic, so one build serves every size."""
    W = coff * d
    T, B1, N = sym(), sym(), sym()
    args = [fake_rows(BF16, T, W), fake_rows(BF16, T, W), fake_rows(F32, ratio, W),
            fake_vec(I32, B1), fake_vec(I32, B1), fake_rows(BF16, N, d)]
    if grads:
        args += [fake_rows(BF16, T, W), fake_rows(BF16, T, W), fake_rows(F32, ratio, W)]
    return args


def build_fwd(*, d: int, coff: int, arch: str, sched=None, ratio: int = 4):
    """Compile the forward for (ratio, d, coff) on ``arch`` (``sched``: the table's default)."""
    kernel = SmallFwdKernel(ratio, d, coff, sched)
    return compile_for(arch, kernel, *_fake_io(ratio, d, coff, False), I32(1), env_stream())


def build_bwd(*, d: int, coff: int, arch: str, sched=None, ratio: int = 4):
    """Compile the backward for (ratio, d, coff) on ``arch`` with ``sched`` (default: the
    table's), which may be deterministic."""
    sched = sched or small_schedule("bwd", d, ratio=ratio, coff=coff)
    fake = (*_fake_io(ratio, d, coff, True), I32(1), I32(0), env_stream())
    return compile_for(arch, SmallBwdKernel(ratio, d, coff, sched), *fake)


def launch_fwd(fn, *, kv, score, ape, cu, cuc, out, sched=None) -> None:
    """out[b] for every row b (padding rows included), on torch's current stream."""
    if out.shape[0]:
        fn(kv, score, ape, cu, cuc, out, segment_bits(cu.shape[0] - 1))


def launch_bwd(fn, *, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape,
               sched=None, zero_dape: bool = False) -> None:
    """Every dkv/dscore slot written (exact zeros on never-consumed ones); dape += the sums
    (``zero_dape``: zeroed inside the launch first)."""
    if grad_out.shape[0]:
        fn(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape,
           segment_bits(cu.shape[0] - 1), int(zero_dape))
