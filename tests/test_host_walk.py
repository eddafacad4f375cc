"""perf/host_walk.py, the tracer behind the one-host-path check (tests/gpu/test_host_path.py),
on plain modules built here: first entries in order, a module's helpers called while it is on
the stack are no re-entry, a module entered again after it was left is."""

from __future__ import annotations

import types

from csagate.perf.host_walk import HOST_PATH, Walk, walk


def _module(name: str, source: str, **names) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(names)
    exec(compile(source, name, "exec"), m.__dict__)
    return m


def _chain():
    low = _module("fake.low", "def leaf():\n    return 1\n")
    mid = _module("fake.mid", "def helper():\n    return low.leaf()\n"
                  "def step():\n    return helper() + low.leaf()\n", low=low)
    top = _module("fake.top", "def inner():\n    return 2\n"
                  "def run():\n    return mid.step() + inner()\n", mid=mid)
    return low, mid, top


def test_a_straight_walk_has_no_reentry():
    _, _, top = _chain()
    seen = walk(top.run, prefix="fake.")
    assert seen.entered == ["fake.top", "fake.mid", "fake.low"]
    # low is left twice and entered again from mid, while mid is on the stack: a re-entry of
    # low (it was left); top's own helper after mid returned is not (top never left)
    assert seen.reentered == ["fake.low"]


def test_a_module_entered_after_it_was_left_is_a_reentry():
    low, mid, _ = _chain()
    again = _module("fake.again", "def run():\n    mid.step()\n    return mid.step()\n", mid=mid)
    seen = walk(again.run, prefix="fake.")
    assert "fake.mid" in seen.reentered
    assert seen.on(["fake.again", "fake.mid"]) == Walk(["fake.again", "fake.mid"], ["fake.mid"])


def test_other_modules_are_not_recorded_and_the_profile_is_restored():
    import sys

    before = sys.getprofile()
    seen = walk(lambda: sorted([3, 1, 2]), prefix="fake.")
    assert seen == Walk() and sys.getprofile() is before


def test_the_host_path_names_existing_modules():
    import importlib

    for name in HOST_PATH:
        importlib.import_module(name)
