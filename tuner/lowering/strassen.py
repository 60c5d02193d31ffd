"""Large matmuls with constant weights by one level of Strassen's algorithm: 7 half-size products
instead of 8, so 7/8 of the multiply-adds.

``C = A @ B`` with ``A`` and ``B`` split into 2x2 blocks is computed from the seven products
``M_p = (A-side sum p) @ (B-side sum p)``. The weights are constants, so their sums are formed once at
compile time (in float64): the model's weights grow to 7/4 of their size. At run time the seven
A-side sums are one element-wise kernel, the seven products one batched matmul (tuned as any other),
and the output blocks one more element-wise kernel that adds the products up; bias, activation and
the like fuse into it as they fused into the matmul.

Neither element-wise kernel branches per element: each output element is one or two (A-side) or up to
four (output) signed terms, whose block indices and signs depend only on the outer loop (which sum,
which output block), so the compiler hoists them out of the vectorised inner loop.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, tirx
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from common.relax_functions import rewrite_functions
from tuner.spaces.strassen_rule import STRASSEN_OUTPUT_RULE

from .graph import fp32_activation_by_weight, static_shape
from .inverted_residual import OPAQUE_PATTERN

# A block by its (row, column) in the 2x2 split.
_11, _12, _21, _22 = (0, 0), (0, 1), (1, 0), (1, 1)
# The seven products: (A-side terms, B-side terms), each term (sign, block).
PRODUCTS = (
    (((1, _11), (1, _22)), ((1, _11), (1, _22))),
    (((1, _21), (1, _22)), ((1, _11),)),
    (((1, _11),), ((1, _12), (-1, _22))),
    (((1, _22),), ((1, _21), (-1, _11))),
    (((1, _11), (1, _12)), ((1, _22),)),
    (((1, _21), (-1, _11)), ((1, _11), (1, _12))),
    (((1, _12), (-1, _22)), ((1, _21), (1, _22))),
)
# Each output block as a signed sum of the products: (sign, product).
OUTPUT_BLOCKS = {
    _11: ((1, 0), (1, 3), (-1, 4), (1, 6)),
    _12: ((1, 2), (1, 4)),
    _21: ((1, 1), (1, 3)),
    _22: ((1, 0), (-1, 1), (1, 2), (1, 5)),
}

# Half-size products must still be large enough to run at the machine's peak, and the saving (1/8 of
# the multiply-adds) must outweigh two element-wise passes over the operands and the output, and the
# weights' growth to 7/4 of their size, which the model streams from memory on every call. At 128 rows
# (BERT's feed-forward, 768 <-> 3072) it paid 3-5% on a Zen 5 and lost 11% on an Intel Xeon VM with
# AMX (Hugging Face's DistilBERT, 19.4 against 17.2 ms; the Mistral and Llama decoders the same either
# way: experiments/README.md, model coverage): 256 rows halve that growth's share.
MIN_ROWS = 256
MIN_DEPTH = 512
MIN_COLUMNS = 512


def suits_strassen(call: Call) -> bool:
    """A float32 matmul of an activation (any leading dimensions) by a constant 2-D weight, every
    dimension even and large enough for the half-size products to run at full speed."""
    shape = fp32_activation_by_weight(call)
    if shape is None:
        return False
    rows, (depth, columns) = int(np.prod(shape[:-1])), call.args[1].value.shape
    if shape[-1] != depth or str(call.ty.dtype) != "float32":
        return False
    return all(n % 2 == 0 and n >= least for n, least in ((rows, MIN_ROWS), (depth, MIN_DEPTH), (columns, MIN_COLUMNS)))


def strassen_weights(weight: np.ndarray) -> np.ndarray:
    """The seven B-side sums of ``weight`` (``[depth, columns]``) as ``[7, depth / 2, columns / 2]``."""
    depth, columns = weight.shape
    blocks = weight.astype(np.float64).reshape(2, depth // 2, 2, columns // 2)
    sums = [sum(sign * blocks[r, :, c, :] for sign, (r, c) in b_side) for _, b_side in PRODUCTS]
    return np.stack(sums).astype(weight.dtype)


def _signed_terms(selector: tirx.PrimExpr, choices: list[list[tuple]], width: int) -> list[list[tirx.PrimExpr]]:
    """For each of ``width`` term positions, the scalar expressions (sign, *indices) chosen by
    ``selector``; a choice with fewer terms pads with sign 0 on its first term's indices."""
    padded = [list(terms) + [(0, *terms[0][1:])] * (width - len(terms)) for terms in choices]
    result = []
    for position in range(width):
        fields = []
        for field in range(len(padded[0][0])):
            expr = tirx.const(padded[-1][position][field], "int32")
            for index in range(len(padded) - 2, -1, -1):
                expr = tirx.Select(selector == index, tirx.const(padded[index][position][field], "int32"), expr)
            fields.append(expr)
        result.append(fields)
    return result


def strassen_operands(data: te.Tensor) -> te.Tensor:
    """The seven A-side sums of ``data`` (``[rows, depth]``) as ``[7, rows / 2, depth / 2]``."""
    rows, depth = (int(n) for n in data.shape)
    half_rows, half_depth = rows // 2, depth // 2
    choices = [[(sign, r, c) for sign, (r, c) in a_side] for a_side, _ in PRODUCTS]

    def operand(product, i, j):
        terms = _signed_terms(product, choices, 2)
        return sum(sign.astype(data.dtype) * data[r * half_rows + i, c * half_depth + j] for sign, r, c in terms)

    return te.compute((7, half_rows, half_depth), operand, name="strassen_operands")


def strassen_output(products: te.Tensor) -> te.Tensor:
    """The output blocks added up from the seven products (``[7, rows / 2, columns / 2]``), as
    ``[2, rows / 2, 2, columns / 2]``: a reshape of that is the ``[rows, columns]`` result."""
    _, half_rows, half_columns = (int(n) for n in products.shape)
    blocks = [_11, _12, _21, _22]
    choices = [[(sign, product) for sign, product in OUTPUT_BLOCKS[block]] for block in blocks]

    def output(block_row, i, block_column, j):
        terms = _signed_terms(block_row * 2 + block_column, choices, 4)
        return sum(sign.astype(products.dtype) * products[product, i, j] for sign, product in terms)

    return te.compute(
        (2, half_rows, 2, half_columns), output, name="strassen_output", attrs={"schedule_rule": STRASSEN_OUTPUT_RULE}
    )


@expr_functor.mutator
class _Strassen(PyExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not suits_strassen(call):
            return call
        data, weight = call.args
        shape = static_shape(data)
        rows, (depth, columns) = int(np.prod(shape[:-1])), weight.value.shape
        flat = self.builder_.emit(relax.op.reshape(data, (rows, depth)))
        operands = self.builder_.emit(
            # a kernel of its own: fused into the kernel that produces its input, the two took 3.5x as
            # long as apart (855 against about 245 us on BERT's feed-forward sizes)
            self.builder_.call_te(
                strassen_operands,
                flat,
                primfunc_name_hint="strassen_operands",
                primfunc_attrs={"op_pattern": OPAQUE_PATTERN},
            )
        )
        weights = relax.const(strassen_weights(weight.value.numpy()))
        products = self.builder_.emit(relax.op.matmul(operands, weights))
        blocks = self.builder_.emit(
            self.builder_.call_te(strassen_output, products, primfunc_name_hint="strassen_output")
        )
        return relax.op.reshape(blocks, (*shape[:-1], columns))


@tvm.transform.module_pass(opt_level=0, name="StrassenMatmuls")
class StrassenMatmuls:
    """Large float32 matmuls by constant weights as one level of Strassen's algorithm."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_Strassen(mod), mod)
