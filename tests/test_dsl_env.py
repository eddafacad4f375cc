"""The DSL environment csagate prepares: PTX dumps in a folder of each process's own."""

from __future__ import annotations

import os
import subprocess
import sys

from csagate.kernels._dsl import _prepare_env

CHILD = ("import os; from csagate.kernels._dsl import _prepare_env; _prepare_env(); "
         "print(os.getpid(), os.environ['CUTE_DSL_DUMP_DIR'])")


def _child(env: dict, cwd) -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=cwd,
                          capture_output=True, text=True, check=True)
    pid, folder = done.stdout.split(maxsplit=1)
    return pid, folder.strip()


def test_a_child_process_dumps_into_its_own_folder(tmp_path):
    """A child inherits the parent's CUTE_DSL_DUMP_DIR; the DSL names a dump after the kernel
    function, so sharing it would let one process read another's PTX (a test worker, the
    probe beside the suite)."""
    _prepare_env()
    mine = os.environ["CUTE_DSL_DUMP_DIR"]
    pid, folder = _child(dict(os.environ), tmp_path)
    assert folder != mine
    assert folder.endswith(f"pid{pid}")


def test_a_folder_the_user_set_is_kept(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CSAGATE_PTX_DUMP_PID"}
    env["CUTE_DSL_DUMP_DIR"] = str(tmp_path / "mine")
    _, folder = _child(env, tmp_path)
    assert folder == str(tmp_path / "mine") and (tmp_path / "mine").is_dir()
