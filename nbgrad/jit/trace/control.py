"""Value-dependent control flow: ``while_loop`` and ``cond`` (JAX's ``lax`` names).

Eagerly both are plain Python. Under ``nbgrad.jit``:

- :func:`cond` traces *both* branches and selects each output with ``where`` on the
  traced predicate: differentiable (the gradient of the branch not taken is zero;
  as with any ``where``, a NaN or inf it computes may still reach the gradient).
- :func:`while_loop` traces ``cond_fun`` and ``body_fun`` once each into sub-graphs
  (values they close over become inputs, as for ``fori_loop``) and records one
  PythonOp node (:mod:`nbgrad.jit.trace.pythonop`) that runs the loop at every call:
  a Python loop calling tier-1 tapes of the two sub-graphs. Its trip count is a
  run-time value, so unlike ``fori_loop`` it is not a native LOOP of tier 1 or a loop
  of generated tier-2 code (tier 1 runs the node as an eager step, tier 2 through
  ``objmode``): each step costs a Python round trip, and results are exact. As in
  JAX it is forward only: differentiating through it (an input that requires grad
  reaching the carry) raises a ``RuntimeError`` saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ... import pytree
from ...autograd.function import Function
from ...autograd.node import Node as AutogradNode
from ...autograd.node import gradient_edge
from ...grad_mode import STATE, no_grad
from ...ops import where
from ...tensor import STATE_TRACE, Tensor
from ..program import build
from ..reference import replay_arrays
from .ir import Graph
from .loops import _check_carry, _leaf_tensor, _placeholders, _trace_body, _traced

__all__ = ["cond", "while_loop"]

NO_GRAD_MESSAGE = (
    "while_loop: reverse-mode differentiation through nbgrad.while_loop is not supported "
    "(its number of steps is only known at run time, as in JAX); use nbgrad.fori_loop or "
    "nbgrad.scan with a static number of steps, or detach() the values entering the loop")


# ------------------------------------------------------------------ while_loop
def _predicate(value: Any, fn: str) -> Tensor:
    t = value if isinstance(value, Tensor) else _leaf_tensor(value, fn, "the predicate")
    if t.size != 1 or t.dtype.kind not in "biu":
        raise TypeError(f"{fn}: the predicate must be a scalar bool (or integer) tensor, got "
                        f"{t.dtype} of shape {tuple(t.shape)}")
    return t


class _WhileBackward(AutogradNode):
    """The autograd node of a while_loop's results: differentiating raises."""

    __slots__ = ()

    def name(self) -> str:
        return "WhileLoopBackward"

    def apply(self, grads: list, create_graph: bool) -> list:
        raise RuntimeError(NO_GRAD_MESSAGE)


def _no_grad_outputs(outs: list[Tensor], inputs: list[Tensor]) -> list[Tensor]:
    """``outs``, those of a floating dtype made to raise when differentiated when some
    of ``inputs`` or ``outs`` (eagerly, through a value the body closes over) requires
    grad (with grad mode on)."""
    if not (STATE.grad_enabled and any(t._requires_grad for t in inputs + outs)):
        return outs
    node = _WhileBackward([gradient_edge(t) if t._requires_grad else None for t in inputs])
    res = []
    for o in outs:
        if o.dtype.kind in "fc":
            o = o.detach() if o._requires_grad else o
            o._requires_grad = True
            o.grad_fn = node
        res.append(o)
    return res


class WhileProgram:
    """The traced ``cond_fun`` and ``body_fun`` of one ``while_loop`` call site, run by
    tier-1 tapes (built on first use; an eager replay where a tape cannot be built)."""

    __slots__ = ("cond", "body", "n_carry", "n_cond_inv", "_run_cond", "_run_body",
                 "__weakref__")

    def __init__(self, cond: Graph, body: Graph, n_carry: int, n_cond_inv: int) -> None:
        self.cond, self.body = cond, body
        self.n_carry, self.n_cond_inv = n_carry, n_cond_inv
        self._run_cond = self._run_body = None

    @staticmethod
    def _runner(graph: Graph, arrays: list[np.ndarray]) -> Callable:
        if any(not isinstance(a, np.ndarray) for a in arrays):  # CUDA data: replay
            return lambda xs: replay_arrays(graph, xs)
        try:
            exe = build(graph, "interpret")
        except Exception:  # noqa: BLE001 - the replay is the reference semantics
            return lambda xs: replay_arrays(graph, xs)
        return exe.run

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The final carries for the loop inputs ``carries + cond invariants + body
        invariants``."""
        nc, ni = self.n_carry, self.n_cond_inv
        carry = [np.array(a, copy=True) for a in arrays[:nc]]
        c_inv, b_inv = list(arrays[nc:nc + ni]), list(arrays[nc + ni:])
        if self._run_cond is None:
            self._run_cond = self._runner(self.cond, carry + c_inv)
            self._run_body = self._runner(self.body, carry + b_inv)
        while bool(np.asarray(self._run_cond(carry + c_inv)[0]).reshape(-1)[0]):
            carry = [np.array(a, copy=True) for a in self._run_body(carry + b_inv)]
        return carry


class _While(Function):
    """A while loop as a PythonOp node (its trip count is a run-time value)."""

    jit_path = "python"

    @staticmethod
    def forward(ctx, program: WhileProgram, *tensors: Tensor) -> tuple[Tensor, ...]:
        outs = program.run([t.numpy() for t in tensors])
        return tuple(Tensor._make(a) for a in outs)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(NO_GRAD_MESSAGE)


def while_loop(cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any],
               init_val: Any) -> Any:
    """``val = init_val; while cond_fun(val): val = body_fun(val)``; returns ``val``.

    ``init_val`` is a tensor or a tuple/list/dict of tensors (numbers become tensors);
    ``body_fun`` returns the same structure, shapes and dtypes and ``cond_fun`` a scalar
    bool tensor. Under ``nbgrad.jit`` both are traced once and the loop runs at every
    call with its run-time trip count (see :mod:`nbgrad.jit.trace.control`). Forward
    only, as in JAX: differentiating through the loop raises.
    """
    leaves, spec = pytree.flatten(init_val)
    carry = [_leaf_tensor(x, "while_loop", "init_val") for x in leaves]
    if STATE_TRACE.tracer is not None and not _traced(carry):
        raise NotImplementedError(
            "while_loop: under nbgrad.jit the loop runs on the CPU only, and its carry is on "
            f"{', '.join(sorted({str(t.device) for t in carry} - {'cpu'}))}; call it outside "
            "nbgrad.jit (eagerly), or with CPU tensors")
    if STATE_TRACE.tracer is None:
        val = pytree.unflatten(spec, carry)
        cur = carry
        while bool(_predicate(cond_fun(val), "while_loop")):
            cur = _check_carry("while_loop", spec, carry, body_fun(val))
            val = pytree.unflatten(spec, cur)
        return pytree.unflatten(spec, _no_grad_outputs(list(cur), carry))

    def traced_cond(*c):
        return [_predicate(cond_fun(pytree.unflatten(spec, list(c))), "while_loop")]

    def traced_body(*c):
        return _check_carry("while_loop", spec, carry, body_fun(pytree.unflatten(spec, list(c))))

    arrays = [t._data for t in carry]
    with no_grad():
        cond_g, cond_inv = _trace_body(traced_cond, _placeholders(arrays))
        body_g, body_inv = _trace_body(traced_body, _placeholders(arrays))
        program = WhileProgram(cond_g, body_g, len(carry), len(cond_inv))
        outs = _While.apply(program, *carry, *cond_inv, *body_inv)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    return pytree.unflatten(spec, _no_grad_outputs(outs, carry + cond_inv + body_inv))


# ------------------------------------------------------------------ cond
def cond(pred: Any, true_fun: Callable[..., Any], false_fun: Callable[..., Any],
         *operands: Any) -> Any:
    """``true_fun(*operands) if pred else false_fun(*operands)``.

    ``pred`` is a Python bool or a scalar bool (or integer) tensor. When it is traced
    by ``nbgrad.jit``, both branches run and each output is selected with ``where``
    (both must return the same structure, shapes and dtypes); differentiable.
    """
    if not isinstance(pred, Tensor):
        return true_fun(*operands) if pred else false_fun(*operands)
    p = _predicate(pred, "cond")
    tracer = STATE_TRACE.tracer
    if tracer is None or not tracer.is_traced(p):
        return true_fun(*operands) if bool(p) else false_fun(*operands)
    t_leaves, t_spec = pytree.flatten(true_fun(*operands))
    f_leaves, f_spec = pytree.flatten(false_fun(*operands))
    if t_spec != f_spec:
        raise TypeError(f"cond: true_fun returned {pytree.describe(t_spec)} but false_fun "
                        f"returned {pytree.describe(f_spec)}; both must return the same "
                        "structure")
    p = p.reshape(())
    if p.dtype.kind != "b":
        p = p != 0
    out = []
    for k, (a, b) in enumerate(zip(t_leaves, f_leaves, strict=True)):
        a, b = _leaf_tensor(a, "cond", "the result"), _leaf_tensor(b, "cond", "the result")
        if a.shape != b.shape or a.dtype != b.dtype:
            raise TypeError(f"cond: output {k} is {a.dtype}{list(a.shape)} in true_fun but "
                            f"{b.dtype}{list(b.shape)} in false_fun; both branches must "
                            "return the same shapes and dtypes")
        out.append(where(p, a, b))
    return pytree.unflatten(t_spec, out)
