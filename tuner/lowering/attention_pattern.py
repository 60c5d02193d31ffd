"""Finding an attention in a Relax function: ``P V`` whose ``P`` is a softmax kernel of ``Q K^T``, with the
ops between them that treat every query alike (a scaling, a mask, leading axes added or dropped). Shared by
the passes that rewrite an attention as a whole (``attention_blocks``, ``attention_padding``).

Runs after ``SimplifyImportedGraph``, whose softmax kernels (``softmax``, ``safe_softmax``) it recognises by
name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.relax import BlockBuilder, Call, Expr, PyExprMutator

from .graph import is_float32, op_name, static_shape

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_SOFTMAX_KERNEL = re.compile(r"(safe_)?softmax\d*$")
# ops between the scores and the softmax, or the softmax and the second product, that a rewrite applies
# again: those that only add or drop leading axes, and arithmetic (a scaling, a mask)
_LEADING_AXES_OPS = ("relax.expand_dims", "relax.squeeze", "relax.reshape")
ARITHMETIC = ("relax.multiply", "relax.divide", "relax.add", "relax.subtract")
# such ops, each with the position of its argument that comes from the scores
Chain = list[tuple[Call, int]]


@dataclass(frozen=True)
class Attention:
    """``product(after(softmax(before(scores))), values)``, found from its second product."""

    scores: Call  # Q K^T: relax.matmul(queries, keys), float32, its shape known
    before: Chain  # innermost first
    softmax: Call  # a call_tir of a softmax kernel
    after: Chain
    product: Call  # P V: relax.matmul(P, values)

    @property
    def safe(self) -> bool:
        return self.softmax.args[0].name_hint.startswith("safe_")

    @property
    def shape(self) -> tuple[int, ...]:
        """The scores' shape: [..., queries, keys]."""
        return static_shape(self.scores)


class AttentionFinder(PyExprMutator):
    """A mutator that can tell an attention's second product (``find``)."""

    def _bound(self, expr: Expr) -> Expr:
        """What ``expr`` is bound to, through bindings of one variable to another."""
        while isinstance(expr, relax.Var) and (value := self.lookup_binding(expr)) is not None:
            expr = value
        return expr

    def _through_row_ops(self, expr: Expr) -> tuple[Expr, Chain]:
        """The value under a chain of ops that keep the last two axes and treat every query alike, and
        the chain, innermost first: each op with the position of its argument from the chain."""
        chain: Chain = []
        while True:
            value = self._bound(expr)
            position = _row_op_argument(value)
            if position is None:
                return value, chain[::-1]
            chain.append((value, position))
            expr = value.args[position]

    def find(self, call: Call) -> Attention | None:
        """The attention whose ``P V`` ``call`` is, if it is one."""
        if op_name(call) != "relax.matmul":
            return None
        softmax, after = self._through_row_ops(call.args[0])
        if not isinstance(softmax, Call) or softmax.op != _CALL_TIR:
            return None
        if not _SOFTMAX_KERNEL.match(softmax.args[0].name_hint) or len(softmax.args[1].fields) != 1:
            return None
        scores, before = self._through_row_ops(softmax.args[1].fields[0])
        if op_name(scores) != "relax.matmul":
            return None
        shape = static_shape(scores)
        if shape is None or len(shape) < 2 or not is_float32(scores):
            return None
        return Attention(scores, before, softmax, after, call)


def reapply(builder: BlockBuilder, chain: Chain, value: Expr, side: dict[Call, Expr]) -> Expr:
    """``chain`` applied to ``value`` (scores or probabilities of another shape in their last two axes),
    each arithmetic op's other operand taken from ``side`` where it is there."""
    for op, position in chain:
        if op_name(op) == "relax.reshape":
            shape, rows, columns = static_shape(op), *static_shape(value)[-2:]
            value = builder.emit(relax.op.reshape(value, (*shape[:-2], rows, columns)))
            continue
        args = list(op.args)
        args[position] = value
        if op in side:
            args[1 - position] = side[op]
        value = builder.emit(Call(op.op, args, op.attrs))
    return value


def _row_op_argument(value: Expr) -> int | None:
    """The position of the argument that ``value`` (a call) computes from row by row, keeping its last
    two axes: the data of an expand_dims, squeeze or reshape of leading axes, or the scores' operand of
    arithmetic with a tensor that is the same for every query or has a row per query (a scaling, a
    mask); else None."""
    name = op_name(value)
    if name in ARITHMETIC:
        # where both operands have the scores' shape, either is taken for the scores': the other is split
        # into blocks as they are, and an element-wise op on blocks is the op
        full = [i for i, arg in enumerate(value.args) if static_shape(arg) == static_shape(value)]
        return full[0] if full and side_operand_rows(value, full[0]) is not None else None
    if name not in _LEADING_AXES_OPS:
        return None
    before, after = static_shape(value.args[0]), static_shape(value)
    if before is None or after is None or len(before) < 2 or len(after) < 2 or before[-2:] != after[-2:]:
        return None
    if name == "relax.reshape":
        return 0
    rank = len(after) if name == "relax.expand_dims" else len(before)
    return 0 if all(int(a) % rank < rank - 2 for a in value.attrs.axis) else None


def side_operand_rows(op: Call, position: int) -> int | None:
    """The rows (queries) of the operand of ``op`` beside the scores' (at ``position``): 1 where it is
    the same for every query, the queries where it has one row each; None where it is neither (or
    unknown)."""
    shape, side = static_shape(op), static_shape(op.args[1 - position])
    if shape is None or side is None or len(side) > len(shape):
        return None
    rows = side[-2] if len(side) >= 2 else 1
    return rows if rows in (1, shape[-2]) else None
