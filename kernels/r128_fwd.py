"""Dedicated ratio=128 forward of the CSA compressor (CuTe DSL), streaming the window.

One CTA per output row and column slice; a thread keeps ``(m, den, acc)`` per column in fp32
registers over its window chunk, and the ``ty == 0`` thread merges the chunk partials in chunk
order: ``out = bf16_rn(acc / den)``, bitwise run-to-run deterministic. Grid, window and
numerics: docs/KERNELS.md section 1. A bf16 ``-inf`` score at a chunk's first slot gives NaN
where eager gives weight 0 (inputs are finite).
"""

from __future__ import annotations

from csagate.kernels._dsl import compile_for, cute_modules, env_stream, fake_rows, fake_vec, sym
from csagate.kernels.device import (
    F32,
    I32,
    add_rn,
    exp_exact,
    exp_of,
    fma_rn,
    mul_rn,
    segment_scan,
)
from csagate.kernels.schedule import (
    RATIO,
    FwdForm,
    FwdSchedule,
    R128Geometry,
    config_problems,
)

cutlass, cute = cute_modules()
import cuda.bindings.driver as cuda  # noqa: E402  (after the DSL environment is prepared)


class R128FwdKernel(R128Geometry):
    """The forward for one (d, coff, schedule); every field is compile-time."""

    def __init__(self, d: int, coff: int, sched: FwdSchedule):
        problems = config_problems(coff, d, sched)
        if problems:
            raise ValueError(f"r128 forward c{coff}d{d} {sched.tag}: " + "; ".join(problems))
        super().__init__(d, coff, sched)
        self.twophase = sched.form is FwdForm.TWOPHASE
        self.oneexp = sched.form is FwdForm.ONEEXP
        self.fastexp = sched.fastexp
        self.unroll = min(sched.unroll, self.chunk)  # slots per unrolled group (divides C)
        self.prefetch = sched.prefetch

    @cute.jit
    def __call__(self, mKV: cute.Tensor, mScore: cute.Tensor, mApe: cute.Tensor,
                 mCu: cute.Tensor, mCuc: cute.Tensor, mOut: cute.Tensor, stream: cuda.CUstream):
        # TVM-FFI: (T, W):(W, 1), (128, W), (B+1,), (B+1,), (N, d):(d, 1); T, B+1, N symbolic.
        n_rows = mOut.shape[0]
        n_seq = mCu.shape[0] - 1
        block = (self.threads_x, self.tchunks, 1)
        self.kernel(mKV, mScore, mApe, mCu, mCuc, mOut, n_seq).launch(
            grid=(n_rows, self.gy, 1), block=block, stream=stream)

    @cute.kernel
    def kernel(self, mKV: cute.Tensor, mScore: cute.Tensor, mApe: cute.Tensor,
               mCu: cute.Tensor, mCuc: cute.Tensor, mOut: cute.Tensor, n_seq: I32):
        VEC, TX, TCH, C = self.vec, self.threads_x, self.tchunks, self.chunk
        tx, ty, _ = cute.arch.thread_idx()
        b, by, _ = cute.arch.block_idx()
        col = by * TX + tx

        # Segment of row b: the last s with cuc[s] <= b (empty segments are passed over).
        seg = segment_scan(mCuc, b, 1, n_seq, 0, 1)
        blk = b - mCuc[seg]
        tok0 = mCu[seg] + blk * RATIO
        if b >= mCuc[n_seq]:  # capacity padding row: a first block at token 0
            blk = I32(0)
            tok0 = I32(0)

        # My chunk: slots [k0, k0 + C); slot k reads token tok0 - (coff-1)*128 + k.
        k0 = ty * C
        tok_start = tok0 + k0
        ape_row0 = k0
        cblk = col  # column group in units of VEC within the W-wide row
        live = col < self.ncols
        if cutlass.const_expr(self.coff == 2):
            tok_start = tok0 + k0 - RATIO
            if k0 >= RATIO:  # own block: columns [d, 2d)
                ape_row0 = k0 - RATIO
                cblk = col + self.ncols
            else:  # previous block: columns [0, d), absent for a segment's first block
                live = live & (blk > 0)

        st = cute.make_rmem_tensor((3, VEC), F32)  # (m, den, acc) per column
        for j in cutlass.range_constexpr(VEC):
            st[0, j] = F32(-F32.inf)
            st[1, j] = F32(0.0)
            st[2, j] = F32(0.0)

        if live:
            if cutlass.const_expr(self.prefetch):
                self.chunk_prefetch(mKV, mScore, mApe, st, tok_start, ape_row0, cblk)
            elif cutlass.const_expr(self.twophase):
                self.chunk_twophase(mKV, mScore, mApe, st, tok_start, ape_row0, cblk)
            else:
                self.chunk_online(mKV, mScore, mApe, st, tok_start, ape_row0, cblk)

        # Merge the tchunks partials of each column (ty == 0, chunk order).
        smem = cutlass.memory.SmemAllocator()
        part = cute.make_layout((TCH, TX * VEC), stride=(TX * VEC, 1))
        sM = smem.allocate_tensor(F32, part, byte_alignment=16)
        sD = smem.allocate_tensor(F32, part, byte_alignment=16)
        sA = smem.allocate_tensor(F32, part, byte_alignment=16)
        for j in cutlass.range_constexpr(VEC):
            sM[ty, tx * VEC + j] = st[0, j]
            sD[ty, tx * VEC + j] = st[1, j]
            sA[ty, tx * VEC + j] = st[2, j]
        cute.arch.sync_threads()  # every thread of the CTA reaches this one barrier

        if ty == 0:
            if col < self.ncols:
                self.merge_store(sM, sD, sA, st, mOut, b, tx, col)

    @cute.jit
    def chunk_online(self, mKV: cute.Tensor, mScore: cute.Tensor, mApe: cute.Tensor,
                     st: cute.Tensor, tok_start: I32, ape_row0: I32, cblk: I32):
        for kk in cutlass.range(self.chunk, unroll=self.unroll):
            sv, uv, av = self.slot_f32(mKV, mScore, mApe, tok_start + kk, ape_row0 + kk, cblk,
                                       True)
            self.online_step(st, sv, uv, av)

    @cute.jit
    def chunk_twophase(self, mKV: cute.Tensor, mScore: cute.Tensor, mApe: cute.Tensor,
                       st: cute.Tensor, tok_start: I32, ape_row0: I32, cblk: I32):
        for kk in cutlass.range(self.chunk, unroll=self.unroll):  # pass A: exact chunk max
            sv, _, av = self.slot_f32(mKV, mScore, mApe, tok_start + kk, ape_row0 + kk, cblk,
                                      False)
            self.max_step(st, sv, av)
        for kk in cutlass.range(self.chunk, unroll=self.unroll):  # pass B: ascending sums
            sv, uv, av = self.slot_f32(mKV, mScore, mApe, tok_start + kk, ape_row0 + kk, cblk,
                                       True)
            self.sum_step(st, sv, uv, av)

    def slot_f32(self, mKV, mScore, mApe, tok, ape_row, cblk, with_kv):
        """One window slot's loads as fp32: score, kv (None without kv), APE."""
        VEC = self.vec
        sv = cute.local_tile(mScore, (1, VEC), (tok, cblk)).load().to(F32)
        uv = cute.local_tile(mKV, (1, VEC), (tok, cblk)).load().to(F32) if with_kv else None
        av = cute.local_tile(mApe, (1, VEC), (ape_row, cblk)).load()
        return sv, uv, av

    @cute.jit
    def chunk_prefetch(self, mKV: cute.Tensor, mScore: cute.Tensor, mApe: cute.Tensor,
                       st: cute.Tensor, tok_start: I32, ape_row0: I32, cblk: I32):
        """The online loop software-pipelined: a register ring of ``U = unroll`` slots' raw
        loads, refilled with slot ``k + U``'s before slot ``k``'s math."""
        VEC, U = self.vec, self.unroll
        groups = self.chunk // U
        rS = cute.make_rmem_tensor((U, VEC), cutlass.BFloat16)
        rU = cute.make_rmem_tensor((U, VEC), cutlass.BFloat16)
        rA = cute.make_rmem_tensor((U, VEC), F32)
        for i in cutlass.range_constexpr(U):  # prologue: slots 0 .. U-1
            self.load_slot(mKV, mScore, mApe, rS, rU, rA, i, tok_start + i, ape_row0 + i, cblk)
        if cutlass.const_expr(groups > 1):
            for g in cutlass.range(groups - 1, unroll=1):
                k = (g + 1) * U  # first slot of the next group
                for i in cutlass.range_constexpr(U):
                    sv, uv, av = self.take_slot(rS, rU, rA, i)
                    self.load_slot(mKV, mScore, mApe, rS, rU, rA, i, tok_start + k + i,
                                   ape_row0 + k + i, cblk)
                    self.online_step(st, sv, uv, av)
        for i in cutlass.range_constexpr(U):  # epilogue: the last group, nothing to load
            sv, uv, av = self.take_slot(rS, rU, rA, i)
            self.online_step(st, sv, uv, av)

    def load_slot(self, mKV, mScore, mApe, rS, rU, rA, i, tok, ape_row, cblk):
        """Issue one slot's global loads into ring entry ``i`` (score, kv, APE order)."""
        VEC = self.vec
        cute.local_tile(rS, (1, VEC), (i, 0)).store(
            cute.local_tile(mScore, (1, VEC), (tok, cblk)).load())
        cute.local_tile(rU, (1, VEC), (i, 0)).store(
            cute.local_tile(mKV, (1, VEC), (tok, cblk)).load())
        cute.local_tile(rA, (1, VEC), (i, 0)).store(
            cute.local_tile(mApe, (1, VEC), (ape_row, cblk)).load())

    def take_slot(self, rS, rU, rA, i):
        """Ring entry ``i`` as fp32 register values."""
        VEC = self.vec
        sv = cute.local_tile(rS, (1, VEC), (i, 0)).load().to(F32)
        uv = cute.local_tile(rU, (1, VEC), (i, 0)).load().to(F32)
        av = cute.local_tile(rA, (1, VEC), (i, 0)).load()
        return sv, uv, av

    @cute.jit
    def online_step(self, st: cute.Tensor, sv, uv, av):
        """One slot of the online-rescale form, every column."""
        for j in cutlass.range_constexpr(self.vec):
            s = sv[j] + av[j]
            if cutlass.const_expr(self.oneexp):
                # One exp for the two-exp form's values: exp(-|x|), x = s - m, is the rescale
                # when s > m, else the weight; after a rescale the weight is 1 + (s - s).
                t = self.exp_loop(-cute.math.abs(s - st[0, j]))
                e = t
                if s > st[0, j]:
                    st[1, j] = mul_rn(st[1, j], t)
                    st[2, j] = mul_rn(st[2, j], t)
                    st[0, j] = s
                    e = add_rn(F32(1.0), add_rn(s, -s))
                st[1, j] = add_rn(st[1, j], e)
                st[2, j] = fma_rn(uv[j], e, st[2, j])
            else:
                if s > st[0, j]:  # strict: rescale to the new max (exp(-inf) = 0 at first)
                    scale = self.exp_loop(st[0, j] - s)
                    st[1, j] = mul_rn(st[1, j], scale)
                    st[2, j] = mul_rn(st[2, j], scale)
                    st[0, j] = s
                e = self.exp_loop(s - st[0, j])
                st[1, j] = add_rn(st[1, j], e)
                st[2, j] = fma_rn(uv[j], e, st[2, j])

    @cute.jit
    def max_step(self, st: cute.Tensor, sv, av):
        """One slot of two-phase pass A: the strict running max."""
        for j in cutlass.range_constexpr(self.vec):
            s = sv[j] + av[j]
            if s > st[0, j]:
                st[0, j] = s

    @cute.jit
    def sum_step(self, st: cute.Tensor, sv, uv, av):
        """One slot of two-phase pass B: ascending den/acc sums at the chunk max."""
        for j in cutlass.range_constexpr(self.vec):
            e = self.exp_loop(sv[j] + av[j] - st[0, j])
            st[1, j] = add_rn(st[1, j], e)
            st[2, j] = fma_rn(uv[j], e, st[2, j])

    @cute.jit
    def merge_store(self, sM: cute.Tensor, sD: cute.Tensor, sA: cute.Tensor, st: cute.Tensor,
                    mOut: cute.Tensor, b: I32, tx: I32, col: I32):
        VEC = self.vec
        # Chunk 0 is this thread's own partial, still in st.
        for t in cutlass.range(1, self.tchunks, unroll=1):
            for j in cutlass.range_constexpr(VEC):
                den_t = sD[t, tx * VEC + j]
                # skip only invalid chunks (den == 0): a NaN den is merged, so NaN propagates
                if den_t != F32(0.0):
                    m_t = sM[t, tx * VEC + j]
                    acc_t = sA[t, tx * VEC + j]
                    mn = cute.arch.fmax(st[0, j], m_t)
                    s1 = exp_exact(st[0, j] - mn)
                    s2 = exp_exact(m_t - mn)
                    st[1, j] = fma_rn(st[1, j], s1, mul_rn(den_t, s2))
                    st[2, j] = fma_rn(st[2, j], s1, mul_rn(acc_t, s2))
                    st[0, j] = mn
        res = cute.make_rmem_tensor((1, VEC), F32)
        for j in cutlass.range_constexpr(VEC):
            res[0, j] = st[2, j] / st[1, j]  # IEEE div.rn
        cute.local_tile(mOut, (1, VEC), (b, col)).store(res.load().to(cutlass.BFloat16))

    def exp_loop(self, x):
        return exp_of(x, self.fastexp)


def fake_args(d: int, coff: int):
    """The compile-time arguments: T, B+1 and N symbolic, so one build serves every size."""
    BF16 = cutlass.BFloat16
    W = coff * d
    T, B1, N = sym(), sym(), sym()
    return (fake_rows(BF16, T, W), fake_rows(BF16, T, W), fake_rows(F32, RATIO, W),
            fake_vec(I32, B1), fake_vec(I32, B1), fake_rows(BF16, N, d), env_stream())


def build_fwd(*, d: int, coff: int, sched: FwdSchedule, arch: str):
    """Compile the r128 forward for (d, coff, sched) on ``arch`` (no GPU needed)."""
    return compile_for(arch, R128FwdKernel(d, coff, sched), *fake_args(d, coff))


def launch_fwd(fn, *, sched: FwdSchedule, kv, score, ape, cu, cuc, out) -> None:
    """Run a compiled forward on torch's current stream, unvalidated (kernels/api.py does it)."""
    if out.shape[0]:
        fn(kv, score, ape, cu, cuc, out)
