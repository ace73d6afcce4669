"""Op kinds: what the executors need to know about an op, declared once at registration.

Every op has one *kind*, given where its CPU kernel registers
(``@kernel(name, kind=...)``; :class:`Opaque` when none is given). Tier-1 lowering,
tier-2 planning and code generation, the interpreter and CUDA fusion keep rules keyed
by kind class and read the kind's parameters; none keeps a list of op names. A new op
of an existing kind (a matmul-like op, a view) therefore lowers natively in every tier
with no change to ``nbgrad/jit/``.

A kind's parameters are plain values or functions of the node's attributes (``attrs``,
the op's non-tensor arguments by name) and static shapes, never of tensor values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Attrs = dict
Shape = tuple[int, ...]


class Kind:
    """Base of the op kinds."""

    #: a short label (``nbgrad ops``, generated-code comments)
    label = "opaque"


@dataclass(frozen=True)
class Elementwise(Kind):
    """Each output element is a scalar expression of the same (broadcast) element of
    every tensor input: the :class:`~nbgrad.kernels.elementwise.ScalarOp` ``spec``,
    with the op's other arguments passed as its numeric parameters."""

    spec: object
    #: maps the op's non-tensor arguments to the scalar expression's float parameters
    #: (for arguments that are not numbers, e.g. ``gelu``'s ``approximate``)
    encode: Callable[..., tuple[float, ...]] | None = None
    #: the expression's names of the tensor arguments, in table order (None: ``x``;
    #: ``a, b``; ``c, a, b`` for one, two, three tensors)
    operands: tuple[str, ...] | None = None
    label = "elementwise"

    def operand_names(self, count: int) -> tuple[str, ...]:
        """The scalar expression's names of ``count`` tensor arguments, in table order."""
        if self.operands is not None:
            return self.operands
        return {1: ("x",), 2: ("a", "b"), 3: ("c", "a", "b")}[count]


@dataclass(frozen=True)
class Fill(Kind):
    """The output has the input's shape and dtype, every element ``value``."""

    value: float
    label = "fill"


@dataclass(frozen=True)
class Cast(Kind):
    """Elementwise conversion of the input to ``attrs["dtype"]``."""

    label = "cast"


@dataclass(frozen=True)
class View(Kind):
    """The output holds the input's elements in the same (C) order, in another shape."""

    label = "view"


@dataclass(frozen=True)
class Permute(Kind):
    """The output is the input with its dimensions permuted by ``perm(attrs, ndim)``."""

    perm: Callable[[Attrs, int], tuple[int, ...]]
    label = "permute"


@dataclass(frozen=True)
class Broadcast(Kind):
    """The output broadcasts the input (NumPy rules) after inserting size-1 dimensions
    at ``unsqueeze(attrs, out_ndim)`` (dims of the output; None: none inserted)."""

    unsqueeze: Callable[[Attrs, int], tuple[int, ...]] | None = None
    label = "broadcast"


@dataclass(frozen=True)
class Move(Kind):
    """Every output element is one element of the (single) tensor input: positions are
    found by running the op's kernel on an ``arange`` of the input's shape."""

    label = "move"


@dataclass(frozen=True)
class Reduction(Kind):
    """A sum (or mean) of the input over ``dims(attrs, in_shape)``; the output keeps
    the reduced dimensions as size 1 when it has the input's rank."""

    dims: Callable[[Attrs, Shape], tuple[int, ...]]
    mean: bool = False
    label = "reduction"


@dataclass(frozen=True)
class Matmul(Kind):
    """NumPy ``matmul`` of the first two tensor inputs (``mm``, ``bmm``, ``dot`` are
    rank-restricted cases). ``outer``: ``a[:, None] * b[None, :]``. ``transpose_b``: the
    second operand is used transposed over its last two dimensions (``linear``).
    ``bias``: the position of an optional tensor argument added to every row."""

    outer: bool = False
    transpose_b: bool = False
    bias: int | None = None
    label = "matmul"


@dataclass(frozen=True)
class Join(Kind):
    """``cat`` (``stack=False``) or ``stack`` of a tensor list along ``attrs["dim"]``."""

    stack: bool = False
    label = "join"


@dataclass(frozen=True)
class IndexScatter(Kind):
    """``index_backward`` (``put=False``: zeros of ``attrs["sizes"]`` with the gradient
    written at the index) or ``index_put`` (``put=True``: a copy of ``self`` with
    ``values`` written or accumulated at the index)."""

    put: bool = False
    label = "index"


@dataclass(frozen=True)
class NativePlan:
    """How an opaque op's native is called for some attributes and shapes (what
    :attr:`Opaque.static` returns).

    The native takes every tensor argument *flat* (1-D, C order; a tensor list as a tuple
    of them; an absent optional tensor as an empty array of the first tensor's dtype),
    then ``consts`` (numbers, bools, strings, dtypes or None; a tuple of ints is passed as
    a 1-D int64 array), and returns its outputs flat, which the caller reshapes to
    ``shapes`` (one per output). Ranks and shapes are values, not types, so a native
    compiles once per dtype rather than once per rank.
    """

    consts: tuple
    shapes: tuple[Shape, ...]


@dataclass(frozen=True)
class Batching:
    """How ``vmap`` batches an :class:`Opaque` op: a rule family of
    :data:`nbgrad.batching.opaque.FAMILIES` (``"along"`` a dim attribute, ``"leading"``
    batch dimensions of linear algebra, ``"broadcasting"``, ``"images"``, or a rule of
    its own) and the family's arguments."""

    family: str
    args: tuple = ()
    options: tuple[tuple[str, object], ...] = ()


def batching(family: str, *args: object, **options: object) -> Batching:
    """``Batching(family, args, options)``, spelled as a call of the family."""
    return Batching(family, args, tuple(sorted(options.items())))


@dataclass(frozen=True)
class Opaque(Kind):
    """Any other op: its kernel runs as is.

    ``native``: an ``@njit`` function that generated code and the op's CPU kernel call
    as :class:`NativePlan` says, with the plan ``static(attrs, shapes)`` (``shapes``: the
    tensor arguments' shapes, None for an absent one). Without one, ``why_not_native``
    says why the op cannot run natively (tier 1 runs it as an eager step, tier 2 through
    ``objmode``; the reason is shown in ``compiled.source()``). ``batch``: how ``vmap``
    batches the op (None: it raises naming the op); usually given as ``@kernel(...,
    batch=...)``.
    """

    native: Callable | None = None
    static: Callable[[Attrs, tuple[Shape | None, ...]], NativePlan] | None = None
    why_not_native: str | None = None
    batch: Batching | None = None
    label = "opaque"

    def __post_init__(self) -> None:
        if self.native is not None and self.static is None:
            raise TypeError(f"Opaque: native {getattr(self.native, '__name__', self.native)} "
                            "needs a static(attrs, shapes) returning its NativePlan")


OPAQUE = Opaque()
