"""Float32 products by a constant weight over a row count that tiles badly, computed over a few zero rows more.

MetaSchedule tiles a loop only by its divisors: the 197 tokens of a ViT (a prime) tile as one row at a
time, at most four vector accumulators, which keeps half of a two-port FMA unit busy (ViT-S's products at
35-46% of the FMA peak on the Intel VM). Over 200 rows the same product tiles 2, 4 or 8 rows at a time.
The activation is padded with zero rows (a copy that fuses into the kernel that produces it, where it
can), and the product's output sliced back (fused into the kernel that reads it).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from common.relax_functions import rewrite_functions

from .graph import fp32_activation_by_weight, static_shape

ROW_MULTIPLE = 8  # padded row counts are multiples of it
TILE_ROWS = range(4, 17)  # a row count with one of these divisors tiles well as it is
MIN_ROWS = 32  # fewer rows: the copies would cost more than a better tile gains


def padded_row_count(rows: int) -> int:
    """``rows``, or the next multiple of ``ROW_MULTIPLE`` where ``rows`` has no divisor in ``TILE_ROWS``."""
    if rows < MIN_ROWS or any(rows % d == 0 for d in TILE_ROWS):
        return rows
    return -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE


def _pads(call: Call) -> int | None:
    """The padded row count of a float32 matmul of an activation by a constant 2-D weight; None if it
    keeps its rows."""
    shape = fp32_activation_by_weight(call)
    if shape is None:
        return None
    padded = padded_row_count(shape[-2])
    return padded if padded != shape[-2] else None


@expr_functor.mutator
class _PadRows(PyExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        padded = _pads(call)
        if padded is None:
            return call
        data, weight = call.args
        shape = static_shape(data)
        widths = [0] * (2 * len(shape))
        widths[2 * (len(shape) - 2) + 1] = padded - shape[-2]
        rows = self.builder_.emit(relax.op.nn.pad(data, widths))
        product = self.builder_.emit(relax.op.matmul(rows, weight))
        return relax.op.strided_slice(product, axes=[len(shape) - 2], begin=[0], end=[shape[-2]])


@tvm.transform.module_pass(opt_level=0, name="PadProductRows")
class PadProductRows:
    """Float32 matmuls by constant weights over row counts that tile badly, over a few zero rows more."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_PadRows(mod), mod)
