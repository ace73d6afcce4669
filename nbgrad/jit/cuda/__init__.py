"""The CUDA tier: a graph whose tensors live on the GPU runs as fused CUDA kernels.

:mod:`.fusion` groups the graph with tier 2's planner and generates one kernel per group
(through the device runtime of :mod:`nbgrad.cuda`), with eager steps for what it cannot
fuse. This package imports nothing itself; :mod:`.fusion` needs a CUDA device runtime.
"""
