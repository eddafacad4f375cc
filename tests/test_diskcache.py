"""CPU tests of the on-disk kernel cache: keys, folder rules, and every planted bad entry.

Most tests use a fake compiled object (export_to_c writes known bytes) and a fake loader, so
they compile nothing. ``test_real_kernel_*`` compiles ONE r128 forward for sm_90a (no GPU),
stores it, loads it back in a fresh cache object and checks the loaded tvm_ffi.Function's
compiled argument checks (a CPU tensor is refused with the kernel's own signature).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import stat
import time
from pathlib import Path

import pytest
from csagate.kernels import diskcache as D

PKG = Path(D.__file__).parent


class FakeCompiled:
    """Stands in for a TVM-FFI compiled function: export_to_c writes ``payload``."""

    def __init__(self, payload=b"\x7fELF-fake-object", ptx=".version 8.0\n.entry k()\n"):
        self.payload, self.__ptx__ = payload, ptx

    def export_to_c(self, path, function_name=None):
        assert function_name == D.EXPORT_NAME
        Path(path).write_bytes(self.payload)


def fake_loader(obj):
    return ("loaded", obj)


class Builds:
    def __init__(self, payload=b"\x7fELF-fake-object"):
        self.n, self.payload = 0, payload

    def __call__(self):
        self.n += 1
        return FakeCompiled(self.payload)


def key(**over):
    k = D.make_key(family="r128", direction="fwd",
                   fields={"d": 128, "coff": 1, "vec": 2, "tchunks": 4},
                   arch="sm_90a", options="--enable-tvm-ffi", sources="s" * 64)
    k.update(over)
    return k


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CSAGATE_CACHE_DIR", str(tmp_path / "cc"))
    return D.DiskCache(loader=fake_loader)


def fresh(c):
    return D.DiskCache(c.root, loader=fake_loader)


# --- folder and keys -----------------------------------------------------------------


def test_root_override_and_default(tmp_path, monkeypatch):
    monkeypatch.setenv("CSAGATE_CACHE_DIR", str(tmp_path / "x"))
    assert D.default_root() == tmp_path / "x"
    monkeypatch.delenv("CSAGATE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert D.default_root() == tmp_path / "xdg" / "csagate"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert D.default_root() == Path.home() / ".cache" / "csagate"


def test_folders_created_private_and_entry_0600(cache):
    old = os.umask(0o022)
    try:
        fn, ptx, rec = cache.get(key(), Builds())
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(cache.root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cache.dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cache.path_of(key())).st_mode) == 0o600
    assert not rec.hit and rec.reason == "absent"
    assert fn == ("loaded", b"\x7fELF-fake-object") and ptx.startswith(".version")


def test_second_process_view_is_a_hit(cache):
    b = Builds()
    cache.get(key(), b)
    fn, ptx, rec = fresh(cache).get(key(), b)
    assert rec.hit and b.n == 1 and fn[1] == b"\x7fELF-fake-object"


def test_key_covers_every_field():
    base = D.key_digest(key())
    variants = [key(arch="sm_100a"), key(direction="bwd"), key(family="r4"),
                key(options="--enable-tvm-ffi x"), key(sources="t" * 64),
                key(fields={"d": 128, "coff": 1, "vec": 2, "tchunks": 8}),
                key(toolchain={**D.toolchain(), "nvidia-cutlass-dsl": "4.9.0"}),
                key(toolchain={**D.toolchain(), "python": "cpython-3.12"}),
                key(toolchain={**D.toolchain(), "cuda-bindings": "12.9.0"}),
                key(format=D.FORMAT + 1)]
    digests = {D.key_digest(k) for k in variants}
    assert base not in digests and len(digests) == len(variants)


def test_toolchain_names_dsl_python_cuda_tvmffi():
    tc = D.toolchain()
    for name in ("nvidia-cutlass-dsl", "cuda-bindings", "apache-tvm-ffi", "python", "dsl_env"):
        assert name in tc, name
    assert tc["nvidia-cutlass-dsl"] == "4.8.1"


def test_source_hash_changes_with_any_kernel_file(tmp_path):
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("x = 1\n")
    h1 = D.source_hash(D.package_sources(tmp_path))
    (tmp_path / "b.py").write_text("x = 2\n")
    h2 = D.source_hash(D.package_sources(tmp_path))
    (tmp_path / "c.py").write_text("")
    h3 = D.source_hash(D.package_sources(tmp_path))
    assert len({h1, h2, h3}) == 3


def test_stale_entry_after_source_change_is_not_served(cache):
    b = Builds(b"old-binary")
    cache.get(key(sources="1" * 64), b)
    b.payload = b"new-binary"
    fn, _, rec = fresh(cache).get(key(sources="2" * 64), b)
    assert not rec.hit and fn[1] == b"new-binary" and b.n == 2


def test_header_key_must_match_exactly(cache):
    """An entry renamed onto another key's name (or a digest collision) is not served."""
    cache.get(key(arch="sm_100a"), Builds(b"other"))
    os.replace(cache.path_of(key(arch="sm_100a")), cache.path_of(key()))
    fn, _, rec = fresh(cache).get(key(), Builds(b"mine"))
    assert not rec.hit and rec.reason == "key mismatch" and fn[1] == b"mine"


# --- planted bad entries: each is rebuilt, not loaded ----------------------------------


def _plant(cache, mutate):
    b = Builds()
    cache.get(key(), b)
    path = cache.path_of(key())
    mutate(path)
    c2 = fresh(cache)
    fn, _, rec = c2.get(key(), b)
    again = fresh(cache).get(key(), b)[2]
    return rec, b.n, again


@pytest.mark.parametrize("name, mutate, reason", [
    ("truncated payload", lambda p: p.write_bytes(p.read_bytes()[:-7]), "truncated (payload)"),
    ("truncated header", lambda p: p.write_bytes(p.read_bytes()[:20]), "truncated (header)"),
    ("empty file", lambda p: p.write_bytes(b""), "corrupt (magic)"),
    ("flipped payload byte", lambda p: p.write_bytes(_flip(p.read_bytes(), -3)),
     "corrupt (checksum)"),
    ("bad magic", lambda p: p.write_bytes(b"XXXXXXXX" + p.read_bytes()[8:]), "corrupt (magic)"),
    ("garbage header", lambda p: p.write_bytes(_garble_header(p.read_bytes())),
     "corrupt (header)"),
    ("group-writable", lambda p: os.chmod(p, 0o620), "writable by group/others (mode 620)"),
    ("other-writable", lambda p: os.chmod(p, 0o602), "writable by group/others (mode 602)"),
    ("symlink", lambda p: _to_symlink(p), "unopenable"),
    ("directory", lambda p: (p.unlink(), p.mkdir()), None),
])
def test_planted_bad_entry_is_rebuilt(cache, name, mutate, reason):
    if name == "directory":
        b = Builds()
        cache.get(key(), b)
        path = cache.path_of(key())
        path.unlink()
        path.mkdir()
        with pytest.raises(IsADirectoryError):  # os.replace cannot replace a directory
            fresh(cache).get(key(), b)
        return
    rec, n_builds, again = _plant(cache, mutate)
    assert not rec.hit and rec.reason.startswith(reason), rec.reason
    assert n_builds == 2 and again.hit  # rebuilt once, then the replaced entry is a hit
    assert stat.S_IMODE(os.lstat(cache.path_of(key())).st_mode) == 0o600


def _flip(blob, i):
    b = bytearray(blob)
    b[i] ^= 0xFF
    return bytes(b)


def _garble_header(blob):
    n = int.from_bytes(blob[8:12], "little")
    return blob[:12] + b"{" * n + blob[12 + n:]


def _to_symlink(p):
    target = p.with_name("elsewhere.bin")
    os.replace(p, target)
    os.symlink(target, p)


def test_foreign_owner_entry_is_rebuilt(cache, monkeypatch):
    b = Builds()
    cache.get(key(), b)
    c2 = fresh(cache)
    assert c2.usable()  # folder checked with the real uid
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 1)  # now the entry is someone else's
    _, _, rec = c2.get(key(), b)
    assert not rec.hit and rec.reason == f"owned by uid {real}"


# --- folder rules -----------------------------------------------------------------------


@pytest.mark.parametrize("what", ["group-writable", "other-writable", "foreign", "symlink"])
def test_unsafe_folder_disables_disk_cache(tmp_path, monkeypatch, what):
    root = tmp_path / "cc"
    if what == "symlink":
        real = tmp_path / "real"
        real.mkdir(mode=0o700)
        os.symlink(real, root)
    else:
        root.mkdir(mode=0o700)
    if what == "group-writable":
        os.chmod(root, 0o770)
    if what == "other-writable":
        os.chmod(root, 0o703)
    if what == "foreign":
        uid = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: uid + 1)
    c = D.DiskCache(root, loader=fake_loader)
    b = Builds()
    with pytest.warns(D.CacheWarning, match="kernel cache disabled"):
        fn, _, rec = c.get(key(), b)
    assert not rec.hit and rec.reason == "cache disabled" and b.n == 1
    assert isinstance(fn, FakeCompiled)  # used in memory, nothing written or loaded
    assert not (root / "kernels").exists() or what in ("symlink",)


def test_existing_private_folder_is_used(tmp_path):
    root = tmp_path / "cc"
    root.mkdir(mode=0o700)
    assert D.DiskCache(root, loader=fake_loader).usable()


# --- atomic writes, concurrency, maintenance ------------------------------------------


def test_failed_write_leaves_no_partial_entry(cache, monkeypatch):
    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(D.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        cache.get(key(), Builds())
    assert not cache.path_of(key()).exists()
    assert not list(cache.dir.glob(".tmp-*"))


def _racer(root, payload, barrier):
    c = D.DiskCache(root, loader=fake_loader)
    c.usable()
    barrier.wait()
    for _ in range(20):
        c.get(key(), Builds(payload))
        c.path_of(key()).unlink(missing_ok=True)
    c.get(key(), Builds(payload))


def test_concurrent_builders_leave_a_valid_entry(tmp_path):
    root = tmp_path / "cc"
    D.DiskCache(root, loader=fake_loader).usable()
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_racer, args=(root, f"p{i}".encode() * 1000, barrier))
             for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    fn, _, rec = D.DiskCache(root, loader=fake_loader).get(key(), Builds(b"late"))
    assert rec.hit and fn[1] in {f"p{i}".encode() * 1000 for i in range(4)}
    assert not list((root / "kernels").glob(".tmp-*"))


def test_info_and_clear(cache):
    cache.get(key(), Builds())
    cache.get(key(arch="sm_100a"), Builds())
    (cache.dir / ".tmp-stale.cso").write_bytes(b"x")
    info = cache.info()
    assert info["entries"] == 2 and info["bytes"] > 0 and info["usable"]
    assert cache.clear() == 3
    assert cache.info()["entries"] == 0


@pytest.mark.parametrize("what", ["absent", "file", "under a file", "group-writable",
                                  "symlink"])
def test_info_reads_only_and_says_why(tmp_path, what):
    root = tmp_path / "a" / "b" / "cc"
    if what == "file":
        root.parent.mkdir(parents=True)
        root.write_text("x")
    elif what == "under a file":
        (tmp_path / "a").write_text("x")
    elif what == "group-writable":
        root.mkdir(parents=True, mode=0o700)
        os.chmod(root, 0o770)
    elif what == "symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        root.parent.mkdir(parents=True)
        os.symlink(tmp_path / "real", root)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    info = D.DiskCache(root, loader=fake_loader).info()
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before   # nothing created
    assert info["usable"] == (what == "absent") and info["exists"] is False
    assert (info["problem"] is None) == (what == "absent")


def _aged(cache, n, size=1000):
    """``n`` entries, the i-th last used i seconds after the first."""
    paths = []
    for i in range(n):
        cache.get(key(arch=f"sm_{i}"), Builds(bytes(size)))
        path = cache.path_of(key(arch=f"sm_{i}"))
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
        paths.append(path)
    return paths


def test_prune_keeps_the_most_recently_used_within_both_bounds(cache):
    paths = _aged(cache, 6)
    sizes = [p.stat().st_size for p in paths]
    removed, freed = cache.prune(max_bytes=sum(sizes), max_entries=4)
    assert (removed, freed) == (2, sizes[0] + sizes[1])
    assert [p.exists() for p in paths] == [False, False, True, True, True, True]
    assert cache.prune(max_bytes=sizes[4] + sizes[5], max_entries=100) == \
        (2, sizes[2] + sizes[3])
    assert [p.exists() for p in paths[4:]] == [True, True]
    fn, _, rec = fresh(cache).get(key(arch="sm_4"), Builds())   # a hit refreshes its mtime
    assert rec.hit and paths[4].stat().st_mtime > paths[5].stat().st_mtime
    assert cache.prune(max_bytes=sizes[4], max_entries=100) == (1, sizes[5])
    assert paths[4].exists() and not paths[5].exists()


def test_a_write_prunes_to_the_automatic_bound(cache, monkeypatch):
    monkeypatch.setattr(D, "MAX_ENTRIES", 3)
    paths = _aged(cache, 5)
    assert len(cache._entries()) == 3 and paths[-1].exists() and not paths[0].exists()


def test_cache_commands_report_the_folder_in_one_line(tmp_path):
    from click.testing import CliRunner

    from csagate.cli import cli

    a_file = tmp_path / "f"
    a_file.write_text("x")
    env = {"CSAGATE_CACHE_DIR": str(a_file), "COLUMNS": "80"}
    info = CliRunner().invoke(cli, ["cache", "info"], env=env)
    assert info.exit_code == 0 and "not a directory" in info.output
    for args in (["cache", "clear"], ["cache", "prune"], ["build", "--arch", "sm_90a"]):
        r = CliRunner().invoke(cli, args, env=env)
        assert r.exit_code == 2, (args, r.output)
        flat = " ".join(r.stderr.split())
        assert flat.startswith("csagate: ") and "not a directory" in flat, r.stderr
        assert flat.count("csagate:") == 1
        assert "nvidia-cutlass-dsl" not in r.stderr and "Traceback" not in r.stderr
    missing = tmp_path / "new" / "cc"
    r = CliRunner().invoke(cli, ["cache", "info"], env={"CSAGATE_CACHE_DIR": str(missing)})
    assert r.exit_code == 0 and not missing.parent.exists()        # read-only


def test_a_disabled_cache_is_one_csagate_warning_line(tmp_path):
    import subprocess
    import sys

    root = tmp_path / "cc"
    root.mkdir(mode=0o700)
    os.chmod(root, 0o777)
    code = ("import warnings\n"
            "from csagate.cli import cli\n"
            "from csagate.kernels.diskcache import DiskCache\n"
            "try:\n"
            "    cli(['cases'], prog_name='csagate', standalone_mode=False)\n"
            "except SystemExit:\n"
            "    pass\n"
            "DiskCache().usable()\n")
    env = {**os.environ, "CSAGATE_CACHE_DIR": str(root), "COLUMNS": "80"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[0].startswith("csagate: warning: kernel cache disabled"), proc.stderr
    assert "RuntimeWarning" not in proc.stderr and "Warning:" not in proc.stderr
    assert all(line.startswith(("csagate:", "  ")) for line in lines), proc.stderr


# --- one real kernel ------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_store(tmp_path_factory, dsl):
    """Compile one r128 forward for sm_90a (no GPU), store it, report compile vs load."""
    root = tmp_path_factory.mktemp("real") / "cc"
    os.environ.setdefault("CSAGATE_CACHE_DIR", str(root.parent / "dsl"))
    from csagate.kernels import _dsl

    _dsl.cute_modules()
    from csagate.kernels import r128_fwd
    from csagate.kernels.schedule import FwdSchedule

    sched = FwdSchedule(2, 4, 32)
    k = D.make_key(family="r128", direction="fwd",
                   fields={"d": 128, "coff": 1, **vars(sched)}, arch="sm_90a",
                   options="--enable-tvm-ffi", sources=D.source_hash(D.package_sources(PKG)))

    def build():
        return r128_fwd.build_fwd(d=128, coff=1, sched=sched, arch="sm_90a")

    cold = D.DiskCache(root).get(k, build)
    t0 = time.perf_counter()
    warm = D.DiskCache(root).get(k, build)
    warm_wall = time.perf_counter() - t0
    return {"key": k, "cold": cold, "warm": warm, "warm_wall": warm_wall, "root": root}


def test_real_kernel_hit_is_fast_and_loads(real_store):
    (_, _, cold), (fn, ptx, warm) = real_store["cold"], real_store["warm"]
    assert not cold.hit and warm.hit
    assert warm.seconds < cold.seconds / 10
    assert type(fn).__name__ == "Function" and callable(fn)
    assert ".entry kernel_cutlass_kernel" in ptx and ".target sm_90a" in ptx


def test_real_kernel_loaded_function_checks_its_signature(real_store):
    import torch

    fn = real_store["warm"][0]
    cpu = [torch.zeros(256, 128, dtype=torch.bfloat16), torch.zeros(256, 128,
                                                                     dtype=torch.bfloat16),
           torch.zeros(128, 128), torch.tensor([0, 256], dtype=torch.int32),
           torch.tensor([0, 2], dtype=torch.int32), torch.empty(2, 128, dtype=torch.bfloat16)]
    with pytest.raises(ValueError) as exc:
        fn(*cpu)  # refused in compiled code before any CUDA work
    msg = str(exc.value)
    assert "expected device_type=cuda" in msg
    assert ("mKV: Tensor([n0, 128], bfloat16), mScore: Tensor([n0, 128], bfloat16), "
            "mApe: Tensor([128, 128], float32), mCu: Tensor([n1], int32), "
            "mCuc: Tensor([n1], int32), mOut: Tensor([n2, 128], bfloat16)") in msg
    with pytest.raises(TypeError, match="Expects 6 parameters"):
        fn(*cpu[:5])


def test_real_kernel_entry_header(real_store):
    import json

    path = D.DiskCache(real_store["root"]).path_of(real_store["key"])
    blob = path.read_bytes()
    n = int.from_bytes(blob[8:12], "little")
    hdr = json.loads(blob[12:12 + n])
    assert hdr["key"] == real_store["key"] and hdr["function"] == D.EXPORT_NAME
    assert hdr["payload_len"] > 10000 and hdr["compile_s"] > 0


def test_object_bytes_of_an_entry(cache):
    """object_bytes: the verified payload of a written entry (what the occupancy query reads
    the cubin from); None for an absent or corrupt one."""
    assert cache.object_bytes(key()) is None
    cache.get(key(), Builds(b"\x7fELF-payload"))
    assert fresh(cache).object_bytes(key()) == b"\x7fELF-payload"
    path = cache.path_of(key())
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 1
    path.write_bytes(bytes(blob))
    assert fresh(cache).object_bytes(key()) is None
