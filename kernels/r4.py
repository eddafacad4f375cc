"""ratio=4 production kernels of the CSA compressor (forward and backward, CuTe DSL).

Semantics and edge rules: docs/CONTRACT.md sections 1-2; designs: docs/KERNELS.md section 4.
The whole window (``RATIO * coff`` positions) of one output row lives in registers, which is
cheap at ratio 4. dKV and dScore are bitwise equal to torch's fp32 eager autograd because
every value is built with torch's expression tree and rounding sequence:

* ``s_k = f32(score) + ape``; ``mx`` = serial max from ``s_0`` (strict ``>``);
  ``e_k = exp(s_k - mx)`` with the accurate exp (bit-identical to ``torch.exp``);
  ``den`` = serial ascending sum from 0; ``p_k = e_k / den`` (IEEE ``div.rn``);
* forward: ``out = bf16(sum_k u_k * p_k)``, a serial ascending sum (not claimed bitwise);
* backward: ``dp_k = go * u_k``; ``t_k = dp_k * p_k``; ``S`` = serial ascending sum of
  ``t_k`` from 0; ``ds_k = fma(p_k, -S, t_k)`` (torch's softmax-backward epilogue);
  ``dKV = bf16(go * p_k)``, ``dScore = bf16(ds_k)``, dAPE accumulates the fp32 ``ds_k``.

Every product and sum that plain fp32 code could contract into an FMA is pinned with
``mul.rn`` / ``add.rn`` / ``fma.rn``. Invalid window positions (the previous half of a
segment's first block, coff=2) hold ``s = -inf, u = 0`` and so give ``e = p = 0``; they own
no dKV/dScore slot, so nothing is stored for them and they add nothing to dAPE.

Kernels take raw global pointers plus runtime Int32 sizes (T tokens, N rows, B segments);
the row width ``W = coff * d`` is compile-time, so vector accesses stay provable. The segment
of a row is found on the device by a binary search over ``cuc`` (no host sync).
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
from csagate.kernels.schedule import (
    R4_BWD_ROWS,
    R4_BWD_THREADS,
    R4_RATIO,
    r4_fwd_grid_y,
    r4_fwd_schedule,
)

cutlass, cute = cute_modules()

# ----------------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------------


def _window_slot(k: int, coff: int, d: int):
    """Static placement of window position k: (token offset from tok0, column offset, APE row).

    coff=1: token tok0+k, columns [0, d). coff=2: k < R4_RATIO is the previous block (token
    tok0-R4_RATIO+k, columns [0, d)), k >= R4_RATIO the own block (token tok0+k-R4_RATIO, columns
    [d, 2d)); both use APE row k mod R4_RATIO and the same column offset as kv/score.
    """
    if coff == 1:
        return k, 0, k
    return k - R4_RATIO, (d if k >= R4_RATIO else 0), k % R4_RATIO


# ----------------------------------------------------------------------------------------
# Forward: one CTA per (row, threads*vec columns); one thread per vec columns
# ----------------------------------------------------------------------------------------


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


@cute.kernel
def _fwd_kernel(mKV: cute.Tensor, mS: cute.Tensor, mApe: cute.Tensor, mCu: cute.Tensor,
                mCuc: cute.Tensor, mOut: cute.Tensor, n_seq: I32, seg_bits: I32,
                D: cutlass.Constexpr, COFF: cutlass.Constexpr, VEC: cutlass.Constexpr,
                THREADS: cutlass.Constexpr):
    WIN = COFF * R4_RATIO
    tx, _, _ = cute.arch.thread_idx()
    row, by, _ = cute.arch.block_idx()
    col = by * THREADS + tx  # this thread's column group: columns [col*VEC, col*VEC+VEC)
    if col < D // VEC:
        seg = segment_search(mCuc, row, n_seq, seg_bits)
        blk = I32(0)  # block index in the segment; capacity padding rows: a first block
        tok0 = I32(0)  # at token 0
        if seg < n_seq:
            blk = row - mCuc[seg]
            tok0 = mCu[seg] + blk * R4_RATIO

        rS = cute.make_rmem_tensor((WIN, VEC), F32)
        rU = cute.make_rmem_tensor((WIN, VEC), F32)
        if cutlass.const_expr(COFF == 2):
            if blk > 0:
                for k in cutlass.range_constexpr(R4_RATIO):
                    _fwd_load(mKV, mS, mApe, rS, rU, k, tok0 - R4_RATIO + k, col, k, VEC)
            else:
                for k in cutlass.range_constexpr(R4_RATIO):
                    _fwd_invalid(rS, rU, k, VEC)
        for k in cutlass.range_constexpr(WIN - R4_RATIO, WIN):
            tok_off, col_off, ape_row = _window_slot(k, COFF, D)
            _fwd_load(mKV, mS, mApe, rS, rU, k, tok0 + tok_off, col + col_off // VEC, ape_row,
                      VEC)

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


@cute.jit
def _fwd_host(mKV: cute.Tensor, mS: cute.Tensor, mApe: cute.Tensor, mCu: cute.Tensor,
              mCuc: cute.Tensor, mOut: cute.Tensor, seg_bits: I32, stream: cuda.CUstream,
              D: cutlass.Constexpr, COFF: cutlass.Constexpr):
    vec, threads = r4_fwd_schedule(D)
    n_rows = mOut.shape[0]
    n_seq = mCu.shape[0] - 1
    _fwd_kernel(mKV, mS, mApe, mCu, mCuc, mOut, n_seq, seg_bits, D, COFF, vec, threads).launch(
        grid=(n_rows, r4_fwd_grid_y(D), 1), block=(threads, 1, 1), stream=stream)


# ----------------------------------------------------------------------------------------
# Backward: one CTA per (R4_BWD_ROWS rows, R4_BWD_THREADS columns); one thread per column
# ----------------------------------------------------------------------------------------


def _zero_token(mDKV, mDS, tok, j, d, coff):
    """Exact zeros into every dKV/dScore slot of token tok owned by column j."""
    for h in range(coff):
        mDKV[tok, j + h * d] = BF16(0.0)
        mDS[tok, j + h * d] = BF16(0.0)


def _bwd_load(mKV, mS, rA, rS, rU, k, tok, c):
    """Window position k of column c: s = f32(score) + ape (hoisted in rA), u = f32(kv)."""
    rS[k] = add_rn(mS[tok, c].to(F32), rA[k])
    rU[k] = mKV[tok, c].to(F32)


def _bwd_store(mDKV, mDS, rP, rT, rG, k, go, dot, tok, c):
    """dKV/dScore of window position k into slot (tok, c); dAPE partial += fp32 ds_k."""
    pk = rP[k]
    ds = fma_rn(pk, -dot, rT[k])
    mDKV[tok, c] = mul_rn(go, pk).to(BF16)
    mDS[tok, c] = ds.to(BF16)
    rG[k] = rG[k] + ds


@cute.kernel
def _bwd_kernel(mKV: cute.Tensor, mS: cute.Tensor, mApe: cute.Tensor, mCu: cute.Tensor,
                mCuc: cute.Tensor, mGo: cute.Tensor, mDKV: cute.Tensor, mDS: cute.Tensor,
                mDApe: cute.Tensor, n_tok: I32, n_rows: I32, n_seq: I32, seg_bits: I32,
                zero_dape: I32, D: cutlass.Constexpr, COFF: cutlass.Constexpr,
                DET: cutlass.Constexpr = False):
    WIN = COFF * R4_RATIO
    if cutlass.const_expr(not DET):
        # A programmatic dependent (PDL) of the kernel before it: behind the launch's dAPE
        # zeroing it runs at once and waits before its atomics; else it waits here, first.
        if zero_dape == 0:
            cute.arch.griddepcontrol_wait()
    if cutlass.const_expr(DET):  # the dAPE reduction may be scheduled now (PDL, reduce.py)
        cute.arch.griddepcontrol_launch_dependents()
    tx, _, _ = cute.arch.thread_idx()
    bx, by, _ = cute.arch.block_idx()
    gdx, _, _ = cute.arch.grid_dim()
    j = by * R4_BWD_THREADS + tx  # this thread's column in [0, d)
    if j < D:
        # Zero classes (c) and (d): segment s belongs to CTA column bx == s mod gridDim.x;
        # token-capacity padding [cu[B], T) is strided over gridDim.x.
        zero = functools.partial(_zero_token, mDKV, mDS, j=j, d=D, coff=COFF)
        zero_short_segments(mCu, mCuc, n_seq, bx, gdx, 0, 1, zero, 1)
        zero_padding_tokens(mCu[n_seq] + bx, n_tok, gdx, zero, 1)

        rA = cute.make_rmem_tensor((WIN,), F32)  # APE of this column, hoisted
        rG = cute.make_rmem_tensor((WIN,), F32)  # dAPE partials over this CTA's rows
        rS = cute.make_rmem_tensor((WIN,), F32)  # s_k, then e_k, then p_k
        rU = cute.make_rmem_tensor((WIN,), F32)  # u_k, then t_k
        for k in cutlass.range_constexpr(WIN):
            _, col_off, ape_row = _window_slot(k, COFF, D)
            rA[k] = mApe[ape_row, j + col_off]
            rG[k] = F32(0.0)

        n_valid = cutlass.min(mCuc[n_seq], n_rows)  # capacity padding rows: ignored
        for rr in cutlass.range(R4_BWD_ROWS, unroll=1):
            row = bx * R4_BWD_ROWS + rr
            if row < n_valid:
                seg = segment_search(mCuc, row, n_seq, seg_bits)
                blk = row - mCuc[seg]
                tok0 = mCu[seg] + blk * R4_RATIO
                has_prev = blk > 0
                if cutlass.const_expr(COFF == 2):
                    if has_prev:
                        for k in cutlass.range_constexpr(R4_RATIO):
                            _bwd_load(mKV, mS, rA, rS, rU, k, tok0 - R4_RATIO + k, j)
                    else:
                        for k in cutlass.range_constexpr(R4_RATIO):
                            rS[k] = F32(NEG_INF)
                            rU[k] = F32(0.0)
                for k in cutlass.range_constexpr(WIN - R4_RATIO, WIN):
                    tok_off, col_off, _ = _window_slot(k, COFF, D)
                    _bwd_load(mKV, mS, rA, rS, rU, k, tok0 + tok_off, j + col_off)

                mx = rS[0]
                for k in cutlass.range_constexpr(1, WIN):
                    if rS[k] > mx:
                        mx = rS[k]
                den = F32(0.0)
                for k in cutlass.range_constexpr(WIN):
                    ek = cute.math.exp(rS[k] - mx)  # invalid: exp(-inf) = +0
                    rS[k] = ek
                    den = add_rn(den, ek)
                go = mGo[row, j].to(F32)
                dot = F32(0.0)  # S = sum_k t_k
                for k in cutlass.range_constexpr(WIN):
                    pk = rS[k] / den
                    tk = mul_rn(mul_rn(go, rU[k]), pk)
                    rS[k] = pk
                    rU[k] = tk
                    dot = add_rn(dot, tk)

                if cutlass.const_expr(COFF == 2):
                    if has_prev:
                        for k in cutlass.range_constexpr(R4_RATIO):
                            _bwd_store(mDKV, mDS, rS, rU, rG, k, go, dot, tok0 - R4_RATIO + k, j)
                for k in cutlass.range_constexpr(WIN - R4_RATIO, WIN):
                    tok_off, col_off, _ = _window_slot(k, COFF, D)
                    _bwd_store(mDKV, mDS, rS, rU, rG, k, go, dot, tok0 + tok_off, j + col_off)

                if row + 1 == mCuc[seg + 1]:  # the segment's last block
                    if cutlass.const_expr(COFF == 2):
                        # Zero class (b): columns [0, d) of the last block's own tokens.
                        for k in cutlass.range_constexpr(R4_RATIO):
                            mDKV[tok0 + k, j] = BF16(0.0)
                            mDS[tok0 + k, j] = BF16(0.0)
                    # Zero class (a): the tail tokens after the last block, all columns.
                    for tok in cutlass.range(tok0 + R4_RATIO, mCu[seg + 1], unroll=1):
                        _zero_token(mDKV, mDS, tok, j, D, COFF)

        # One fp32 atomic per (window position, column) per CTA. DET: the same values STORED
        # into CTA bx's slice of the (gx*R4_RATIO, W) partials buffer mDApe points at; the
        # (by, tx, k) of the CTAs (bx, *) cover every (APE row, column) once, so every slot of
        # slice bx is written once (zeros where no row ran).
        if cutlass.const_expr(not DET):
            cute.arch.griddepcontrol_wait()  # the zeros land first (else already waited)
        for k in cutlass.range_constexpr(WIN):
            _, col_off, ape_row = _window_slot(k, COFF, D)
            if cutlass.const_expr(DET):
                store_partial_f32(mDApe, bx, (ape_row, j + col_off), rG, k)
            else:
                red_add_f32(mDApe, (ape_row, j + col_off), rG, k)


@cute.jit
def _bwd_host(mKV: cute.Tensor, mS: cute.Tensor, mApe: cute.Tensor, mCu: cute.Tensor,
              mCuc: cute.Tensor, mGo: cute.Tensor, mDKV: cute.Tensor, mDS: cute.Tensor,
              mDApe: cute.Tensor, seg_bits: I32, zero_dape: I32, stream: cuda.CUstream,
              D: cutlass.Constexpr, COFF: cutlass.Constexpr,
              DET: cutlass.Constexpr = False):
    # zero_dape != 0: dape is zeroed first (a fresh output); 0: accumulated into. DET's mDApe
    # is a partials slice the kernel stores whole (kernels/reduce.py takes the flag there).
    n_tok = mKV.shape[0]
    n_rows = mGo.shape[0]
    n_seq = mCu.shape[0] - 1
    if cutlass.const_expr(not DET):
        if zero_dape != 0:
            launch_zero_f32(mDApe, stream)
    # The default mode launches as a programmatic dependent (PDL), as the r128 backward.
    _bwd_kernel(mKV, mS, mApe, mCu, mCuc, mGo, mDKV, mDS, mDApe, n_tok, n_rows, n_seq,
                seg_bits, zero_dape, D, COFF, DET).launch(
        grid=(cute.ceil_div(n_rows, R4_BWD_ROWS), -(-D // R4_BWD_THREADS), 1),
        block=(R4_BWD_THREADS, 1, 1), stream=stream, use_pdl=not DET)


# ----------------------------------------------------------------------------------------
# Build and launch (plain Python)
# ----------------------------------------------------------------------------------------


def _check_config(d: int, coff: int) -> None:
    if coff not in (1, 2):
        raise ValueError(f"ratio=4 kernels support coff in (1, 2), got {coff}")
    if d < 1:
        raise ValueError(f"head_dim must be >= 1, got {d}")


def _fake_io(d: int, coff: int, grads: bool) -> list:
    """The compile-time tensors: T, B+1 and N symbolic, so one build serves every size."""
    W = coff * d
    T, B1, N = sym(), sym(), sym()
    args = [fake_rows(BF16, T, W), fake_rows(BF16, T, W), fake_rows(F32, R4_RATIO, W),
            fake_vec(I32, B1), fake_vec(I32, B1), fake_rows(BF16, N, d)]
    if grads:
        args += [fake_rows(BF16, T, W), fake_rows(BF16, T, W), fake_rows(F32, R4_RATIO, W)]
    return args


def build_fwd(*, d: int, coff: int, arch: str, sched=None):
    """Compile the ratio=4 forward for (d, coff) on ``arch`` (no GPU needed); the schedule
    follows from d (``schedule.r4_schedule``), ``sched`` is taken for the uniform signature."""
    _check_config(d, coff)
    return compile_for(arch, _fwd_host, *_fake_io(d, coff, False), I32(1), env_stream(),
                       d, coff)


def build_bwd(*, d: int, coff: int, arch: str, sched=None):
    """Compile the ratio=4 backward for (d, coff) on ``arch`` (no GPU needed); ``sched`` as in
    :func:`build_fwd`."""
    _check_config(d, coff)
    fake = (*_fake_io(d, coff, True), I32(1), I32(0), env_stream())
    if sched is not None and sched.deterministic:  # the dAPE partials path (BwdSchedule)
        return compile_for(arch, _bwd_host, *fake, d, coff, True)
    return compile_for(arch, _bwd_host, *fake, d, coff)


def launch_fwd(fn, *, kv, score, ape, cu, cuc, out, sched=None) -> None:
    """out[b] for every row b < out.shape[0] (capacity padding rows included), on torch's
    current stream."""
    if out.shape[0]:
        fn(kv, score, ape, cu, cuc, out, segment_bits(cu.shape[0] - 1))


def launch_bwd(fn, *, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape,
               sched=None, zero_dape: bool = False) -> None:
    """Every dkv/dscore slot written (exact zeros on never-consumed ones); dape += partials
    (``zero_dape``: dape zeroed inside the launch first, a fresh output)."""
    if grad_out.shape[0]:
        fn(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape,
           segment_bits(cu.shape[0] - 1), int(zero_dape))
