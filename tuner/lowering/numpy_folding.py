"""Constant arithmetic and layout steps folded in NumPy, before TVM's ``FoldConstant``.

``FoldConstant`` evaluates a call of constants by compiling it to a kernel of its own and running it:
HF EfficientNet's batch norms, folded into its convolutions' weights, left 392 such calls (a scale's
expand_dims, multiply, sqrt, divide, subtract, add per norm), 39 s of a 60 s lowering on this 2-core
VM; its weights' transposes to HWIO another 10. The same steps in NumPy take milliseconds. Only steps
NumPy computes exactly as the compiled kernel does are taken: IEEE float32 add, subtract, multiply,
divide and square root (correctly rounded in both), negation, and the steps that only move data
(expand_dims, squeeze, reshape, permute_dims); everything else is left to ``FoldConstant``. A float32
scalar written as a literal (the epsilon PyTorch's importer gives a batch norm) is a constant like any
other: left to ``FoldConstant``, its norm's whole chain was, 424 builds and 14.8 of a 16.8 s lowering of
Hugging Face's ResNet-50 on a 2-core Zen 4 (2.2 s without them; its MobileNetV2 15.5 -> 1.7 s; the same bits).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from common.relax_functions import rewrite_functions

from .graph import ints, op_name, static_shape

_ARITHMETIC: dict[str, Callable[..., np.ndarray]] = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
    "relax.sqrt": np.sqrt,
    "relax.negative": np.negative,
}
_MOVES = ("relax.expand_dims", "relax.squeeze", "relax.reshape", "relax.permute_dims")


@expr_functor.mutator
class _NumpyFolding(PyExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        name = op_name(call)
        if name not in _ARITHMETIC and name not in _MOVES:
            return call
        tensors = [arg for arg in call.args if not isinstance(arg, relax.ShapeExpr)]
        values = [self._constant(arg) for arg in tensors]
        if not values or any(v is None or v.dtype != np.float32 for v in values):
            return call
        normalized = self.builder_.normalize(call)
        shape = static_shape(normalized)
        if shape is None or str(normalized.ty.dtype) != "float32":
            return call
        with np.errstate(all="ignore"):  # a division by zero gives what the kernel gives: inf or nan
            folded = _ARITHMETIC[name](*values) if name in _ARITHMETIC else _moved(call, values[0], shape)
        return relax.const(np.ascontiguousarray(folded, dtype=np.float32).reshape(shape))

    def _constant(self, expr: Expr) -> np.ndarray | None:
        value = self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr
        if isinstance(value, tvm.tirx.FloatImm):  # a scalar written as a literal: a batch norm's epsilon
            return np.asarray(value.value, dtype=np.float32) if str(value.ty) == "float32" else None
        if not isinstance(value, tvm.ir.expr.Constant) or not hasattr(value.value, "numpy"):
            return None  # not a constant tensor
        return value.value.numpy()


def _moved(call: Call, data: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if op_name(call) == "relax.permute_dims":
        axes = call.attrs.axes
        return np.transpose(data, None if axes is None else ints(axes))
    return data.reshape(shape)  # expand_dims, squeeze, reshape: the same elements in the same order


@tvm.transform.module_pass(opt_level=0, name="FoldConstantsInNumpy")
class FoldConstantsInNumpy:
    """Calls of constants that NumPy computes exactly as TVM would, folded without building a kernel."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_NumpyFolding(mod), mod)


def fold_constants() -> tvm.transform.Pass:
    """NumPy's folding, then TVM's ``FoldConstant`` for what is left."""
    return tvm.transform.Sequential([FoldConstantsInNumpy(), relax.transform.FoldConstant()])
