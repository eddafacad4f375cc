"""The numerics contracts (ratio=128 and the production ratio=4 kernels): the named cases,
the contract records, the gate checks, the gate run.

Nothing in this package prints: it returns data (``csagate.gates.verdict``) that the
``csagate`` CLI renders.
"""
