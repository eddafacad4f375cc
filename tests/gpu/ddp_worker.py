"""One DDP training step through ``csagate.kernels.ops.csa_compress`` per configuration, checked
against the same step on one GPU (run by tests/gpu/test_ddp.py under
``torchrun --nproc_per_node=2``; not a test module itself).

Each rank holds its own batch (same lengths, its own seeds) and a replica of the one
parameter, ape. The loss is ``(out * w).sum()`` with w bf16, so grad_out is w exactly in eager
and compiled code alike and the op's gradients are the kernels' own. On one GPU (this rank's,
no process group) the same step runs for every rank's batch; then the DDP step runs. Written
per rank as JSON records: dKV / dScore of this rank's batch bitwise equal to the one-GPU step's;
the all-reduced dAPE against the one-GPU mean (g_0 + g_1) / 2: its largest difference and
whether it is bitwise equal; whether dAPE is bitwise equal on every rank.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from csagate.kernels import ops
from csagate.reference import make_grad_out, make_pack
from torch.nn.parallel import DistributedDataParallel as DDP

CONFIGS = ((4, 1), (4, 2), (128, 1), (128, 2))  # (ratio, coff), head_dim 128
LENS = (1023, 2048, 509)
D = 128


class Compressor(torch.nn.Module):
    """The op with ape as the module's parameter (what DDP all-reduces)."""

    def __init__(self, ape: torch.Tensor, ratio: int, coff: int):
        super().__init__()
        self.ape = torch.nn.Parameter(ape.clone())
        self.ratio, self.coff = ratio, coff

    def forward(self, kv, score, cu, cuc, n_rows: int):
        return ops.csa_compress(kv, score, self.ape, cu, cuc, ratio=self.ratio, coff=self.coff,
                                n_rows=n_rows)


def batch(rank: int, ratio: int, coff: int, device):
    p = make_pack(LENS, ratio=ratio, coff=coff, d=D, seed=100 + rank, device=device)
    return p, make_grad_out(p.n_rows, D, seed=200 + rank, device=device)


def step(fn, p, w):
    """kv.grad, score.grad of one forward + backward of ``fn`` on the pack ``p``."""
    kv, score = (t.clone().requires_grad_(True) for t in (p.kv, p.score))
    out = fn(kv, score, p.cu, p.cuc, p.n_rows)
    (out.float() * w.float()).sum().backward()
    return kv.grad, score.grad


def check(ratio: int, coff: int, mode: str, rank: int, world: int, device) -> dict:
    ape0 = batch(0, ratio, coff, device)[0].ape  # the same initial parameter on every rank
    wrap = (lambda m: m) if mode == "eager" else torch.compile
    torch._dynamo.reset()  # each configuration compiles from scratch (static shapes)
    one_gpu, dapes = {}, []
    for r in range(world):
        model = Compressor(ape0, ratio, coff).to(device)
        one_gpu[r] = step(wrap(model), *batch(r, ratio, coff, device))
        dapes.append(model.ape.grad)
    mean = dapes[0]
    for g in dapes[1:]:
        mean = mean + g
    mean = mean / world

    model = Compressor(ape0, ratio, coff).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    dkv, dscore = step(wrap(ddp), *batch(rank, ratio, coff, device))
    dape = model.ape.grad
    every = [torch.empty_like(dape) for _ in range(world)]
    dist.all_gather(every, dape)
    return {"ratio": ratio, "coff": coff, "mode": mode, "rank": rank,
            "dkv_bitwise": torch.equal(dkv, one_gpu[rank][0]),
            "dscore_bitwise": torch.equal(dscore, one_gpu[rank][1]),
            "dape_max_abs": (dape - mean).abs().max().item(),
            "dape_bitwise": torch.equal(dape, mean),
            "dape_same_on_every_rank": all(torch.equal(g, dape) for g in every),
            "dape_nonzero": bool(dape.abs().sum().item() > 0)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--modes", default="eager,compiled")
    a = ap.parse_args(argv)
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.deterministic:
        torch.use_deterministic_algorithms(True)
    try:
        records = [check(ratio, coff, mode, rank, world, device)
                   for ratio, coff in CONFIGS for mode in a.modes.split(",")]
        (a.out / f"rank{rank}.json").write_text(json.dumps(records, indent=1) + "\n")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
