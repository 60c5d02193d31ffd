"""Which products the float32 rewrites of products (Strassen's, padded rows) take."""

from __future__ import annotations

import tvm
from tvm.relax import Call

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
