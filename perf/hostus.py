"""Host time per call: CPU wall time of many back-to-back calls on a shape small enough that
the GPU is never the bottleneck (issue targets: the api at most 8 us forward / 12 us backward;
the op at most 8 us above a do-nothing custom op with the same signature, measured in the same
process, so the op costs the dispatcher's toll plus the raw launch).

Each figure: ``calls`` back-to-back calls after warm-ups, CPU wall time per call, median of
``reps``; ``sync_tail_us`` is the wait in the final synchronize (a few us: the GPU kept up).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch


@torch.library.custom_op("csagate_bench::noop_fwd", mutates_args=(), device_types="cuda")
def noop_fwd(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, cu_seqlens: torch.Tensor,
             cu_seqlens_comp: torch.Tensor, ratio: int, coff: int, n_rows: int | None = None
             ) -> torch.Tensor:
    """The forward op's signature and output allocation, no kernel."""
    return torch.empty((n_rows, kv.shape[1] // coff), dtype=kv.dtype, device=kv.device)


@noop_fwd.register_fake
def _(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio, coff, n_rows=None):
    return kv.new_empty((n_rows, kv.shape[1] // coff))


@torch.library.custom_op("csagate_bench::noop_bwd", mutates_args=(), device_types="cuda")
def noop_bwd(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, cu_seqlens: torch.Tensor,
             cu_seqlens_comp: torch.Tensor, grad_out: torch.Tensor, ratio: int, coff: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward op's signature and output allocation, no kernel (the op allocates its
    three outputs uninitialized too: the launch zeroes dAPE itself)."""
    return torch.empty_like(kv), torch.empty_like(score), torch.empty_like(ape)


@noop_bwd.register_fake
def _(kv, score, ape, cu_seqlens, cu_seqlens_comp, grad_out, ratio, coff):
    return torch.empty_like(kv), torch.empty_like(score), torch.empty_like(ape)


@dataclass(frozen=True)
class HostRow:
    path: str
    us: float            # CPU wall time per call, median of the repetitions
    sync_tail_us: float  # the wait in the final synchronize (median)


def host_us(call, *, calls: int = 1000, warm: int = 100, reps: int = 5) -> tuple[float, float]:
    for _ in range(warm):
        call()
    torch.cuda.synchronize()
    per, tails = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        per.append((t1 - t0) / calls * 1e6)
        tails.append((time.perf_counter() - t1) * 1e6)
    return statistics.median(per), statistics.median(tails)


def host_us_table(*, tokens: int = 1024, coff: int = 1, d: int = 128, calls: int = 1000,
                  reps: int = 5) -> list[HostRow]:
    """The api path, the op, and the do-nothing op, forward and backward (ratio=128)."""
    from csagate.kernels import api
    from csagate.reference import make_grad_out, make_pack

    from csagate import ops

    p = make_pack((tokens,), ratio=128, coff=coff, d=d, device="cuda")
    kv, score, ape, cu, cuc = p.inputs()
    go = make_grad_out(p.n_rows, d, device="cuda")
    n = p.n_rows
    out = torch.empty(n, d, dtype=torch.bfloat16, device="cuda")
    dkv, dsc, dape = torch.empty_like(kv), torch.empty_like(score), torch.zeros_like(ape)
    fwd_op, bwd_op = torch.ops.csagate.csa_compress_fwd, torch.ops.csagate.csa_compress_bwd
    nf, nb = torch.ops.csagate_bench.noop_fwd, torch.ops.csagate_bench.noop_bwd
    paths = [
        ("api.run_forward (launch into out)",
         lambda: api.run_forward(kv, score, ape, cu, cuc, out, ratio=128, coff=coff)),
        ("api.forward (allocates out)",
         lambda: api.forward(kv, score, ape, cu, cuc, ratio=128, coff=coff, n_rows=n)),
        ("op csa_compress_fwd", lambda: fwd_op(kv, score, ape, cu, cuc, 128, coff, n)),
        ("do-nothing op, forward signature", lambda: nf(kv, score, ape, cu, cuc, 128, coff, n)),
        ("api.run_backward (launch into buffers)",
         lambda: api.run_backward(kv, score, ape, cu, cuc, go, dkv, dsc, dape, ratio=128,
                                  coff=coff)),
        ("api.backward (allocates; the launch zeroes dape)",
         lambda: api.backward(kv, score, ape, cu, cuc, go, ratio=128, coff=coff)),
        ("api.backward(deterministic=True)",
         lambda: api.backward(kv, score, ape, cu, cuc, go, ratio=128, coff=coff,
                              deterministic=True)),
        ("op csa_compress_bwd", lambda: bwd_op(kv, score, ape, cu, cuc, go, 128, coff)),
        ("do-nothing op, backward signature",
         lambda: nb(kv, score, ape, cu, cuc, go, 128, coff)),
    ]
    assert ops.csa_compress_fwd is not None  # the ops are registered by the import above
    return [HostRow(name, *host_us(call, calls=calls, reps=reps)) for name, call in paths]
