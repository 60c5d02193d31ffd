"""Who uses each variable of a model's dataflow blocks: what a rewrite checks before it moves or
merges a value that other operators might still read."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import Expr


@dataclass
class Dataflow:
    """Who uses each variable of a model's dataflow blocks, and which variable each call is bound to."""

    users: dict[relax.Var, list[Expr | None]]  # the calls using it; None for a use outside its block
    bound_to: dict[Expr, relax.Var]

    @classmethod
    def of(cls, mod: IRModule) -> Dataflow:
        users: dict[relax.Var, list[Expr | None]] = {}
        bound_to: dict[Expr, relax.Var] = {}
        for func in mod.functions.values():
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            for block in func.body.blocks:
                if not isinstance(block, relax.DataflowBlock):
                    continue
                values = {b.var: b.value for b in block.bindings}
                bound_to.update({value: var for var, value in values.items()})
                for var, used_by in relax.analysis.udchain(block).items():
                    users[var] = [values.get(user) for user in used_by]
                    if not isinstance(var, relax.DataflowVar):
                        users[var].append(None)
        return cls(users, bound_to)

    def binding(self, var: Expr) -> Expr | None:
        """The value ``var`` is bound to in its dataflow block, if it is such a variable."""
        return self._values.get(var)

    @cached_property
    def _values(self) -> dict[relax.Var, Expr]:
        return {var: value for value, var in self.bound_to.items()}

    def sole_user(self, var: Expr) -> Expr | None:
        used_by = self.users.get(var, []) if isinstance(var, relax.DataflowVar) else []
        return used_by[0] if len(used_by) == 1 else None
