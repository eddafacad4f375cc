"""``csa_compress``: the CSA compressor as a differentiable torch op.

    out = csa_compress(kv, score, ape, cu_seqlens, cu_seqlens_comp, *, ratio, coff,
                       n_rows=None)

Two custom ops, each one opaque node for torch.compile, make_fx and CUDA graphs:

* ``csagate::csa_compress_fwd(kv, score, ape, cu, cuc, ratio, coff, n_rows) -> out``
* ``csagate::csa_compress_bwd(kv, score, ape, cu, cuc, grad_out, ratio, coff)
  -> (dkv, dscore, dape)``: dape is freshly zeroed and accumulated by the kernel, so
  autograd's accumulation into ``ape.grad`` is right across calls.

``register_autograd`` links them (differentiable in kv, score and ape; not twice
differentiable). ``register_fake`` gives the shapes: the forward's row count is ``n_rows`` when
given, else a data-dependent (unbacked) size, ``cuc[-1]``. The fake implementations validate
shapes and dtypes with the messages of :func:`csagate.kernels.api.check_support`; the real
ones call :mod:`csagate.kernels.api`, whose outputs they return unchanged: the op adds no
numerics (the gate checks that bitwise, docs/CONTRACT.md section 5).
"""

from __future__ import annotations

import torch

from csagate.kernels import api


@torch.library.custom_op("csagate::csa_compress_fwd", mutates_args=(), device_types="cuda")
def csa_compress_fwd(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor,
                     cu_seqlens: torch.Tensor, cu_seqlens_comp: torch.Tensor, ratio: int,
                     coff: int, n_rows: int | None = None) -> torch.Tensor:
    return api.forward(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio=ratio, coff=coff,
                       n_rows=n_rows)


@csa_compress_fwd.register_fake
def _fwd_fake(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio, coff, n_rows=None):
    api.check_support(kv, score, ape, cu_seqlens, cu_seqlens_comp, ratio=ratio, coff=coff,
                      devices=False)
    if n_rows is None:
        # cuc[-1] is known only at run time (torch's guidance for data-dependent sizes).
        n_rows = torch.library.get_ctx().new_dynamic_size()
    elif n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    return kv.new_empty((n_rows, kv.shape[1] // coff))


@torch.library.custom_op("csagate::csa_compress_bwd", mutates_args=(), device_types="cuda")
def csa_compress_bwd(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor,
                     cu_seqlens: torch.Tensor, cu_seqlens_comp: torch.Tensor,
                     grad_out: torch.Tensor, ratio: int, coff: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return api.backward(kv, score, ape, cu_seqlens, cu_seqlens_comp, grad_out, ratio=ratio,
                        coff=coff)


@csa_compress_bwd.register_fake
def _bwd_fake(kv, score, ape, cu_seqlens, cu_seqlens_comp, grad_out, ratio, coff):
    api.check_support(kv, score, ape, cu_seqlens, cu_seqlens_comp, grad_out, ratio=ratio,
                      coff=coff, out_name="grad_out", devices=False)
    return torch.empty_like(kv), torch.empty_like(score), torch.empty_like(ape)


def _setup_context(ctx, inputs, output):
    kv, score, ape, cu, cuc, ratio, coff, _n_rows = inputs
    ctx.save_for_backward(kv, score, ape, cu, cuc)
    ctx.ratio, ctx.coff = ratio, coff


def _backward(ctx, grad_out):
    kv, score, ape, cu, cuc = ctx.saved_tensors
    # The kernel reads grad_out row-major; autograd may hand an expanded or strided view.
    dkv, dscore, dape = csa_compress_bwd(kv, score, ape, cu, cuc, grad_out.contiguous(),
                                         ctx.ratio, ctx.coff)
    need = ctx.needs_input_grad
    return (dkv if need[0] else None, dscore if need[1] else None,
            dape if need[2] else None, None, None, None, None, None)


csa_compress_fwd.register_autograd(_backward, setup_context=_setup_context)


def csa_compress(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor,
                 cu_seqlens: torch.Tensor, cu_seqlens_comp: torch.Tensor, *, ratio: int,
                 coff: int, n_rows: int | None = None) -> torch.Tensor:
    """The compressor output (N, head_dim) bf16; differentiable in kv, score and ape.

    ``n_rows`` is N (the static row capacity, >= cuc[-1]); without it the op reads
    ``cuc[-1]`` (a device sync: not capturable in a CUDA graph; under torch.compile a
    data-dependent size). Bad input raises the one-line ValueErrors of
    ``csagate.kernels.api.check_support``.
    """
    return torch.ops.csagate.csa_compress_fwd(kv, score, ape, cu_seqlens, cu_seqlens_comp,
                                              ratio, coff, n_rows)
