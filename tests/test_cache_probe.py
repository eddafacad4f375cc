"""The compile cache (keys, compile-once, capture guard) and the register probe, on CPU.

The probe tests compile through the process-wide cache, and pick kernels the CLI tests
compile too, so the suite pays for each kernel once.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections import Counter

import pytest
from csagate.kernels import cache as C
from csagate.kernels import schedule as S
from csagate.kernels import small_schedule as SS
from csagate.kernels.cache import KernelCache
from csagate.kernels.registry import keys_for, make_key
from csagate.kernels.small_schedule import small_schedule as _small_schedule


def _bwd_tag(d: int) -> str:
    """The sm_90a table's ratio-4 coff-2 backward schedule tag at head dim d."""
    return _small_schedule("bwd", d, ratio=4, coff=2, arch="sm_90a").tag


@pytest.mark.parametrize("arch", S.ARCHES)
def test_r128_keys_are_the_table_kernels(arch):
    keys = keys_for(128, arch)
    assert len(set(keys)) == len(keys)
    assert {((k.coff, k.d), k.schedule) for k in keys if k.direction == "fwd"} == \
        S.selectable("fwd", arch)
    assert {((k.coff, k.d), k.schedule) for k in keys if k.direction == "bwd"} == \
        S.selectable("bwd", arch)
    assert all(k.arch == arch and k.ratio == 128 and not k.deterministic for k in keys)


def test_tags_are_injective():
    """One tag per kernel over every ratio, direction, config and arch's tables, the
    deterministic twins included (a tag names a kernel in the probe, build and cache tables)."""
    from csagate.kernels.registry import RATIOS

    for arch in S.ARCHES:
        keys = {k for ratio in RATIOS for k in keys_for(ratio, arch)}
        keys |= {dataclasses.replace(k, deterministic=True) for k in keys
                 if k.direction == "bwd"}
        tags = Counter(k.tag for k in keys)
        assert len(tags) == len(keys), [t for t, n in tags.items() if n > 1]


def test_r128_tags_read_like_the_upstream_probe():
    """The upstream (sm_100a) tables: tags name their fields."""
    tags = {k.tag for k in keys_for(128, "sm_100a")}
    assert "fwd_c1d128_v4t4x32_fastexp_form_twophase" in tags  # F3, the only two-phase
    assert "fwd_c1d128_v2t8x32" in tags           # F1, exact exp
    assert "bwd_c2d128_v2t8x32_fastexp_goreuse" in tags  # B4
    assert "bwd_c1d128_v1t8x32_goreuse" in tags   # B1, vec=1 small bucket


@pytest.mark.parametrize("coff,d", S.CONFIGS)
def test_r128_keys_narrow_by_config(coff, d):
    every = keys_for(128, "sm_100a")
    keys = keys_for(128, "sm_100a", coff=coff, d=d)
    assert keys == [k for k in every if (k.coff, k.d) == (coff, d)]
    assert {k.direction for k in keys} == {"fwd", "bwd"}


def test_r128_keys_reject_other_head_dims():
    with pytest.raises(ValueError, match="ratio=128 is validated for head_dim"):
        keys_for(128, "sm_90a", d=96)
    with pytest.raises(ValueError, match="ratio must be one of"):
        keys_for(64, "sm_90a")


def need_dsl():
    """Skip without the DSL; import it through csagate.kernels._dsl (which sets CUTE_DSL_KEEP=ptx
    first: a bare ``import cutlass`` here would turn PTX retention off for the whole test run)."""
    from csagate.kernels._dsl import dsl_available

    ok, why = dsl_available()
    if not ok:
        pytest.skip(why)


def test_r4_keys():
    need_dsl()
    keys = keys_for(4, "sm_90a")
    assert len(set(keys)) == len(keys) and len({k.tag for k in keys}) == len(keys)
    # one forward and one backward per coff and build head dim
    assert sorted((k.coff, k.d, k.direction) for k in keys) == sorted(
        (c, d, direction) for c in S.COFFS for d in SS.SMALL_HEAD_DIMS
        for direction in ("fwd", "bwd"))
    tags = {k.tag for k in keys}
    assert {"r4fwd_c2d128_v2", "r4fwd_c1d65_v1", f"r4bwd_c2d128_{_bwd_tag(128)}"} <= tags
    assert [k.tag for k in keys_for(4, "sm_90a", coff=2, d=192)] == \
        ["r4fwd_c2d192_v2", f"r4bwd_c2d192_{_bwd_tag(192)}"]


# --- cache behaviour (fake compiler: no DSL needed) -------------------------------------

KEY = make_key("fwd", 4, 2, 128, SS.SmallSchedule(2, 64, 1), "sm_90a")
OTHER = make_key("bwd", 4, 2, 128, SS.SmallSchedule(1, 128, 8), "sm_90a")


class SlowCompiler:
    def __init__(self):
        self.calls = Counter()

    def __call__(self, key):
        self.calls[key] += 1
        time.sleep(0.05)
        return object()


def test_concurrent_first_calls_compile_once():
    compiler = SlowCompiler()
    cache = KernelCache(compiler)
    got = []
    threads = [threading.Thread(target=lambda: got.append(cache.get(KEY))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert compiler.calls[KEY] == 1 and len({id(fn) for fn in got}) == 1
    stats = cache.stats()
    assert stats["misses"] == 1 and stats["hits"] == 7 and stats["entries"] == 1


def test_build_records_hits_and_progress():
    cache = KernelCache(SlowCompiler())
    cache.get(KEY)
    seen = []
    records = cache.build([KEY, OTHER], progress=lambda rec, i, n: seen.append((rec.key, i, n)))
    assert [(r.key, r.hit) for r in records] == [(KEY, True), (OTHER, False)]
    assert all(r.seconds >= 0.05 for r in records)  # the entry's own compile time
    assert seen == [(KEY, 1, 2), (OTHER, 2, 2)]
    cache.clear()
    assert cache.stats()["entries"] == 0 and not cache.contains(KEY)


def test_first_compile_under_graph_capture_is_refused(monkeypatch):
    cache = KernelCache(SlowCompiler())
    cache.get(KEY)
    monkeypatch.setattr(C, "_capturing", lambda: True)
    assert cache.get(KEY) is not None  # compiled before the capture: fine
    with pytest.raises(RuntimeError, match="under CUDA graph capture.*csagate.kernels.api.build"):
        cache.get(OTHER)
    assert not cache.contains(OTHER)


# --- real compiles ---------------------------------------------------------------------


def test_cache_hit_on_second_get(dsl):
    cache = KernelCache()  # private: the stats below are exact
    key = keys_for(4, "sm_90a", coff=1, d=65)[0]
    fn = cache.get(key)
    assert cache.get(key) is fn
    assert cache.build([key])[0].hit
    stats = cache.stats()
    assert stats["misses"] == 1 and stats["hits"] == 2 and stats["compile_seconds"] > 0


def test_the_same_ptx_is_assembled_once_and_still_kept(tmp_path):
    """ptxas runs once per (PTX, arch, ptxas) in a process; a kept PTX file is written on
    every call."""
    from csagate.perf.probe import assemble

    calls = tmp_path / "calls"
    fake = tmp_path / "ptxas"
    fake.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'ptxas info    : Used 7 registers'\n")
    fake.chmod(0o755)
    ptx = f"// {tmp_path}\n.version 8.8\n"   # a PTX no other test assembles
    first = assemble(ptx, "sm_90a", str(fake))
    kept = tmp_path / "kept.ptx"
    assert assemble(ptx, "sm_90a", str(fake), kept) == first == (0, "ptxas info    : Used 7 "
                                                                     "registers\n")
    assert kept.read_text() == ptx
    assert len(calls.read_text().split()) == 1
    assemble(ptx, "sm_100a", str(fake))       # another arch: assembled again
    assemble(ptx + "\n", "sm_90a", str(fake))  # another PTX: assembled again
    assert len(calls.read_text().split()) == 3


def test_parse_ptxas_report():
    from csagate.perf.probe import parse_ptxas

    report = """ptxas info    : Compiling entry function 'kernel_x' for 'sm_90a'
ptxas info    : Function properties for kernel_x
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 380 bytes cmem[0]"""
    assert parse_ptxas(report) == (255, 4, 12, 8)
    assert parse_ptxas("ptxas fatal   : Unresolved extern function") == (None,) * 4


def test_no_ptxas_is_a_specific_error(monkeypatch, tmp_path):
    from csagate.perf import probe as P

    monkeypatch.setattr(P, "wheel_ptxas", lambda: None)
    monkeypatch.setattr(P.shutil, "which", lambda name: None)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(P, "DEFAULT_CUDA_HOME", str(tmp_path / "none"))
    with pytest.raises(P.PtxasNotFound, match="ptxas not found"):
        P.find_ptxas()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ptxas").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "ptxas").chmod(0o755)
    assert P.find_ptxas() == str(tmp_path / "bin" / "ptxas")
    # PATH before CUDA_HOME, the wheel before PATH
    monkeypatch.setattr(P.shutil, "which", lambda name: "/on/path/ptxas")
    assert P.find_ptxas() == "/on/path/ptxas"
    monkeypatch.setattr(P, "wheel_ptxas", lambda: "/wheel/bin/ptxas")
    assert P.find_ptxas() == "/wheel/bin/ptxas"


def test_ptxas_wheel_is_found_and_runs():
    """The dev extra's ptxas wheel (`make setup`) is what find_ptxas returns, and it runs."""
    import subprocess
    from importlib import metadata

    from csagate.perf import probe as P

    try:
        metadata.distribution(P.PTXAS_WHEEL)
    except metadata.PackageNotFoundError:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{P.PTXAS_WHEEL} is not installed: `make setup` installs the dev extra")
        pytest.skip(f"{P.PTXAS_WHEEL} is not installed")
    path = P.wheel_ptxas()
    assert path is not None and path.endswith("nvidia/cuda_nvcc/bin/ptxas"), path
    assert P.find_ptxas() == path
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and "release 12." in version.stdout, version.stdout


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_probe_reports_clean_kernels(ptxas, arch, tmp_path):
    from csagate.perf.probe import probe, summary

    r4 = keys_for(4, arch, coff=2, d=128)[0]              # the drift-check forward
    r128 = keys_for(128, arch, coff=2, d=128)[-1]         # B4 backward, goreuse
    rows = probe([r4, r128], keep_dir=tmp_path)
    for row in rows:
        assert row.clean and row.rc == 0, row
        assert (row.spill_st, row.spill_ld, row.stack) == (0, 0, 0), row
        assert 0 < row.regs <= 255 and row.ex2 > 0 and row.arch == arch, row
        assert (tmp_path / f"{row.tag}.{arch}.ptx").is_file()
    assert [r.tag for r in rows] == ["r4fwd_c2d128_v2", r128.tag]
    assert rows[1].schedule == r128.schedule.astuple()
    assert summary(rows, arch) == (True, f"2 kernels probed ({arch}); ALL 0 spill / 0 stack")


def test_probe_without_ptx_is_skipped_and_not_clean(ptxas, monkeypatch):
    from csagate.kernels import _dsl
    from csagate.perf.probe import probe, summary

    monkeypatch.setattr(_dsl, "ptx_of", lambda fn: None)
    rows = probe(keys_for(4, "sm_90a", coff=2, d=128)[:1])
    assert rows[0].skipped and not rows[0].clean and "no PTX retained" in rows[0].note
    ok, line = summary(rows, "sm_90a")
    assert not ok and "1 kernel(s) skipped with no PTX" in line


@pytest.mark.parametrize("ci, outcome", [("true", "1 error"), ("", "1 skipped")])
def test_missing_ptxas_fails_under_ci_and_skips_elsewhere(ci, outcome, tmp_path):
    """The `ptxas` fixture (tests/conftest.py) with no ptxas anywhere: CI=true fails the run."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_needs_ptxas.py").write_text(
        "import csagate.perf.probe as P\n"
        "P.wheel_ptxas = lambda: None\n"
        "P.DEFAULT_CUDA_HOME = '/nonexistent'\n"
        "def test_probe(ptxas):\n"
        "    pass\n")
    env = {**os.environ, "CI": ci, "PATH": "/usr/bin:/bin", "CUDA_HOME": "/nonexistent",
           "CSAGATE_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert outcome in proc.stdout, proc.stdout + proc.stderr
    assert (proc.returncode != 0) == (ci == "true"), proc.stdout
@pytest.mark.parametrize("arch", S.TABLE_ARCHES)
def test_every_table_kernel_builds_and_probes_clean(ptxas, arch):
    """Every kernel a dispatch table of either ratio can select on ``arch`` builds and
    assembles with ptxas -arch=<arch>, 0 spill / 0 stack (compiled through the test run's
    cache: the other build tests reuse the entries)."""
    from csagate.kernels.registry import RATIOS
    from csagate.perf.probe import probe, summary

    keys = [k for ratio in RATIOS for k in keys_for(ratio, arch)]
    rows = probe(keys)
    assert [r.tag for r in rows] == [k.tag for k in keys]
    assert summary(rows, arch)[0], [r for r in rows if not r.clean]


def test_sm_103a_table_kernels_build_and_probe_clean(beside_probe):
    """The same for sm_103a, the arch whose kernels no other test builds: `csagate probe
    --ratio all --arch sm_103a --json` ran in a process beside the suite (tests/conftest.py);
    it exits 0 only when every kernel probed 0 spill / 0 stack and none was skipped."""
    from csagate.kernels.registry import RATIOS

    assert set(S.ARCHES) == {*S.TABLE_ARCHES, "sm_103a"}   # every arch is probed
    code, doc, err = beside_probe
    assert code == 0 and doc is not None, err
    keys = [k for ratio in RATIOS for k in keys_for(ratio, "sm_103a")]
    assert [k["tag"] for k in doc["kernels"]] == [k.tag for k in keys]
    assert doc["ok"] and all(k["clean"] and k["rc"] == 0 for k in doc["kernels"]), doc["summary"]
    assert {k["arch"] for k in doc["kernels"]} == {"sm_103a"}


def test_sm_103a_selects_the_sm_100a_tables():
    """sm_103a (B300) selects the sm_100a tables: the same kernels, built for its own arch."""
    from csagate.kernels.registry import RATIOS

    same = lambda arch: [(k.kind, k.config, k.schedule) for r in RATIOS for k in keys_for(r, arch)]
    assert same("sm_103a") == same("sm_100a")


def test_disk_keys_tell_every_compile_time_input_apart():
    """The deterministic mode and the dAPE reduction are compile-cache keys of their own, on
    disk too (no compile: the keys only)."""
    from csagate.kernels.diskcache import key_digest
    from csagate.kernels.registry import ReduceKey

    key = keys_for(128, "sm_90a", coff=1, d=128)[-1]
    det = dataclasses.replace(key, deterministic=True)
    reduce = ReduceKey("sm_90a")
    digests = {key_digest(C.disk_key(k)) for k in (key, det, reduce, ReduceKey("sm_100a"),
                                                  ReduceKey("sm_90a", depths=(8, 4)))}
    assert len(digests) == 5
    assert C.disk_key(det)["fields"]["deterministic"] is True
    assert C.disk_key(reduce)["family"] == "reduce"
    cache = KernelCache(lambda k: object())  # one cache for both kinds of key
    cache.build([reduce, key])
    assert list(cache.stats()["per_entry"]) == [f"{key.tag}@sm_90a", "reduce_dape_g4@sm_90a"]
