"""csagate: the numerics contract gate for the CSA compressor kernels."""

# The one place the package version is written (pyproject.toml reads it from here).
__version__ = "0.3.0"
