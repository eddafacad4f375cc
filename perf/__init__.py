"""Tools that measure the kernels (installed as ``csagate.perf``): the benchmark, the register
probe and the PTX hashes. They import ``csagate.kernels``; the kernels never import them."""
