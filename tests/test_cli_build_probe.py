"""`csagate build` and `csagate probe` through click's CliRunner (no GPU: cross-compiles).

Kernels compile through the process-wide cache, so tests reuse what earlier tests built.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from click.testing import CliRunner
from csagate.kernels.small_schedule import small_schedule as _small_schedule

from csagate.cli import cli


def _bwd_tag(d: int) -> str:
    """The sm_90a table's ratio-4 coff-2 backward schedule tag at head dim d."""
    return _small_schedule("bwd", d, ratio=4, coff=2, arch="sm_90a").tag


def run(*args):
    return CliRunner().invoke(cli, list(args))


def table_rows(text: str, marker: str) -> list[str]:
    return [line for line in text.splitlines() if "│" in line and marker in line]


@pytest.mark.parametrize("command", ["build", "probe"])
def test_bad_ratio_is_a_usage_error(command):
    r = run(command, "--ratio", "7")
    assert r.exit_code == 2 and "Invalid value" in r.output


def test_bad_arch_is_a_usage_error():
    assert run("build", "--arch", "sm_80").exit_code == 2


def test_build_ratio4_cross_compiles(dsl):
    r = run("build", "--ratio", "4", "--arch", "sm_90a")
    assert r.exit_code == 0, r.output
    assert "12 kernels for sm_90a" in r.stdout
    rows = table_rows(r.stdout, "│ r4")
    assert len(rows) == 12, r.stdout
    # the whole schedule, every field by name
    assert any("r4fwd_c2d128_v2" in row and "vec=2 threads=64 rows_per_cta=1" in row
               for row in rows), r.stdout
    assert "12 kernels:" in r.stdout


def test_build_again_hits_the_cache_json(dsl):
    assert run("build", "--ratio", "4", "--arch", "sm_90a").exit_code == 0
    r = run("build", "--ratio", "4", "--arch", "sm_90a", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "csagate.kernels/1" and doc["command"] == "build"
    assert doc["arch"] == "sm_90a" and "disk cache" in doc["cache"]
    records = doc["kernels"]
    assert len(records) == 12 and all(rec["cache_hit"] for rec in records)
    assert {rec["tag"] for rec in records} >= {"r4fwd_c1d65_v1", f"r4bwd_c2d512_{_bwd_tag(512)}"}
    fwd = next(rec for rec in records if rec["tag"] == "r4fwd_c2d128_v2")
    assert fwd["schedule"] == {"tag": "v2", "vec": 2, "threads": 64, "rows_per_cta": 1,
                               "ape_regs": True, "lanes": 1, "prefetch": False, "stages": 0,
                               "ieee_div": False}
    assert fwd["deterministic"] is False  # the key's mode, not a schedule field
    assert (fwd["kind"], fwd["ratio"], fwd["config"], fwd["arch"]) == \
        ("r4fwd", 4, "c2d128", "sm_90a")


def test_build_and_probe_choose_the_default_arch_the_same_way(monkeypatch):
    from csagate import options

    monkeypatch.setattr(options, "gpu_arch", lambda: "sm_90a")
    assert options.resolve_arch(None) == "sm_90a"
    assert options.resolve_arch("sm_100a") == "sm_100a"
    monkeypatch.setattr(options, "gpu_arch", lambda: None)
    assert options.resolve_arch(None) == "sm_100a"
    for command in ("build", "probe"):
        r = run(command, "--help")
        assert "this machine's GPU" in " ".join(r.stdout.split()), r.stdout
        assert "auto" not in r.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_build_without_gpu_cross_compiles_for_sm100a_and_says_so(dsl, monkeypatch):
    from csagate.kernels import api

    seen = []
    monkeypatch.setattr(api, "build", lambda r, arch, progress: seen.append(arch) or [])
    r = run("build", "--ratio", "128")
    assert r.exit_code == 0, r.output
    assert seen == ["sm_100a"] and "cross-compiling for sm_100a" in r.stderr


def test_keep_ptx_in_a_missing_directory_is_a_usage_error(tmp_path):
    r = run("probe", "--ratio", "4", "--keep-ptx", str(tmp_path / "nope" / "ptx"))
    assert r.exit_code == 2, r.output
    assert "--keep-ptx" in r.stderr and "does not exist" in r.stderr


def test_build_failure_exits_3_with_one_line(dsl, monkeypatch):
    from csagate.kernels import cache

    def broken(key):
        raise RuntimeError("nvvm says no\nsecond line")

    monkeypatch.setattr(cache, "CACHE", cache.KernelCache(broken))
    monkeypatch.setattr("csagate.kernels.dispatch.CACHE", cache.CACHE)
    r = run("build", "--ratio", "4", "--arch", "sm_100a")
    assert r.exit_code == 3, r.output
    assert "build failed: RuntimeError: nvvm says no" in r.stderr
    assert "second line" not in r.output and "Traceback" not in r.output


def test_probe_ratio128_sm100a_all_clean(ptxas):
    r = run("probe", "--ratio", "128", "--arch", "sm_100a")
    assert r.exit_code == 0, r.output
    rows = table_rows(r.stdout, "_c")
    assert len(rows) == 16, r.stdout
    assert all("clean" in row for row in rows), r.stdout
    assert "16 kernels probed (sm_100a); ALL 0 spill / 0 stack" in r.stdout


def test_probe_json_and_keep_ptx(ptxas, tmp_path):
    r = run("probe", "--ratio", "4", "--arch", "sm_90a", "--keep-ptx", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["schema"] == "csagate.kernels/1" and report["command"] == "probe"
    assert report["ok"] and len(report["kernels"]) == 12 and report["arch"] == "sm_90a"
    assert all(k["spill_st"] == k["spill_ld"] == k["stack"] == 0 for k in report["kernels"])
    # the same kernel fields as `build --json`
    built = json.loads(run("build", "--ratio", "4", "--arch", "sm_90a", "--json").stdout)
    common = ("tag", "kind", "direction", "ratio", "config", "coff", "d", "arch", "schedule")
    assert [{f: k[f] for f in common} for k in report["kernels"]] == \
        [{f: k[f] for f in common} for k in built["kernels"]]
    assert len(list(tmp_path.glob("*.sm_90a.ptx"))) == 12


def test_probe_without_ptx_exits_1(ptxas, monkeypatch):
    from csagate.kernels import _dsl

    monkeypatch.setattr(_dsl, "ptx_of", lambda fn: None)
    r = run("probe", "--ratio", "4", "--arch", "sm_90a")
    assert r.exit_code == 1, r.output
    assert "12 kernel(s) skipped with no PTX" in r.stdout


def test_probe_without_ptxas_exits_3(dsl, monkeypatch):
    from csagate.perf import probe

    def missing():
        raise probe.PtxasNotFound("ptxas not found on PATH (test)")

    monkeypatch.setattr(probe, "find_ptxas", missing)
    r = run("probe", "--ratio", "4", "--arch", "sm_90a")
    assert r.exit_code == 3, r.output
    assert "ptxas not found" in r.stderr and "Traceback" not in r.output


def test_bench_json_in_a_missing_directory_is_a_usage_error(tmp_path):
    r = run("bench", "--json", str(tmp_path / "nope" / "b.json"))
    assert r.exit_code == 2 and "does not exist" in r.stderr


def test_build_reports_true_disk_cache_hits(dsl, tmp_path):
    """A second process building the same kernels loads them from the disk cache: hits."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, CSAGATE_CACHE_DIR=str(tmp_path), CSAGATE_DISK_CACHE="1")
    args = [sys.executable, "-m", "csagate", "build", "--ratio", "4", "--arch", "sm_90a",
            "--json"]
    first, second = (json.loads(subprocess.run(args, env=env, capture_output=True, text=True,
                                               check=True).stdout) for _ in range(2))
    assert not any(rec["cache_hit"] for rec in first["kernels"])
    assert all(rec["cache_hit"] for rec in second["kernels"]) and len(second["kernels"]) == 12
    assert second["compile_s"] == 0


def test_cache_info_and_clear(tmp_path, monkeypatch):
    from csagate.kernels import diskcache

    monkeypatch.setenv("CSAGATE_CACHE_DIR", str(tmp_path / "kc"))
    r = run("cache", "info", "--json")
    assert r.exit_code == 0, r.output
    facts = json.loads(r.stdout)
    assert facts["root"] == str(tmp_path / "kc") and facts["usable"] and facts["entries"] == 0
    assert not (tmp_path / "kc").exists()          # info only reads
    (tmp_path / "kc" / "kernels").mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "kc", 0o700)
    entry = tmp_path / "kc" / "kernels" / ("0" * 40 + ".cso")
    entry.write_bytes(diskcache.MAGIC + b"junk")
    assert json.loads(run("cache", "info", "--json").stdout)["entries"] == 1
    r = run("cache", "clear")
    assert r.exit_code == 0 and not entry.exists()
    assert "removed 1 file" in r.stderr
