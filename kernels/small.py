"""The small-ratio kernels of the CSA compressor (forward and backward, CuTe DSL): every
power-of-two ratio in ``registry.SMALL_RATIOS``, the ratio compile-time, the whole
window of a row in registers. out, dKV and dScore are bitwise equal to the fp32 reference:
each value follows the reference's order and rounding, every step pinned (``mul.rn`` /
``add.rn`` / ``fma.rn``). Semantics: docs/CONTRACT.md sections 1-2; design and numerics:
docs/KERNELS.md section 4. At ratio 4 these are the production ratio=4 kernels.
"""

from __future__ import annotations

import functools

import cuda.bindings.driver as cuda
from csagate.kernels._dsl import compile_for, cute_modules, env_stream, fake_rows, fake_vec, sym
from csagate.kernels.device import (
    BF16,
    DIV_FAST_MIN,
    F32,
    I32,
    NEG_INF,
    add_rn,
    cp_async_to_shared,
    div_by,
    div_seed,
    fma_rn,
    launch_zero_f32,
    mul_rn,
    red_add_f32_vec,
    segment_bits,
    segment_search,
    store_partial_f32,
    zero_padding_tokens,
    zero_short_segments,
)
from csagate.kernels.small_schedule import (
    SmallSchedule,
    bwd_rows_per_cta,
    bwd_schedule_problems,
    bwd_stage_shapes,
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


@cute.jit
def _exp_den(rS: cute.Tensor, e: cutlass.Constexpr, win: cutlass.Constexpr,
             least: cutlass.Constexpr):
    """Column e of a window: s_k -> e_k = exp(s_k - mx) in place, mx the strict serial max
    from s_0; returns (den, lo): den the serial ascending sum of the e_k, lo (``least``) the
    least e_k, NaN if any is (then den is NaN too), else 1."""
    mx = rS[0, e]
    for k in cutlass.range_constexpr(1, win):
        if rS[k, e] > mx:
            mx = rS[k, e]
    den = F32(0.0)
    lo = F32(1.0)
    for k in cutlass.range_constexpr(win):
        ek = cute.math.exp(rS[k, e] - mx)  # invalid: exp(-inf) = +0
        rS[k, e] = ek
        den = add_rn(den, ek)
        if cutlass.const_expr(least):
            lo = cute.arch.fmin(lo, ek, nan=True)
    return den, lo


@cute.jit
def _probabilities(rS: cute.Tensor, e: cutlass.Constexpr, win: cutlass.Constexpr):
    """Column e of a window: s_k -> p_k = e_k / den in place (``_exp_den``), each p_k bitwise
    the IEEE division: where every e_k >= DIV_FAST_MIN (no NaN) the quotients share one
    reciprocal (``div_seed`` / ``div_by``), else one ``div.rn.f32`` each."""
    den, lo = _exp_den(rS, e, win, True)
    if lo >= F32(DIV_FAST_MIN):
        r = div_seed(den)
        for k in cutlass.range_constexpr(win):
            rS[k, e] = div_by(rS[k, e], den, r)
    else:
        for k in cutlass.range_constexpr(win):
            rS[k, e] = rS[k, e] / den


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
        self.seeded = not sched.ieee_div
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
        seg, first_block, first_token = segment_search(mCu, mCuc, row, n_seq, seg_bits)
        blk = I32(0)  # block index in the segment; capacity padding rows: a first block
        tok0 = I32(0)  # at token 0
        if seg < n_seq:
            blk = row - first_block
            tok0 = first_token + blk * RATIO
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
            if cutlass.const_expr(self.seeded):
                _probabilities(rS, e, WIN)
                acc = F32(0.0)
                for k in cutlass.range_constexpr(WIN):
                    acc = add_rn(acc, mul_rn(rU[k, e], rS[k, e]))
            else:  # ieee_div: the form before the shared reciprocal, operation for operation
                den, _ = _exp_den(rS, e, WIN, False)
                acc = F32(0.0)
                for k in cutlass.range_constexpr(WIN):
                    acc = add_rn(acc, mul_rn(rU[k, e], rS[k, e] / den))
            rOut[0, e] = acc
        cute.local_tile(mOut, (1, VEC), (row, col)).store(rOut.load().to(BF16))


# --- backward: one CTA per (rows_per_cta rows, threads*vec columns); a thread owns vec
# adjacent columns; a vector form's CTA runs ``lanes`` rows side by side (block.y); a prefetch
# form loads a lane's next row during this one, a staged form copies its next rows into shared
# memory. The rows per CTA are a launch argument up to the schedule's rows_per_cta
# (``bwd_rows_per_cta``)


def _zero_token(mDKV, mDS, tok, col, groups, coff, vec):
    """Exact zeros into every dKV/dScore slot of token tok owned by column group col."""
    z = cute.make_rmem_tensor((1, vec), BF16)
    z.fill(0.0)
    for h in range(coff):
        cute.local_tile(mDKV, (1, vec), (tok, col + h * groups)).store(z.load())
        cute.local_tile(mDS, (1, vec), (tok, col + h * groups)).store(z.load())


class SmallBwdKernel(SmallGeometry):
    """The backward for one (ratio, d, coff, schedule)."""

    def __init__(self, ratio: int, d: int, coff: int, sched: SmallSchedule,
                 deterministic: bool = False):
        super().__init__(ratio, d, coff)
        problems = bwd_schedule_problems(ratio, coff, d, sched)
        if problems:
            raise ValueError(f"ratio={ratio} c{coff}d{d} {sched.tag}: " + "; ".join(problems))
        self.rows, self.threads, self.lanes = sched.rows_per_cta, sched.threads, sched.lanes
        self.vec, self.groups = sched.vec, d // sched.vec
        self.deterministic = deterministic
        self.ape_regs, self.prefetch, self.stages = sched.ape_regs, sched.prefetch, sched.stages
        self.seeded = not sched.ieee_div
        self.sched = sched

    @cute.jit
    def __call__(self, mKV: cute.Tensor, mS: cute.Tensor, mApe: cute.Tensor, mCu: cute.Tensor,
                 mCuc: cute.Tensor, mGo: cute.Tensor, mDKV: cute.Tensor, mDS: cute.Tensor,
                 mDApe: cute.Tensor, seg_bits: I32, rows_per_cta: I32, zero_dape: I32,
                 stream: cuda.CUstream):
        # zero_dape != 0: dape is zeroed first, else accumulated into (or a partials slice).
        # rows_per_cta: at most the schedule's (1 when that is 1: the loop is compile-time).
        n_tok = mKV.shape[0]
        n_rows = mGo.shape[0]
        n_seq = mCu.shape[0] - 1
        if cutlass.const_expr(not self.deterministic):
            if zero_dape != 0:
                launch_zero_f32(mDApe, stream)
        # The default mode launches as a programmatic dependent (PDL), as the r128 backward.
        gx = n_rows  # rows == 1: one CTA per row, the launch argument unread
        if cutlass.const_expr(self.rows > 1):
            gx = cute.ceil_div(n_rows, rows_per_cta)
        self.kernel((mKV, mS, mApe), (mCu, mCuc), mGo, (mDKV, mDS), mDApe, n_tok, n_rows, n_seq,
                    seg_bits, rows_per_cta, zero_dape).launch(
            grid=(gx, -(-self.groups // self.threads), 1),
            block=(self.threads, self.lanes, 1), stream=stream, use_pdl=not self.deterministic)

    @cute.kernel
    def kernel(self, ins: tuple, cu: tuple, mGo: cute.Tensor, outs: tuple, mDApe: cute.Tensor,
               n_tok: I32, n_rows: I32, n_seq: I32, seg_bits: I32, rows: I32, zero_dape: I32):
        # ins = (kv, score, ape), cu = (cu_seqlens, cu_compressed), outs = (dkv, dscore).
        (_, _, mApe), (mCu, mCuc), (mDKV, mDS) = ins, cu, outs
        COFF, WIN, VEC, LANES = self.coff, self.win, self.vec, self.lanes
        if cutlass.const_expr(not self.deterministic):
            # PDL: behind the launch's dAPE zeroing it waits before its atomics, else here.
            if zero_dape == 0:
                cute.arch.griddepcontrol_wait()
        if cutlass.const_expr(self.deterministic):  # the dAPE reduction may be scheduled (PDL)
            cute.arch.griddepcontrol_launch_dependents()
        tx, ty, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        gdx, _, _ = cute.arch.grid_dim()
        col = by * self.threads + tx  # this thread's column group: [col*VEC, col*VEC+VEC)
        rG = cute.make_rmem_tensor((WIN, VEC), F32)  # dAPE partials over this lane's rows
        smem = cutlass.memory.SmemAllocator()
        if col < self.groups:
            # Zero classes (c) and (d): segments and padding tokens strided over the CTAs.
            zero = functools.partial(_zero_token, mDKV, mDS, col=col, groups=self.groups,
                                     coff=COFF, vec=VEC)
            zero_short_segments(mCu, mCuc, n_seq, bx, gdx, ty, LANES, zero, 1)
            zero_padding_tokens(mCu[n_seq] + bx * LANES + ty, n_tok, gdx * LANES, zero, 1)

            rA = cute.make_rmem_tensor((WIN if self.ape_regs else 1, VEC), F32)  # APE, hoisted
            rS = cute.make_rmem_tensor((WIN, VEC), F32)  # s_k, then e_k, then p_k
            rU = cute.make_rmem_tensor((WIN, VEC), F32)  # u_k, then t_k
            for k in cutlass.range_constexpr(WIN):
                if cutlass.const_expr(self.ape_regs):
                    _, col_off, ape_row = self.window_slot(k)
                    av = cute.local_tile(mApe, (1, VEC), (ape_row, col + col_off // VEC)).load()
                    for e in cutlass.range_constexpr(VEC):
                        rA[k, e] = av[e]
                for e in cutlass.range_constexpr(VEC):
                    rG[k, e] = F32(0.0)

            n_valid = cutlass.min(mCuc[n_seq], n_rows)  # capacity padding rows: ignored
            regs = (rA, rG, rS, rU)
            if cutlass.const_expr(self.rows == 1):
                if bx < n_valid:
                    self.row_grads(ins, cu, mGo, outs, regs, bx, n_seq, seg_bits, col)
            elif cutlass.const_expr(self.stages > 0):
                self.staged_rows(ins, cu, mGo, outs, regs, self.stage_buffers(smem),
                                 (bx * rows, rows, n_valid), (n_seq, seg_bits), ty, col)
            elif cutlass.const_expr(self.prefetch):
                # Software pipelined: a lane's next row is loaded while this one's arithmetic
                # and stores run.
                raw = self.raw_row()
                if bx * rows + ty < n_valid:
                    self.fetch(ins, cu, mGo, raw, bx * rows + ty, n_seq, seg_bits, col)
                for rr in cutlass.range(ty, rows, LANES, unroll=1):
                    row = bx * rows + rr
                    if row < n_valid:
                        self.row_grads_ahead(ins, cu, mGo, outs, regs, raw, row, col,
                                             (n_seq, seg_bits, n_valid, rr + LANES < rows))
            else:
                for rr in cutlass.range(ty, rows, LANES, unroll=1):
                    row = bx * rows + rr
                    if row < n_valid:
                        self.row_grads(ins, cu, mGo, outs, regs, row, n_seq, seg_bits, col)
        if cutlass.const_expr(LANES > 1):
            self.merge_lanes(smem, rG, col, tx, ty)
            if col < self.groups:
                if ty == 0:
                    self.dape_out(mDApe, rG, bx, col)
        else:
            if col < self.groups:
                self.dape_out(mDApe, rG, bx, col)

    @cute.jit
    def merge_lanes(self, smem, rG: cute.Tensor, col: I32, tx: I32, ty: I32):
        """Lane 0's dAPE partials += lane 1's, then lane 2's, ... (a fixed order), through
        shared memory; every thread of the CTA reaches the barrier."""
        WIN, VEC, LANES = self.win, self.vec, self.lanes
        span = self.threads * VEC
        sG = smem.allocate_tensor(F32, cute.make_layout((LANES - 1, WIN, span),
                                                        stride=(WIN * span, span, 1)),
                                  byte_alignment=16)
        if col < self.groups:
            if ty > 0:
                for k in cutlass.range_constexpr(WIN):
                    for e in cutlass.range_constexpr(VEC):
                        sG[ty - 1, k, tx * VEC + e] = rG[k, e]
        cute.arch.sync_threads()
        if col < self.groups:
            if ty == 0:
                for lane in cutlass.range_constexpr(LANES - 1):
                    for k in cutlass.range_constexpr(WIN):
                        for e in cutlass.range_constexpr(VEC):
                            rG[k, e] = add_rn(rG[k, e], sG[lane, k, tx * VEC + e])

    def stage_buffers(self, smem) -> tuple:
        """The staged form's shared buffers (``bwd_stage_shapes``): inputs, grad_out, where."""
        types = (BF16, BF16, I32)
        return tuple(smem.allocate_tensor(  # compact, the last mode contiguous
            t, cute.make_ordered_layout(shape, order=tuple(range(len(shape) - 1, -1, -1))),
            byte_alignment=16)
            for t, (shape, _) in zip(types, bwd_stage_shapes(self.sched, self.win)))

    @cute.jit
    def staged_rows(self, ins: tuple, cu: tuple, mGo: cute.Tensor, outs: tuple, regs: tuple,
                    bufs: tuple, span: tuple, where: tuple, ty: I32, col: I32):
        """Lane ty's rows of the CTA (``span`` = (first row, rows, valid rows)): each row's
        window and grad_out copied by ``cp.async`` into stage i mod stages, ``stages - 1``
        rows ahead of its arithmetic (one commit group per row, empty past the end)."""
        first, rows, n_valid = span
        n_seq, seg_bits = where
        S, LANES = self.stages, self.lanes
        for j in cutlass.range_constexpr(S - 1):
            if ty + j * LANES < rows:
                if first + ty + j * LANES < n_valid:
                    self.fetch_async(ins, cu, mGo, bufs, j, first + ty + j * LANES, n_seq,
                                     seg_bits, col)
            cute.arch.cp_async_commit_group()
        it = I32(0)
        for rr in cutlass.range(ty, rows, LANES, unroll=1):
            ahead = rr + (S - 1) * LANES
            if ahead < rows:
                if first + ahead < n_valid:
                    self.fetch_async(ins, cu, mGo, bufs, (it + S - 1) % S, first + ahead,
                                     n_seq, seg_bits, col)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(S - 1)
            if first + rr < n_valid:
                self.row_grads_staged(ins[2], cu, outs, regs, bufs, it % S, first + rr, col)
            it = it + 1
        cute.arch.cp_async_wait_group(0)

    @cute.jit
    def fetch_async(self, ins: tuple, cu: tuple, mGo: cute.Tensor, bufs: tuple, slot: I32,
                    row: I32, n_seq: I32, seg_bits: I32, col: I32):
        """Copy valid row ``row``'s window and grad_out in column group col into stage
        ``slot`` (``cp.async``, not waited); its (segment, block, first token) stored
        beside."""
        mKV, mS, _ = ins
        sIn, sGo, sAt = bufs
        tx, ty, _ = cute.arch.thread_idx()
        seg, blk, tok0 = self.block_of(cu, row, n_seq, seg_bits)
        sAt[slot, 0, ty, tx] = seg
        sAt[slot, 1, ty, tx] = blk
        sAt[slot, 2, ty, tx] = tok0
        nbytes = 2 * self.vec

        def copy(k, tok, cg):
            cp_async_to_shared(sIn, (slot, 0, k, ty, tx, 0), mS, (tok, cg * self.vec), nbytes)
            cp_async_to_shared(sIn, (slot, 1, k, ty, tx, 0), mKV, (tok, cg * self.vec), nbytes)
        self.slots(blk > 0, tok0, col, copy)
        cp_async_to_shared(sGo, (slot, ty, tx, 0), mGo, (row, col * self.vec), nbytes)

    @cute.jit
    def row_grads_staged(self, mApe: cute.Tensor, cu: tuple, outs: tuple, regs: tuple,
                         bufs: tuple, slot: I32, row: I32, col: I32):
        """One valid row from stage ``slot`` (copied and waited): ``grads``."""
        rA, _, rS, rU = regs
        sIn, sGo, sAt = bufs
        tx, ty, _ = cute.arch.thread_idx()
        seg, blk, tok0 = sAt[slot, 0, ty, tx], sAt[slot, 1, ty, tx], sAt[slot, 2, ty, tx]

        def take(k, tok, cg):
            sv = sIn[slot, 0, k, ty, tx, None].load()
            uv = sIn[slot, 1, k, ty, tx, None].load()
            self.put(mApe, rA, rS, rU, k, cg, lambda e: F32(sv[e]), lambda e: F32(uv[e]))
        self.slots(blk > 0, tok0, col, take, functools.partial(self.absent, rS, rU))
        gv = sGo[slot, ty, tx, None].load().to(F32)
        self.grads(cu, outs, regs, gv, (seg, blk, tok0), row, col)

    def raw_row(self) -> tuple:
        """One row's raw inputs in registers, as ``fetch`` loads them: its window's bf16 score
        and kv (WIN, VEC), its bf16 grad_out (VEC,), and (segment, block, first token)."""
        WIN, VEC = self.win, self.vec
        return (cute.make_rmem_tensor((WIN, VEC), BF16), cute.make_rmem_tensor((WIN, VEC), BF16),
                cute.make_rmem_tensor((VEC,), BF16), cute.make_rmem_tensor((3,), I32))

    @cute.jit
    def block_of(self, cu: tuple, row: I32, n_seq: I32, seg_bits: I32):
        """A valid row's (segment, block index in it, first token of the block)."""
        mCu, mCuc = cu
        seg, first_block, first_token = segment_search(mCu, mCuc, row, n_seq, seg_bits)
        blk = row - first_block
        return seg, blk, first_token + blk * self.ratio

    @cute.jit
    def slots(self, has_prev, tok0: I32, col: I32, put: cutlass.Constexpr,
              absent: cutlass.Constexpr = None):
        """put(k, token, column group) for every window position of a row whose block starts
        at token tok0; a first block's previous half (coff=2, not ``has_prev``): absent(k)."""
        RATIO, WIN, VEC = self.ratio, self.win, self.vec
        if cutlass.const_expr(self.coff == 2):
            if has_prev:
                for k in cutlass.range_constexpr(RATIO):
                    put(k, tok0 - RATIO + k, col)
            elif cutlass.const_expr(absent is not None):
                for k in cutlass.range_constexpr(RATIO):
                    absent(k)
        for k in cutlass.range_constexpr(WIN - RATIO, WIN):
            tok_off, col_off, _ = self.window_slot(k)
            put(k, tok0 + tok_off, col + col_off // VEC)

    def absent(self, rS, rU, k):
        """A position of no token (the previous half of a first block): s = -inf, u = 0."""
        for e in range(self.vec):
            rS[k, e] = F32(NEG_INF)
            rU[k, e] = F32(0.0)

    @cute.jit
    def row_grads(self, ins: tuple, cu: tuple, mGo: cute.Tensor, outs: tuple, regs: tuple,
                  row: I32, n_seq: I32, seg_bits: I32, col: I32):
        """One valid row in column group col: its window and grad_out loaded, then
        ``grads``."""
        mKV, mS, mApe = ins
        rA, _, rS, rU = regs
        seg, blk, tok0 = self.block_of(cu, row, n_seq, seg_bits)
        self.slots(blk > 0, tok0, col, functools.partial(self.load, mKV, mS, mApe, rA, rS, rU),
                   functools.partial(self.absent, rS, rU))
        gv = cute.local_tile(mGo, (1, self.vec), (row, col)).load().to(F32)
        self.grads(cu, outs, regs, gv, (seg, blk, tok0), row, col)

    @cute.jit
    def fetch(self, ins: tuple, cu: tuple, mGo: cute.Tensor, raw: tuple, row: I32, n_seq: I32,
              seg_bits: I32, col: I32):
        """Issue the loads of valid row ``row``'s window and grad_out in column group col into
        ``raw`` (``raw_row``), unconverted."""
        mKV, mS, _ = ins
        rSb, rUb, rGob, rMeta = raw
        seg, blk, tok0 = self.block_of(cu, row, n_seq, seg_bits)
        rMeta[0] = seg
        rMeta[1] = blk
        rMeta[2] = tok0
        self.slots(blk > 0, tok0, col, functools.partial(self.fetch_slot, mKV, mS, rSb, rUb))
        gv = cute.local_tile(mGo, (1, self.vec), (row, col)).load()
        for e in cutlass.range_constexpr(self.vec):
            rGob[e] = gv[e]

    def fetch_slot(self, mKV, mS, rSb, rUb, k, tok, cg):
        """Window position k of column group cg: the bf16 score and kv, unconverted."""
        sv = cute.local_tile(mS, (1, self.vec), (tok, cg)).load()
        uv = cute.local_tile(mKV, (1, self.vec), (tok, cg)).load()
        for e in range(self.vec):
            rSb[k, e] = sv[e]
            rUb[k, e] = uv[e]

    @cute.jit
    def row_grads_ahead(self, ins: tuple, cu: tuple, mGo: cute.Tensor, outs: tuple,
                        regs: tuple, raw: tuple, row: I32, col: I32, ahead: tuple):
        """One valid row from its fetched ``raw``; once taken, the lane's next row (``ahead``
        = (n_seq, seg_bits, n_valid, more)) is fetched into ``raw`` while ``grads`` runs."""
        mApe = ins[2]
        rA, _, rS, rU = regs
        rSb, rUb, rGob, rMeta = raw
        n_seq, seg_bits, n_valid, more = ahead
        seg, blk, tok0 = rMeta[0], rMeta[1], rMeta[2]
        self.slots(blk > 0, tok0, col,
                   functools.partial(self.take, mApe, rA, rSb, rUb, rS, rU),
                   functools.partial(self.absent, rS, rU))
        rGi = cute.make_rmem_tensor((self.vec,), F32)
        for e in cutlass.range_constexpr(self.vec):
            rGi[e] = F32(rGob[e])
        if more:
            if row + self.lanes < n_valid:
                self.fetch(ins, cu, mGo, raw, row + self.lanes, n_seq, seg_bits, col)
        self.grads(cu, outs, regs, rGi, (seg, blk, tok0), row, col)

    @cute.jit
    def grads(self, cu: tuple, outs: tuple, regs: tuple, gv, at: tuple, row: I32, col: I32):
        """dKV/dScore of row ``row``'s window (in regs: s, u) in column group col, gv its fp32
        grad_out, ``at`` = (segment, block, first token); its zero classes (a) and (b); its ds
        into the dAPE partials rG."""
        (mCu, mCuc), (mDKV, mDS) = cu, outs
        _, _, rS, rU = regs
        seg, blk, tok0 = at
        RATIO, WIN, VEC = self.ratio, self.win, self.vec
        rGo = cute.make_rmem_tensor((VEC,), F32)
        rDot = cute.make_rmem_tensor((VEC,), F32)  # S = sum_k t_k, per column
        for e in cutlass.range_constexpr(VEC):
            if cutlass.const_expr(self.seeded):
                _probabilities(rS, e, WIN)
                go = gv[e]
                dot = F32(0.0)
                for k in cutlass.range_constexpr(WIN):
                    tk = mul_rn(mul_rn(go, rU[k, e]), rS[k, e])
                    rU[k, e] = tk
                    dot = add_rn(dot, tk)
            else:  # ieee_div: the form before the shared reciprocal, operation for operation
                den, _ = _exp_den(rS, e, WIN, False)
                go = gv[e]
                dot = F32(0.0)
                for k in cutlass.range_constexpr(WIN):
                    pk = rS[k, e] / den
                    tk = mul_rn(mul_rn(go, rU[k, e]), pk)
                    rS[k, e] = pk
                    rU[k, e] = tk
                    dot = add_rn(dot, tk)
            rGo[e] = go
            rDot[e] = dot

        self.slots(blk > 0, tok0, col,
                   functools.partial(self.store, mDKV, mDS, regs, rGo, rDot))

        if row + 1 == mCuc[seg + 1]:  # the segment's last block
            if cutlass.const_expr(self.coff == 2):
                # Zero class (b): columns [0, d) of the last block's own tokens.
                z = cute.make_rmem_tensor((1, VEC), BF16)
                z.fill(0.0)
                for k in cutlass.range_constexpr(RATIO):
                    cute.local_tile(mDKV, (1, VEC), (tok0 + k, col)).store(z.load())
                    cute.local_tile(mDS, (1, VEC), (tok0 + k, col)).store(z.load())
            # Zero class (a): the tail tokens after the last block, all columns.
            for tok in cutlass.range(tok0 + RATIO, mCu[seg + 1], unroll=1):
                _zero_token(mDKV, mDS, tok, col, self.groups, self.coff, VEC)

    def load(self, mKV, mS, mApe, rA, rS, rU, k, tok, cg):
        """Window position k of column group cg loaded and converted (``put``)."""
        sv = cute.local_tile(mS, (1, self.vec), (tok, cg)).load().to(F32)
        uv = cute.local_tile(mKV, (1, self.vec), (tok, cg)).load().to(F32)
        self.put(mApe, rA, rS, rU, k, cg, lambda e: sv[e], lambda e: uv[e])

    def take(self, mApe, rA, rSb, rUb, rS, rU, k, tok, cg):
        """Window position k of column group cg from its fetched bf16 (``put``; ``tok``
        unused)."""
        self.put(mApe, rA, rS, rU, k, cg, lambda e: F32(rSb[k, e]), lambda e: F32(rUb[k, e]))

    def put(self, mApe, rA, rS, rU, k, cg, score, kv):
        """Window position k of column group cg from its fp32 score and kv (``score(e)``,
        ``kv(e)`` for column e): s = score + ape (hoisted or re-read), u = kv."""
        VEC = self.vec
        if self.ape_regs:
            for e in range(VEC):
                rS[k, e] = add_rn(score(e), rA[k, e])
        else:
            av = cute.local_tile(mApe, (1, VEC), (self.window_slot(k)[2], cg)).load()
            for e in range(VEC):
                rS[k, e] = add_rn(score(e), av[e])
        for e in range(VEC):
            rU[k, e] = kv(e)

    def store(self, mDKV, mDS, regs, rGo, rDot, k, tok, cg):
        """dKV/dScore of window position k into slot (tok, column group cg); the dAPE
        partials += fp32 ds_k."""
        _, rG, rP, rT = regs
        VEC = self.vec
        dkv = cute.make_rmem_tensor((1, VEC), F32)
        dsv = cute.make_rmem_tensor((1, VEC), F32)
        for e in range(VEC):
            pk = rP[k, e]
            ds = fma_rn(pk, -rDot[e], rT[k, e])
            dkv[0, e] = mul_rn(rGo[e], pk)
            dsv[0, e] = ds
            rG[k, e] = rG[k, e] + ds
        cute.local_tile(mDKV, (1, VEC), (tok, cg)).store(dkv.load().to(BF16))
        cute.local_tile(mDS, (1, VEC), (tok, cg)).store(dsv.load().to(BF16))

    @cute.jit
    def dape_out(self, mDApe: cute.Tensor, rG: cute.Tensor, bx: I32, col: I32):
        """One fp32 reduction (vec wide) per (window position, column group) per CTA;
        deterministic: the same values stored into CTA bx's partials slice (every slot written
        once)."""
        VEC = self.vec
        if cutlass.const_expr(not self.deterministic):
            cute.arch.griddepcontrol_wait()  # the zeros land first (else already waited)
        for k in cutlass.range_constexpr(self.win):
            _, col_off, ape_row = self.window_slot(k)
            j0 = col * VEC + col_off
            if cutlass.const_expr(self.deterministic):
                for e in cutlass.range_constexpr(VEC):
                    store_partial_f32(mDApe, bx, (ape_row, j0 + e), rG, (k, e))
            else:
                red_add_f32_vec(mDApe, (ape_row, j0), [rG[k, e] for e in range(VEC)])


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
    """Compile the forward for (ratio, d, coff) on ``arch`` (``sched``: default the arch's
    table form)."""
    kernel = SmallFwdKernel(ratio, d, coff,
                            sched or small_schedule("fwd", d, ratio=ratio, coff=coff, arch=arch))
    return compile_for(arch, kernel, *_fake_io(ratio, d, coff, False), I32(1), env_stream())


def build_bwd(*, d: int, coff: int, arch: str, sched=None, ratio: int = 4,
              deterministic: bool = False):
    """Compile the backward for (ratio, d, coff) on ``arch`` with ``sched`` (default: the
    table's); ``deterministic``: dAPE stored per CTA into partials."""
    sched = sched or small_schedule("bwd", d, ratio=ratio, coff=coff, arch=arch)
    fake = (*_fake_io(ratio, d, coff, True), I32(1), I32(1), I32(0), env_stream())
    return compile_for(arch, SmallBwdKernel(ratio, d, coff, sched, deterministic), *fake)


def launch_fwd(fn, *, kv, score, ape, cu, cuc, out, sched=None) -> None:
    """out[b] for every row b (padding rows included), on torch's current stream."""
    if out.shape[0]:
        fn(kv, score, ape, cu, cuc, out, segment_bits(cu.shape[0] - 1))


def launch_bwd(fn, *, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape,
               rows_per_cta: int | None = None, sched=None, zero_dape: bool = False) -> None:
    """Every dkv/dscore slot written (exact zeros on never-consumed ones); dape += the sums
    (``zero_dape``: zeroed inside the launch first). ``rows_per_cta`` (None: what
    ``bwd_rows_per_cta`` picks for ``sched``) must not exceed the schedule's."""
    if rows_per_cta is None:
        n_rows, d = grad_out.shape
        coff = kv.shape[1] // d
        rows_per_cta = bwd_rows_per_cta(n_rows, d, coff, sched or small_schedule(
            "bwd", d, ratio=ape.shape[0], coff=coff))
    if grad_out.shape[0]:
        fn(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape,
           segment_bits(cu.shape[0] - 1), int(rows_per_cta), int(zero_dape))
