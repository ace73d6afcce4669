"""Arrays outside the tier-1 pool, seen from the interpreter: a slot's address and
length (a row of the ``ext`` table) become a 1-d array of the pool's type inside
compiled code. The caller keeps the arrays alive while the interpreter runs."""

from __future__ import annotations

from numba import carray, njit, types
from numba.extending import intrinsic


@intrinsic
def _pointer(typingctx, address, like):
    """``address`` (an integer) as a pointer to the element type of the array ``like``."""
    sig = types.CPointer(like.dtype)(address, like)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
    return sig, codegen


@njit(inline="always")
def view_at(ext, slot, like):
    """The array of slot ``slot``: ``ext[slot]`` is (address, length), typed as ``like``."""
    return carray(_pointer(ext[slot, 0], like), ext[slot, 1])
