"""The built-in implementations the gate can judge (``csagate run --impl NAME``), each an
implementation like any other (:mod:`csagate.gates.plugin`), found by name through
``csagate.gates.implementation.BUILTINS``.

* ``csagate``: the gate's own CuTe DSL kernels (``csagate.kernels.api``), with their dispatch
  tables and deterministic backward: the default.
* ``csagate-op``: the torch op users call (``csagate.kernels.ops.csa_compress``), forward
  and the autograd backward.
* ``cudnn``: the released ``nvidia-cudnn-frontend`` (``cudnn.csa.compressor``'s
  ``csa_compressor_forward_wrapper`` / ``csa_compressor_backward_wrapper``; ratios 2, 4 and
  128, coff 1 and 2, compute capability >= 10). Below that the package refuses, and its
  one-line refusal is what the gate reports (could not evaluate).
* ``eager-bf16w``: the reference's upstream formulation (softmax weights rounded to bf16
  before the weighted sum, as Megatron-LM's eager region does).
* ``eager-bf16ape``: the APE cast to the score dtype before the add (bf16 + bf16, rounded
  to bf16), the rest in fp32, as transformers-style eager code does.
* ``compiled``: ``torch.compile`` of the fp32 gather formulation below (the reference's
  slice views do not compile).

The gather formulation (:func:`window_index`, :func:`pool`) is written apart from the
reference (``csagate.reference.compressor``), from the layout it documents: row ``b`` of
segment ``s``, block ``i = b - cuc[s]``, window position ``j`` of ``coff * ratio`` reads
token ``cu[s] + i * ratio + j - (coff - 1) * ratio``, column half ``j >= ratio`` (coff=2),
APE row ``j mod ratio``; the previous half of a segment's first block is empty (kv 0, score
-inf). Capacity padding rows (``b >= cuc[B]``) read a first block at token 0 and take no part
in the backward.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from typing import Any

import torch
from csagate.gates.driver import ProgressFn, Target
from csagate.gates.errors import BuildError, one_line
from csagate.gates.plugin import Supports
from csagate.gates.verdict import Selection
from csagate.kernels.registry import RATIOS
from csagate.reference import backward as ref_backward
from csagate.reference import forward as ref_forward

# Head dims: every one the host API accepts (kernels/validate.py: ratio 128 takes 128 and 512,
# the small ratios any d their registers allow), so no second list is kept here.
CSAGATE_SUPPORTS = Supports(ratios=RATIOS, coffs=(1, 2), min_compute_capability=(9, 0))
# Measurement only: lowers nvidia-cudnn-frontend's own compute-capability constant to this
# major so its CSA kernels can be measured on a GPU below its validated envelope (cc 10).
# A verdict taken with it says so; it is not a supported configuration of that package.
CUDNN_MEASURE_ENV = "CSAGATE_MEASURE_CUDNN_MIN_CC"


# --- the gather formulation -----------------------------------------------------------------


def window_index(cu, cuc, n_rows: int, ratio: int, coff: int):
    """Per row and window position: the flat kv row (``kv.reshape(T * coff, d)``), the flat
    APE row (``ape.reshape(ratio * coff, d)``), whether the position is an empty half, and
    whether the row is a real (not capacity padding) row."""
    cu, cuc = cu.long(), cuc.long()
    rows = torch.arange(n_rows, device=cu.device)
    seg = torch.searchsorted(cuc[1:], rows, right=True).clamp(max=cu.numel() - 2)
    valid = rows < cuc[-1]
    block = torch.where(valid, rows - cuc[seg], torch.zeros_like(rows))
    tok0 = torch.where(valid, cu[seg] + block * ratio, torch.zeros_like(rows))
    j = torch.arange(coff * ratio, device=cu.device)
    shift = (coff - 1) * ratio
    half = (j >= ratio).long() if coff == 2 else torch.zeros_like(j)
    hole = (j[None] < shift) & (block == 0)[:, None]
    token = (tok0[:, None] + j[None] - shift).clamp(min=0)
    return token * coff + half[None], (j % ratio) * coff + half, hole, valid


def pool(kv, score, ape, flat, ape_flat, hole, valid, *, bf16_ape: bool = False):
    """``out`` (N, d) bf16 from the window indices: fp32 softmax and weighted sum, one bf16
    rounding. ``bf16_ape``: ``score + ape.to(bf16)`` in bf16 (then fp32). Padding rows keep
    their values and lose their gradient path (``where(valid, x, x.detach())``)."""
    coff = ape_flat.shape[0] // ape.shape[0]   # window positions = coff * ratio
    d = kv.shape[1] // coff
    kv_rows = kv.reshape(-1, d)
    s_rows = score.reshape(-1, d)
    a_rows = ape.reshape(-1, d)
    kvw = kv_rows[flat].float()                                 # (N, W, d)
    if bf16_ape:
        sw = (s_rows[flat] + a_rows.to(torch.bfloat16)[ape_flat][None]).float()
    else:
        sw = s_rows[flat].float() + a_rows[ape_flat][None]
    keep = valid[:, None, None]
    kvw = torch.where(keep, kvw, kvw.detach())
    sw = torch.where(keep, sw, sw.detach())
    gap = hole[:, :, None]
    kvw = torch.where(gap, torch.zeros((), device=kvw.device), kvw)
    sw = torch.where(gap, torch.full((), float("-inf"), device=sw.device), sw)
    p = torch.softmax(sw, dim=1)
    return (p * kvw).sum(dim=1).to(torch.bfloat16)


def _autograd(fn, kv, score, ape, grad_out, *index):
    """(dkv, dscore, dape) of ``fn`` by autograd; padding rows' grad_out is zeroed too."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (kv, score, ape)]
    with torch.enable_grad():
        out = fn(*leaves, *index)
        valid = index[-1]
        go = torch.where(valid[:, None], grad_out, torch.zeros((), dtype=grad_out.dtype,
                                                               device=grad_out.device))
        if out.numel():
            out.backward(go)
    return tuple(t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves)


class _Eager:
    """The shared part of the eager built-ins: any ratio, any head dim, any device."""

    supports = Supports()

    def describe(self) -> dict[str, Any]:
        """The formulation: the first line of the class's docstring, inherited where a
        subclass (an adapter's) has none of its own."""
        doc = inspect.getdoc(type(self)) or self.name
        return {"formulation": doc.splitlines()[0]}


class EagerBf16Weights(_Eager):
    """The reference's upstream formulation: softmax weights rounded to bf16."""

    name = "eager-bf16w"

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        return ref_forward(kv, score, ape, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows,
                           precision="upstream").to(torch.bfloat16)

    def backward(self, kv, score, ape, cu, cuc, grad_out, *, ratio, coff):
        g = ref_backward(kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff,
                         precision="upstream")
        return g.dkv, g.dscore, g.dape


class _Gather(_Eager):
    """The gather formulation (``pool`` over ``window_index``) through ``_fn``, autograd for
    the backward."""

    def _fn(self, kv, score, ape, *index):
        return pool(kv, score, ape, *index)

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        if n_rows == 0:
            return torch.zeros(0, kv.shape[1] // coff, dtype=torch.bfloat16, device=kv.device)
        index = window_index(cu, cuc, n_rows, ratio, coff)
        with torch.no_grad():
            return self._fn(kv, score, ape, *index)

    def backward(self, kv, score, ape, cu, cuc, grad_out, *, ratio, coff):
        if grad_out.shape[0] == 0:
            return torch.zeros_like(kv), torch.zeros_like(score), torch.zeros_like(ape)
        index = window_index(cu, cuc, grad_out.shape[0], ratio, coff)
        return _autograd(self._fn, kv, score, ape, grad_out, *index)


class EagerBf16Ape(_Gather):
    """The gather formulation with the APE cast to bf16 and added to the bf16 score."""

    name = "eager-bf16ape"

    def _fn(self, kv, score, ape, *index):
        return pool(kv, score, ape, *index, bf16_ape=True)


class Compiled(_Gather):
    """torch.compile (Inductor, dynamic shapes) of the fp32 gather formulation."""

    name = "compiled"

    def __init__(self):
        self._compiled = None

    def _fn(self, kv, score, ape, *index):
        if self._compiled is None:
            self._compiled = torch.compile(pool, dynamic=True)
        return self._compiled(kv, score, ape, *index)


# --- the gate's own kernels -------------------------------------------------------------------

SUPPORTED_GPUS = "an H100, H200, B200 or B300 GPU"
DSL_PIN = "nvidia-cutlass-dsl==4.8.1"


def no_gpu_message(torch_version: str, cuda: str | None) -> str:
    """Why the kernels cannot run without a GPU; "a CUDA build of torch" only where torch is
    not one."""
    if cuda:
        return f"no CUDA GPU visible (torch {torch_version}, CUDA {cuda}); needs {SUPPORTED_GPUS}"
    return (f"no CUDA GPU visible (torch {torch_version}, a CPU-only build); needs "
            f"{SUPPORTED_GPUS} and a CUDA build of torch")


def kernels_unavailable(device: torch.device) -> str | None:
    """Why the gate's own kernels cannot run on ``device`` (one line), or None: the device, the
    GPU, its arch, then nvidia-cutlass-dsl (imported last, after the GPU is known)."""
    if device.type != "cuda":
        return ("the gate's own kernels need a CUDA GPU; on the CPU only CPU-capable "
                "implementations are judged")
    if not torch.cuda.is_available():
        return no_gpu_message(torch.__version__, torch.version.cuda)
    from csagate.kernels._dsl import device_arch, dsl_available
    from csagate.kernels.schedule import ARCHES

    index = device.index or 0
    arch = device_arch(index)
    if arch not in ARCHES:
        return (f"{torch.cuda.get_device_name(index)} (cuda:{index}) is {arch}; the kernels "
                f"are built for {', '.join(ARCHES)}: run on {SUPPORTED_GPUS}")
    ok, why = dsl_available()
    return None if ok else f"{why}; install it with `pip install {DSL_PIN}`"


def op_forward_backward(kv, score, ape, cu, cuc, grad_out, *, n_rows: int, ratio: int,
                        coff: int):
    """``(out, (dkv, dscore, dape))`` through the torch op users call
    (``csagate.kernels.ops.csa_compress``): its forward, then autograd with ``grad_out``; the
    leaves are fresh copies of kv, score and ape."""
    from csagate.kernels import ops

    leaves = [t.detach().clone().requires_grad_(True) for t in (kv, score, ape)]
    with torch.enable_grad():
        out = ops.csa_compress(*leaves, cu, cuc, ratio=ratio, coff=coff, n_rows=n_rows)
        out.backward(grad_out)
    return out.detach(), tuple(t.grad for t in leaves)


def _selection(direction: str, key) -> Selection | None:
    """The kernel a launch took (a ``KernelKey``), as the verdict records it."""
    if key is None:
        return None
    return Selection(direction, int(key.coff), int(key.d), key.schedule)


def _arch() -> str:
    """The build target of the current CUDA device (the driver makes the judged one current)."""
    from csagate.kernels._dsl import device_arch

    return device_arch(torch.cuda.current_device())


class _Kernels:
    """What the built-ins over the gate's kernels share: their envelope, their availability,
    their build and their dispatch tables, all through ``csagate.kernels`` on the current
    CUDA device (the driver's)."""

    supports = CSAGATE_SUPPORTS

    def unavailable(self, device: torch.device) -> str | None:
        return kernels_unavailable(device)

    def prepare(self, targets: tuple[Target, ...], progress: ProgressFn | None = None) -> list:
        """Build (or load from the cache) every kernel the tables can select for each target;
        ``progress`` counts kernels, cache hits included. BuildError on any failure."""
        from csagate.kernels import api
        from csagate.kernels.registry import keys_for
        from csagate.kernels.schedule import config_name

        arch = _arch()
        counts = [len(keys_for(ratio, arch, coff=coff, d=d)) for ratio, coff, d in targets]
        total, done = sum(counts), 0
        records: list = []
        for (ratio, coff, d), count in zip(targets, counts, strict=True):
            label = f"ratio={ratio} {config_name(coff, d)} for {arch}"
            if progress:
                progress(done, total, label)

            def tick(record, i, n, offset=done):
                if progress:
                    hit = " (cached)" if getattr(record, "hit", False) else ""
                    progress(offset + i, total, f"{record.key.tag}{hit}")

            try:
                records.extend(api.build(ratio, arch=arch, coff=coff, d=d, progress=tick)
                               or [])
            except Exception as exc:
                raise BuildError(f"building {label} failed: {one_line(exc)}") from exc
            done += count
        if progress:
            progress(total, total, "built")
        return records

    def kernels(self, ratio, direction, configs=None):
        """Every (bucket, coff, d) entry of the device's tables (``registry.entries``: bucket by
        bucket, not through the dispatcher's constants)."""
        from csagate.kernels.registry import entries

        return {k: _selection(direction, key)
                for k, key in entries(ratio, direction, _arch(), configs).items()}

    def dispatch(self, ratio, direction, coff, d, n_rows):
        from csagate.kernels.dispatch import kernel_for

        return _selection(direction, kernel_for(direction, ratio, coff, d, n_rows, _arch()))

    def describe(self) -> dict[str, Any]:
        from csagate.kernels._dsl import dsl_version

        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return {"backend": "kernels", "device": f"cuda:{index}", "gpu": props.name,
                "compute_capability": f"{props.major}.{props.minor}",
                "sm_count": props.multi_processor_count, "arch": _arch(),
                "driver": _nvidia_driver(), "cuda_driver_api": _driver_api_version(),
                "cuda_runtime": torch.version.cuda, "torch": torch.__version__,
                "nvidia_cutlass_dsl": dsl_version()}


class Csagate(_Kernels):
    """The gate's own CuTe DSL kernels (csagate.kernels.api), dispatch tables included; they
    write into the gate's buffers (every launch with ``check=True``: the gate's cu/cuc values
    are read and checked first), and the torch op over them is checked against them."""

    name = "csagate"
    label = ""               # the gate's subject: its headline names no implementation
    deterministic = True

    def forward_into(self, kv, score, ape, cu, cuc, out, *, ratio, coff):
        from csagate.kernels import api

        return _selection("fwd", api.run_forward(kv, score, ape, cu, cuc, out, ratio=ratio,
                                                 coff=coff, check=True))

    def backward_into(self, kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, *, ratio,
                      coff, deterministic=False):
        from csagate.kernels import api

        key = api.run_backward(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape,
                               ratio=ratio, coff=coff, deterministic=bool(deterministic),
                               check=True)
        return _selection("bwd", key)   # a deterministic key's schedule is its table entry

    def through_op(self, kv, score, ape, cu, cuc, grad_out, *, n_rows, ratio, coff):
        got = op_forward_backward(kv, score, ape, cu, cuc, grad_out, n_rows=n_rows,
                                  ratio=ratio, coff=coff)
        torch.cuda.synchronize()
        return got

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        out = torch.empty(n_rows, kv.shape[1] // coff, dtype=torch.bfloat16, device=kv.device)
        self.forward_into(kv, score, ape, cu, cuc, out, ratio=ratio, coff=coff)
        return out

    def backward(self, kv, score, ape, cu, cuc, grad_out, *, ratio, coff, deterministic=False):
        dkv, dscore = torch.empty_like(kv), torch.empty_like(score)
        dape = torch.zeros_like(ape)
        self.backward_into(kv, score, ape, cu, cuc, grad_out, dkv, dscore, dape, ratio=ratio,
                           coff=coff, deterministic=deterministic)
        return dkv, dscore, dape


class CsagateOp(_Kernels):
    """The torch op users call (csagate.kernels.ops.csa_compress): forward, then autograd."""

    name = "csagate-op"
    deterministic = False    # the op follows torch's deterministic flag, not an argument

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        from csagate.kernels import ops

        with torch.no_grad():
            return ops.csa_compress(kv, score, ape, cu, cuc, ratio=ratio, coff=coff,
                                    n_rows=n_rows)

    def backward(self, kv, score, ape, cu, cuc, grad_out, *, ratio, coff):
        _, grads = op_forward_backward(kv, score, ape, cu, cuc, grad_out,
                                       n_rows=grad_out.shape[0], ratio=ratio, coff=coff)
        return grads


def _nvidia_driver() -> str:
    """The kernel module's version (e.g. ``570.86.15``) from /proc, else ``unknown``."""
    import re
    from pathlib import Path

    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return "unknown"
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]+)", text)
    return found.group(1) if found else "unknown"


def _driver_api_version() -> str:
    """The CUDA driver API version as ``major.minor`` (``unknown`` if no binding answers)."""
    try:
        import cuda.bindings.driver as drv

        err, v = drv.cuDriverGetVersion()
        if int(err) == 0:
            return f"{v // 1000}.{v % 1000 // 10}"
    except Exception:
        pass
    try:
        v = torch._C._cuda_getDriverVersion()
        return f"{v // 1000}.{v % 1000 // 10}"
    except Exception:
        return "unknown"


# --- nvidia-cudnn-frontend --------------------------------------------------------------------


class Cudnn:
    """nvidia-cudnn-frontend's cudnn.csa.compressor wrappers (the released package)."""

    name = "cudnn"
    supports = Supports(ratios=(2, 4, 128), coffs=(1, 2), min_compute_capability=(10, 0))
    deterministic = True

    def __init__(self):
        self._mod = None

    @staticmethod
    def lowered_cc() -> int | None:
        """The measurement-only compute-capability major (``CSAGATE_MEASURE_CUDNN_MIN_CC``)."""
        from csagate.kernels.env import cudnn_min_cc

        return cudnn_min_cc()

    @property
    def label(self) -> str:
        cc = self.lowered_cc()
        if cc is None:
            return self.name
        return (f"{self.name} [MEASUREMENT ONLY: the package's compute-capability check "
                f"lowered to {cc}]")

    def _m(self):
        if self._mod is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import cudnn.csa.compressor as mod
                import cudnn.csa.compressor.api as api
            cc = self.lowered_cc()
            if cc is not None:
                api.MINIMUM_COMPUTE_CAPABILITY_MAJOR = cc
            # The package logs "... is an experimental API" once per API class through a
            # logger named after the class; the gate's own report says which package judged.
            for name in ("CSACompressorForward", "CSACompressorBackward"):
                logging.getLogger(name).setLevel(logging.ERROR)
            self._mod = mod
        return self._mod

    @property
    def module(self):
        """``cudnn.csa.compressor``, imported with the measurement-only constant applied."""
        return self._m()

    def unavailable(self, device: torch.device) -> str | None:
        """Not installed, or the package's own refusal (its check_support, one line)."""
        try:
            mod = self._m()
        except ImportError as exc:
            return (f"nvidia-cudnn-frontend is not importable ({one_line(exc)}); install it "
                    "with `pip install 'csagate[cudnn]'`")
        except Exception as exc:
            return f"importing cudnn.csa.compressor failed: {one_line(exc)}"
        if device.type != "cuda" or not torch.cuda.is_available():
            return "no CUDA GPU visible (needs compute capability >= 10.0)"
        kv = torch.zeros(8, 2 * 128, dtype=torch.bfloat16, device=device)
        cu = torch.tensor([0, 8], dtype=torch.int32, device=device)
        probe = mod.CSACompressorForward(
            sample_kv=kv, sample_score=kv, sample_ape=torch.zeros(4, 256, device=device),
            sample_cu_seqlens=cu, sample_cu_seqlens_comp=torch.tensor([0, 2], dtype=torch.int32,
                                                                      device=device),
            sample_out=torch.zeros(2, 128, dtype=torch.bfloat16, device=device), ratio=4,
            coff=2)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                probe.check_support()
        except Exception as exc:
            return f"nvidia-cudnn-frontend refuses: {one_line(exc)}"
        return None

    def forward(self, kv, score, ape, cu, cuc, n_rows, *, ratio, coff):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = self._m().csa_compressor_forward_wrapper(
                kv, score, ape, cu, cuc, ratio=ratio, coff=coff, total_comp=n_rows)
        return got["out"]

    def backward(self, kv, score, ape, cu, cuc, grad_out, *, ratio, coff, deterministic=False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = self._m().csa_compressor_backward_wrapper(
                kv, score, ape, cu, cuc, grad_out, ratio=ratio, coff=coff,
                deterministic=deterministic)
        return got["grad_kv"], got["grad_score"], got["grad_ape"]

    @staticmethod
    def version() -> str:
        """The installed nvidia-cudnn-frontend's version, or "not installed"."""
        from importlib import metadata

        try:
            return metadata.version("nvidia-cudnn-frontend")
        except metadata.PackageNotFoundError:
            return "not installed"

    def describe(self) -> dict[str, Any]:
        env: dict[str, Any] = {"nvidia_cudnn_frontend": self.version()}
        if self.lowered_cc() is not None:
            env["cudnn_min_cc_major"] = (f"{self.lowered_cc()} (measurement only: lowered "
                                         "from the package's 10)")
        return env

