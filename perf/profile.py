"""Nsight Compute / SASS tooling for the large shapes (GPU only).

``python -m csagate.perf.profile launch`` runs each large-shape kernel ONCE per direction
(after one untimed build-and-warm call outside the profiled range), so that
``ncu -k regex:...`` captures exactly one launch of each. The cold bench table of those shapes
and 8192 tokens is ``csagate bench`` with a ``--shape`` per entry of :func:`table_shapes`
(docs/PERF_NOTES.md section 1 has the command lines).
"""

from __future__ import annotations

import argparse
import sys

from csagate.kernels.registry import has_tables, parse_shape

# (coff, d, tokens): the four large shapes.
LARGE: tuple[tuple[int, int, int], ...] = (
    (1, 128, 131072), (2, 128, 65536), (1, 512, 65536), (2, 512, 131072))
SHORT_TOKENS = 8192


def table_shapes() -> list[tuple[int, int, int]]:
    """The large shapes plus every config at SHORT_TOKENS, in config order, no duplicates."""
    out = list(LARGE) + [(c, d, SHORT_TOKENS) for c, d, _ in LARGE]
    return sorted(dict.fromkeys(out))


def _calls(api, args, go, out, dkv, dscore, dape, coff, ratio):
    return {
        "fwd": lambda: api.run_forward(*args, out, ratio=ratio, coff=coff),
        "bwd": lambda: api.run_backward(*args, go, dkv, dscore, dape.zero_(), ratio=ratio,
                                        coff=coff),
    }


def _small_calls(ratio: int, pack, go, forms: dict) -> dict:
    """A small ratio's launchers per direction: the table's form, or ``forms[direction]``
    (a tag of ``small_bench.forms_of``: a forward form, a backward rows per CTA)."""
    from csagate.kernels._dsl import device_arch
    from csagate.perf import small_bench

    calls = {}
    for direction in ("fwd", "bwd"):
        options = small_bench.forms_of(direction, ratio, pack.coff, pack.d, pack.n_rows,
                                       device_arch())
        tag = forms.get(direction) or next(iter(options))
        if tag not in options:
            raise SystemExit(f"{direction} form {tag!r} is not one of {sorted(options)}")
        launch = small_bench.launcher(direction, pack, go, *options[tag])
        calls[direction] = (lambda launch=launch, tag=tag: (launch(zero_dape=True), tag)[1])
    return calls


def launch_once(shapes, directions=("fwd", "bwd"), *, warm: bool = True, ratio: int = 128,
                forms: dict | None = None) -> list[str]:
    """Run each shape's kernel once per direction; returns 'direction shape kernel-tag' lines.

    With ``warm`` the first call of each (which builds the kernel) runs before
    ``cudaProfilerStart``; run ncu with ``--profile-from-start off`` to skip it, or count the
    launches with ``--launch-skip 1 --launch-count 1`` per kernel regex.
    """
    import torch
    from csagate.kernels import api
    from csagate.reference import make_grad_out, make_pack

    lines = []
    for coff, d, tokens in shapes:
        pack = make_pack((tokens,), ratio=ratio, coff=coff, d=d, device="cuda")
        args = pack.inputs()
        go = make_grad_out(pack.n_rows, d, device="cuda")
        out = torch.empty(pack.n_rows, d, dtype=torch.bfloat16, device="cuda")
        dkv, dscore = torch.empty_like(pack.kv), torch.empty_like(pack.score)
        dape = torch.zeros_like(pack.ape)
        if has_tables(ratio):
            calls = _calls(api, args, go, out, dkv, dscore, dape, coff, ratio)
        else:
            calls = _small_calls(ratio, pack, go, forms or {})
        for direction in directions:
            if warm:
                calls[direction]()
                torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            key = calls[direction]()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            lines.append(f"r{ratio} {direction} c{coff}d{d}:{tokens} "
                         f"{getattr(key, 'tag', key)}")
        del pack, go, out, dkv, dscore, dape
        torch.cuda.empty_cache()
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m csagate.perf.profile", description=__doc__)
    sub = ap.add_subparsers(dest="what", required=True)
    la = sub.add_parser("launch", help="one launch per direction per large shape (for ncu)")
    la.add_argument("--shape", action="append", default=None, metavar="cCOFFdD:TOKENS")
    la.add_argument("--direction", choices=("fwd", "bwd", "all"), default="all")
    la.add_argument("--ratio", type=int, default=128, help="128 or a small ratio")
    la.add_argument("--fwd-form", default=None, help="a small ratio's forward form tag")
    la.add_argument("--bwd-form", default=None, help="a small ratio's backward form tag")
    ns = ap.parse_args(argv)
    try:
        shapes = [parse_shape(s) for s in ns.shape] if ns.shape else list(LARGE)
    except ValueError as exc:
        ap.error(str(exc))
    dirs = ("fwd", "bwd") if ns.direction == "all" else (ns.direction,)
    forms = {"fwd": ns.fwd_form, "bwd": ns.bwd_form}
    for line in launch_once(shapes, dirs, ratio=ns.ratio, forms=forms):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
