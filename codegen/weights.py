"""A model's weights taken out of its Relax ``main`` as trailing parameters, and bound back in.

Detached, a model travels to a build worker without its weights (an IRModule pickles its constants as
base64 inside JSON: BERT-base's 434 MB took 18 s to pickle and unpickle) and compiles into a library
without them (``common.model_weights`` says why). Scalars stay constants: they are no weights.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.ir import GenericConst
from tvm.relax import PyExprMutator
from tvm.relax.expr_functor import mutator

NUM_INPUT = "num_input"  # main's attribute: how many of its parameters are inputs (the rest, weights)


@mutator
class _WeightsAsVars(PyExprMutator):
    """Each tensor constant replaced by a variable, one per distinct constant, in the order first met."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.vars: list[relax.Var] = []
        self.weights: list[tvm.runtime.Tensor] = []
        self._seen: dict[GenericConst, relax.Var] = {}

    def visit_generic_const_(self, op: GenericConst) -> relax.Expr:
        if not isinstance(op.value, tvm.runtime.Tensor) or len(op.value.shape) == 0:
            return op
        if op not in self._seen:
            var = relax.Var(f"weight_{len(self.vars)}", op.ty)
            self._seen[op] = var
            self.vars.append(var)
            self.weights.append(op.value)
        return self._seen[op]


def detach_weights(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[tvm.runtime.Tensor]]:
    """``mod`` with the tensor constants of ``main`` as parameters after its inputs (``NUM_INPUT`` says
    how many inputs), and their values in that order."""
    main = mod["main"]
    lifter = _WeightsAsVars(mod)
    body = lifter.visit_expr(main.body)
    if not lifter.vars:
        return mod, []
    detached = relax.Function(
        [*main.params, *lifter.vars], body, main.ret_ty, main.is_pure, main.attrs, main.span
    ).with_attr(NUM_INPUT, len(main.params))
    mod = mod.clone()
    mod["main"] = detached
    return mod, lifter.weights


def weight_bytes(mod: tvm.IRModule) -> int:
    """The bytes of the weights ``detach_weights`` takes out of ``mod`` (what a compile reads and writes)."""
    _, weights = detach_weights(mod)
    return sum(math.prod(w.shape) * tvm.DataType(str(w.dtype)).bits // 8 for w in weights)


def attach_weights(mod: tvm.IRModule, weights: list[tvm.runtime.Tensor]) -> tvm.IRModule:
    """``detach_weights`` undone: the trailing parameters of ``main`` bound to ``weights`` as constants."""
    if not weights:
        return mod
    main = mod["main"]
    params = list(main.params)[int(main.attrs[NUM_INPUT]) :]
    if len(params) != len(weights):
        raise ValueError(f"main takes {len(params)} weights, {len(weights)} were given")
    return relax.transform.BindParams("main", dict(zip(params, weights, strict=True)))(mod)
