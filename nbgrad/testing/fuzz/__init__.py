"""Differential fuzzing: random graphs of nbgrad ops run by every executor and compared.

- :mod:`.catalogue`: the step kinds (table ops, loops, custom Functions), how each runs
  and reads as nbgrad source, value domains and adapters;
- :mod:`.program`: :class:`Program` (leaves and steps; its ``repr`` rebuilds it),
  :func:`to_source` (the program as nbgrad code) and the :class:`Builder`;
- :mod:`.families` and :mod:`.patterns`: the step families; :mod:`.generate`:
  :func:`generate` (one program per seed) and :func:`programs` (a hypothesis strategy);
- :mod:`.differential`: runs a program eagerly, against finite differences and under
  ``nbgrad.jit`` in each mode, and reports disagreements with a reproducer;
- :mod:`.on_device`: the ``cuda`` executor (eager and jit on CUDA tensors);
- :mod:`.special`: the extra call on inputs with special values (±0, subnormals, huge,
  ±inf, NaN) and its IEEE-aware comparison;
- :mod:`.shrink`: smaller reproducers of a failure;
- :mod:`.runner`: many seeds or a time budget (``nbgrad fuzz``).

Programs are built while they are drawn: each step runs eagerly on the actual values, so
that an op only sees values inside its domain (a smooth *adapter* step is put first
otherwise) and no step sits on a point where it is not differentiable (ties of ``max``,
jumps of ``fmod``, ...: a smooth fallback replaces it), so a mismatch is always a bug.
"""

from .catalogue import FUZZ_OPS, FuzzOp, catalogue_entries, check_catalogue
from .differential import EXECUTORS, EXTRA_EXECUTORS, Mismatch, check_program, check_programs
from .generate import FAMILIES, generate, programs
from .on_device import run_on_device  # registers the ``cuda`` executor
from .program import GAP, MAX_SIZE, Builder, Leaf, Program, Step, leaf_value, to_source

__all__ = ["EXECUTORS", "EXTRA_EXECUTORS", "FAMILIES", "FUZZ_OPS", "GAP", "MAX_SIZE",
           "Builder", "FuzzOp",
           "Leaf", "Mismatch", "Program", "Step", "catalogue_entries", "check_catalogue",
           "check_program", "check_programs", "generate", "leaf_value", "programs",
           "to_source"]
