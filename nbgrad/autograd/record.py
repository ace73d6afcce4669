"""Recording table ops: the hook :func:`nbgrad.ops.dispatch.apply` calls to build the graph.

:func:`record` is installed into dispatch when this package is imported (``ops/`` never
imports ``autograd/``). It creates the op's :class:`OpNode` and saves what the op's
formulas read. :func:`run_formulas` is that node's backward: it evaluates the table's
formulas and then, once for every op, sums broadcast gradients back to each input's
shape and casts them to the input's dtype. :func:`compile_backward` specialises it to
one op (the formulas' arguments read straight from the node) on the op's first backward.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .. import ops as _ops
from ..device import Device, cpu_device
from ..ops import dispatch
from ..ops.registry import REGISTRY
from ..tensor import Tensor
from .node import (
    RETAIN_GRAPH_MESSAGE,
    Node,
    SavedMeta,
    SavedOutput,
    SavedTensor,
    _sequence,
    gradient_edge,
    modified_message,
    saved_meta,
)

if TYPE_CHECKING:
    from ..ops.registry import OpDef


class OpNode(Node):
    """The backward of one application of a table op: evaluates the table's formulas."""

    __slots__ = ("op", "saved", "attrs", "input_slots", "input_meta", "output_meta",
                 "materialize")

    def __init__(self, op: OpDef, next_edges: Sequence, input_slots=None, input_meta=None,
                 attrs=None, output_meta=None) -> None:
        # Node.__init__ inlined: one node per recorded op
        self.next_edges = next_edges
        self.seq = next(_sequence)
        self._pre_hooks = self._post_hooks = self._retain = self.anomaly_trace = None
        self.op = op
        self.saved = None
        self.attrs = attrs
        self.input_slots = input_slots
        self.input_meta = input_meta
        self.output_meta = output_meta

    def name(self) -> str:
        return f"{self.op.name.title().replace('_', '').replace('.', '')}Backward"

    def release(self) -> None:
        self.saved = None

    def apply(self, grads: list, create_graph: bool) -> list:
        if self.saved is None:
            raise RuntimeError(RETAIN_GRAPH_MESSAGE)
        return (self.op.run_backward or compile_backward(self.op))(self, grads)


_NO_ATTRS: dict = {}  # shared by the nodes of ops without attributes (read, never written)

#: ``(shape, dtype)`` -> a CPU tensor's ``(shape, dtype, device)`` (an ``input_meta``
#: item), and -> ``(that,)`` (the ``output_meta`` of a node with one CPU output): the
#: compiled records share these tuples between nodes (fewer objects per node for the
#: garbage collector to walk); bounded
_META: dict = {}
_OUT_META: dict = {}
_MAX_META = 4096


def _input_meta(d: np.ndarray, device: Device) -> tuple:
    """The ``input_meta`` item of an input with data ``d`` (from ``_META`` on the CPU)."""
    meta = (d.shape, d.dtype, device)
    if device is cpu_device and len(_META) < _MAX_META:
        meta = _META.setdefault(meta[:2], meta)
    return meta


def _output_meta(d: np.ndarray, device: Device) -> tuple:
    """The ``output_meta`` of a node whose one output has data ``d`` on ``device``: its
    ``(shape, dtype, device)``, the ``input_meta`` item of a later op reading the output
    (from ``_OUT_META`` on the CPU)."""
    meta = (_input_meta(d, device),)
    if device is cpu_device and len(_OUT_META) < _MAX_META:
        _OUT_META[meta[0][:2]] = meta
    return meta


def record(op: OpDef, args: tuple, outputs: list[Tensor]) -> None:
    """Make ``op``'s backward node for ``outputs`` (dispatch's recorder hook)."""
    if op.has_lists or len(outputs) != 1:
        _record_general(op, args, outputs)
        return
    (op.run_record or compile_record(op))(op, args, outputs)


def compile_record(op: OpDef):
    """The recorder of an op with one output and no tensor lists (kept as
    ``op.run_record``): ``_record_general`` unrolled over the op's tensor parameters,
    with the node's fields set directly; ``input_meta`` only for inputs with an edge
    (the backward reads no other)."""
    lines = ["def record(op, args, outputs):"]
    edges, metas = [], []
    # an elementwise op's output is most often shaped as its first input: its metadata
    # is then that input's (when known), and a node with one output shares its
    # ``output_meta`` tuple
    like = op.kind.label == "elementwise" and op.record_plan[0][3]
    if like:
        lines.append("    om0 = None")
    for k, (i, _name, _is_list, has_formula) in enumerate(op.record_plan):
        edges.append(f"e{k}")
        metas.append(f"m{k}")
        if has_formula:  # the metadata is read only for a gradient's input; a table
            # op's output has its node's (the same tuple: no lookup)
            own = (["        om0 = fn.output_meta", "        m0 = om0[t0._output_nr]"]
                   if like and k == 0 else
                   [f"        m{k} = fn.output_meta[t{k}._output_nr]"])
            body = [f"if t{k}._requires_grad:",
                    f"    fn = t{k}.grad_fn",
                    "    if type(fn) is OpNode:",
                    f"        e{k} = (fn, t{k}._output_nr)",
                    *own,
                    "    else:",
                    f"        e{k} = (fn, t{k}._output_nr) if fn is not None "
                    f"else gradient_edge(t{k})",
                    f"        d = t{k}._data",
                    f"        m{k} = META.get((d.shape, d.dtype)) if t{k}._device is CPU "
                    "else None",
                    f"        if m{k} is None:",
                    f"            m{k} = input_meta(d, t{k}._device)",
                    "else:",
                    f"    e{k} = m{k} = None"]
        else:
            body = [f"e{k} = m{k} = None"]
        lines.append(f"    t{k} = args[{i}]")
        if op.params[i].optional:
            lines += [f"    if t{k} is None:",
                      f"        e{k} = m{k} = None",
                      "    else:"]
            lines += ["        " + b for b in body]
        else:
            lines += ["    " + b for b in body]
    position = {i: k for k, (i, *_rest) in enumerate(op.record_plan)}
    saved = []  # the flat tuple of ``saved_names``: two items a name (see run_formulas)
    for (i, _name, need_value), users in zip(op.save_plan, op.save_users, strict=False):
        t = f"t{position[i]}"
        if need_value and op.params[i].optional:
            pair = (f"*((None, None) if {t} is None else ({t}, {t}._version_box[0]))",)
        elif need_value:
            pair = (t, f"{t}._version_box[0]")
        else:
            pair = (f"None if {t} is None else saved_meta({t})", "None")
        saved += _if_read(pair, users)
    for (_k, name), users in zip(op.save_outputs, op.save_users[len(op.save_plan):],
                                 strict=True):
        saved += _if_read((f"SavedOutput(out, {name!r})", "None"), users)
    attrs = ", ".join(f"{name!r}: args[{i}]" for i, name in op.attr_names)
    lines += ["    out = outputs[0]",
              "    d = out._data",
              "    node = new(OpNode)",
              f"    node.next_edges = ({''.join(e + ', ' for e in edges)})",
              "    node.seq = next(sequence)",
              "    node._pre_hooks = node._post_hooks = node._retain = None",
              "    node.anomaly_trace = None",
              "    node.op = op",
              f"    node.attrs = {{{attrs}}}" if attrs else "    node.attrs = NO_ATTRS",
              "    node.input_slots = op.record_slots",
              f"    node.input_meta = ({', '.join(metas)},)"]
    lookup = ["om = OUT_META.get((d.shape, d.dtype)) if out._device is CPU else None",
              "node.output_meta = output_meta(d, out._device) if om is None else om"]
    if like:  # (om0: the input's node's output_meta, where that node is a table op's)
        lines += ["    if (m0 is not None and m0[1] is d.dtype and m0[2] is out._device",
                  "            and m0[0] == d.shape):",
                  "        node.output_meta = om0 if om0 is not None and len(om0) == 1 "
                  "else (m0,)",
                  "    else:",
                  *("        " + x for x in lookup)]
    else:
        lines += ["    " + x for x in lookup]
    if op.out_diff[0]:
        lines += ["    out._requires_grad = True",
                  "    out.grad_fn = node"]
    lines.append(f"    node.saved = ({''.join(v + ', ' for v in saved)})")
    env = {"OpNode": OpNode, "new": object.__new__, "sequence": _sequence,
           "gradient_edge": gradient_edge, "saved_meta": saved_meta, "SavedOutput": SavedOutput,
           "NO_ATTRS": _NO_ATTRS, "META": _META, "CPU": cpu_device, "input_meta": _input_meta,
           "OUT_META": _OUT_META, "output_meta": _output_meta}
    exec(compile("\n".join(lines), f"<record of {op.name}>", "exec"), env)  # noqa: S102
    op.run_record = env["record"]
    return op.run_record


def _if_read(items: tuple[str, ...], users: tuple | None) -> tuple[str, ...]:
    """A compiled record's ``saved`` items for one name (two expressions, or one that
    unpacks to two), saved only where one of the inputs ``users`` (``record_plan``
    indices; None: every input with a formula) has an edge, else ``None, None``."""
    if users is None:
        return items
    cond = " or ".join(f"e{k} is not None" for k in users) or "False"
    if len(items) == 1:
        return (f"*(({items[0][1:]}) if {cond} else (None, None))",)
    return tuple(item if item == "None" else f"({item} if {cond} else None)" for item in items)


def _record_general(op: OpDef, args: tuple, outputs: list[Tensor]) -> None:
    """``record`` for ops with a tensor-list parameter (``cat``, ``stack``...) or several
    outputs."""
    edges: list = []
    meta: list = []
    slots: dict[str, range] = {}
    for i, name, is_list, has_formula in op.record_plan:
        start = len(edges)
        for t in (args[i] if is_list else (args[i],)):
            if t is None:
                edges.append(None)
                meta.append(None)
                continue
            if has_formula and t._requires_grad:
                fn = t.grad_fn
                edges.append((fn, t._output_nr) if fn is not None else gradient_edge(t))
            else:
                edges.append(None)
            data = t._data
            meta.append((data.shape, data.dtype, t._device))
        if has_formula:
            slots[name] = range(start, len(edges))
    node = OpNode(op, tuple(edges), slots, meta, {name: args[i] for i, name in op.attr_names})
    _finish(node, op, args, outputs)


def _finish(node: OpNode, op: OpDef, args: tuple, outputs: list[Tensor]) -> None:
    """Save what the formulas read and make ``node`` the outputs' grad_fn."""
    node.output_meta = tuple((o._data.shape, o._data.dtype, o._device) for o in outputs)
    saved = {}
    read = [_is_read(node, users) for users in op.save_users]
    for (i, name, need_value), is_read in zip(op.save_plan, read, strict=False):
        value = args[i]
        if value is None or not is_read:
            saved[name] = None
        elif isinstance(value, (list, tuple)):
            saved[name] = [_save(t, name, need_value) for t in value]
        else:
            saved[name] = SavedTensor(value, name) if need_value else SavedMeta(value)
    out_diff = op.out_diff
    for k, out in enumerate(outputs):
        if out_diff[k] if k < len(out_diff) else out_diff[-1]:
            out._requires_grad = True
            out.grad_fn = node
    for (k, name), is_read in zip(op.save_outputs, read[len(op.save_plan):], strict=True):
        saved[name] = SavedOutput(outputs[k], name) if is_read else None
    node.saved = saved


def _is_read(node: OpNode, users: tuple | None) -> bool:
    """Whether a formula that will run reads a saved name read by the inputs ``users``
    (``record_plan`` indices; None: every input with a formula): one of them has an edge."""
    if users is None:
        return True
    slots, edges, plan = node.input_slots, node.next_edges, node.op.record_plan
    return any(edges[s] is not None for k in users for s in slots[plan[k][1]])


def _save(t: Tensor, name: str, need_value: bool):
    return SavedTensor(t, name) if need_value else SavedMeta(t)


def run_formulas(node: OpNode, grads: list) -> list:
    """Backward of a table op: evaluate its formulas, then reduce and cast each gradient."""
    op = node.op
    env = dict(node.attrs) if node.attrs else {}
    for name, saved in _saved_items(node):
        if saved is None:
            env[name] = None
        elif type(saved) is list:
            env[name] = [s.unpack(node) for s in saved]
        elif type(saved) is tuple:
            env[name] = _unpack(node, name, saved)
        else:
            env[name] = saved.unpack(node)
    out_meta = node.output_meta
    if len(out_meta) == 1 and grads and grads[0] is not None:
        full = grads if len(grads) == 1 else [grads[0]]
    else:
        full = []
        out_diff = op.out_diff
        for k, (shape, dtype, _device) in enumerate(out_meta):
            g = grads[k] if k < len(grads) else None
            if g is None and (out_diff[k] if k < len(out_diff) else out_diff[-1]):
                g = _ops.zeros(shape, dtype=dtype, device=_grads_device(grads))
            full.append(g)
    env["grads"] = full
    env["grad"] = full[0] if full else None
    needs = op.formula_names
    if "result" in needs and "result" not in env and "result0" in env:
        env["result"] = env["result0"]
    if "grad_input_mask" in needs:
        env["grad_input_mask"] = [e is not None for e in node.next_edges]
    formulas = op.entry.formulas
    edges = node.next_edges
    input_meta = node.input_meta
    list_names = op.list_names
    results: list = [None] * len(edges)
    for name, idx in node.input_slots.items():
        single = len(idx) == 1 and name not in list_names
        if single:
            if edges[idx[0]] is None:
                continue
        elif all(edges[s] is None for s in idx):
            continue
        formula = formulas[name]
        value = formula.func(*[env[n] for n in formula.arg_names])
        if single:
            pairs: Iterable = ((idx[0], value),)
        else:
            pairs = zip(idx, list(value) if name in list_names else (value,), strict=True)
        for s, g in pairs:
            if g is None or edges[s] is None:
                continue
            results[s] = fit_gradient(op, name, g, input_meta[s])
    return results


def saved_names(op: OpDef) -> list[str]:
    """The names of what ``op``'s nodes save, in the order of a compiled record's flat
    ``saved`` tuple (two items a name: ``(tensor, version)``, or ``(saved object or None,
    None)``)."""
    return [name for _i, name, _v in op.save_plan] + [name for _k, name in op.save_outputs]


def _saved_items(node: OpNode) -> Iterable:
    """``(name, saved)`` of every saved value of ``node``, as ``_finish`` saves them (a
    compiled record's flat tuple read back as pairs)."""
    saved = node.saved
    if type(saved) is not tuple:
        return saved.items()
    items = []
    for k, name in enumerate(saved_names(node.op)):
        value, version = saved[2 * k], saved[2 * k + 1]
        items.append((name, value if version is None else (value, version)))
    return items


def _unpack(node: OpNode, name: str, saved: tuple) -> Tensor:
    """The tensor of a ``(tensor, version)`` pair that ``record`` saved (a lighter
    :class:`SavedTensor`), checked against in-place changes since."""
    t, version = saved
    if t._version_box[0] != version:
        raise RuntimeError(modified_message(node, name, t, version))
    return t


def fit_gradient(op: OpDef, name: str, g, meta: tuple) -> Tensor:
    """Formula ``name``'s gradient ``g`` as a tensor of its input's ``(shape, dtype,
    device)``: broadcast gradients summed back, other dtypes and devices converted."""
    shape, dtype, device = meta
    if not isinstance(g, Tensor):
        g = Tensor._make(np.asarray(g, dtype=dtype))
    if g._device is not device and g._device != device:  # to_device, CPU scalars
        g = _ops.to_device(g, device)
    if g._data.shape != shape:
        g = _fit_shape(op, name, g, shape)
    dt = g._data.dtype
    if dt is not dtype and dt != dtype:
        g = _ops.to_dtype(g, dtype)
    return g


def compile_backward(op: OpDef):
    """``run_formulas`` specialised to ``op`` (kept as ``op.run_backward``): the formulas'
    arguments read straight from the node, no environment built per call.

    For ops with one output, no tensor lists, and formulas that read only ``grad``,
    saved tensors and attributes; any other op keeps ``run_formulas``. Like it, the
    compiled function unpacks every saved tensor (a modified one raises) and runs the
    formula of each input that has an edge, in table order.
    """
    fn = _specialised(op)
    op.run_backward = fn if fn is not None else run_formulas
    return op.run_backward


def _specialised(op: OpDef):
    saved = saved_names(op)
    attrs = [name for _i, name in op.attr_names]
    if (op.has_lists or len(op.entry.schema.returns) != 1
            or not op.formula_names <= {"grad", *saved, *attrs}):
        return None
    local = {}
    lines = ["def backward(node, grads):",
             "    saved = node.saved",
             "    if not grads or grads[0] is None or type(saved) is not tuple:",
             "        return run_formulas(node, grads)",
             "    grad = grads[0]"]
    kinds = ["value" if v else "meta" for _i, _n, v in op.save_plan]
    kinds += ["output"] * len(op.save_outputs)
    tensors = {"grad"}  # the locals that hold a tensor
    optional = {name for i, name, _v in op.save_plan if op.params[i].optional}
    for k, (name, kind) in enumerate(zip(saved, kinds, strict=True)):
        local[name] = f"s{k}"
        if kind != "meta" and name not in optional:
            tensors.add(name)
        if kind == "value":  # (tensor, version), or (None, None) for an absent optional
            lines += [f"    s{k}, v{k} = saved[{2 * k}], saved[{2 * k + 1}]",
                      f"    if v{k} is not None and s{k}._version_box[0] != v{k}:",
                      f"        unpack(node, {name!r}, (s{k}, v{k}))"]
        elif kind == "output":  # a SavedOutput, or None where no formula that runs reads it
            lines += [f"    s{k} = saved[{2 * k}]",
                      f"    if s{k} is not None:",
                      f"        s{k} = s{k}.unpack(node)"]
        else:  # a SavedMeta (its own unpack) or None
            lines.append(f"    s{k} = saved[{2 * k}]")
    for k, name in enumerate(attrs):
        if name in op.formula_names:
            local[name] = f"a{k}"
            lines.append(f"    a{k} = node.attrs[{name!r}]")
    local["grad"] = "grad"  # as in run_formulas, where it overrides any other ``grad``
    lines += ["    edges = node.next_edges",
              "    meta = node.input_meta",
              f"    results = [None] * {len(op.record_plan)}"]
    env = {"run_formulas": run_formulas, "fit": fit_gradient, "Tensor": Tensor, "op": op,
           "unpack": _unpack}
    for k, (_i, name, _is_list, has_formula) in enumerate(op.record_plan):
        if not has_formula:
            continue
        formula = op.entry.formulas[name]
        env[f"f{k}"] = formula.func
        args = ", ".join(local[n] for n in formula.arg_names)
        lines += [f"    if edges[{k}] is not None:"]
        lines += ["        " + c for c in _formula_call(formula, k, local, tensors, env)
                  or [f"g = f{k}({args})"]]
        lines += ["        if g is not None:",
                  f"            m = meta[{k}]",
                  "            if (type(g) is Tensor and g._device is m[2]",
                  "                    and g._data.shape == m[0] and g._data.dtype is m[1]):",
                  f"                results[{k}] = g",
                  "            else:",
                  f"                results[{k}] = fit(op, {name!r}, g, m)"]
    lines.append("    return results")
    exec(compile("\n".join(lines), f"<backward of {op.name}>", "exec"), env)  # noqa: S102
    return env["backward"]


_BINARY_CALL = re.compile(r"    return __bin_(\w+)\((\w+), (\w+)\)\n")
_UNARY_CALL = re.compile(r"    return __una_(\w+)\((\w+)\)\n")


def _formula_call(formula, k: int, local: dict, tensors: set, env: dict) -> list[str]:
    """The lines setting ``g`` to what ``formula`` returns without calling it, for
    formulas that are one name (``grad``) or one operator on tensors (``grad * other``):
    the op's function called directly, after its lean path (``OpDef.lean_apply``),
    which that function would try first. ``[]`` for any other formula."""
    body = formula.source.partition("\n")[2]
    if body.strip() in {f"return {n}" for n in tensors}:
        return [f"g = {local[body.strip()[7:]]}"]
    call = _BINARY_CALL.fullmatch(body) or _UNARY_CALL.fullmatch(body)
    if call is None or not set(call.groups()[1:]) <= tensors:
        return []
    name, *names = call.groups()
    target = REGISTRY.get(name)
    if target is None or target.fn is None:
        return []
    env[f"op{k}"], env[f"fn{k}"] = target, target.fn
    operands = ", ".join(local[n] for n in names)
    return [f"g = op{k}.lean_apply({operands})", "if g is None:", f"    g = fn{k}({operands})"]


def _grads_device(grads: list) -> Device:
    """The device of the gradients that did arrive (for zeros in place of missing ones)."""
    return next((g._device for g in grads if g is not None), cpu_device)


def _fit_shape(op: OpDef, name: str, g: Tensor, shape: tuple) -> Tensor:
    """Sum a gradient that is broadcast wider than its input back to the input's shape."""
    try:
        ok = np.broadcast_shapes(shape, g._data.shape) == g._data.shape
    except ValueError:
        ok = False
    if not ok:
        raise RuntimeError(f"{op.name}: the formula for {name!r} returned a gradient of shape "
                           f"{g._data.shape}, but the input has shape {shape} (a gradient may "
                           "only be wider than its input by broadcasting)")
    return _ops.sum_to(g, shape)


dispatch.set_recorder(record)
