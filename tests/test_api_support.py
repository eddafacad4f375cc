"""csagate.kernels.api on CPU: every check_support rule (meta tensors for the shape-only rules),
the cu/cuc value rules of ``check=True`` (kernels/validate.check_values, on CPU tensors), the
dispatch decision, and the guards that fire before anything launches.

The upstream message fragments are matched, so callers can rely on them (upstream's
"check_support" tests). The alignment and same-device rules need CUDA tensors: tests/gpu/.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from csagate.kernels import api, dispatch, launch, registry, validate
from csagate.kernels import schedule as S

BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32


def tensors(*, ratio=4, coff=2, d=128, T=512, N=128, B=2, device="meta", **override):
    width = coff * d
    t = {
        "kv": torch.empty(T, width, dtype=BF16, device=device),
        "score": torch.empty(T, width, dtype=BF16, device=device),
        "ape": torch.empty(ratio, width, dtype=F32, device=device),
        "cu": torch.empty(B + 1, dtype=I32, device=device),
        "cuc": torch.empty(B + 1, dtype=I32, device=device),
        "out": torch.empty(N, d, dtype=BF16, device=device),
    }
    t.update(override)
    return t


def check(t, *, ratio=4, coff=2, out_name="out"):
    api.check_support(t["kv"], t["score"], t["ape"], t["cu"], t["cuc"], t["out"],
                      ratio=ratio, coff=coff, out_name=out_name)


@pytest.mark.parametrize("coff", [1, 2])
def test_accepts_ratio4(coff):
    check(tensors(ratio=4, coff=coff, d=128, T=512, N=128), ratio=4, coff=coff)


@pytest.mark.parametrize("coff", [1, 2])
@pytest.mark.parametrize("d", [128, 512])
def test_accepts_ratio128(coff, d):
    check(tensors(ratio=128, coff=coff, d=d, T=1024, N=8), ratio=128, coff=coff)


def test_accepts_without_out_and_with_empty_out():
    t = tensors(N=0, T=3)  # N == 0: fewer tokens than ratio is fine, nothing launches
    api.check_support(t["kv"], t["score"], t["ape"], t["cu"], t["cuc"], ratio=4, coff=2)
    check(t)


def test_ratio128_rejects_coff3():
    with pytest.raises(ValueError, match="ratio=128 supports coff"):
        check(tensors(ratio=128, coff=3, d=128, T=1024, N=8), ratio=128, coff=3)


def test_rejects_other_ratio_listing_the_served_ones():
    served = sorted({ratio for ratio, _ in registry.FAMILIES})
    assert list(api.RATIOS) == list(dict.fromkeys(r for r, _ in registry.FAMILIES))
    unserved = max(served) + 1
    with pytest.raises(ValueError, match=rf"ratio must be one of \[.*\], got {unserved}$") as e:
        check(tensors(ratio=2), ratio=unserved)
    assert all(str(r) in str(e.value) for r in served)


@pytest.mark.parametrize("ratio", ["128", 4.0, None, True])
def test_rejects_a_ratio_that_is_not_an_int(ratio):
    with pytest.raises(ValueError, match="ratio must be an int") as e:
        check(tensors(), ratio=ratio)
    assert "\n" not in str(e.value) and repr(ratio) in str(e.value)
    with pytest.raises(ValueError, match="ratio must be an int"):
        api.kernel_for("fwd", ratio, 1, 128, 8, "sm_90a")


@pytest.mark.parametrize("ratio", [2, 8, 16, 32])
def test_small_ratios_accepted(ratio):
    """Every small ratio is in the envelope with ape (ratio, coff*d), at both coffs."""
    for coff in (1, 2):
        check(tensors(ratio=ratio, coff=coff, d=128, T=4 * ratio, N=4), ratio=ratio, coff=coff)
    with pytest.raises(ValueError, match=r"ape shape .* must be \(ratio, coff\*head_dim\)"):
        check(tensors(ratio=4, coff=1), ratio=ratio, coff=1)


def test_ratio2_refuses_an_odd_width():
    """ratio=2 with an odd coff*head_dim: dAPE (2*W fp32) is not a whole number of 16-byte
    vectors; one line, before any launch. coff=2 serves the same d."""
    with pytest.raises(ValueError, match="multiple of 4"):
        check(tensors(ratio=2, coff=1, d=65, T=64, N=4), ratio=2, coff=1)
    check(tensors(ratio=2, coff=2, d=65, T=64, N=4), ratio=2, coff=2)


@pytest.mark.parametrize("coff", [3, 0])
def test_rejects_coff(coff):
    with pytest.raises(ValueError, match="coff in"):
        check(tensors(coff=max(coff, 1)), ratio=4, coff=coff)


def test_rejects_fp16_kv():
    t = tensors()
    t["kv"] = t["kv"].to(torch.float16)
    with pytest.raises(ValueError, match="kv"):
        check(t)


def test_rejects_bf16_ape():
    t = tensors()
    t["ape"] = t["ape"].to(BF16)
    with pytest.raises(ValueError, match="ape"):
        check(t)


@pytest.mark.parametrize("which", ["cu", "cuc"])
def test_rejects_int64_offsets(which):
    t = tensors()
    t[which] = t[which].to(torch.int64)
    with pytest.raises(ValueError, match="cu_seqlens"):
        check(t)


def test_rejects_fp32_out():
    t = tensors()
    t["out"] = t["out"].float()
    with pytest.raises(ValueError, match="out"):
        check(t)


def test_grad_out_is_named():
    t = tensors()
    t["out"] = t["out"].float()
    with pytest.raises(ValueError, match="grad_out must be"):
        check(t, out_name="grad_out")


def test_rejects_score_shape():
    t = tensors(score=torch.empty(511, 256, dtype=BF16, device="meta"))
    with pytest.raises(ValueError, match="score shape"):
        check(t)


def test_rejects_ape_shape():
    t = tensors(ape=torch.empty(128, 256, dtype=F32, device="meta"))  # ratio 4 needs (4, 256)
    with pytest.raises(ValueError, match="ape shape"):
        check(t)


def test_rejects_cuc_length():
    t = tensors(cuc=torch.empty(4, dtype=I32, device="meta"))
    with pytest.raises(ValueError, match=r"B \+ 1"):
        check(t)


def test_rejects_single_entry_cu():
    t = tensors(cu=torch.empty(1, dtype=I32, device="meta"),
                cuc=torch.empty(1, dtype=I32, device="meta"))
    with pytest.raises(ValueError, match=r"cu_seqlens must be 1-D with B \+ 1 >= 2"):
        check(t)


@pytest.mark.parametrize("name", ["kv", "out"])
def test_rejects_non_2d(name):
    t = tensors()
    t[name] = t[name].reshape(-1)
    with pytest.raises(ValueError, match=name):
        check(t)


def test_rejects_width_not_multiple_of_coff():
    t = tensors(coff=1, d=127)  # width 127 at coff=2
    t["ape"] = torch.empty(4, 127, dtype=F32, device="meta")
    with pytest.raises(ValueError, match="coff\\*head_dim"):
        check(t, coff=2)


def test_rejects_out_width():
    t = tensors(out=torch.empty(128, 64, dtype=BF16, device="meta"))
    with pytest.raises(ValueError, match=r"out must be \(N, head_dim\)"):
        check(t)


def test_rejects_int32_flat_offsets():
    with pytest.raises(ValueError, match="int32 flat offsets"):
        check(tensors(T=2**25))  # 2^25 tokens x 256 columns = 2^33


def test_rejects_int32_flat_offsets_of_out():
    with pytest.raises(ValueError, match="int32 flat offsets"):
        check(tensors(coff=1, d=65536, T=8, N=2**15), coff=1)  # 2^15 rows x 65536 = 2^31


def test_rejects_head_dim_limit():
    assert validate.MAX_HEAD_DIM == 8388480
    check(tensors(coff=1, d=8388480, T=4, N=1, ape=torch.empty(4, 8388480, dtype=F32,
                                                                 device="meta")), coff=1)
    with pytest.raises(ValueError, match="head_dim"):
        check(tensors(coff=1, d=8388482, T=512, N=128), coff=1)


def test_rejects_fewer_tokens_than_ratio():
    with pytest.raises(ValueError, match="requires at least ratio"):
        check(tensors(T=3, N=1))


def test_rejects_non_contiguous():
    t = tensors()
    t["kv"] = torch.empty(256, 512, dtype=BF16, device="meta").t()  # (512, 256), strided
    with pytest.raises(ValueError, match="contiguous"):
        check(t)


@pytest.mark.parametrize("d", [96, 256])
def test_ratio128_head_dims(d):
    with pytest.raises(ValueError, match="ratio=128 is validated for head_dim"):
        check(tensors(ratio=128, coff=1, d=d, T=1024, N=8), ratio=128, coff=1)


def test_rejects_cpu_tensor():
    t = tensors()
    t["kv"] = torch.zeros(512, 256, dtype=BF16)
    with pytest.raises(ValueError, match="CUDA"):
        check(t)


def test_rejects_non_tensor():
    t = tensors()
    t["ape"] = [[0.0] * 256] * 4
    with pytest.raises(ValueError, match="ape must be a torch.Tensor"):
        check(t)


def test_grad_buffers_checked():
    t = tensors()
    good = dict(dkv=torch.empty_like(t["kv"]), dscore=torch.empty_like(t["kv"]),
                dape=torch.empty_like(t["ape"]))
    validate.check_grad_buffers(t["kv"], t["ape"], **good)
    for name, bad, match in (
        ("dkv", torch.empty(512, 256, dtype=F32, device="meta"), "dkv must be"),
        ("dscore", torch.empty(511, 256, dtype=BF16, device="meta"), "dscore shape"),
        ("dape", torch.empty(4, 256, dtype=BF16, device="meta"), "dape must be"),
        ("dape", torch.empty(256, 4, dtype=F32, device="meta").t(), "dape must be contiguous"),
    ):
        with pytest.raises(ValueError, match=match):
            validate.check_grad_buffers(t["kv"], t["ape"], **{**good, name: bad})


# --- dispatch --------------------------------------------------------------------------


@pytest.mark.parametrize("coff,d", S.CONFIGS)
def test_kernel_for_follows_the_tables(coff, d):
    for arch in S.TABLE_ARCHES:
        for n in (1, 128, 129, 192, 193, 1023, 1024, 5000):
            fwd = api.kernel_for("fwd", 128, coff, d, n, arch)
            bwd = api.kernel_for("bwd", 128, coff, d, n, arch)
            assert fwd.schedule == S.select_fwd(coff, d, n, arch) and fwd.kind == "r128fwd"
            assert bwd.schedule == S.select_bwd(coff, d, n, arch) and bwd.kind == "r128bwd"
            assert (fwd.ratio, fwd.coff, fwd.d, fwd.arch) == (128, coff, d, arch)


def test_kernel_for_nothing_when_empty():
    assert api.kernel_for("fwd", 128, 1, 128, 0, "sm_90a") is None
    assert api.kernel_for("bwd", 4, 2, 128, 0, "sm_90a") is None
    with pytest.raises(ValueError, match="direction"):
        api.kernel_for("up", 4, 2, 128, 1, "sm_90a")


@pytest.mark.parametrize("ratio,coff,d", [(128, 1, 128), (4, 2, 128), (16, 1, 64)])
def test_a_launch_checks_its_ratio_once(monkeypatch, ratio, coff, d):
    """The envelope check validates the ratio; what a launch does with it afterwards (the
    head dims, rows_per_cta, the dispatch, the key and its family) trusts that check."""
    checked = []
    real = registry.check_ratio
    monkeypatch.setattr(registry, "check_ratio", lambda r: checked.append(r) or real(r))
    t = tensors(ratio=ratio, coff=coff, d=d, T=1024, N=8)
    for direction in registry.DIRECTIONS:
        checked.clear()
        check(t, ratio=ratio, coff=coff, out_name="out" if direction == "fwd" else "grad_out")
        if direction == "bwd":
            validate.check_rows_per_cta(ratio, 1 if ratio != 128 else None)
        key = dispatch.select(direction, ratio, coff, d, 8, "sm_90a")
        assert key.family.direction == direction and key.family.ratio == ratio
        assert checked == [ratio], direction


def test_a_key_refuses_a_ratio_or_direction_no_family_serves():
    sched = api.kernel_for("fwd", 4, 2, 128, 8, "sm_90a").schedule
    with pytest.raises(ValueError, match="ratio must be one of"):
        registry.make_key("fwd", 5, 2, 128, sched, "sm_90a")
    with pytest.raises(ValueError, match="direction must be"):
        registry.make_key("up", 4, 2, 128, sched, "sm_90a")


# --- guards before any launch ----------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_launch_without_cuda_is_a_runtime_error():
    t = tensors()
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        api.forward(t["kv"], t["score"], t["ape"], t["cu"], t["cuc"], ratio=4, coff=2,
                    n_rows=128)
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        api.run_forward(t["kv"], t["score"], t["ape"], t["cu"], t["cuc"], t["out"], ratio=4,
                        coff=2)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        api.build(4)


@pytest.fixture
def deterministic():
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _backward(t):
    return api.backward(t["kv"], t["score"], t["ape"], t["cu"], t["cuc"], t["out"], ratio=4,
                        coff=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the launch itself is a GPU test")
def test_deterministic_mode_follows_torch_and_no_longer_refuses(deterministic):
    assert api._deterministic(True) and not api._deterministic(False)
    torch.use_deterministic_algorithms(False)
    assert not api._deterministic(None)
    for warn_only in (False, True):
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
        assert api._deterministic(None) and not api._deterministic(False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(RuntimeError, match="CUDA is not available"):
                _backward(tensors())
        assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]


def test_kernel_modules_take_the_keywords_the_api_passes():
    """The api <-> kernel-module contract: a renamed keyword fails here, not on the GPU."""
    import inspect

    from csagate.kernels._dsl import dsl_available

    ok, why = dsl_available()
    if not ok:
        pytest.skip(why)
    from csagate.kernels import r128_bwd, r128_fwd
    from csagate.kernels import small as r4

    x = object()
    inputs = dict(kv=x, score=x, ape=x, cu=x, cuc=x)
    grads = dict(grad_out=x, dkv=x, dscore=x, dape=x)
    # launches go to torch's current stream (the TVM-FFI environment stream): no stream arg
    inspect.signature(r4.launch_fwd).bind(x, sched=x, **inputs, out=x)
    inspect.signature(r4.launch_bwd).bind(x, sched=x, **inputs, **grads)
    inspect.signature(r128_fwd.launch_fwd).bind(x, sched=x, **inputs, out=x)
    inspect.signature(r128_bwd.launch_bwd).bind(x, sched=x, **inputs, **grads, rows_per_cta=1)
    with pytest.raises(TypeError):
        inspect.signature(r128_fwd.launch_fwd).bind(x, sched=x, **inputs, out=x, stream=x)
    inspect.signature(r4.build_bwd).bind(d=128, coff=1, arch="sm_90a", ratio=2)
    for build, kw in ((r4.build_fwd, {}), (r4.build_bwd, {}), (r128_fwd.build_fwd, {"sched": x}),
                      (r128_bwd.build_bwd, {"sched": x})):
        inspect.signature(build).bind(d=128, coff=1, arch="sm_90a", **kw)


def test_importing_the_api_does_not_import_sympy():
    """torch's symbolic-shape helpers (and sympy, a second of import) load only when a rule
    meets a symbolic size: a process that never traces does not pay for them."""
    import subprocess
    import sys

    code = ("import sys, torch; from csagate.kernels import api, validate; "
            "assert 'sympy' not in sys.modules, 'sympy imported'; "
            "assert validate.guard_or_false(True) and not validate.guard_or_false(False)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


# --- check=True: the cu/cuc values (read on the host) ---------------------------------------


def offsets(lens, ratio=4, **cuc_fix):
    """cu, cuc (CPU int32) of segments ``lens``; ``cuc_fix`` {index: value} overrides cuc."""
    cu = torch.tensor([0, *lens], dtype=I32).cumsum(0, dtype=I32)
    cuc = torch.tensor([0, *(n // ratio for n in lens)], dtype=I32).cumsum(0, dtype=I32)
    for i, v in cuc_fix.items():
        cuc[int(i[1:])] = v
    return cu, cuc


def values(cu, cuc, *, ratio=4, T=None, N=None):
    validate.check_values(cu, cuc, ratio=ratio, n_tokens=int(cu[-1]) if T is None else T,
                          n_rows=N, out_name="out")


@pytest.mark.parametrize("ratio,lens", [(4, (9, 0, 4, 3)), (128, (300, 128, 5)), (4, (0,))])
def test_check_values_accepts_a_pack(ratio, lens):
    cu, cuc = offsets(lens, ratio)
    values(cu, cuc, ratio=ratio, N=int(cuc[-1]))
    values(cu, cuc, ratio=ratio, T=int(cu[-1]) + 7, N=int(cuc[-1]) + 3)  # padding: fine


def _bad_packs():
    cu, cuc = offsets((8, 8))
    yield r"cu_seqlens\[0\] must be 0, got 1", cu + 1, cuc, {}
    yield r"cu_seqlens must be non-decreasing: cu_seqlens\[2\] = 4 < cu_seqlens\[1\] = 8", \
        torch.tensor([0, 8, 4], dtype=I32), torch.tensor([0, 2, 2], dtype=I32), {}
    yield r"cu_seqlens\[-1\] = 16 exceeds T = 15", cu, cuc, {"T": 15}
    yield r"cu_seqlens_comp\[0\] must be 0, got 1", cu, offsets((8, 8), c0=1)[1], {}
    yield (r"cu_seqlens_comp\[2\] - cu_seqlens_comp\[1\] = 3 must be "
           r"\(cu_seqlens\[2\] - cu_seqlens\[1\]\) // ratio = 2"), cu, offsets((8, 8), c2=5)[1], {}
    yield r"cu_seqlens_comp\[-1\] = 4 exceeds N = 3 \(out rows\)", cu, cuc, {"N": 3}


@pytest.mark.parametrize("rule,cu,cuc,kw", list(_bad_packs()),
                         ids=["cu0", "monotonic", "cu-T", "cuc0", "rows", "cuc-N"])
def test_check_values_names_the_broken_rule(rule, cu, cuc, kw):
    with pytest.raises(ValueError, match=rule) as e:
        values(cu, cuc, **kw)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_check_is_opt_in_on_every_launch():
    """check defaults off (the values are the caller's promise) on the four launches."""
    import inspect

    for fn in (api.forward, api.backward, api.run_forward, api.run_backward):
        assert inspect.signature(fn).parameters["check"].default is False, fn.__name__


# --- the one fast path (kernels/launch.py), with recording stand-ins for compiled functions -


@pytest.fixture
def fast():
    launch.FAST.clear()
    yield launch.FAST
    launch.FAST.clear()
    launch.PARTIALS_FILL = None


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


def _remembered(fast, direction, deterministic=False, *, ratio=4, coff=2, d=128, n=8, tail=(),
                seg_bits=True, gx=None, stage=0):
    """A remembered signature of CPU tensors (get_device() == -1) with recording calls
    (``gx`` partial slices and ``stage`` rows: the deterministic backward)."""
    key = object()
    call, red = Recorder(), (Recorder() if gx else None)
    if direction == "fwd":
        tmpl = torch.empty((1, 1), dtype=BF16).expand(n, d)
    elif gx:
        tmpl = torch.empty((1, 1, 1)).expand(gx + stage, ratio, coff * d)
    else:
        tmpl = None
    fast[(direction, deterministic, ratio, coff, coff * d, -1, n)] = launch.Entry(
        key, call, tail, seg_bits, 10**6, tmpl, red and (red, gx, stage))
    return key, call, red


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU stand-ins for the compiled calls")
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_one_host_path_per_call(fast, direction):
    """A remembered call walks the api and the launch module only; a miss enters the full path
    from inside the launch module (never the launch module again after leaving it), whose one
    validation refuses CPU tensors (perf/host_walk.py; tests/gpu/test_host_path.py on a GPU)."""
    from csagate.perf.host_walk import HOST_PATH, walk

    t = tensors(device="cpu", N=8)
    inputs = (t["kv"], t["score"], t["ape"], t["cu"], t["cuc"])
    if direction == "fwd":
        def run():
            return api.forward(*inputs, ratio=4, coff=2, n_rows=8)
    else:
        def run():
            return api.backward(*inputs, t["out"], ratio=4, coff=2)

    def refused():
        with pytest.raises(ValueError, match="must be a CUDA tensor"):
            run()

    names = [f"csagate.kernels.{m}" for m in ("api", "launch", "validate")]
    seen = walk(refused).on(HOST_PATH)
    assert (seen.entered, seen.reentered) == (names, [])
    _remembered(fast, direction)
    seen = walk(run).on(HOST_PATH)
    assert (seen.entered, seen.reentered) == (names[:2], [])


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU stand-ins for the compiled calls")
def test_fast_path_forward_launches_and_allocates(fast):
    t = tensors(device="cpu", N=8)
    key, call, _ = _remembered(fast, "fwd")
    inputs = (t["kv"], t["score"], t["ape"], t["cu"], t["cuc"])
    assert api.run_forward(*inputs, t["out"], ratio=4, coff=2) is key
    assert call.calls[-1][:6] == (*inputs, t["out"]) and call.calls[-1][6:] == (2,)  # B=2: 2 bits
    out = api.forward(*inputs, ratio=4, coff=2, n_rows=8)
    assert out.shape == (8, 128) and out.dtype == BF16 and out.is_contiguous()
    assert call.calls[-1][5] is out and len(call.calls) == 2
    # what the fast path cannot decide goes to the full path: its argument checks come first
    # (CPU tensors, a coff that does not fit, too few tokens), before the device's
    for bad, rule in (({"ratio": 4, "coff": 2, "check": True}, "must be a CUDA tensor"),
                      ({"ratio": 4, "coff": 1}, r"out must be \(N, head_dim\)")):
        with pytest.raises(ValueError, match=rule):
            api.run_forward(*inputs, t["out"], **bad)
    few = tensors(device="cpu", N=8, T=3)
    with pytest.raises(ValueError, match="requires at least ratio=4 tokens"):
        api.run_forward(few["kv"], few["score"], few["ape"], few["cu"], few["cuc"], few["out"],
                        ratio=4, coff=2)
    assert len(call.calls) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU stand-ins for the compiled calls")
def test_fast_path_backward_atomic_and_deterministic(fast):
    t = tensors(device="cpu", N=8)
    inputs = (t["kv"], t["score"], t["ape"], t["cu"], t["cuc"], t["out"])
    grads = (torch.empty_like(t["kv"]), torch.empty_like(t["score"]), torch.empty_like(t["ape"]))
    key, call, _ = _remembered(fast, "bwd", tail=(5,), seg_bits=False)  # r128-like: rows only
    assert api.run_backward(*inputs, *grads, ratio=4, coff=2, deterministic=False) is key
    assert call.calls[-1] == (*inputs, *grads, 5, 0)  # zero_dape=False: the flag 0
    dkv, dscore, dape = api.backward(*inputs, ratio=4, coff=2, deterministic=False)
    assert call.calls[-1][6:9] == (dkv, dscore, dape) and call.calls[-1][9:] == (5, 1)
    key, call, _ = _remembered(fast, "bwd", tail=(5,))  # small ratios: segment bits, rows
    assert api.run_backward(*inputs, *grads, ratio=4, coff=2, deterministic=False) is key
    assert call.calls[-1] == (*inputs, *grads, 2, 5, 0)
    for gx, stage in ((3, 0), (300, 19)):  # the one-pass and the split reduction
        key, call, red = _remembered(fast, "bwd", True, gx=gx, stage=stage, tail=(4,))
        launch.PARTIALS_FILL = float("nan")
        assert api.run_backward(*inputs, *grads, ratio=4, coff=2, deterministic=True,
                                zero_dape=True) is key
        args = call.calls[-1]
        partials = args[8]
        assert args[:8] == (*inputs, *grads[:2]) and args[9:] == (2, 4, 0)  # bits, rows, 0
        assert partials.shape == grads[2].shape and torch.isnan(partials).all()
        flat, dape_flat, n_parts, n_groups, zero = red.calls[-1]
        assert flat.numel() == (gx + stage) * grads[2].numel()
        assert flat.data_ptr() == partials.data_ptr() and (n_parts, n_groups) == (gx, stage)
        assert dape_flat.data_ptr() == grads[2].data_ptr() and zero == 1


def test_small_backward_rows_per_cta_bounded_by_its_schedule():
    """An explicit rows_per_cta above a small-ratio schedule's most is refused with one line;
    at or below it, the grid follows it."""
    from csagate.kernels import registry
    from csagate.kernels.small_schedule import small_schedule

    for ratio, coff in ((4, 2), (32, 2)):
        sched = small_schedule("bwd", 128, ratio=ratio, coff=coff)
        key = registry.make_key("bwd", ratio, coff, 128, sched, "sm_90a")
        assert launch.bwd_ctas(key, 100, sched.rows_per_cta, 0) == (
            -(-100 // sched.rows_per_cta), sched.rows_per_cta)
        with pytest.raises(ValueError, match=f"exceeds the {sched.rows_per_cta} rows per CTA"):
            launch.bwd_ctas(key, 100, sched.rows_per_cta + 1, 0)


# --- a CPU-only machine: the arguments first, then the device --------------------------------


def _cpu(**override):
    t = tensors(ratio=128, coff=1, device="cpu", N=2, **override)
    return t["kv"], t["score"], t["ape"], t["cu"], t["cuc"]


def _op_error(call) -> str:
    with pytest.raises(ValueError) as err:
        call()
    return str(err.value)


@pytest.mark.parametrize("bad", ["ratio", "dtype", "shape"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_api_validates_arguments_before_the_device_as_the_op_does(bad, direction):
    from csagate.kernels import ops

    ratio = 5 if bad == "ratio" else 128
    override = {}
    if bad == "dtype":
        override["ape"] = torch.empty(128, 128, dtype=BF16)
    if bad == "shape":
        override["score"] = torch.empty(64, 128, dtype=BF16)
    ins = _cpu(**override)
    go = torch.empty(2, 128, dtype=BF16)
    if direction == "fwd":
        api_msg = _op_error(lambda: api.forward(*ins, ratio=ratio, coff=1, n_rows=2))
        op_msg = _op_error(lambda: torch.ops.csagate.csa_compress_fwd(*ins, ratio, 1, 2))
    else:
        api_msg = _op_error(lambda: api.backward(*ins, go, ratio=ratio, coff=1))
        op_msg = _op_error(lambda: torch.ops.csagate.csa_compress_bwd(*ins, go, ratio, 1))
    assert api_msg == op_msg and "\n" not in api_msg
    assert "CUDA" not in api_msg
    if bad == "ratio":
        assert api_msg == "ratio must be one of [2, 4, 8, 16, 32, 128], got 5"
    del ops


def test_api_valid_cpu_arguments_get_the_ops_device_error():
    ins = _cpu()
    with pytest.raises(ValueError, match=r"^kv must be a CUDA tensor \(or meta for checks\), "
                                         r"got device cpu$"):
        api.forward(*ins, ratio=128, coff=1, n_rows=2)


def test_ratio_and_coff_lists_are_sorted():
    with pytest.raises(ValueError) as e:
        registry.check_ratio(3)
    listed = [int(x) for x in str(e.value).split("[")[1].split("]")[0].split(",")]
    assert listed == sorted(listed)


def test_meta_op_without_n_rows_is_one_clear_line():
    from csagate.kernels import ops

    t = tensors(ratio=128, coff=1, T=256)
    with pytest.raises(ValueError, match="^meta tensors need n_rows") as e:
        ops.csa_compress(t["kv"], t["score"], t["ape"], t["cu"], t["cuc"], ratio=128, coff=1)
    assert "\n" not in str(e.value)


def test_meta_op_refuses_t_below_ratio_as_check_support_does():
    from csagate.kernels import ops

    t = tensors(ratio=128, coff=1, T=100, N=2)
    with pytest.raises(ValueError) as api_err:
        check(t, ratio=128, coff=1)
    with pytest.raises(ValueError) as op_err:
        ops.csa_compress(t["kv"], t["score"], t["ape"], t["cu"], t["cuc"], ratio=128, coff=1,
                         n_rows=2)
    assert str(op_err.value) == str(api_err.value)
    assert "requires at least ratio=128 tokens" in str(op_err.value)
