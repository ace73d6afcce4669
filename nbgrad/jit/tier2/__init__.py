"""Tier 2: a graph becomes one generated, fused ``@njit`` module, compiled in the background.

:mod:`.fusion` groups nodes into elementwise chains, reductions and single ops;
:mod:`.emit` writes the function body group by group, with :mod:`.ops` for views and
matrix products, :mod:`.moves` for data movement and native calls of opaque ops, and
:mod:`.store` for buffers, casts and scalar expressions, :mod:`.alloc` for the intrinsics
that allocate, fill and permute arrays without a compile per process (rules keyed by the op's kind,
:mod:`nbgrad.ops.traits`); :mod:`.codegen` builds the
module text, caches it on disk and compiles it. Its first result is checked against tier 1
(:mod:`nbgrad.jit.verify`) before it replaces the tape.
"""
