"""Float32 products by a constant weight over an output column count no vector divides, computed over a few
zero columns more.

MetaSchedule tiles a loop only by its divisors: FocalNet's modulation projection (384 -> 771 columns, two
halves of 384 and its 3 gates; 771 = 3 x 257) got no vector loop over its columns and ran at 15% of the FMA
peak, 1.47 ms of the model's 14. Its weight takes zero columns up to a multiple of ``COLUMN_MULTIPLE`` once,
at compile time, and the product's output is sliced back (an epilogue of the product's kernel, which reads
it from the tile that computed it).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from common.relax_functions import rewrite_functions

from .graph import fp32_activation_by_weight

COLUMN_MULTIPLE = 16  # padded column counts are multiples of it: AVX-512's fp32 lanes
VECTOR_COLUMNS = 8  # a column count this divides has whole vectors already (AVX2's lanes)
MIN_COLUMNS = 32  # fewer columns: a few lanes of one vector, not worth the slice


def padded_column_count(columns: int) -> int:
    """``columns``, or the next multiple of ``COLUMN_MULTIPLE`` where ``VECTOR_COLUMNS`` does not divide it."""
    if columns < MIN_COLUMNS or columns % VECTOR_COLUMNS == 0:
        return columns
    return -(-columns // COLUMN_MULTIPLE) * COLUMN_MULTIPLE


@expr_functor.mutator
class _PadColumns(PyExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        shape = fp32_activation_by_weight(call)
        if shape is None:
            return call
        data, weight = call.args
        columns = int(weight.value.shape[1])
        padded = padded_column_count(columns)
        if padded == columns:
            return call
        wider = relax.const(np.pad(weight.value.numpy(), ((0, 0), (0, padded - columns))))
        product = self.builder_.emit(relax.op.matmul(data, wider))
        return relax.op.strided_slice(product, axes=[len(shape) - 1], begin=[0], end=[columns])


@tvm.transform.module_pass(opt_level=0, name="PadProductColumns")
class PadProductColumns:
    """Float32 matmuls by constant weights over column counts no vector divides, over a few zero columns more."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_PadColumns(mod), mod)
