"""Tier 1: a graph becomes a tape for one precompiled ``@njit`` interpreter.

:mod:`.interpreter` is the interpreter (compiled once, shared by every graph);
:mod:`.lowering` walks a graph and emits instructions through the per-kind :mod:`.rules`
(unsupported nodes become eager steps), over the operand types of :mod:`.operands`;
:mod:`.storage` gives large inputs and outputs arrays of their own (read and handed
out in place, through :mod:`.pointers`) and assigns the buffer pool from live intervals;
:mod:`.tape` is the runtime executable that runs native segments and eager steps. Tier 1
starts instantly and runs any graph; it is the reference every faster tier is checked
against.
"""
