"""Reading a Relax graph: a tensor's static shape, the operator a call is, a call's attributes, and the
kinds of call the lowering's passes look for."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax import Call, Expr


def static_shape(expr: Expr) -> tuple[int, ...] | None:
    """The shape of a tensor expression, if every dimension is a known integer."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    values = ty.shape.values
    if not all(isinstance(d, tvm.tirx.IntImm) for d in values):
        return None
    return tuple(int(d) for d in values)


def ints(values) -> list[int]:
    """An attribute's array of integers (strides, padding, axes) as Python ints."""
    return [int(v) for v in values]


def op_name(expr: Expr) -> str | None:
    """The operator ``expr`` calls, if it is a call of a Relax operator."""
    return expr.op.name if isinstance(expr, Call) and isinstance(expr.op, tvm.ir.Op) else None


_CONV2D_ATTRS = ("strides", "padding", "dilation", "groups", "data_layout", "kernel_layout", "out_layout", "out_dtype")


def conv2d_like(call: Call, data: Expr, weight: Expr, **changes: object) -> Expr:
    """A conv2d of ``data`` and ``weight`` with the attributes of the conv2d ``call``, but ``changes``."""
    attrs = {name: getattr(call.attrs, name) for name in _CONV2D_ATTRS}
    return relax.op.nn.conv2d(data, weight, **{**attrs, **changes})


def is_float32(call: Call) -> bool:
    ty = call.ty
    return isinstance(ty, relax.TensorType) and ty.dtype == "float32"


def fp32_activation_by_weight(call: Call) -> tuple[int, ...] | None:
    """The activation's shape where ``call`` is a float32 matmul of an activation (any leading
    dimensions, its shape known) by a constant 2-D float32 weight; else None."""
    if op_name(call) != "relax.matmul":
        return None
    data, weight = call.args
    if not isinstance(weight, tvm.ir.expr.Constant) or len(weight.value.shape) != 2:
        return None
    shape = static_shape(data)
    if shape is None or len(shape) < 2 or str(data.ty.dtype) != "float32" or str(weight.ty.dtype) != "float32":
        return None
    return shape
