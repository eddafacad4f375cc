"""CuTe DSL kernels of the CSA compressor and their dispatch tables.

Importing this package is cheap: nothing here imports cutlass or torch until a kernel is
built or launched (``csagate.kernels.schedule`` is pure Python and safe everywhere).
"""
