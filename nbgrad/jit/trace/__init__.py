"""Tracing room: a Python function of tensors becomes a checked graph.

:mod:`.ir` is the graph IR (printable, checked, hashable); :mod:`.tracer` records eager
ops through the dispatch hook; :mod:`.function_trace` and :mod:`.pythonop` trace custom
autograd Functions (inlined, or kept as Python-op nodes whose contexts live in the
handle table of :mod:`.handles`);
:mod:`.loops` gives ``fori_loop``/``scan`` and the ``loop`` node; :mod:`.reroll` folds
repeated stretches of a trace back into loops; :mod:`.autodiff` differentiates a graph
from the derivative table; :mod:`.passes` cleans it (dead code, common subexpressions,
constant folding, hoisting). Nothing here runs a graph natively: that is the tiers' job.
"""
