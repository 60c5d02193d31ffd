"""Float32 matmuls by constant weights as products of ours on AVX-512's FMAs: the weight packed
[N/16, K, 16] once, here, and the product's register tiles computed by the micro-kernel of
``measure.fma_dot`` (design spaces: ``tuner.bf16_rule``, unit ``FMA``).

MetaSchedule's own space for these products left BERT-base's and the Llama-3 layer's at 61-81% of
the sgemm peak measured beside them (the register tile its random factors draw, and what LLVM's
vectoriser keeps in registers); these are the fp32 models that ran slower than OpenVINO's fp32.
Rows that tile badly (197 tokens) are computed over a few zero rows more (``padded_rows``), outputs
over a multiple of 16, both sliced off after.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor
from tvm.target import codegen

from measure.fma_dot import FMA, LANES
from workloads.relax_functions import rewrite_functions

from ..bf16_rule import padded_rows
from .bf16_kernels import F32, gemm_attrs, rows_padded
from .products import fp32_activation_by_weight, without_padding

MIN_REDUCTION = 16  # below it the micro-kernel's call is mostly its accumulators' loads and stores


def takes_fma_products(target: tvm.target.Target | None) -> bool:
    """Whether ``target`` is a CPU whose -mcpu has AVX-512 (the micro-kernel's 16-lane vectors)."""
    return target is not None and target.kind.name == "llvm" and bool(codegen.target_has_features("avx512f", target))


def pack_fma_weight(weight: np.ndarray) -> np.ndarray:
    """[K, N] -> [N/16, K, 16] (N padded with zero outputs to a multiple of 16)."""
    k, n = weight.shape
    weight = np.pad(weight, [(0, 0), (0, -n % LANES)])
    return np.ascontiguousarray(weight.reshape(k, -1, LANES).transpose(1, 0, 2))


def fma_dense(data: te.Tensor, packed: te.Tensor, rows: int | None = None) -> te.Tensor:
    """data [..., R, K] times the packed weight [N/16, K, 16]: [..., R, N], or [..., ``rows``, N] with
    zero rows added."""
    *lead, k_extent = (int(d) for d in data.shape)
    n_extent = int(packed.shape[0]) * LANES
    flops = 2.0 * float(np.prod(lead, dtype=np.float64)) * n_extent * k_extent
    if rows is not None and rows != lead[-1]:
        data, lead[-1] = rows_padded(data, rows), rows
    k = te.reduce_axis((0, k_extent), "k")
    return te.compute(
        (*lead, n_extent),
        lambda *i: te.sum(data[(*i[:-1], k)] * packed[i[-1] // LANES, k, i[-1] % LANES], axis=k),
        name="fma_dense",
        attrs=gemm_attrs(flops, FMA),
    )


def _suits(call: Call) -> bool:
    shape = fp32_activation_by_weight(call)
    if shape is None or str(call.ty.dtype) != F32:
        return False
    depth, columns = call.args[1].value.shape
    return shape[-1] == depth and depth >= MIN_REDUCTION and columns >= LANES


@expr_functor.mutator
class _FmaProducts(PyExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not isinstance(call, Call) or call.op != tvm.ir.Op.get("relax.matmul") or not _suits(call):
            return call
        data, weight = call.args[0], call.args[1].value.numpy()
        packed = pack_fma_weight(weight)
        rows = fp32_activation_by_weight(call)[-2]
        padded = padded_rows(rows, packed.shape[0], FMA)
        out = self.builder_.call_te(fma_dense, data, relax.const(packed), padded, primfunc_name_hint="fma_dense")
        return without_padding(self.builder_, out, rows, weight.shape[1])


@tvm.transform.module_pass(opt_level=0, name="FmaProducts")
class FmaProducts:
    """Float32 matmuls of activations by constant 2-D weights as FMA micro-kernel products."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_FmaProducts(mod), mod)
