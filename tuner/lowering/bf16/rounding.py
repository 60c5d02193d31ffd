"""In bf16, activations rounded before the operators that only compare or move them: a max pool, a
concatenation.

Rounding to bf16 is monotonic, so a max pool of rounded values is the rounded max pool, and a
concatenation of rounded tensors the rounded concatenation: the same bits either way. Rounded
first, the cast that ``bf16`` put after the pool or the concatenation (where a product reads it)
fuses into the kernel that produces the activation, a convolution's epilogue: that kernel writes
half the bytes, and the pool or concatenation reads and writes half. SqueezeNet's fire modules
concatenate two convolutions' outputs and pool them (fp32 before this: its concatenations, pools
and casts were a fifth of the model's time in bf16). Measured (experiments/README.md, results on AMX):
the concatenations, vectorised by ``tuner.spaces.copy_rule``, take 10-20 us where they took 30-105; TVM's
16-bit max pools run slower than its fp32 ones (SqueezeNet's first 46 us against 29).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from common.relax_functions import rewrite_functions
from tuner.lowering.dataflow import Dataflow
from tuner.lowering.graph import op_name

from .kernels import BF16
from .products import is_bf16

_POOL = "relax.nn.max_pool2d"
_CONCAT = "relax.concat"


@expr_functor.mutator
class _RoundBeforeMoves(PyExprMutator):
    def __init__(self, mod: IRModule) -> None:
        super().__init__(mod)
        self.dataflow = Dataflow.of(mod)

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if op_name(call) != "relax.astype" or str(call.attrs.dtype) != BF16:
            return call
        earlier = self._rounded_before(call.args[0])
        return call if earlier is None else earlier

    def _rounded_before(self, var: Expr) -> Call | None:
        """``var`` in bf16, computed from its operands rounded; None where no pool or concatenation
        computes it, or where something else reads it too (they would be computed twice)."""
        if not isinstance(var, relax.Var) or self.dataflow.sole_user(var) is None:
            return None
        value = self.lookup_binding(var)
        if op_name(value) == _POOL:
            return Call(value.op, [self._rounded(value.args[0])], value.attrs)
        if op_name(value) == _CONCAT and isinstance(value.args[0], relax.Tuple):
            return Call(value.op, [relax.Tuple([self._rounded(f) for f in value.args[0].fields])], value.attrs)
        return None

    def _rounded(self, expr: Expr) -> Expr:
        if is_bf16(expr):
            return expr
        earlier = self._rounded_before(expr)
        return self.builder_.emit(earlier if earlier is not None else relax.op.astype(expr, BF16))


@tvm.transform.module_pass(opt_level=0, name="RoundBeforeMoves")
class RoundBeforeMoves:
    """Casts to bf16 moved above the max pools and concatenations they follow (module docstring)."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_RoundBeforeMoves(mod), mod)
