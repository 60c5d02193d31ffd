"""Rewriting every Relax function of a module with one expression mutator (shared by the model
passes in ``workloads`` and ``tuner.lowering``; ``workloads`` cannot import ``tuner``)."""

from __future__ import annotations

from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import PyExprMutator


def rewrite_functions(mutator: PyExprMutator, mod: IRModule) -> IRModule:
    """``mod`` with each Relax function replaced by what ``mutator`` (made on ``mod``) makes of it."""
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()
