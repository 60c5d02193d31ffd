"""Which products the float32 rewrites of products (Strassen's, padded rows, FMA micro-kernels) take, and
the slice that drops the zero rows and outputs a packed product was computed with."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax import Call, Expr

from measure.bf16_dot import LANES

from .rewrites import static_shape


def fp32_activation_by_weight(call: Call) -> tuple[int, ...] | None:
    """The activation's shape where ``call`` is a float32 matmul of an activation (any leading
    dimensions, its shape known) by a constant 2-D float32 weight; else None."""
    data, weight = call.args
    if not isinstance(weight, tvm.ir.expr.Constant) or len(weight.value.shape) != 2:
        return None
    shape = static_shape(data)
    if shape is None or len(shape) < 2 or str(data.ty.dtype) != "float32" or str(weight.ty.dtype) != "float32":
        return None
    return shape


def without_padding(builder: relax.BlockBuilder, out: Expr, rows: int | None, outputs: int) -> Expr:
    """``out`` without the zero rows (its second to last axis: a matmul's rows, a convolution's columns)
    and zero outputs (up to a multiple of 16) a product of packed weights was computed with."""
    out = builder.normalize(out)
    ndim = out.ty.ndim
    kept = [(ndim - 1, outputs)] if outputs % LANES else []
    if rows is not None and static_shape(out)[ndim - 2] != rows:
        kept.insert(0, (ndim - 2, rows))
    if not kept:
        return out
    out = builder.emit(out)
    return relax.op.strided_slice(
        out, axes=[axis for axis, _ in kept], begin=[0] * len(kept), end=[count for _, count in kept]
    )
