"""bf16 max pools compared as 16-bit integers.

After ``bf16_rounding`` a max pool reads and writes bf16. TVM's own pool keeps its running
maximum in bf16, and LLVM, without 16-bit float arithmetic, converts it to fp32 and rounds it
back at every window position: SqueezeNet's first pool took 46 us in bf16 against 29 in fp32.
Compared in fp32 (each value widened once, the maximum rounded once) it took 38. Here the values'
bits are compared as int16, 32 to a vector: a bf16 is its sign and magnitude, so among values
>= +0 the largest integer is the largest value, and among negative ones the smallest integer
is; the window's highest and lowest integers are taken, and the highest wins where it is >= 0.
(A negative NaN among positive values is lost, where PyTorch's pool would return it.) The
kernel names ``tuner.spaces.pool_rule``'s design space: channels vectorised innermost, under the
window's loops.
"""

from __future__ import annotations

import tvm
from tvm import te
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from common.relax_functions import rewrite_functions
from tuner.lowering.graph import ints, op_name, static_shape
from tuner.lowering.inverted_residual import OPAQUE_PATTERN
from tuner.spaces.pool_rule import BF16_POOL_RULE, POOL_BLOCKS, POOL_OUTPUT

from .kernels import BF16
from .products import is_bf16

I16 = "int16"


def bf16_max_pool2d(
    data: te.Tensor,
    window: tuple[int, int],
    strides: tuple[int, int],
    padding: tuple[int, int, int, int],
    out_shape: tuple[int, int, int, int],
) -> te.Tensor:
    """The max pool of NHWC bf16 ``data`` into ``out_shape`` (the pool's own, ceil mode included),
    positions outside the image left out of each window. Compared as 16-bit integers (module docstring)."""
    _, height, width, _ = (int(d) for d in data.shape)
    top, left = padding[0], padding[1]
    rule = {"schedule_rule": BF16_POOL_RULE}

    def over_window(reducer, outside, name: str) -> te.Tensor:
        ry, rx = te.reduce_axis((0, window[0]), "ry"), te.reduce_axis((0, window[1]), "rx")

        def reduce(n, y, x, c):
            iy, ix = y * strides[0] - top + ry, x * strides[1] - left + rx
            inside = tvm.tirx.all(iy >= 0, iy < height, ix >= 0, ix < width)
            bits = tvm.tirx.reinterpret(I16, data[n, iy, ix, c])
            return reducer(tvm.tirx.if_then_else(inside, bits, outside), axis=[ry, rx])

        return te.compute(out_shape, reduce, name=name, attrs=rule)

    highest = over_window(te.max, tvm.tirx.min_value(I16), POOL_BLOCKS[0])
    lowest = over_window(te.min, tvm.tirx.max_value(I16), POOL_BLOCKS[1])

    def largest(*i):  # a window holding a value >= +0 has it as its highest; one of negatives, as its lowest
        return tvm.tirx.reinterpret(BF16, tvm.tirx.Select(highest(*i) >= 0, highest(*i), lowest(*i)))

    return te.compute(out_shape, largest, name=POOL_OUTPUT, attrs=rule)


@expr_functor.mutator
class _Bf16MaxPools(PyExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if op_name(call) != "relax.nn.max_pool2d" or not is_bf16(call.args[0]):
            return call
        attrs = call.attrs
        out_shape = static_shape(call)
        if (
            attrs.layout != "NHWC"
            or attrs.out_layout != "NHWC"
            or ints(attrs.dilation) != [1, 1]
            or static_shape(call.args[0]) is None
            or out_shape is None
        ):
            return call
        return self.builder_.call_te(
            bf16_max_pool2d,
            call.args[0],
            tuple(ints(attrs.pool_size)),
            tuple(ints(attrs.strides)),
            tuple(ints(attrs.padding)),
            tuple(out_shape),
            primfunc_name_hint="bf16_max_pool2d",
            primfunc_attrs={"op_pattern": OPAQUE_PATTERN},  # its two blocks are one design space
        )


@tvm.transform.module_pass(opt_level=0, name="Bf16MaxPools")
class Bf16MaxPools:
    """Channels-last bf16 max pools as ``bf16_max_pool2d`` (module docstring)."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_Bf16MaxPools(mod), mod)
