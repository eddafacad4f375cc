"""``csa_compress``: the CSA compressor as a differentiable torch op.

    out = csa_compress(kv, score, ape, cu_seqlens, cu_seqlens_comp, *, ratio, coff,
                       n_rows=None)

Two paths, one result (the kernels' own: the op adds no numerics, and the gate checks that
bitwise, docs/CONTRACT.md section 5):

* **Eager** (plain CUDA tensors, not under torch.compile, no torch dispatch mode or functorch
  transform active): :class:`_CsaCompress`, a ``torch.autograd.Function`` whose forward and
  backward call :mod:`csagate.kernels.api` directly. What a training step pays on the host is
  then what any autograd.Function over the api pays; the dispatcher's custom-op machinery
  (its per-call checks and dynamo-disable wrappers) is not on the path. Without grad the
  forward is ``api.forward`` itself.
* **Everything else** (torch.compile and export, make_fx, fake and meta tensors, dispatch
  modes, other devices): the registered custom ops, each one opaque node for torch.compile,
  make_fx and CUDA graphs:

  - ``csagate::csa_compress_fwd(kv, score, ape, cu, cuc, ratio, coff, n_rows) -> out``
  - ``csagate::csa_compress_bwd(kv, score, ape, cu, cuc, grad_out, ratio, coff)
    -> (dkv, dscore, dape)``: dape is freshly zeroed and accumulated by the kernel, so
    autograd's accumulation into ``ape.grad`` is right across calls.

  ``register_autograd`` links them (differentiable in kv, score and ape; not twice
  differentiable). ``register_fake`` gives the shapes: the forward's row count is ``n_rows``
  when given, else a data-dependent (unbacked) size, ``cuc[-1]``. The fake implementations
  validate shapes and dtypes with the messages of :func:`csagate.kernels.api.check_support`.
  The CUDA kernels call the api; on any other device the ops raise the api's one-line
  ValueError (``kv must be a CUDA tensor ...``), not the dispatcher's list of backends.

The backward's dAPE mode follows ``torch.are_deterministic_algorithms_enabled()`` on both
paths (``api.backward(deterministic=None)``); streams are the current stream of the tensors'
device on both.
"""

from __future__ import annotations

import torch
from csagate.kernels import api
from csagate.kernels.validate import check_support
from torch.autograd.function import once_differentiable


def _refuse_off_cuda(kv, score, ape, cu, cuc, other=None, *, ratio, coff, out_name="out"):
    """The api's one-line error for inputs that are not all CUDA tensors (shape and dtype
    errors first, as check_support orders them)."""
    check_support(kv, score, ape, cu, cuc, other, ratio=ratio, coff=coff,
                      out_name=out_name)
    raise ValueError(f"kv must be a CUDA tensor, got device {kv.device}")


# --- the registered ops: torch.compile, make_fx, fake tensors, opcheck ------------------


@torch.library.custom_op("csagate::csa_compress_fwd", mutates_args=())
def csa_compress_fwd(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor,
                     cu_seqlens: torch.Tensor, cu_seqlens_comp: torch.Tensor, ratio: int,
                     coff: int, n_rows: int | None = None) -> torch.Tensor:
    """Every device but CUDA (whose kernel is below) and meta (the fake): the one-line
    device error."""
    _refuse_off_cuda(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio=ratio, coff=coff)


@csa_compress_fwd.register_kernel("cuda")
def _fwd_cuda(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio, coff, n_rows=None):
    return api.forward(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio=ratio, coff=coff,
                       n_rows=n_rows)


@csa_compress_fwd.register_fake
def _fwd_fake(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio, coff, n_rows=None):
    # n_rows too: T < ratio is refused exactly as the api refuses it
    check_support(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio=ratio, coff=coff,
                      devices=False, n_rows=n_rows)
    if n_rows is None and kv.device.type == "meta":
        raise ValueError("meta tensors need n_rows: the row count is cu_seqlens_comp[-1], a "
                         "value meta tensors do not hold (pass n_rows, the row capacity)")
    if n_rows is None:
        # cuc[-1] is known only at run time (torch's guidance for data-dependent sizes).
        n_rows = torch.library.get_ctx().new_dynamic_size()
    elif n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    return kv.new_empty((n_rows, kv.shape[1] // coff))


@torch.library.custom_op("csagate::csa_compress_bwd", mutates_args=())
def csa_compress_bwd(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor,
                     cu_seqlens: torch.Tensor, cu_seqlens_comp: torch.Tensor,
                     grad_out: torch.Tensor, ratio: int, coff: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every device but CUDA and meta: the one-line device error."""
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
    """(dkv, dscore, dape, None x 5) from the saved inputs; the backward op, or the api on
    the eager path."""
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


# --- the eager path ------------------------------------------------------------------------


def _eager(kv, other) -> bool:
    """True where the api may be called directly: plain CUDA tensors, not traced (dynamo,
    export), no torch dispatch mode (fake tensors, make_fx, FlopCounter...) and no functorch
    transform active. Each test is one cheap attribute or C call."""
    return (not torch.compiler.is_compiling() and type(kv) is torch.Tensor
            and type(other) is torch.Tensor and kv.is_cuda
            and not torch._C._len_torch_dispatch_stack()
            and not torch._C._are_functorch_transforms_active())


_grads_once = once_differentiable(_grads)


class _CsaCompress(torch.autograd.Function):
    """The eager path: the api's forward and backward under autograd, nothing else."""

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
    """The compressor output (N, head_dim) bf16; differentiable in kv, score and ape.

    ``n_rows`` is N (the static row capacity, >= cuc[-1]); without it the op reads
    ``cuc[-1]`` (a device sync: not capturable in a CUDA graph; under torch.compile a
    data-dependent size). Bad input raises the one-line ValueErrors of
    ``csagate.kernels.api.check_support``.
    """
    if _eager(kv, score):
        if torch.is_grad_enabled() and (kv.requires_grad or score.requires_grad
                                        or ape.requires_grad):
            return _CsaCompress.apply(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio,
                                      coff, n_rows)
        return api.forward(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio=ratio,
                           coff=coff, n_rows=n_rows)
    return torch.ops.csagate.csa_compress_fwd(kv, score, ape, cu_seqlens, cu_seqlens_comp,
                                              ratio, coff, n_rows)
