"""Numba kernels: the compiled arithmetic behind every op."""
