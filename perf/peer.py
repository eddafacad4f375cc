"""Our kernels against a peer implementation's, in one process, on the same inputs (GPU only).

The peer today is the released ``nvidia-cudnn-frontend``'s CSA compressor (the gate's ``cudnn``
implementation, ``gates/builtin_impls.Cudnn``, gives its import and availability). Its kernels
are launched through the package's public plans (``CSACompressorForward`` /
``CSACompressorBackward``: built and compiled once, ``execute`` into buffers allocated once),
so neither side allocates in the timed region. Before timing, the two sides' results on the
shape are compared and recorded (never asserted). Both directions are timed cold by
``bench.interleaved`` in both orders; the peer's ``execute`` validates its arguments in Python
on every call, so every sample of both sides starts behind a GPU sleep of ``HIDE_HOST_US``
that the host work of either launcher hides under. Nothing here prints.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from csagate.kernels import schedule as S
from csagate.perf import bench

# The GPU sleep before each timed launch: well above either side's host work per call.
HIDE_HOST_US = 200.0


@dataclass(frozen=True)
class PeerRow:
    """One shape: ours and the peer's cold times per order (order 1: ours first), the bytes
    the op moves, the copy ceiling, and how the two sides' results compare."""

    config: str                        # "r4 c2d128"
    tokens: int
    ours_fwd_us: tuple[float, float]
    peer_fwd_us: tuple[float, float]
    ours_bwd_us: tuple[float, float]
    peer_bwd_us: tuple[float, float]
    fwd_bytes: int
    bwd_bytes: int
    copy_bw: float
    out_max_abs: float                 # max |ours - peer| of the forward's output
    dape_max_abs: float
    dkv_equal: bool                    # dKV bitwise equal
    dscore_equal: bool

    def us(self, who: str, direction: str) -> float:
        """The mean of the two orders' medians (``who``: "ours" or "peer")."""
        a, b = getattr(self, f"{who}_{direction}_us")
        return (a + b) / 2

    def speedup(self, direction: str) -> float:
        """Peer time over ours (above 1: ours is faster; 0 when a time is missing)."""
        ours, peer = self.us("ours", direction), self.us("peer", direction)
        return peer / ours if ours > 0 and peer > 0 else 0.0

    def roofline(self, who: str, direction: str) -> float:
        nbytes = self.fwd_bytes if direction == "fwd" else self.bwd_bytes
        return bench.percent_of(bench.bandwidth(nbytes, self.us(who, direction)), self.copy_bw)

    @property
    def bits_equal(self) -> bool:
        return self.dkv_equal and self.dscore_equal


def cudnn_launchers(mod, pack, go, out, dkv, dscore, dape):
    """The peer's forward and backward launchers on ``pack``: its plans built, checked and
    compiled now, each launch an ``execute`` into the given buffers (dAPE accumulated: the
    caller zeroes it)."""
    kv, score, ape, cu, cuc = pack.inputs()
    common = dict(sample_kv=kv, sample_score=score, sample_ape=ape, sample_cu_seqlens=cu,
                  sample_cu_seqlens_comp=cuc, ratio=pack.ratio, coff=pack.coff)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fwd = mod.CSACompressorForward(sample_out=out, **common)
        bwd = mod.CSACompressorBackward(sample_out=go, deterministic=False, **common)
        for plan in (fwd, bwd):
            plan.check_support()
            plan.compile()

    def forward() -> None:
        fwd.execute(kv, score, ape, cu, cuc, out)

    def backward() -> None:
        bwd.execute(kv, score, ape, cu, cuc, go, dkv, dscore, dape)
    return forward, backward


def compare_shape(peer, ratio: int, coff: int, d: int, tokens: int, *, copy_bw: float,
                  iters: int = 100, warmup: int = 30, seed: int = 1234,
                  flush: bench.L2Flush | None = None) -> PeerRow:
    """One shape: both sides' results compared, then forward and backward timed cold,
    interleaved in both orders. ``peer`` is an available ``builtin_impls.Cudnn``."""
    from csagate.kernels import api

    flush = flush or bench.L2Flush()
    pack, go, out, dkv, dscore, dape = bench.shape_buffers(ratio, coff, d, tokens, seed)
    theirs = (torch.empty_like(out), torch.empty_like(dkv), torch.empty_like(dscore),
              torch.zeros_like(dape))
    args, kw = pack.inputs(), {"ratio": ratio, "coff": coff}
    peer_fwd, peer_bwd = cudnn_launchers(peer.module, pack, go, *theirs)

    def fwd() -> None:
        api.run_forward(*args, out, **kw)

    def bwd() -> None:
        api.run_backward(*args, go, dkv, dscore, dape, **kw)

    for launch in (fwd, peer_fwd, dape.zero_, bwd, theirs[3].zero_, peer_bwd):
        launch()
    torch.cuda.synchronize()
    record = dict(out_max_abs=_max_abs(out, theirs[0]), dape_max_abs=_max_abs(dape, theirs[3]),
                  dkv_equal=torch.equal(dkv, theirs[1]),
                  dscore_equal=torch.equal(dscore, theirs[2]))
    n = pack.n_rows
    nbytes = {direction: bench.op_bytes(direction, coff=coff, d=d, n_tokens=tokens, n_rows=n,
                                        ratio=ratio) for direction in ("fwd", "bwd")}
    timing = {"iters": iters, "warmup": warmup, "flush": flush, "hide_host_us": HIDE_HOST_US}
    ours_f, peer_f = bench.interleaved([fwd, peer_fwd], **timing)
    ours_b, peer_b = bench.interleaved([bwd, peer_bwd], before=[dape.zero_, theirs[3].zero_],
                                       **timing)
    return PeerRow(f"r{ratio} {S.config_name(coff, d)}", tokens, ours_f, peer_f, ours_b,
                   peer_b, nbytes["fwd"], nbytes["bwd"], copy_bw, **record)


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
