"""Attention over long sequences computed a block of queries at a time, so that each block's scores
stay in the CPU's caches between the kernels that write and read them.

``softmax(Q K^T) V`` writes its scores (heads x queries x keys floats) to memory, reads them back in
the softmax and once more in the second product: at 1,500 positions (Whisper on 30 s of audio) that
is 54 MB per layer, passed over three times at the speed of memory. Split along the queries, each
block's scores (a few MB) are written and read back while they are still in the last-level cache.
The blocks are of one size, so each of their kernels is one task; one kernel splits the queries
(fused with the layout ops that produce them) and one joins the blocks' outputs.

Runs after ``SimplifyImportedGraph``, whose softmax kernels (``softmax``, ``safe_softmax``) it
recognises by name and computes again for each block.

Off by default (``LoweringOptions(attention_blocks=True)`` turns it on): on Whisper-tiny's encoder at
1,500 positions, tuned at 32 trials per kernel on a 2-core Zen 5, the model took 369 ms in blocks against
253 ms whole (``experiments/attention_blocks.py``). Its attention there is bound by the products, not by
memory: the blocks' first product ran slower on 100 queries than on 1,500 (14.8 against 12.5 ms per
layer), and the tuned softmax of a block was 4x slower per element than the whole one (28 against 6.6 ms
per layer), so the softmax's saved passes over memory (at most its 6.6 ms) could not pay.
"""

from __future__ import annotations

import re

import numpy as np
import tvm
from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from common.relax_functions import rewrite_functions

from .fast_math import row_softmax
from .graph import is_float32, op_name, static_shape

# Split where the scores outgrow the caches of a few cores; each block's scores fit in a
# last-level cache slice.
MIN_SCORE_BYTES = 16 << 20
BLOCK_SCORE_BYTES = 4 << 20
MIN_BLOCK_ROWS = 16  # fewer, and the products' tiles run short

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_SOFTMAX_KERNEL = re.compile(r"(safe_)?softmax\d*$")
# ops between the scores and the softmax, or the softmax and the second product, re-applied to each
# block: those that only add or drop leading axes, and arithmetic (a scaling, a mask)
_LEADING_AXES_OPS = ("relax.expand_dims", "relax.squeeze", "relax.reshape")
# such ops, each with the position of its argument that comes from the scores
_Chain = list[tuple[Call, int]]
_ARITHMETIC = ("relax.multiply", "relax.divide", "relax.add", "relax.subtract")


def query_blocks(queries: int, bytes_per_query: int) -> int:
    """How many equal blocks to split ``queries`` into: 1 (none) while the scores are small, else the
    fewest of at least ``MIN_BLOCK_ROWS`` queries whose scores fit ``BLOCK_SCORE_BYTES``."""
    if queries * bytes_per_query < MIN_SCORE_BYTES:
        return 1
    for blocks in range(2, queries // MIN_BLOCK_ROWS + 1):
        if queries % blocks == 0 and queries // blocks * bytes_per_query <= BLOCK_SCORE_BYTES:
            return blocks
    return 1


@expr_functor.mutator
class _AttentionBlocks(PyExprMutator):
    def __init__(self, mod: IRModule, fast_math: bool):
        super().__init__(mod)
        self.fast_math = fast_math

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if op_name(call) != "relax.matmul":
            return call
        found = self._attention(call)
        return call if found is None else self._in_blocks(call, *found)

    def _bound(self, expr: Expr) -> Expr:
        """What ``expr`` is bound to, through bindings of one variable to another."""
        while isinstance(expr, relax.Var) and (value := self.lookup_binding(expr)) is not None:
            expr = value
        return expr

    def _through_row_ops(self, expr: Expr) -> tuple[Expr, _Chain]:
        """The value under a chain of ops that keep the last two axes and treat every query alike, and
        the chain, innermost first: each op with the position of its argument from the chain."""
        chain: _Chain = []
        while True:
            value = self._bound(expr)
            position = _row_op_argument(value)
            if position is None:
                return value, chain[::-1]
            chain.append((value, position))
            expr = value.args[position]

    def _attention(self, call: Call) -> tuple[int, Call, _Chain, Call, _Chain] | None:
        """(how many blocks, Q K^T, the ops between it and the softmax, the softmax, the ops after it), if
        ``call`` is the ``P V`` of an attention whose scores are worth splitting."""
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
        blocks = query_blocks(shape[-2], int(np.prod(shape[:-2])) * shape[-1] * 4)
        return None if blocks == 1 else (blocks, scores, before, softmax, after)

    def _in_blocks(self, call: Call, blocks: int, scores: Call, before: _Chain, softmax: Call, after: _Chain) -> Expr:
        queries, keys = scores.args
        safe = softmax.args[0].name_hint.startswith("safe_")
        fast = self.fast_math and is_float32(softmax)
        split = self.builder_.emit(relax.op.split(queries, blocks, axis=-2))
        # operands with a row per query (a causal mask): split as the queries are
        pieces = {
            op: self.builder_.emit(relax.op.split(op.args[1 - position], blocks, axis=-2))
            for op, position in before + after
            if op_name(op) in _ARITHMETIC and _side_operand_rows(op, position) > 1
        }
        outputs = []
        for block in range(blocks):
            block_queries = self.builder_.emit(relax.TupleGetItem(split, block))
            part = self.builder_.emit(relax.op.matmul(block_queries, keys, scores.attrs.out_dtype))
            part = self._reapply(before, part, pieces, block)
            part = self.builder_.emit(
                self.builder_.call_te(row_softmax, part, fast, safe, primfunc_name_hint=softmax.args[0].name_hint)
            )
            part = self._reapply(after, part, pieces, block)
            outputs.append(self.builder_.emit(relax.op.matmul(part, call.args[1], call.attrs.out_dtype)))
        return relax.op.concat(outputs, axis=-2)

    def _reapply(self, chain: _Chain, value: Expr, pieces: dict[Call, Expr], block: int) -> Expr:
        """``chain`` applied to the ``block``-th block's ``value``."""
        for op, position in chain:
            if op_name(op) == "relax.reshape":
                shape = static_shape(op)
                value = self.builder_.emit(relax.op.reshape(value, (*shape[:-2], static_shape(value)[-2], shape[-1])))
                continue
            args = list(op.args)
            args[position] = value
            if op in pieces:
                args[1 - position] = self.builder_.emit(relax.TupleGetItem(pieces[op], block))
            value = self.builder_.emit(Call(op.op, args, op.attrs))
        return value


def _row_op_argument(value: Expr) -> int | None:
    """The position of the argument that ``value`` (a call) computes from row by row, keeping its last
    two axes: the data of an expand_dims, squeeze or reshape of leading axes, or the scores' operand of
    arithmetic with a tensor that is the same for every query or has a row per query (a scaling, a
    mask); else None."""
    name = op_name(value)
    if name in _ARITHMETIC:
        # where both operands have the scores' shape, either is taken for the scores': the other is split
        # into blocks as they are, and an element-wise op on blocks is the op
        full = [i for i, arg in enumerate(value.args) if static_shape(arg) == static_shape(value)]
        return full[0] if full and _side_operand_rows(value, full[0]) is not None else None
    if name not in _LEADING_AXES_OPS:
        return None
    before, after = static_shape(value.args[0]), static_shape(value)
    if before is None or after is None or len(before) < 2 or len(after) < 2 or before[-2:] != after[-2:]:
        return None
    if name == "relax.reshape":
        return 0
    rank = len(after) if name == "relax.expand_dims" else len(before)
    return 0 if all(int(a) % rank < rank - 2 for a in value.attrs.axis) else None


def _side_operand_rows(op: Call, position: int) -> int | None:
    """The rows (queries) of the operand of ``op`` beside the scores' (at ``position``): 1 where it is
    the same for every query, the queries where it has one row each; None where it is neither (or
    unknown)."""
    shape, side = static_shape(op), static_shape(op.args[1 - position])
    if shape is None or side is None or len(side) > len(shape):
        return None
    rows = side[-2] if len(side) >= 2 else 1
    return rows if rows in (1, shape[-2]) else None


@tvm.transform.module_pass(opt_level=0, name="AttentionInQueryBlocks")
class AttentionInQueryBlocks:
    """Attentions whose scores outgrow the caches computed a block of queries at a time."""

    def __init__(self, fast_math: bool = True):
        self.fast_math = fast_math

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_AttentionBlocks(mod, self.fast_math), mod)
