"""The reference executor: replay a graph with eager ops.

Every table-op node calls ``nbgrad.ops.dispatch.apply`` with the arguments it was
recorded with, so the replay computes exactly what eager mode computes and, when its
inputs require grad, records an autograd graph: this is the oracle of the tests and
the path that keeps ``create_graph`` (higher-order gradients) working through a
jitted function. Loop nodes go through :func:`nbgrad.jit.trace.loops.apply_loop`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..backends import is_cuda_array, to_device
from ..device import Device
from ..grad_mode import no_grad
from ..ops.dispatch import apply
from ..ops.registry import REGISTRY
from ..tensor import STATE_TRACE, Tensor
from .trace.ir import CUSTOM_KINDS, LOOP, Graph, LoopInfo, Node, node_args
from .trace.pythonop import replay_node


def replay(graph: Graph, inputs: Sequence[Tensor]) -> list[Tensor]:
    """Run ``graph`` on ``inputs`` with eager ops; returns its outputs as tensors."""
    if len(inputs) != len(graph.inputs):
        raise RuntimeError(f"replay: the graph takes {len(graph.inputs)} inputs, got "
                           f"{len(inputs)}")
    env: dict[int, Tensor] = {id(v): t for v, t in zip(graph.inputs, inputs, strict=True)}
    # constants (host arrays) live on the device of the inputs (the first CUDA one)
    device = next((t._device for t in inputs if t is not None and t._device.type != "cpu"),
                  None)
    for v, arr in graph.consts.items():
        env[id(v)] = Tensor._make(arr) if device is None else \
            Tensor._make(to_device(arr, device), device=device)
    for node in graph.nodes:
        run_node(node, env)
    return [env[id(v)] for v in graph.outputs]


def run_node(node: Node, env: dict[int, Tensor]) -> None:
    """Run one node with eager ops on the tensors of ``env`` and bind its outputs there."""
    values = [None if v is None else env[id(v)] for v in node.inputs]
    if node.op == LOOP:
        from .trace.loops import apply_loop  # cyclic: loops replays its bodies through here
        outs = apply_loop(LoopInfo.of(node), values)
    elif node.op in CUSTOM_KINDS:
        outs = replay_node(node, values)
    else:
        out = apply(REGISTRY[node.op], node_args(node, values))
        outs = out if isinstance(out, (tuple, list)) else (out,)
    for v, t in zip(node.outputs, outs, strict=True):
        env[id(v)] = t


def replay_arrays(graph: Graph, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Replay on plain arrays, recording nothing (no tracer, no autograd)."""
    cuda_device = Device.of("cuda")
    prev = STATE_TRACE.tracer
    STATE_TRACE.tracer = None
    try:
        with no_grad():
            outs = replay(graph, [Tensor._make(a, device=cuda_device)
                                  if is_cuda_array(a) else Tensor._make(np.asarray(a))
                                  for a in arrays])
    finally:
        STATE_TRACE.tracer = prev
    return [t._data for t in outs]
