"""Walking TVM 0.27's lowered TIR from Python, which has no statement functor: the statements and
expressions a kernel holds, the lets it binds, the variables an expression names."""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import tirx
from tvm.tirx import stmt as s

_EXPR_CHILDREN = ("a", "b", "value", "args", "indices", "condition", "true_value", "false_value", "base", "vectors")


def contains_loop(stmt: s.Stmt) -> bool:
    found = []
    walk_stmts(stmt, lambda node: found.append(node) if isinstance(node, (s.For, s.While)) else None)
    return bool(found)


def walk_expr(expr: tirx.Expr, visit: Callable[[tirx.Expr], None]) -> None:
    visit(expr)
    for name in _EXPR_CHILDREN:
        for item in _exprs_in(getattr(expr, name, None)):
            walk_expr(item, visit)


def exprs_of(stmt: s.Stmt) -> list[tirx.Expr]:
    """The expressions ``stmt`` holds itself (not its body's)."""
    return [expr for name in ("value", "condition", "indices") for expr in _exprs_in(getattr(stmt, name, None))]


def _exprs_in(child: object) -> list[tirx.Expr]:
    """The expressions a node's field holds: itself, or the items of a list of them."""
    items = child if isinstance(child, (list, tuple, tvm.ir.Array)) else [child]
    return [item for item in items if isinstance(item, tirx.Expr)]


def binds(stmt: s.Stmt) -> dict:
    """The lets ``stmt`` binds, anywhere in it: variable -> value."""
    found = {}
    walk_stmts(stmt, lambda node: found.__setitem__(node.var, node.value) if isinstance(node, s.Bind) else None)
    return found


def vars_of(expr: tirx.Expr) -> list[tirx.Var]:
    found: list[tirx.Var] = []
    walk_expr(expr, lambda node: found.append(node) if isinstance(node, tirx.Var) else None)
    return found


def walk_stmts(stmt: s.Stmt, visit: Callable[[s.Stmt], None]) -> None:
    visit(stmt)
    if isinstance(stmt, s.SeqStmt):
        for child in stmt.seq:
            walk_stmts(child, visit)
    elif isinstance(stmt, (s.For, s.AttrStmt, s.While)):
        walk_stmts(stmt.body, visit)
    elif isinstance(stmt, s.IfThenElse):
        walk_stmts(stmt.then_case, visit)
        if stmt.else_case is not None:
            walk_stmts(stmt.else_case, visit)
