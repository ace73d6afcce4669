"""``gemm(a, b, out)``: ``out = a @ b`` for 2-D float32/float64 matrices in compiled code,
through the BLAS NumPy itself links where it can be found, else Numba's ``np.dot``.

Numba's ``np.dot`` calls SciPy's BLAS (``scipy.linalg.cython_blas``). NumPy's wheels bundle
their own OpenBLAS, often a newer one: on an AVX-512 Xeon, OpenBLAS 0.3.31 (NumPy 2.4)
ran W2's float32 products 5-16% faster than SciPy's 0.3.30 on one core. This module
finds NumPy's ``cblas_?gemm`` (64-bit integers; ``scipy_cblas_?gemm64_`` in NumPy's wheels,
``cblas_?gemm64_`` in older ones) when it is imported and keeps the two addresses in a
table that compiled code reads by a symbol name (so the code stays cacheable and the
same whichever BLAS runs). Operands are read in place, whatever their strides, where one
dimension has unit stride (a transposed view is ``Trans``, no copy); anything else, and
a process where the table is empty, goes through ``np.dot``. A product with one row or
one column (``X.T @ u`` of a ``(k, 1)`` ``u``) calls ``cblas_?gemv`` from the same
library: OpenBLAS's ``gemm`` takes three times as long for it (W4's 2000 x 100
``X.T @ u``: 141 us against 42 us). ``NBGRAD_GEMM=numba`` leaves the table empty
(Numba's ``np.dot`` everywhere).
"""

from __future__ import annotations

import ctypes
import glob
import os

import numpy as np
from llvmlite import binding as _ll
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from .blas import pointer_table_entry

OPTS = dict(cache=True, nogil=True)

_SYMBOLS = ("scipy_cblas_{}gemm64_", "cblas_{}gemm64_")
#: addresses of NumPy's ``cblas_sgemm``, ``cblas_dgemm``, ``cblas_sgemv`` and
#: ``cblas_dgemv`` (64-bit integers), or 0
SLOTS = (ctypes.c_void_p * 4)()
_ll.add_symbol("nbgrad_gemm_slots", ctypes.addressof(SLOTS))


def numpy_blas() -> tuple[str, int, int, int, int] | None:
    """(library path, then the addresses of sgemm, dgemm, sgemv and dgemv) of NumPy's
    bundled BLAS, or None."""
    base = os.path.dirname(np.__file__)
    paths = []
    for pattern in ("../numpy.libs/*openblas*", ".dylibs/*openblas*", "../numpy.libs/*blas*"):
        paths += sorted(glob.glob(os.path.join(base, pattern)))
    for path in dict.fromkeys(paths):
        try:
            lib = ctypes.CDLL(path)  # loaded already by NumPy: the same library
        except OSError:
            continue
        for symbol in _SYMBOLS:
            try:
                found = [ctypes.cast(getattr(lib, symbol.format(t).replace("gemm", kind)),
                                     ctypes.c_void_p).value
                         for kind in ("gemm", "gemv") for t in "sd"]
            except AttributeError:
                continue
            if all(found):
                return (path, *found)
    return None


def install(enabled: bool = True) -> str | None:
    """Fill the table with NumPy's BLAS (``enabled``) or empty it; the library in use."""
    found = numpy_blas() if enabled else None
    SLOTS[:] = found[1:] if found else [None] * len(SLOTS)
    return found[0] if found else None


LIBRARY = install(os.environ.get("NBGRAD_GEMM", "numpy").strip().lower() != "numba")


#: entry ``index`` of the table (0 when empty)
_slot = pointer_table_entry("nbgrad_gemm_slots", 4)


@intrinsic
def _cblas_gemm(typingctx, function, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, like):
    """``cblas_?gemm(RowMajor, ta, tb, m, n, k, 1, a, lda, b, ldb, 0, c, ldc)`` at address
    ``function``; the dtype of the array ``like`` picks the precision."""
    def codegen(context, builder, signature, args):
        fn, ta_, tb_, m_, n_, k_, a_, lda_, b_, ldb_, c_, ldc_, _ = args
        i32, i64, ptr = ir.IntType(32), ir.IntType(64), ir.IntType(8).as_pointer()
        real = context.get_value_type(signature.args[-1].dtype)
        callee_type = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i64, i64, i64, real, ptr,
                                                      i64, ptr, i64, real, ptr, i64])
        callee = builder.inttoptr(fn, callee_type.as_pointer())
        builder.call(callee, [
            ir.Constant(i32, 101), builder.trunc(ta_, i32), builder.trunc(tb_, i32),
            m_, n_, k_, ir.Constant(real, 1.0), builder.inttoptr(a_, ptr), lda_,
            builder.inttoptr(b_, ptr), ldb_, ir.Constant(real, 0.0), builder.inttoptr(c_, ptr),
            ldc_])
        return context.get_dummy_value()
    i, p = types.int64, types.uintp
    return types.void(types.uintp, i, i, i, i, i, p, i, p, i, p, i, like), codegen


@intrinsic
def _cblas_gemv(typingctx, function, trans, m, n, a, lda, x, incx, y, incy, like):
    """``cblas_?gemv(RowMajor, trans, m, n, 1, a, lda, x, incx, 0, y, incy)`` at address
    ``function`` (``y = A x`` of the ``m x n`` row-major ``A``, or ``A.T x``); the dtype of
    the array ``like`` picks the precision."""
    def codegen(context, builder, signature, args):
        fn, trans_, m_, n_, a_, lda_, x_, incx_, y_, incy_, _ = args
        i32, i64, ptr = ir.IntType(32), ir.IntType(64), ir.IntType(8).as_pointer()
        real = context.get_value_type(signature.args[-1].dtype)
        callee_type = ir.FunctionType(ir.VoidType(), [i32, i32, i64, i64, real, ptr, i64,
                                                      ptr, i64, real, ptr, i64])
        callee = builder.inttoptr(fn, callee_type.as_pointer())
        builder.call(callee, [
            ir.Constant(i32, 101), builder.trunc(trans_, i32), m_, n_, ir.Constant(real, 1.0),
            builder.inttoptr(a_, ptr), lda_, builder.inttoptr(x_, ptr), incx_,
            ir.Constant(real, 0.0), builder.inttoptr(y_, ptr), incy_])
        return context.get_dummy_value()
    i, p = types.int64, types.uintp
    return types.void(types.uintp, i, i, i, p, i, p, i, p, i, like), codegen


@njit(inline="always")
def _increment(stride, size):
    """The BLAS increment of a vector of byte ``stride``, or 0 where BLAS cannot read it."""
    return stride // size if stride > 0 and stride % size == 0 else 0


@njit(inline="always")
def _gemv(a, b, out, size, ta, lda, tb, ldb):
    """``out = a @ b`` through ``cblas_?gemv`` where ``b`` has one column or ``a`` one row
    (``out.T = b.T @ a.T``); False where it does not apply (the caller runs gemm)."""
    m, k = a.shape
    n = b.shape[1]
    fn = _slot(2 if size == 4 else 3)
    if fn == 0:
        return False
    # y = M x for the rows x cols matrix M read with trans code t (112: M is the transpose
    # of the row-major cols x rows matrix there)
    if n == 1 and m > 1:  # out's column = a @ b's column
        t, rows, cols, mat, ld, x = ta, m, k, a.ctypes.data, lda, b.ctypes.data
        incx, incy = _increment(b.strides[0], size), _increment(out.strides[0], size)
    elif m == 1:  # out's row = b.T @ a's row (b.T: the other trans code of b)
        t, rows, cols, mat, ld, x = 223 - tb if tb else 0, n, k, b.ctypes.data, ldb, \
            a.ctypes.data
        incx, incy = _increment(a.strides[1], size), _increment(out.strides[1], size)
    else:
        return False
    if t == 0 or incx == 0 or incy == 0:
        return False
    if t == 112:
        rows, cols = cols, rows
    _cblas_gemv(fn, t, rows, cols, mat, ld, x, incx, out.ctypes.data, incy, out)
    return True


@njit(inline="always")
def _operand(strides, rows, cols, size):
    """``(trans, ld)`` for BLAS of a row-major ``rows x cols`` matrix with byte
    ``strides`` (``trans`` 111 NoTrans, 112 Trans), or (0, 0) where it needs a copy."""
    s0, s1 = strides
    if (cols == 1 or s1 == size) and (rows == 1 or (s0 % size == 0 and s0 >= cols * size)):
        return 111, s0 // size if rows > 1 else max(cols, 1)
    if (rows == 1 or s0 == size) and (cols == 1 or (s1 % size == 0 and s1 >= rows * size)):
        return 112, s1 // size if cols > 1 else max(rows, 1)
    return 0, 0


def _dot(a, b, out):
    """Numba's ``np.dot`` into ``out`` (operands neither C- nor F-contiguous copied)."""


@overload(_dot)
def _dot_impl(a, b, out):
    if a.layout in "CF" and b.layout in "CF":
        return lambda a, b, out: np.dot(a, b, out)
    return lambda a, b, out: np.dot(np.ascontiguousarray(a), np.ascontiguousarray(b), out)


@njit(**OPTS)
def gemm(a, b, out):
    """``out[...] = a @ b`` (2-D arrays of one float dtype; ``out`` must not overlap them)."""
    m, k = a.shape
    n = b.shape[1]
    if b.shape[0] != k or out.shape[0] != m or out.shape[1] != n:
        raise ValueError("gemm: operands of shapes that do not multiply into out")
    if m == 0 or n == 0:
        return
    if k == 0:
        out[...] = 0
        return
    size = out.itemsize
    fn = _slot(0 if size == 4 else 1)
    ta, lda = _operand(a.strides, m, k, size)
    tb, ldb = _operand(b.strides, k, n, size)
    if (n == 1 or m == 1) and _gemv(a, b, out, size, ta, lda, tb, ldb):
        _keep_alive(a, b, out)
        return
    tc, ldc = _operand(out.strides, m, n, size)
    if fn == 0 or ta == 0 or tb == 0 or tc != 111:
        _dot(a, b, out)
        return
    _cblas_gemm(fn, ta, tb, m, n, k, a.ctypes.data, lda, b.ctypes.data, ldb,
                out.ctypes.data, ldc, out)
    _keep_alive(a, b, out)


@njit(**OPTS)
def _keep_alive(a, b, out):
    """A use of the arrays after the call (a ``.ctypes`` pointer is not a use)."""
    return a.size + b.size + out.size
