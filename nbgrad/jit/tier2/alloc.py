"""Allocating, filling and permuting arrays (and string constants) in tier-2 generated
code, with nothing to compile per process.

``np.empty(shape, dtype)``, ``a.fill(value)`` or ``np.transpose(a, axes)`` in an
``@njit`` function makes Numba compile its overload for each signature it meets, once in
every process (overload implementations are never disk-cached): 0.05-0.8 s each on a
loaded 2-core host, often half of a graph's whole compile, and seconds for a transpose of
3 or more dimensions (its axis checks format messages). :func:`empty`, :func:`fill` and
:func:`permuted` are intrinsics: the same code (Numba's runtime allocator and alignment;
the value cast as ``a[...] = value`` casts) written inline into the caller, so a process
compiles nothing for them and the generated function's disk cache holds all of it.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.core.imputils import impl_ret_borrowed
from numba.core.typing.npydecl import parse_dtype
from numba.extending import intrinsic
from numba.np.arrayobj import get_itemsize, make_array, populate_array

__all__ = ["empty", "fill", "permuted", "unicode"]


@intrinsic
def empty(typingctx, shape, dtype):
    """``np.empty(shape, dtype)`` (C order) for a tuple of integers and a NumPy scalar
    type such as ``np.float64``; negative or overflowing sizes raise ValueError."""
    if not isinstance(shape, types.BaseTuple) or \
            not all(isinstance(t, types.Integer) for t in shape):
        return None
    nb_dtype = parse_dtype(dtype)
    if nb_dtype is None:
        return None
    retty = types.Array(nb_dtype, len(shape), "C")

    def codegen(context, builder, sig, args):
        intp = context.get_value_type(types.intp)
        dims = [context.cast(builder, v, t, types.intp)
                for v, t in zip(cgutils.unpack_tuple(builder, args[0]), shape, strict=True)]
        itemsize = context.get_constant(types.intp, get_itemsize(context, retty))
        size = itemsize
        bad = ir.Constant(ir.IntType(1), 0)
        for d in dims:  # the byte size, with numpy's checks
            bad = builder.or_(bad, builder.icmp_signed("<", d, ir.Constant(intp, 0)))
            prod = builder.smul_with_overflow(size, d)
            size = builder.extract_value(prod, 0)
            bad = builder.or_(bad, builder.extract_value(prod, 1))
        with builder.if_then(bad, likely=False):
            context.call_conv.return_user_exc(
                builder, ValueError, ("nbgrad tier 2: negative or too large array "
                                      "dimensions",))
        strides = [itemsize] if dims else []
        for d in reversed(dims[1:]):
            strides.append(builder.mul(strides[-1], d))
        align = context.get_preferred_array_alignment(nb_dtype)
        meminfo = context.nrt.meminfo_alloc_aligned(builder, size, align)
        arr = make_array(retty)(context, builder)
        data = context.nrt.meminfo_data(builder, meminfo)
        ptr = context.get_data_type(nb_dtype).as_pointer()
        populate_array(arr, data=builder.bitcast(data, ptr),
                       shape=cgutils.pack_array(builder, dims, ty=intp),
                       strides=cgutils.pack_array(builder, strides[::-1], ty=intp),
                       itemsize=itemsize, meminfo=meminfo)
        return arr._getvalue()

    return retty(shape, dtype), codegen


@intrinsic
def fill(typingctx, arr, value):
    """``arr[...] = value`` for a writeable array and a number or boolean."""
    if not isinstance(arr, types.Array) or not arr.mutable or \
            not isinstance(value, (types.Number, types.Boolean)):
        return None

    def codegen(context, builder, sig, args):
        ary = make_array(arr)(context, builder, args[0])
        val = context.cast(builder, args[1], value, arr.dtype)
        intp = context.get_value_type(types.intp)
        if arr.layout == "C":  # one flat loop
            with cgutils.for_range(builder, ary.nitems, intp=intp) as loop:
                context.pack_value(builder, arr.dtype, val,
                                   builder.gep(ary.data, [loop.index]))
        else:
            shapes = cgutils.unpack_tuple(builder, ary.shape)
            strides = cgutils.unpack_tuple(builder, ary.strides)
            with cgutils.loop_nest(builder, shapes, intp) as idx:
                ptr = cgutils.get_item_pointer2(context, builder, ary.data, shapes, strides,
                                                arr.layout, idx)
                context.pack_value(builder, arr.dtype, val, ptr)
        return context.get_dummy_value()

    return types.none(arr, value), codegen


@intrinsic
def permuted(typingctx, arr, perm):
    """``np.transpose(arr, perm)`` (a view) for a permutation ``perm`` of the dimensions
    (the generator's own: not checked; ``np.transpose`` of 3 or more dimensions compiles
    its axis checks and their messages in every process, seconds)."""
    if not isinstance(arr, types.Array) or not isinstance(perm, types.UniTuple) or \
            perm.count != arr.ndim or not isinstance(perm.dtype, types.Integer):
        return None
    retty = arr.copy(layout="A")

    def codegen(context, builder, sig, args):
        ary = make_array(arr)(context, builder, args[0])
        shapes = cgutils.unpack_tuple(builder, ary.shape)
        strides = cgutils.unpack_tuple(builder, ary.strides)
        intp = context.get_value_type(types.intp)
        axes = [context.cast(builder, v, perm.dtype, types.intp)
                for v in cgutils.unpack_tuple(builder, args[1])]

        def pick(values, axis):  # values[axis] (constant-folded: the axes are literals)
            out = values[-1]
            for j in range(len(values) - 2, -1, -1):
                out = builder.select(builder.icmp_signed("==", axis, ir.Constant(intp, j)),
                                     values[j], out)
            return out

        ret = make_array(retty)(context, builder)
        populate_array(ret, data=ary.data,
                       shape=cgutils.pack_array(builder, [pick(shapes, a) for a in axes]),
                       strides=cgutils.pack_array(builder, [pick(strides, a) for a in axes]),
                       itemsize=ary.itemsize, meminfo=ary.meminfo, parent=ary.parent)
        return impl_ret_borrowed(context, builder, retty, ret._getvalue())

    return retty(arr, perm), codegen


@intrinsic
def unicode(typingctx, text):
    """A string constant as ``unicode_type``, not ``Literal[str]`` (a native function then
    compiles once for every message; ``str(text)`` compiles ``str``'s overload, seconds, in
    every process)."""
    if not isinstance(text, (types.UnicodeType, types.StringLiteral)):
        return None

    def codegen(context, builder, sig, args):
        return impl_ret_borrowed(context, builder, types.unicode_type, args[0])

    return types.unicode_type(types.unicode_type), codegen
