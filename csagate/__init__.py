"""csagate: the numerics contract gate for the CSA compressor kernels."""

__version__ = "0.1.0"
