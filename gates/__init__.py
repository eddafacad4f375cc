"""The ratio=128 numerics contract: the named cases, the gate checks, the gate run.

Nothing in this package prints: it returns data (``csagate.gates.verdict``) that the
``csagate`` CLI renders.
"""
