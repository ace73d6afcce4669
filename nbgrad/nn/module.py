"""``Module`` and ``Parameter``: models as trees of layers holding tensors, as PyTorch.

A module's attributes that are :class:`Parameter` s, sub-modules or registered buffers
are found by :meth:`Module.named_parameters`, :meth:`Module.state_dict` and the rest by
walking the tree, so a model is written as plain attribute assignments in ``__init__``
and a ``forward``. Parameters require grad, so a model runs eagerly or under
``nbgrad.jit`` unchanged (there they are implicit inputs, read at every call).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .. import dtypes
from ..tensor import Tensor

__all__ = ["Module", "ModuleDict", "ModuleList", "Parameter", "Sequential"]


class Parameter(Tensor):
    """A tensor that is a module's parameter: a leaf that requires grad by default.

    ``Parameter(t)`` shares ``t``'s memory, as PyTorch; ops on it return plain tensors.
    """

    __slots__ = ()

    def __init__(self, data: Any = None, requires_grad: bool = True) -> None:
        array = np.empty(0) if data is None else (
            data._data if isinstance(data, Tensor) else np.asarray(data))
        device = data._device if isinstance(data, Tensor) else "cpu"
        super().__init__(array, requires_grad=requires_grad, device=device)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


class Module:
    """Base class of layers and models: subclass it, assign parameters and sub-modules
    in ``__init__`` (after ``super().__init__()``), and define ``forward``."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # ------------------------------------------------------------------ attributes
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign {name!r} before Module.__init__() is called "
                                 f"(call super().__init__() first in {type(self).__name__})")
        if isinstance(value, Parameter):
            self._drop(name)
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._drop(name)
            self._modules[name] = value
        elif name in self._parameters:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} as parameter {name!r} "
                                "(nbgrad.nn.Parameter or None expected)")
            self._parameters[name] = None
        elif name in self._buffers and (value is None or isinstance(value, Tensor)):
            self._buffers[name] = value
        else:
            self._drop(name)
            object.__setattr__(self, name, value)

    def _drop(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            table.pop(name, None)
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        for table in ("_parameters", "_buffers", "_modules"):
            entries = self.__dict__.get(table)
            if entries is not None and name in entries:
                return entries[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Add ``param`` under ``name`` (None: a declared but absent parameter)."""
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter: {name!r} must be a Parameter or None, "
                            f"got {type(param).__name__}")
        self._drop(name)
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add a tensor that is state but not a parameter (e.g. running statistics); it is
        in :meth:`state_dict` unless ``persistent=False``."""
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer: {name!r} must be a Tensor or None, got "
                            f"{type(tensor).__name__}")
        self._drop(name)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module: {name!r} must be a Module, got {type(module).__name__}")
        self._drop(name)
        self._modules[name] = module

    # ------------------------------------------------------------------ calling
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # ------------------------------------------------------------------ the tree
    def named_children(self) -> Iterator[tuple[str, Module]]:
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module and every sub-module (each once), with dotted names."""
        seen: set[int] = set()
        stack = [(prefix, self)]
        while stack:
            name, m = stack.pop(0)
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield name, m
            stack[:0] = [(f"{name}.{c}" if name else c, child)
                         for c, child in m.named_children()]

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def _named(self, table: str, prefix: str, recurse: bool) -> Iterator[tuple[str, Tensor]]:
        seen: set[int] = set()
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mname, m in modules:
            for name, t in getattr(m, table).items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                yield (f"{mname}.{name}" if mname else name), t

    def named_parameters(self, prefix: str = "", recurse: bool = True
                         ) -> Iterator[tuple[str, Parameter]]:
        """Every parameter (shared ones once), with dotted names."""
        return self._named("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True
                      ) -> Iterator[tuple[str, Tensor]]:
        return self._named("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def apply(self, fn: Callable[[Module], None]) -> Module:
        """Call ``fn`` on every sub-module (children first), then on this module."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------------ modes
    def train(self, mode: bool = True) -> Module:
        """Training mode (dropout drops, batch norm uses batch statistics) on or off."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad._data[...] = 0

    def to(self, dtype: Any) -> Module:
        """Convert floating parameters and buffers to ``dtype`` (the Parameter objects
        stay the same; their gradients are dropped)."""
        target = dtypes.as_dtype(dtype)
        for t in (*self.parameters(), *self.buffers()):
            if t._data.dtype.kind == "f":
                t._data = t._data.astype(target)
                if t.grad is not None:
                    t.grad = None
        return self

    def double(self) -> Module:
        return self.to(np.float64)

    def float(self) -> Module:
        return self.to(np.float32)

    # ------------------------------------------------------------------ state
    def state_dict(self, prefix: str = "") -> OrderedDict[str, Tensor]:
        """Parameters and persistent buffers by dotted name (detached, sharing memory)."""
        out: OrderedDict[str, Tensor] = OrderedDict()
        for mname, m in self.named_modules(prefix.rstrip(".")):
            for table in ("_parameters", "_buffers"):
                for name, t in getattr(m, table).items():
                    if t is None or (table == "_buffers" and name in m._non_persistent):
                        continue
                    out[f"{mname}.{name}" if mname else name] = t.detach()
        return out

    def load_state_dict(self, state: dict[str, Any], strict: bool = True
                        ) -> tuple[list[str], list[str]]:
        """Copy ``state`` (tensors or arrays by dotted name, e.g. from :func:`nbgrad.load`)
        into this module's parameters and buffers, in place. Returns the missing and the
        unexpected keys; with ``strict`` either raises a ``KeyError`` naming them."""
        own = self.state_dict()
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict of {type(self).__name__}: missing keys "
                           f"{missing}, unexpected keys {unexpected}")
        for key, target in own.items():
            if key not in state:
                continue
            value = state[key]
            array = value._data if isinstance(value, Tensor) else np.asarray(value)
            if array.shape != target.shape:
                raise ValueError(f"load_state_dict of {type(self).__name__}: {key!r} has shape "
                                 f"{array.shape}, the module's has {tuple(target.shape)}")
            np.copyto(target._data, array, casting="same_kind")
        for p in self.parameters():
            p._version_box[0] += 1
        return missing, unexpected

    # ------------------------------------------------------------------ printing
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({name}): " + repr(m).replace("\n", "\n  ")
                 for name, m in self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"


class Sequential(Module):
    """Modules applied in order: ``Sequential(Linear(2, 8), ReLU(), Linear(8, 1))``."""

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], dict):
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), m)

    def forward(self, x: Any) -> Any:
        for m in self.children():
            x = m(x)
        return x

    def __getitem__(self, index: int | slice) -> Module:
        items = list(self._modules.values())
        if isinstance(index, slice):
            return Sequential(*items[index])
        return items[index]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self._modules)), module)
        return self


class ModuleList(Module):
    """A list of modules whose parameters the owner sees."""

    def __init__(self, modules: Any = ()) -> None:
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self._modules)), module)
        return self

    def __getitem__(self, index: int) -> Module:
        return list(self._modules.values())[index]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


class ModuleDict(Module):
    """A dict of modules whose parameters the owner sees."""

    def __init__(self, modules: dict[str, Module] | None = None) -> None:
        super().__init__()
        for name, m in (modules or {}).items():
            self.add_module(name, m)

    def __getitem__(self, name: str) -> Module:
        return self._modules[name]

    def __setitem__(self, name: str, module: Module) -> None:
        self.add_module(name, module)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()
