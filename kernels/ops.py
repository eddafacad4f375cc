"""``csa_compress``: the CSA compressor as a differentiable torch op; both paths give the kernels'
results bitwise (docs/CONTRACT.md section 5). Eager calls on plain CUDA tensors go through
:class:`_CsaCompress` straight to the api, skipping the custom-op dispatch cost (docs/PERF_NOTES.md
section 11.2); all else (torch.compile, export, make_fx, fake or meta tensors, other devices) gets
the opaque custom ops ``csagate::csa_compress_fwd`` / ``csa_compress_bwd``. Not twice
differentiable; dAPE's mode follows torch.are_deterministic_algorithms_enabled() on both paths."""

from __future__ import annotations

import torch
from csagate.kernels import api
from csagate.kernels.validate import check_support
from torch.autograd.function import once_differentiable


def _refuse_off_cuda(kv, score, ape, cu, cuc, other=None, *, ratio, coff, out_name="out"):
    """check_support's errors first, in its order, then the api's one-line device error."""
    check_support(kv, score, ape, cu, cuc, other, ratio=ratio, coff=coff,
                      out_name=out_name)
    raise ValueError(f"kv must be a CUDA tensor, got device {kv.device}")


@torch.library.custom_op("csagate::csa_compress_fwd", mutates_args=())
def csa_compress_fwd(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor,
                     cu_seqlens: torch.Tensor, cu_seqlens_comp: torch.Tensor, ratio: int,
                     coff: int, n_rows: int | None = None) -> torch.Tensor:
    """Every device but CUDA and meta (kernel and fake below): the api's device ValueError."""
    _refuse_off_cuda(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio=ratio, coff=coff)


@csa_compress_fwd.register_kernel("cuda")
def _fwd_cuda(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio, coff, n_rows=None):
    return api.forward(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio=ratio, coff=coff,
                       n_rows=n_rows)


@csa_compress_fwd.register_fake
def _fwd_fake(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio, coff, n_rows=None):
    check_support(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio=ratio, coff=coff,
                      devices=False, n_rows=n_rows)
    if n_rows is None and kv.device.type == "meta":
        raise ValueError("meta tensors need n_rows: the row count is cu_seqlens_comp[-1], a "
                         "value meta tensors do not hold (pass n_rows, the row capacity)")
    if n_rows is None:
        n_rows = torch.library.get_ctx().new_dynamic_size()
    elif n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    return kv.new_empty((n_rows, kv.shape[1] // coff))


@torch.library.custom_op("csagate::csa_compress_bwd", mutates_args=())
def csa_compress_bwd(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor,
                     cu_seqlens: torch.Tensor, cu_seqlens_comp: torch.Tensor,
                     grad_out: torch.Tensor, ratio: int, coff: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As the forward's; dape is zeroed before the kernel adds into it, so ape.grad sums right."""
    _refuse_off_cuda(kv, score, ape, cu_seqlens, cu_seqlens_comp, grad_out, ratio=ratio,
                     coff=coff, out_name="grad_out")


@csa_compress_bwd.register_kernel("cuda")
def _bwd_cuda(kv, score, ape, cu_seqlens, cu_seqlens_comp, grad_out, ratio, coff):
    return api.backward(kv, score, ape, cu_seqlens, cu_seqlens_comp, grad_out, ratio=ratio,
                        coff=coff)


@csa_compress_bwd.register_fake
def _bwd_fake(kv, score, ape, cu_seqlens, cu_seqlens_comp, grad_out, ratio, coff):
    check_support(kv, score, ape, cu_seqlens, cu_seqlens_comp, grad_out, ratio=ratio,
                      coff=coff, out_name="grad_out", devices=False)
    return torch.empty_like(kv), torch.empty_like(score), torch.empty_like(ape)


def _setup_context(ctx, inputs, output):
    kv, score, ape, cu, cuc, ratio, coff, _n_rows = inputs
    ctx.save_for_backward(kv, score, ape, cu, cuc)
    ctx.ratio, ctx.coff = ratio, coff


def _grads(ctx, grad_out):
    kv, score, ape, cu, cuc = ctx.saved_tensors
    # The kernel reads grad_out row-major; autograd may hand an expanded or strided view.
    grad_out = grad_out.contiguous()
    if _eager(kv, grad_out):
        dkv, dscore, dape = api.backward(kv, score, ape, cu, cuc, grad_out, ratio=ctx.ratio,
                                         coff=ctx.coff)
    else:
        dkv, dscore, dape = csa_compress_bwd(kv, score, ape, cu, cuc, grad_out, ctx.ratio,
                                             ctx.coff)
    need = ctx.needs_input_grad
    return (dkv if need[0] else None, dscore if need[1] else None,
            dape if need[2] else None, None, None, None, None, None)


csa_compress_fwd.register_autograd(_grads, setup_context=_setup_context)


def _eager(kv, other) -> bool:
    """True where the api may run directly: plain CUDA tensors, no tracing, dispatch mode or
    functorch transform (fake tensors, make_fx, FlopCounter...)."""
    return (not torch.compiler.is_compiling() and type(kv) is torch.Tensor
            and type(other) is torch.Tensor and kv.is_cuda
            and not torch._C._len_torch_dispatch_stack()
            and not torch._C._are_functorch_transforms_active())


_grads_once = once_differentiable(_grads)


class _CsaCompress(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kv, score, ape, cu, cuc, ratio, coff, n_rows):
        out = api.forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)
        ctx.save_for_backward(kv, score, ape, cu, cuc)
        ctx.ratio, ctx.coff = ratio, coff
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if torch.is_grad_enabled():  # create_graph=True: a second derivative must raise
            return _grads_once(ctx, grad_out)
        return _grads(ctx, grad_out)


def csa_compress(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor,
                 cu_seqlens: torch.Tensor, cu_seqlens_comp: torch.Tensor, *, ratio: int,
                 coff: int, n_rows: int | None = None) -> torch.Tensor:
    """The compressor output (N, head_dim) bf16, differentiable in kv, score and ape (shapes: see
    csagate.kernels.api). N = ``n_rows`` (row capacity, >= cuc[-1]), else cuc[-1]: a sync, not
    graph-capturable. Raises ValueError (one line) on bad input, RuntimeError on no usable GPU."""
    if _eager(kv, score):
        if torch.is_grad_enabled() and (kv.requires_grad or score.requires_grad
                                        or ape.requires_grad):
            return _CsaCompress.apply(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio,
                                      coff, n_rows)
        return api.forward(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio=ratio,
                           coff=coff, n_rows=n_rows)
    return torch.ops.csagate.csa_compress_fwd(kv, score, ape, cu_seqlens, cu_seqlens_comp,
                                              ratio, coff, n_rows)
