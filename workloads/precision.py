"""A model's convolutions and matmuls computed in half precision (bfloat16: marked here, done by the
tuner's lowering, which knows the target: ``tuner.lowering.bf16.products``).

TVM's torch importer gives every convolution a float32 output, so a half-precision torch module
does not import; TVM's mixed-precision pass (``ToMixedPrecision``) is the supported route instead:
convolutions and matmuls compute in fp16 (accumulating in fp32), the rest follows, and the model's
inputs and outputs keep their dtypes.

Two things are done before that pass:
- batch norms are folded into the convolutions: behind the cast the pass puts after each
  convolution they would no longer be, and ResNet-18 would keep them as arithmetic in every
  convolution's epilogue and gain six kernels that only cast (26 kernels against 20);
- a clip's bounds become constants (``maximum``/``minimum``): the pass cannot type the bounds as
  scalars once a clip follows a half-precision result (MobileNetV2's ReLU6 after a folded norm).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from common.relax_functions import rewrite_functions

from .errors import WorkloadError
from .workload import Workload

MODEL_DTYPES = ("float32", "float16", "bfloat16")


def in_precision(workload: Workload, dtype: str | None) -> Workload:
    """``workload`` with its convolutions and matmuls computed in ``dtype`` (None: as it is)."""
    if dtype not in (None, *MODEL_DTYPES):
        raise WorkloadError(f"model dtype must be one of {', '.join(MODEL_DTYPES)}, got {dtype!r}")
    if dtype == "float16":
        prepared = tvm.transform.Sequential(
            [
                relax.transform.FoldBatchnormToConv2D(),
                relax.transform.DecomposeOpsForInference(),  # what is left of them, as arithmetic
                relax.transform.FoldConstant(),
                ClipBoundsAsConstants(),
            ]
        )(workload.mod)
        workload.mod = relax.transform.ToMixedPrecision(out_dtype="float32")(prepared)
        workload.precision = "float16"
        workload.name += "-fp16"
        workload.description = f"{workload.description}; float16" if workload.description else "float16"
    elif dtype == "bfloat16":  # the lowering computes its products from bf16 (tuner.lowering.bf16.products)
        workload.precision = "bfloat16"
        workload.name += "-bf16"
        workload.description = f"{workload.description}; bfloat16" if workload.description else "bfloat16"
    return workload


@expr_functor.mutator
class _ClipBounds(PyExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not (isinstance(call, Call) and isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.clip"):
            return call
        data, low, high = call.args
        dtype = data.ty.dtype if isinstance(data.ty, relax.TensorType) else None
        if dtype is None or not all(isinstance(b, tvm.tirx.FloatImm | tvm.tirx.IntImm) for b in (low, high)):
            return call
        dtype = str(dtype)
        lower = self.builder_.emit(relax.op.maximum(data, relax.const(float(low.value), dtype)))
        return relax.op.minimum(lower, relax.const(float(high.value), dtype))


@tvm.transform.module_pass(opt_level=0, name="ClipBoundsAsConstants")
class ClipBoundsAsConstants:
    """``clip(x, a, b)`` with scalar bounds as ``minimum(maximum(x, a), b)`` with constant ones."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_ClipBounds(mod), mod)
