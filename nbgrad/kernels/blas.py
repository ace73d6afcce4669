"""Matrix kernels: products through BLAS (eager products call NumPy's ``dot``/``matmul``
directly, generated code and natives call ``np.dot`` inside ``@njit``), batched LAPACK
decompositions (``np.linalg`` inside ``@njit``, ``potrf``) and triangular solves (BLAS
``trsm``)."""

from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import binding as _ll
from llvmlite import ir
from numba import njit, types
from numba.core.errors import TypingError
from numba.extending import intrinsic, overload
from numba.np.linalg import _LAPACK, get_blas_kind

from ..errors import LinAlgError
from .layout import broadcast, c_contiguous, flat, native_const, permuted, view3

OPTS = dict(cache=True, nogil=True)


def blas_ready(x: np.ndarray) -> np.ndarray:
    """A C- or F-contiguous array (what BLAS takes without a copy)."""
    if x.flags.c_contiguous or x.flags.f_contiguous:
        return x
    return c_contiguous(x)


# The eager products call NumPy's BLAS from Python: the same GEMM as ``np.dot`` inside
# ``@njit``, without compiling a kernel per layout (about 0.4 s each on a cold start).
def matmul2d(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty((a.shape[0], b.shape[1]), np.result_type(a, b))
    if out.size == 0:
        return out
    if a.shape[1] == 0:
        out[...] = 0
        return out
    np.dot(blas_ready(a).astype(out.dtype, copy=False),
           blas_ready(b).astype(out.dtype, copy=False), out=out)
    return out


def matmul3d(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty((a.shape[0], a.shape[1], b.shape[2]), np.result_type(a, b))
    if out.size == 0:
        return out
    if a.shape[2] == 0:
        out[...] = 0
        return out
    np.matmul(c_contiguous(a).astype(out.dtype, copy=False),
              c_contiguous(b).astype(out.dtype, copy=False), out=out)
    return out


def matmul_nd(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NumPy's ``matmul`` semantics: 1-D promotion and broadcast batch dimensions."""
    a1, b1 = a.ndim == 1, b.ndim == 1
    A = a[None, :] if a1 else a
    B = b[:, None] if b1 else b
    if A.ndim == 2 and B.ndim == 2:
        out = matmul2d(A, B)
    else:
        batch = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        count = int(np.prod(batch, dtype=np.int64))  # not -1: ambiguous for empty matrices
        A3 = np.broadcast_to(A, batch + A.shape[-2:]).reshape((count,) + A.shape[-2:])
        B3 = np.broadcast_to(B, batch + B.shape[-2:]).reshape((count,) + B.shape[-2:])
        out = matmul3d(A3, B3).reshape(batch + (A.shape[-2], B.shape[-1]))
    if a1:
        out = out[..., 0, :]
    if b1:
        out = out[..., 0]
    return c_contiguous(out)


# ------------------------------------------------------------------ einsum of two operands
def einsum_plan(a_shape: tuple[int, ...], a_labels: str, b_shape: tuple[int, ...],
                b_labels: str, out_labels: str) -> tuple:
    """How :func:`einsum_native` computes ``np.einsum(f"{a_labels},{b_labels}->
    {out_labels}", a, b)`` as one batched GEMM: the native's constants ``(a_shape,
    a_perm, a3, b_shape, b_perm, b3, grouped, out_perm)`` (a perm ``()`` where it is the
    identity) and the output's shape.

    The equation must be *clean*: no label repeats within an operand, and every label
    appears in at least two of the two operands and the output. Labels then fall in
    four groups: batch (in both operands and the output), left-free, right-free and
    contracted. ``a`` is laid out as (batch, left, contracted) (``a3``), ``b`` as
    (batch, contracted, right) (``b3``); the product has the ``grouped`` shape (batch,
    left, right) and is transposed by ``out_perm``. No NumPy ``einsum`` is involved.
    """
    size = dict(zip(a_labels, a_shape, strict=True))
    size.update(zip(b_labels, b_shape, strict=True))
    batch = [c for c in out_labels if c in a_labels and c in b_labels]
    left = [c for c in out_labels if c in a_labels and c not in b_labels]
    right = [c for c in out_labels if c in b_labels and c not in a_labels]
    contracted = [c for c in a_labels if c in b_labels and c not in out_labels]

    def prod(labels) -> int:
        n = 1
        for c in labels:
            n *= size[c]
        return n

    def perm(order: list[int]) -> tuple[int, ...]:
        return () if order == sorted(order) else tuple(order)

    nb, m, k, n = prod(batch), prod(left), prod(contracted), prod(right)
    grouped = batch + left + right
    return ((tuple(a_shape), perm([a_labels.index(c) for c in batch + left + contracted]),
             (nb, m, k), tuple(b_shape),
             perm([b_labels.index(c) for c in batch + contracted + right]), (nb, k, n),
             tuple(size[c] for c in grouped), perm([grouped.index(c) for c in out_labels])),
            tuple(size[c] for c in out_labels))


@njit(**OPTS)
def einsum_native(operands, a_shape, a_perm, a3, b_shape, b_perm, b3, grouped, out_perm):
    """The two-operand einsum planned by :func:`einsum_plan` (BLAS products), flat."""
    a = permuted(operands[0], a_shape, a_perm).reshape((a3[0], a3[1], a3[2]))
    b = permuted(operands[1], b_shape, b_perm).reshape((b3[0], b3[1], b3[2]))
    out = np.empty((a3[0], a3[1], b3[2]), a.dtype)
    if out.size:
        if a3[2] == 0:
            out[:] = 0
        else:
            for i in range(a3[0]):
                np.dot(a[i], b[i], out[i])
    return permuted(out.reshape(-1), grouped, out_perm)


def einsum_pair(a: np.ndarray, a_labels: str, b: np.ndarray, b_labels: str,
                out_labels: str) -> np.ndarray:
    """``np.einsum(f"{a_labels},{b_labels}->{out_labels}", a, b)`` (see
    :func:`einsum_plan`)."""
    consts, shape = einsum_plan(a.shape, a_labels, b.shape, b_labels, out_labels)
    return einsum_native((flat(a), flat(b)), *map(native_const, consts)).reshape(shape)


# ------------------------------------------------------------------ LAPACK, batched
# Numba implements np.linalg.* on 2-D arrays through SciPy's LAPACK; these loops run
# them over a C-contiguous (batch, n, n) stack. A LinAlgError raised inside is NumPy's.
@njit(**OPTS)
def inv_batched(a, out):
    for i in range(a.shape[0]):
        out[i] = np.linalg.inv(a[i])


@njit(**OPTS)
def det_batched(a, out):
    for i in range(a.shape[0]):
        out[i] = np.linalg.det(a[i])


@njit(**OPTS)
def slogdet_batched(a, sign, logabs):
    for i in range(a.shape[0]):
        s, v = np.linalg.slogdet(a[i])
        sign[i] = s
        logabs[i] = v


@njit(**OPTS)
def solve_batched(a, b, out):
    for i in range(a.shape[0]):
        out[i] = np.linalg.solve(a[i], b[i])


@njit(**OPTS)
def cholesky_batched(a, out):
    for i in range(a.shape[0]):
        out[i] = np.linalg.cholesky(a[i])


# ------------------------------------------------------------------ BLAS/LAPACK calls
# ``trsm`` (BLAS ``?trsm``; ``?trsv`` for one right-hand side) and ``potrf`` on C-order
# float32/float64 matrices, in place, for the natives below. ``?potrf`` is Numba's binding
# of SciPy's LAPACK. ``?trsm``/``?trsv``, which Numba does not bind, come from
# ``scipy.linalg.cython_blas`` (the BLAS SciPy links), through a table of function
# pointers that compiled code reads by a symbol name (so it stays cacheable); the first
# call in a process fills the table (importing ``scipy.linalg`` then, not at nbgrad's
# import) through a callback. They live in this file because Numba's cache of a native is
# keyed by the native's own file (and so is tier 2's ``native_digest``): code inlined
# from another file would go stale there. Column-major routines see a C-order matrix
# transposed; the wrappers set the flags for that.
_BLAS_NAMES = ("strsm", "dtrsm", "strsv", "dtrsv", "strmm", "dtrmm")
_BLAS_SLOTS = (ctypes.c_void_p * len(_BLAS_NAMES))()


def _address(module, name: str) -> int:
    """The C address of ``module``'s Cython function ``name`` (from its capsule)."""
    capsule = module.__pyx_capi__[name]
    get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
        ("PyCapsule_GetName", ctypes.pythonapi))
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))
    return get_pointer(capsule, get_name(capsule))


def _fill_blas_slots() -> None:
    """Fill the table of BLAS pointers (called back from compiled code, GIL taken)."""
    import scipy.linalg.cython_blas as cython_blas
    for i, name in enumerate(_BLAS_NAMES):
        _BLAS_SLOTS[i] = _address(cython_blas, name)


_FILL_CALLBACK = ctypes.CFUNCTYPE(None)(_fill_blas_slots)
_ll.add_symbol("nbgrad_blas_slots", ctypes.addressof(_BLAS_SLOTS))
_ll.add_symbol("nbgrad_blas_fill", ctypes.cast(_FILL_CALLBACK, ctypes.c_void_p).value)
_fill_slots = types.ExternalFunction("nbgrad_blas_fill", types.void())


def pointer_table_entry(symbol: str, size: int):
    """An intrinsic reading entry ``index`` of the table of ``size`` C pointers that the
    process exports as ``symbol`` (``llvmlite.binding.add_symbol``; 0 while unfilled).
    Compiled code reads the table when it runs, so it stays cacheable across processes."""
    @intrinsic
    def entry(typingctx, index):
        def codegen(context, builder, signature, args):
            table_type = ir.ArrayType(ir.IntType(8).as_pointer(), size)
            table = builder.module.globals.get(symbol)
            if table is None:
                table = ir.GlobalVariable(builder.module, table_type, symbol)
                table.linkage = "external"
            item = builder.gep(table, [ir.Constant(ir.IntType(32), 0), args[0]])
            return builder.ptrtoint(builder.load(item), context.get_value_type(types.uintp))
        return types.uintp(index), codegen
    return entry


#: entry ``index`` of the table of BLAS pointers (0 while unfilled)
_blas_slot = pointer_table_entry("nbgrad_blas_slots", len(_BLAS_NAMES))


@intrinsic
def _call_void(typingctx, function, pointers):
    """Call the C function at address ``function`` with the addresses ``pointers``."""
    def codegen(context, builder, signature, args):
        bytes_ptr = ir.IntType(8).as_pointer()
        count = signature.args[1].count
        callee_type = ir.FunctionType(ir.VoidType(), [bytes_ptr] * count)
        callee = builder.inttoptr(args[0], callee_type.as_pointer())
        builder.call(callee, [builder.inttoptr(builder.extract_value(args[1], i), bytes_ptr)
                              for i in range(count)])
        return context.get_dummy_value()
    return types.void(function, pointers), codegen


@njit(**OPTS)
def _blas_function(index):
    """The address of BLAS routine ``_BLAS_NAMES[index]`` (filling the table once)."""
    address = _blas_slot(index)
    if address == 0:
        _fill_slots()
        address = _blas_slot(index)
        if address == 0:
            raise RuntimeError("nbgrad: SciPy's BLAS (scipy.linalg.cython_blas) could not "
                               "be loaded")
    return address


def trsm(a, b, lower, unit, left, trans):
    """Solve ``op(a) @ x = b`` (``left``) or ``x @ op(a) = b`` in place in ``b`` for a
    triangular ``a``: its ``lower`` (else upper) triangle is read, its diagonal taken as
    ones when ``unit``, ``op(a) = a.T`` when ``trans``. ``a`` (n, n) and ``b`` are
    C-contiguous 2-D float32 or float64 arrays of one dtype. A zero on the diagonal gives
    infinities or NaNs, as substitution does."""


def _check(name: str, *arrays) -> None:
    for x in arrays:
        if x.dtype not in (types.float32, types.float64) or x.ndim != 2 or x.layout != "C":
            raise TypingError(f"{name}: needs C-contiguous 2-D float32/float64 arrays, "
                              f"got {x}")


@overload(trsm)
def _trsm(a, b, lower, unit, left, trans):
    _check("trsm", a, b)
    double = a.dtype == types.float64
    which_trsm, which_trsv = _BLAS_NAMES.index("dtrsm" if double else "strsm"), \
        _BLAS_NAMES.index("dtrsv" if double else "strsv")

    def impl(a, b, lower, unit, left, trans):
        if b.size == 0:
            return
        if b.shape[1 if left else 0] != 1:
            _level3(_blas_function(which_trsm), left, lower, trans, unit, a, b)
            return
        # one right-hand side, contiguous: ?trsv
        n = a.shape[0]
        flags = np.empty(3, np.uint8)
        ints = np.empty(3, np.int32)
        f, i = flags.ctypes.data, ints.ctypes.data
        flags[0] = 85 if lower else 76     # 'U' : 'L' (the triangle of a.T)
        flags[1] = 84 if left != trans else 78  # a.T solves x op(a) = b: 'N'
        flags[2] = 85 if unit else 78
        ints[0] = n
        ints[1] = max(n, 1)
        ints[2] = 1
        _call_void(_blas_function(which_trsv),
                   (f, f + 1, f + 2, i, a.ctypes.data, i + 4, b.ctypes.data, i + 8))
        _keep_alive(flags, ints, a, b)

    return impl


@njit(**OPTS)
def _level3(function, left, lower, trans, unit, a, b):
    """BLAS ``?trsm`` or ``?trmm`` (one argument list) at address ``function``, alpha 1,
    in place in the C-order ``b`` for the C-order triangular ``a``: ``op(a) x = b`` or
    ``b := op(a) b`` (``left``), else ``x op(a) = b`` or ``b := b op(a)``. Column-major
    BLAS sees ``a`` as ``a.T`` and ``b`` as ``b.T``: ``op(a) x = b  <=>  x.T op(a).T =
    b.T`` (side R), and ``x op(a) = b  <=>  op(a).T x.T = b.T`` (side L); ``a.T``'s
    triangle is the other one."""
    flags = np.empty(4, np.uint8)
    ints = np.empty(4, np.int32)
    alpha = np.ones(1, b.dtype)
    f, i = flags.ctypes.data, ints.ctypes.data
    flags[0] = 82 if left else 76      # 'R' : 'L'
    flags[1] = 85 if lower else 76     # 'U' : 'L'
    flags[2] = 84 if trans else 78     # 'T' : 'N'
    flags[3] = 85 if unit else 78      # 'U' : 'N'
    ints[0] = b.shape[1]               # m: rows of b.T
    ints[1] = b.shape[0]               # n: columns of b.T
    ints[2] = max(a.shape[0], 1)       # lda
    ints[3] = max(b.shape[1], 1)       # ldb
    _call_void(function, (f, f + 1, f + 2, f + 3, i, i + 4, alpha.ctypes.data,
                          a.ctypes.data, i + 8, b.ctypes.data, i + 12))
    _keep_alive(flags, ints, alpha, a, b)


def trmm(a, b, lower, trans):
    """``b[...] = op(a) @ b`` in place for a triangular ``a``: only its ``lower`` (else
    upper) triangle is read, ``op(a) = a.T`` when ``trans``. ``a`` (n, n) and ``b`` (n, k)
    are C-contiguous 2-D float32 or float64 arrays of one dtype (BLAS ``?trmm``: half the
    work of a general product)."""


@overload(trmm)
def _trmm(a, b, lower, trans):
    _check("trmm", a, b)
    which = _BLAS_NAMES.index("dtrmm" if a.dtype == types.float64 else "strmm")

    def impl(a, b, lower, trans):
        if b.size:
            _level3(_blas_function(which), True, lower, trans, False, a, b)

    return impl


@njit(**OPTS)
def _keep_alive(*arrays):
    """A use of ``arrays`` after the call (Numba may free an array after its last use,
    and a ``.ctypes`` pointer is not a use)."""
    return len(arrays)


def potrf(a):
    """The lower Cholesky factor of the symmetric ``a`` (C-contiguous, 2-D, read from its
    lower triangle) in place, its strict upper triangle zeroed; returns LAPACK's
    ``info`` (> 0: the leading minor of that order is not positive definite; ``a`` is
    then partly overwritten)."""


@overload(potrf)
def _potrf(a):
    _check("potrf", a)
    fn = _LAPACK().numba_xxpotrf(a.dtype)
    kind = ord(get_blas_kind(a.dtype, "cholesky"))

    def impl(a):
        n = a.shape[0]
        if n == 0:
            return 0
        info = fn(kind, 85, n, a.ctypes, n)  # 'U' of a.T: the lower triangle of a
        if info == 0:
            for r in range(n - 1):
                a[r, r + 1:] = 0
        return info

    return impl


# ------------------------------------------------------------------ natives
# ``@njit`` entry points that generated code calls directly (``Opaque.native``) and the
# ops' CPU kernels call too, flat (``NativePlan``). ``stack``: (batch, rows, cols) of an
# input; (prefix, suffix): the LinAlgError message around NumPy's words.
@njit(**OPTS)
def _lapack_failure(a, b):
    """Why a LAPACK solve or inverse of ``a`` (and ``b``) failed, in NumPy's words."""
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return "Array must not contain infs or NaNs."
    return "Matrix is singular to machine precision."


@njit(**OPTS)
def inv_native(A, stack, prefix, suffix):
    """The inverse of each matrix of ``A``."""
    a = view3(A, stack)
    out = np.empty_like(a)
    for i in range(stack[0]):
        ok = True
        try:
            out[i] = np.linalg.inv(a[i])
        except Exception:  # noqa: BLE001 - Numba binds no exception; the message is NumPy's
            ok = False
        if not ok:
            raise LinAlgError(prefix + _lapack_failure(a[i], a[i]) + suffix)
    return out.reshape(-1)


@njit(**OPTS)
def cholesky_native(A, stack, prefix, suffix):
    """The lower Cholesky factor of each matrix of ``A`` (LAPACK ``potrf``)."""
    out = view3(A, stack).copy()
    for i in range(stack[0]):
        if potrf(out[i]) != 0:
            raise LinAlgError(prefix + "Matrix is not positive definite." + suffix)
    return out.reshape(-1)


@njit(**OPTS)
def det_native(A, stack):
    """The determinant of each matrix of ``A``."""
    out = np.empty(stack[0], A.dtype)
    det_batched(view3(A, stack), out)
    return out


@njit(**OPTS)
def slogdet_native(A, stack):
    """``(sign, logabsdet)`` of each matrix of ``A``."""
    sign = np.empty(stack[0], A.dtype)
    logabs = np.empty(stack[0], A.dtype)
    slogdet_batched(view3(A, stack), sign, logabs)
    return sign, logabs


@njit(**OPTS)
def solve_native(A, B, a_shape, b_matrix, a_full, b_full, a_stack, b_stack, prefix, suffix):
    """``X`` with ``A @ X = B`` (``B`` as the matrices ``b_matrix``), batches broadcast."""
    a = view3(broadcast(A, a_shape, a_full), a_stack)
    b = view3(broadcast(B, b_matrix, b_full), b_stack)
    out = np.empty_like(b)
    for i in range(a_stack[0]):
        ok = True
        try:
            out[i] = np.linalg.solve(a[i], b[i])
        except Exception:  # noqa: BLE001
            ok = False
        if not ok:
            raise LinAlgError(prefix + _lapack_failure(a[i], b[i]) + suffix)
    return out.reshape(-1)


@njit(**OPTS)
def triangular_matmul_native(A, B, upper, transpose, a_shape, b_shape, a_full, b_full,
                             a_stack, b_stack):
    """``op(T) @ B`` for the upper (else lower) triangle ``T`` of each ``A``, ``op(T) = T.T``
    when ``transpose`` (BLAS ``trmm``), batches broadcast."""
    a = view3(broadcast(A, a_shape, a_full), a_stack)
    x = view3(broadcast(B, b_shape, b_full).copy(), b_stack)
    for i in range(a_stack[0] if x.size else 0):
        trmm(a[i], x[i], not upper, transpose)
    return x.reshape(-1)


@njit(**OPTS)
def solve_triangular_native(A, B, upper, unit, left, a_shape, b_shape, a_full, b_full,
                            a_stack, b_stack, prefix, suffix):
    """``X`` with ``A @ X = B`` (``X @ A = B`` unless ``left``) for each triangular ``A``
    (BLAS ``trsm``; ``trsv`` for one right-hand side), batches broadcast. A zero on the
    diagonal (unless ``unit``) raises LinAlgError."""
    a = view3(broadcast(A, a_shape, a_full), a_stack)
    x = view3(broadcast(B, b_shape, b_full).copy(), b_stack)
    for i in range(a_stack[0] if x.size else 0):
        if not unit:
            for r in range(a_stack[1]):
                if a[i, r, r] == 0:
                    raise LinAlgError(prefix + "Matrix is singular: diagonal entry "
                                      + str(r) + " is zero." + suffix)
        trsm(a[i], x[i], not upper, unit, left, False)
    return x.reshape(-1)
