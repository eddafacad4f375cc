"""The reference of the CSA compressor (gated softmax KV pooling), forward and backward.

It is written to be audited in place, and it defines its own numerics: every value the
contract compares bit for bit is built here from elementwise IEEE operations in an order
written below, never from a torch reduction whose order torch picks by shape or device.
One function per direction computes the contract's references; the ``precision`` switch
picks the numerics:

* ``"fp32"``: the contract's comparator (docs/CONTRACT.md section 3). kv and score are upcast
  to fp32 and every step below is one fp32 operation rounded to nearest even.
* ``"fp64"``: the oracle. The same steps in fp64 from the exact fp64 upcasts of kv, score and
  ape; nothing is rounded to fp32 or bf16.
* ``"upstream"``: Megatron-LM's eager numerics, by definition torch's own eager ops
  (softmax weights cast to bf16 before the multiply with the bf16 kv; backward by autograd).
  It is what the fused op replaces; no contract compares it bit for bit.

Layout is THD (packed sequences). For output row ``b`` of segment ``s`` with block index
``i = b - cuc[s]``, the window starts at token ``tok0 = cu[s] + i*ratio``:

* coff=1: window position k in [0, ratio) reads token tok0+k, all d columns, APE row k.
* coff=2: the window is 2*ratio long. Positions [0, ratio) read the PREVIOUS block's tokens
  (tok0-ratio+k) in columns [0, d) with APE[k, :d]; positions [ratio, 2*ratio) read the own
  tokens in columns [d, 2d) with APE[k-ratio, d:]. A segment's first block (i == 0) has no
  previous block: that half is invalid, score -inf and kv 0 (weight exactly 0).

Rows ``cuc[B] <= b < N`` are capacity padding rows (a static CUDA-graph capacity). The
forward computes them as a first block starting at token 0 (what the eager gather does); the
backward excludes them: they are not read at all, so neither their grad_out nor a non-finite
value only they read (0 * inf = NaN) reaches a gradient (docs/CONTRACT.md section 2.3).
Tokens beyond a segment's last full block (tails) and tokens ``[cu[B], T)`` are never read;
``never_consumed_mask`` names those slots, whose gradients are exact zeros.

The numerics (docs/CONTRACT.md section 3.1), per output row and column, over the window
positions k = 0, 1, ..., W-1 in ascending order (W = coff*ratio):

    s_k = fp32(score) + ape            u_k = fp32(kv)       (invalid: s_k = -inf, u_k = 0)
    m   = s_0, then m = s_k wherever s_k > m                (strict: a NaN s_k never wins)
    e_k = exp(s_k - m)                                      (torch.exp on the tensors' device)
    den = (((0 + e_0) + e_1) + ...) + e_{W-1}
    p_k = e_k / den                                         (IEEE division)
    out = bf16( (((0 + u_0*p_0) + u_1*p_1) + ...) )         (each product rounded, then added)

and, with go = fp32(grad_out), for the valid rows and valid positions:

    t_k    = (go * u_k) * p_k
    S      = (((0 + t_0) + t_1) + ...) + t_{W-1}
    ds_k   = fma(p_k, -S, t_k)                              (one rounding: ``_fma``)
    dKV    = bf16(go * p_k)           dScore = bf16(ds_k)   (into the slot position k read)
    dAPE[k mod ratio, column] = the sum over valid rows of ds_k: blocks of 32 consecutive
                                rows summed serially, then the block sums serially

This is the order the small-ratio kernels use and, at the head dims where torch's CUDA
softmax reduces serially along the window, the order of torch's own fp32 eager autograd.
The one device dependence left is ``exp``: torch.exp is CUDA's expf on a GPU and a vectorized
libm exp on the CPU, which differ in the last bit on some inputs (CONTRACT section 3.1 says
how many, measured).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PRECISIONS = ("fp32", "upstream", "fp64")


@dataclass(frozen=True)
class Grads:
    """Forward output and the three gradients of one reference evaluation."""

    out: torch.Tensor     # (N, d): bf16 (fp32, upstream) or fp64 (oracle)
    dkv: torch.Tensor     # (T, coff*d): bf16 or fp64
    dscore: torch.Tensor  # (T, coff*d): bf16 or fp64
    dape: torch.Tensor    # (ratio, coff*d): fp32 or fp64


# --- where each window position reads ---------------------------------------------------------


def _row_geometry(cu: torch.Tensor, cuc: torch.Tensor, n_rows: int, ratio: int):
    """Per output row: first token of its window, whether it opens its segment, whether it
    is a real row (not capacity padding).

    Padding rows (b >= cuc[B]) read tokens [0, ratio) and count as a first block, even when
    that crosses a segment boundary: that is what the eager gather does.
    """
    device = cu.device
    cu = cu.long()
    cuc = cuc.long()
    n_seq = cu.numel() - 1
    rows = torch.arange(n_rows, device=device)
    seg = torch.bucketize(rows, cuc[1:], right=True).clamp(max=n_seq - 1)
    valid = rows < cuc[-1]
    local = torch.where(valid, rows - cuc[seg], torch.zeros_like(rows))
    tok0 = torch.where(valid, cu[seg] + local * ratio, torch.zeros_like(rows))
    return tok0, local == 0, valid


@dataclass(frozen=True)
class _Slots:
    """Where each (window position k, row) reads: position-major, shapes (W, N) and (W,)."""

    token: torch.Tensor   # (W, N) token index (clamped to 0 where invalid)
    valid: torch.Tensor   # (W, N) the position holds a token (not a first block's empty half)
    half: torch.Tensor    # (W,) column half: 0 for [0, d), 1 for [d, 2d)
    ape_row: torch.Tensor  # (W,) APE row k mod ratio

    def rows(self, start: int, end: int) -> _Slots:
        """The slots of output rows [start, end)."""
        return _Slots(self.token[:, start:end], self.valid[:, start:end], self.half,
                      self.ape_row)


def _slots(cu, cuc, n_rows: int, ratio: int, coff: int) -> _Slots:
    tok0, first_block, _ = _row_geometry(cu, cuc, n_rows, ratio)
    k = torch.arange(coff * ratio, device=cu.device)
    shift = (coff - 1) * ratio                    # coff=2: positions [0, ratio) look back
    token = tok0[None, :] + (k - shift)[:, None]
    valid = ~((k < shift)[:, None] & first_block[None, :])
    half = (k >= ratio).long() if coff == 2 else torch.zeros_like(k)
    return _Slots(token.clamp(min=0), valid, half, k % ratio)


def _windows(kv, score, ape, slots: _Slots, coff: int, dtype):
    """(s, u), each (W, N, d) in ``dtype``: s = score + ape and u = kv at every position,
    -inf and 0 at the invalid ones."""
    d = kv.shape[1] // coff
    kv3 = kv.view(kv.shape[0], coff, d)
    sc3 = score.view(score.shape[0], coff, d)
    ape3 = ape.view(ape.shape[0], coff, d).to(dtype)
    half = slots.half[:, None]
    u = kv3[slots.token, half].to(dtype)                          # (W, N, d), exact upcast
    s = sc3[slots.token, half].to(dtype) + ape3[slots.ape_row, slots.half][:, None, :]
    invalid = ~slots.valid[:, :, None]
    s = torch.where(invalid, torch.full((), float("-inf"), dtype=dtype, device=s.device), s)
    u = torch.where(invalid, torch.zeros((), dtype=dtype, device=u.device), u)
    return s, u


# --- the arithmetic, in the documented order ---------------------------------------------------


def _serial_sum(x: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
    """(((start + x_0) + x_1) + ...) over dim 0 (start: 0), one rounded add at a time."""
    acc = start if start is not None else x.new_zeros(x.shape[1:])
    for k in range(x.shape[0]):
        acc = acc + x[k]
    return acc


def _softmax(s: torch.Tensor):
    """(p, den) over dim 0 (the window): strict serial max, exp, serial sum, IEEE division."""
    m = s[0]
    for k in range(1, s.shape[0]):
        m = torch.where(s[k] > m, s[k], m)
    e = torch.exp(s - m)
    den = _serial_sum(e)
    return e / den, den


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a*b + c`` with one rounding, as ``fma.rn``, elementwise.

    fp64: a*b + c (the oracle rounds at fp64 only). fp32: the product of two fp32 values is
    exact in fp64; the fp64 sum is made round-to-odd (its error from TwoSum; an inexact
    even result moves one ulp toward the exact value), and rounding a round-to-odd fp64
    value to fp32 rounds the exact sum correctly (53 >= 24 + 2 bits; Boldo and Melquiond,
    "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to
    odd", 2008). Zeros keep IEEE's signs: (-0) + (-0) = -0, (+0) + (-0) = +0.
    """
    if a.dtype == torch.float64:
        return a * b + c
    prod = a.double() * b.double()
    cc = c.double()
    total = prod + cc
    back = total - prod
    err = (prod - (total - back)) + (cc - back)          # TwoSum: total + err is exact
    odd = (total.view(torch.int64) & 1) == 1
    inexact = (err != 0) & torch.isfinite(total)
    toward = torch.where(err > 0, torch.full_like(total, float("inf")),
                         torch.full_like(total, float("-inf")))
    total = torch.where(inexact & ~odd, torch.nextafter(total, toward), total)
    return total.float()


# --- forward and backward -------------------------------------------------------------------


def _dtype(precision: str) -> torch.dtype:
    return torch.float64 if precision == "fp64" else torch.float32


def _out(p: torch.Tensor, u: torch.Tensor, precision: str) -> torch.Tensor:
    acc = _serial_sum(u * p)                      # (N, d)
    return acc if precision == "fp64" else acc.to(torch.bfloat16)


def _check(kv, score, ape, cu, cuc, ratio, coff, precision):
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if coff not in (1, 2):
        raise ValueError(f"coff must be 1 or 2, got {coff}")
    if kv.dim() != 2 or kv.shape[1] % coff or score.shape != kv.shape:
        raise ValueError("kv and score must be (T, coff*d) of the same shape")
    if tuple(ape.shape) != (ratio, kv.shape[1]):
        raise ValueError(f"ape must be (ratio, coff*d) = {(ratio, kv.shape[1])}")
    if cu.numel() != cuc.numel() or cu.numel() < 2:
        raise ValueError("cu_seqlens and cu_seqlens_comp must both have B + 1 >= 2 entries")


# dAPE sums ds over the rows in blocks of this many consecutive valid rows (the most rows a
# small-ratio backward CTA sums in registers before its one atomic per slot and column).
DAPE_BLOCK_ROWS = 32
# The rows are evaluated in chunks whose window tensors (W, rows, d) hold about this many
# elements (8 MiB per fp64 temporary): the references' working memory is bounded whatever N
# is. Every value is computed per row, and dAPE's block sums run on across chunks in the same
# order (a block a chunk leaves unfinished is carried into the next), so the bits do not
# depend on the chunking.
CHUNK_ELEMENTS = 1 << 20


def row_chunks(n_rows: int, window: int, d: int) -> list[tuple[int, int]]:
    """[start, end) row ranges of at most ``CHUNK_ELEMENTS / (window * d)`` rows (at least
    one)."""
    per = max(1, CHUNK_ELEMENTS // max(1, window * d))
    return [(start, min(start + per, n_rows)) for start in range(0, n_rows, per)]


def forward(kv, score, ape, cu, cuc, *, ratio: int, coff: int, n_rows: int | None = None,
            precision: str = "fp32") -> torch.Tensor:
    """``out`` (N, d) in the documented order; N defaults to cuc[B] (no capacity padding)."""
    _check(kv, score, ape, cu, cuc, ratio, coff, precision)
    if n_rows is None:
        n_rows = int(cuc[-1])
    with torch.no_grad():
        if precision == "upstream":
            return _torch_eager(kv, score, ape, cu, cuc, ratio=ratio, coff=coff,
                                n_rows=n_rows, precision=precision)
        slots = _slots(cu, cuc, n_rows, ratio, coff)
        d = kv.shape[1] // coff
        out = torch.empty((n_rows, d), dtype=_out_dtype(precision), device=kv.device)
        for a, b in row_chunks(n_rows, coff * ratio, d):
            s, u = _windows(kv, score, ape, slots.rows(a, b), coff, _dtype(precision))
            p, _ = _softmax(s)
            out[a:b] = _out(p, u, precision)
        return out


@dataclass(frozen=True)
class Piece:
    """The gradients of the kv slots of tokens [start, end), all columns, as ``backward``
    computes them; the last piece of an evaluation also carries ``out`` and ``dape``, complete
    once every row has been evaluated (None on the others)."""

    start: int
    end: int
    dkv: torch.Tensor     # (end - start, coff*d): bf16 or fp64
    dscore: torch.Tensor  # (end - start, coff*d)
    out: torch.Tensor | None = None
    dape: torch.Tensor | None = None


def backward(kv, score, ape, cu, cuc, grad_out, *, ratio: int, coff: int,
             precision: str = "fp32") -> Grads:
    """``out`` for all N rows and the gradients of the valid rows, in the documented order.

    Capacity padding rows take no part: only rows ``b < cuc[B]`` are read for the gradients,
    so no value of theirs, finite or not, reaches dKV, dScore or dAPE. Every (token, column)
    slot some valid window position reads is written once; every other slot is +0. The
    gradients are those of ``backward_pieces``, put together.
    """
    _check(kv, score, ape, cu, cuc, ratio, coff, precision)
    if precision == "upstream":
        return _torch_eager_backward(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff)
    dkv = dscore = None
    for piece in backward_pieces(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff,
                                 precision=precision):
        if dkv is None:
            dkv = torch.empty(kv.shape, dtype=piece.dkv.dtype, device=kv.device)
            dscore = torch.empty_like(dkv)
        dkv[piece.start:piece.end] = piece.dkv
        dscore[piece.start:piece.end] = piece.dscore
    return Grads(piece.out, dkv, dscore, piece.dape)


def backward_pieces(kv, score, ape, cu, cuc, grad_out, *, ratio: int, coff: int,
                    precision: str = "fp32"):
    """The backward a row chunk (``row_chunks``) at a time, as :class:`Piece` s in token order
    that tile [0, T): the working memory is a chunk's, whatever the pack.

    The piece of rows [a, b) holds tokens [tok0(a), tok0(b)) (the first from token 0, the last
    to T): the own blocks of rows [a, b) and, with coff=2, the previous blocks rows a+1..b read
    in columns [0, d), so row b is evaluated for that piece too (and again for its own). Every
    slot is computed by its one (row, position) whatever the chunk, so the pieces hold the
    bits of the whole.
    """
    _check(kv, score, ape, cu, cuc, ratio, coff, precision)
    if precision not in ("fp32", "fp64"):
        raise ValueError(f"backward_pieces computes the fp32 and fp64 references, not "
                         f"{precision!r}")
    dtype = _dtype(precision)
    grad_dtype = dtype if precision == "fp64" else torch.bfloat16
    n_rows, d = grad_out.shape
    n_tokens, width = kv.shape
    n_valid = min(int(cuc[-1]), n_rows)              # the backward reads real rows only
    with torch.no_grad():
        slots = _slots(cu, cuc, n_rows, ratio, coff)
        tok0 = _row_geometry(cu, cuc, n_rows, ratio)[0].tolist()
    out = torch.empty((n_rows, d), dtype=_out_dtype(precision), device=kv.device)
    zeros = torch.zeros((coff * ratio, d), dtype=dtype, device=kv.device)
    dape_sum = (zeros, zeros)                        # (finished blocks, the block going on)
    chunks = row_chunks(n_rows, coff * ratio, d) or [(0, 0)]

    def edge(row: int) -> int:                       # the first token row ``row`` owns
        return tok0[row] if row < n_valid else n_tokens

    for i, (a, b) in enumerate(chunks):
        last = i == len(chunks) - 1
        start, end = (0 if i == 0 else edge(a)), (n_tokens if last else edge(b))
        dkv = torch.zeros((end - start, coff, d), dtype=grad_dtype, device=kv.device)
        dscore = torch.zeros_like(dkv)
        dape_sum = _rows_backward(kv, score, ape, grad_out, slots, (a, b), n_valid, coff,
                                  precision, out, (start, dkv, dscore), dape_sum)
        dape = None
        if last:
            total, block = dape_sum
            if n_valid % DAPE_BLOCK_ROWS:             # the last block, short
                total = total + block
            dape = torch.zeros((ratio, coff, d), dtype=dtype, device=kv.device)
            dape[slots.ape_row, slots.half] = total    # each (row k mod ratio, half) once
            dape = dape.view(ratio, width)
        yield Piece(start, end, dkv.view(end - start, width), dscore.view(end - start, width),
                    out if last else None, dape)


@torch.no_grad()
def _rows_backward(kv, score, ape, grad_out, slots: _Slots, rows: tuple[int, int],
                   n_valid: int, coff: int, precision: str, out: torch.Tensor, piece,
                   dape_sum: tuple[torch.Tensor, torch.Tensor]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [a, b): ``out[a:b]``, the slots of ``piece`` = (its first token, dkv, dscore) that
    the valid rows among [a, b] read, and ``dape_sum`` with the valid rows of [a, b)."""
    a, b = rows
    dtype = _dtype(precision)
    grad_dtype = dtype if precision == "fp64" else torch.bfloat16
    v = max(0, min(n_valid, b) - a)                   # the chunk's real rows
    g = max(v, min(n_valid, b + coff - 1) - a)        # and row b, for coff=2's first half
    end = max(b, a + g)
    s, u = _windows(kv, score, ape, slots.rows(a, end), coff, dtype)
    p, _ = _softmax(s)
    out[a:b] = _out(p[:, :b - a], u[:, :b - a], precision)
    if not g:
        return dape_sum
    p, u = p[:, :g], u[:, :g]
    go = grad_out[a:a + g].to(dtype)
    t = (go * u) * p                                  # t_k = dp_k * p_k, dp_k = go * u_k
    S = _serial_sum(t)
    ds = _fma(p, -S, t)
    start, dkv, dscore = piece
    _scatter(dkv, (go * p).to(grad_dtype), slots.rows(a, a + g), start)
    _scatter(dscore, ds.to(grad_dtype), slots.rows(a, a + g), start)
    return _dape_blocks(dape_sum, ds[:, :v], slots.rows(a, a + v), a) if v else dape_sum


def _out_dtype(precision: str) -> torch.dtype:
    return torch.float64 if precision == "fp64" else torch.bfloat16


def _scatter(grad: torch.Tensor, vals: torch.Tensor, rows: _Slots, start: int = 0) -> None:
    """Write ``vals`` (W, rows, d) into ``grad`` (tokens [start, start + len), coff, d) at the
    slots the valid positions of ``rows`` read in that range (each slot is read by at most
    one (row, position), so nothing adds; the others keep their +0)."""
    keep = rows.valid & (rows.token >= start) & (rows.token < start + grad.shape[0])
    token = rows.token[keep] - start
    half = rows.half[:, None].expand(keep.shape)[keep]
    grad[token, half] = vals[keep]


def _dape_blocks(dape_sum: tuple[torch.Tensor, torch.Tensor], ds: torch.Tensor, rows: _Slots,
                 first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``dape_sum`` = (total, block) (W, d) each, with the rows [first, first + n) of ``ds``:
    ds summed over the valid rows in its own precision (an invalid position's ds is never
    added), each block of ``DAPE_BLOCK_ROWS`` consecutive rows (from row 0) serially, then each
    block sum added to ``total`` (``block``: the sum so far of a block these rows leave
    unfinished, which the next chunk goes on with): the structure and precision of the
    kernels' own reduction, so that G3 compares a kernel's dAPE with a same-precision sum. The
    blocks and their order are those of the whole pack, whatever the chunks."""
    total, block = dape_sum
    w, n, d = ds.shape
    ds = torch.where(rows.valid[:, :, None], ds, torch.zeros((), dtype=ds.dtype,
                                                                device=ds.device))
    lead = first % DAPE_BLOCK_ROWS                 # the first block's rows before ``first``
    n_blocks = -(-(lead + n) // DAPE_BLOCK_ROWS)
    pad = n_blocks * DAPE_BLOCK_ROWS - lead - n
    padded = torch.cat([ds.new_zeros((w, lead, d)), ds, ds.new_zeros((w, pad, d))], dim=1)
    blocks = padded.view(w, n_blocks, DAPE_BLOCK_ROWS, d).transpose(0, 2)
    start = torch.zeros_like(blocks[0])
    start[0] = block                               # the first block goes on from ``block``
    partial = _serial_sum(blocks, start)           # (n_blocks, W, d): rows within a block
    for i in range(n_blocks - (1 if pad else 0)):  # the finished blocks in order
        total = total + partial[i]
    return total, (partial[-1] if pad else torch.zeros_like(block))


# --- upstream: torch's own eager ops (Megatron-LM's numerics) ------------------------------


def _torch_eager(kv, score, ape, cu, cuc, *, ratio: int, coff: int, n_rows: int,
                 precision: str = "upstream", cut_padding: bool = False):
    """The eager region as Megatron-LM writes it, in torch ops: gather, add APE, overlap
    transform, ``torch.softmax`` over the window, weighted sum (``precision``: "upstream" casts
    the weights to bf16 before the multiply with the bf16 kv; "fp32" keeps fp32, for
    comparisons with torch's own order). ``cut_padding``: the capacity padding rows' windows
    keep their values and lose their path back to the leaves, so autograd excludes them."""
    d = kv.shape[1] // coff
    tok0, first_block, valid = _row_geometry(cu, cuc, n_rows, ratio)
    idx = tok0[:, None] + torch.arange(ratio, device=kv.device)  # (N, ratio) token ids
    if precision == "fp32":
        kv, score = kv.float(), score.float()
    kv_w = kv[idx]                   # (N, ratio, coff*d)
    s_w = score[idx] + ape[None]     # bf16 + fp32 promotes to fp32
    if cut_padding:
        keep = valid[:, None, None]
        kv_w = torch.where(keep, kv_w, kv_w.detach())
        s_w = torch.where(keep, s_w, s_w.detach())
    if coff == 2:
        prev_kv = torch.roll(kv_w[:, :, :d], shifts=1, dims=0)
        prev_s = torch.roll(s_w[:, :, :d], shifts=1, dims=0)
        hole = first_block[:, None, None]
        prev_kv = torch.where(hole, torch.zeros_like(prev_kv), prev_kv)
        prev_s = torch.where(hole, torch.full_like(prev_s, float("-inf")), prev_s)
        kv_w = torch.cat([prev_kv, kv_w[:, :, d:]], dim=1)   # (N, 2*ratio, d)
        s_w = torch.cat([prev_s, s_w[:, :, d:]], dim=1)
    p = torch.softmax(s_w, dim=1, dtype=torch.float32)
    if precision == "upstream":
        return (p.to(torch.bfloat16) * kv_w).sum(dim=1)
    return (p * kv_w).sum(dim=1).to(torch.bfloat16)


def _torch_eager_backward(kv, score, ape, cu, cuc, grad_out, *, ratio: int, coff: int,
                          precision: str = "upstream") -> Grads:
    """Autograd through ``_torch_eager`` with the padding rows cut from the graph."""
    n_rows = grad_out.shape[0]
    leaves = [t.detach().clone().requires_grad_(True) for t in (kv, score, ape)]
    with torch.enable_grad():
        out = _torch_eager(*leaves, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows,
                           precision=precision, cut_padding=True)
        _, _, valid = _row_geometry(cu, cuc, n_rows, ratio)
        go = torch.where(valid[:, None], grad_out.to(out.dtype),
                         torch.zeros((), dtype=out.dtype, device=out.device))
        if out.numel():
            out.backward(go)
    dkv, dscore, dape = (t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves)
    return Grads(out.detach(), dkv, dscore, dape)


def never_consumed_mask(cu, *, ratio: int, coff: int, d: int, n_tokens: int,
                        tokens: tuple[int, int] | None = None) -> torch.Tensor:
    """(T, coff*d) bool: the slots no window reads, whose gradients are exact zeros; with
    ``tokens`` = (start, end), the rows [start, end) of it only.

    Per segment with nb = len // ratio full blocks:
    (a) tail tokens [nb*ratio, len), all columns;
    (b) coff=2: the last block's own tokens, columns [0, d) (no next block reads them);
    (c) nb == 0 (shorter than ratio, or empty): the whole segment;
    (d) token-capacity padding [cu[B], T): all columns.
    """
    first, last = tokens if tokens is not None else (0, n_tokens)
    bounds = [int(x) for x in cu.tolist()]
    mask = torch.zeros(last - first, coff * d, dtype=torch.bool)

    def mark(lo: int, hi: int, columns: int = coff * d) -> None:
        lo, hi = max(lo, first), min(hi, last)
        if lo < hi:
            mask[lo - first:hi - first, :columns] = True

    for start, end in zip(bounds[:-1], bounds[1:]):
        nb = (end - start) // ratio
        mark(start + nb * ratio, end)
        if coff == 2 and nb > 0:
            mark(start + (nb - 1) * ratio, start + nb * ratio, d)
    mark(bounds[-1], n_tokens)
    return mask.to(cu.device)
