"""Reshapes legalized with their input's indices simplified within the output's bounds.

TVM's reshape (``topi.reshape``) reads its input at the output's flat offset unravelled:
``x[((c * 768 + h * 96 + w) // 2304 + r) % 196, (c * 768 + h * 96 + w) % 2304]``, simplified without the
bounds of the output's axes. What a kernel fuses after it inherits the divisions and remainders: the copy is
vectorised as a gather, element by element (Hiera's query and key copies across axes: 0.7 ms alone where the
same copy with plain indices is predicted at 0.14), and a block computed at a loop of its reader is computed
whole at every iteration, TVM unable to bound the region read through a remainder (Hiera's pooled maximum: its
1.8 MB input copied 392 times, 2.0 ms for a 21 us kernel). Within the output's bounds the same offsets are
affine in the usual reshapes (axes split or merged): ``x[r, c * 768 + h * 96 + w]``; where they are not (a
6 x 10 array read as 4 x 15), the division stays.
"""

from __future__ import annotations

import tvm
from tvm import te, tirx
from tvm.relax import BlockBuilder, Call, Expr
from tvm.sym import Analyzer

from .graph import static_shape


def bounded_reshape(data: te.Tensor, shape: list[tirx.PrimExpr]) -> te.Tensor:
    """``data`` reshaped to ``shape`` (static), each input index simplified for the output's bounds."""
    extents = [int(d) for d in data.shape]

    def element(*axes: tirx.Var) -> tirx.PrimExpr:
        analyzer = Analyzer()
        offset = tirx.const(0, str(shape[0].ty))
        for axis, extent in zip(axes, shape, strict=True):
            analyzer.bind(axis, tvm.ir.Range.from_min_extent(tirx.const(0, str(extent.ty)), extent))
            offset = offset * extent + axis
        indices = []
        for extent in reversed(extents):
            indices.append(analyzer.simplify(tirx.floormod(offset, extent)))
            offset = tirx.floordiv(offset, extent)
        return data[tuple(reversed(indices))]

    return te.compute(shape, element, name="T_reshape", tag="injective")


def legalize_reshape(bb: BlockBuilder, call: Call) -> Expr:
    """``relax.reshape`` (and ``relax.flatten``) of static shapes as ``bounded_reshape``; others as TVM does."""
    data = call.args[0]
    if static_shape(data) is None or not static_shape(call):  # symbolic, or a scalar
        return call.op.get_attr("FLegalize")(bb, call)
    return bb.call_te(bounded_reshape, data, list(call.ty.shape.values), primfunc_name_hint="reshape")


LEGALIZATIONS = {"relax.reshape": legalize_reshape, "relax.flatten": legalize_reshape}
