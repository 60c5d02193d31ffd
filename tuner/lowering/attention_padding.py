"""Attention over a token count that tiles badly, computed over a few zero tokens more.

MetaSchedule tiles a loop only by its divisors. Attention's first product ``Q K^T`` vectorises along the
keys: over a ViT's 197 tokens (a prime) or DINOv2's 257 it offers no whole vector, and takes one column at
a time (``analytic``: "197 rows: 1"); the second product ``P V`` reduces over the same count in runs that
do not divide it either. ViT-S's two products ran at 41-49 GFLOP/s in the model, a fifth of the FMA peak
(362 and 302 us against 117 predicted); DINOv2-S's, 1.5 and 0.85 ms of its 33.

The queries, keys and values are padded with zero tokens to a multiple of ``TOKEN_MULTIPLE``; the padded
keys' scores are set to -inf before the softmax, so their probabilities are 0 and the padded values' zero
rows add nothing, and the padded queries' rows are sliced off the output. Every real score, sum and
product is the model's own. A mask or bias added to the scores is padded with zeros beside them.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, expr_functor

from common.relax_functions import rewrite_functions

from .attention_pattern import ARITHMETIC, Attention, AttentionFinder, reapply
from .fast_math import row_softmax
from .graph import is_float32, op_name, static_shape

TOKEN_MULTIPLE = 16  # AVX-512's lanes, two of AVX2's vectors
MAX_EXTRA = 0.125  # padded tokens, of the real ones: beyond it the padded work costs what whole vectors gain


def padded_tokens(tokens: int) -> int:
    """``tokens``, or the next multiple of ``TOKEN_MULTIPLE`` where that is at most ``MAX_EXTRA`` more."""
    padded = -(-tokens // TOKEN_MULTIPLE) * TOKEN_MULTIPLE
    return padded if padded - tokens <= MAX_EXTRA * tokens else tokens


@expr_functor.mutator
class _PadTokens(AttentionFinder):
    def __init__(self, mod: IRModule, fast_math: bool):
        super().__init__(mod)
        self.fast_math = fast_math
        self._pads: list[tuple[Expr, tuple, Expr]] = []  # each padded operand, once: a mask every layer adds

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        found = self.find(call)
        if found is None:
            return call
        queries, keys = found.shape[-2:]
        padded = (padded_tokens(queries), padded_tokens(keys))
        if padded == (queries, keys) or not self._side_operands_pad(found):
            return call
        return self._padded(found, *padded)

    def _side_operands_pad(self, attention: Attention) -> bool:
        """Whether every operand beside the scores (a scaling, a mask, a bias) can be padded with zeros:
        not a divisor with a row or a column per token."""
        for op, position in _arithmetic(attention):
            side = static_shape(op.args[1 - position])
            if op_name(op) == "relax.divide" and side and max(side[-2:]) > 1:
                return False
        return True

    def _padded(self, attention: Attention, queries: int, keys: int) -> Expr:
        shape = attention.shape
        q, k = attention.scores.args
        values = attention.product.args[1]
        scores = self.builder_.emit(
            relax.op.matmul(
                self._pad(q, -2, queries - shape[-2]),
                self._pad(k, -1, keys - shape[-1]),
                attention.scores.attrs.out_dtype,
            )
        )
        masking = _masking_add(attention)
        side = {
            op: self._pad_side(op, position, shape, queries, keys, -np.inf if op is masking else 0.0)
            for op, position in _arithmetic(attention)
        }
        scores = reapply(self.builder_, attention.before, scores, side)
        if keys > shape[-1] and masking is None:
            mask = np.concatenate([np.zeros(shape[-1]), np.full(keys - shape[-1], -np.inf)]).astype("float32")
            scores = self.builder_.emit(relax.op.add(scores, relax.const(mask)))
        fast = self.fast_math and is_float32(attention.softmax)
        name = attention.softmax.args[0].name_hint
        probabilities = self.builder_.emit(
            self.builder_.call_te(row_softmax, scores, fast, attention.safe, primfunc_name_hint=name)
        )
        probabilities = reapply(self.builder_, attention.after, probabilities, side)
        values = self._pad(values, -2, keys - shape[-1])
        out = self.builder_.emit(relax.op.matmul(probabilities, values, attention.product.attrs.out_dtype))
        rank = len(static_shape(out))
        return relax.op.strided_slice(out, axes=[rank - 2], begin=[0], end=[shape[-2]])

    def _pad_side(
        self, op: Call, position: int, shape: tuple[int, ...], queries: int, keys: int, key_fill: float
    ) -> Expr:
        """The operand of ``op`` beside the scores, its query rows padded with zeros and its key columns with
        ``key_fill``."""
        side = op.args[1 - position]
        side_shape = static_shape(side)
        if len(side_shape) >= 1 and side_shape[-1] == shape[-1] > 1:
            side = self._pad(side, -1, keys - shape[-1], key_fill)
        if len(side_shape) >= 2 and side_shape[-2] == shape[-2] > 1:
            side = self._pad(side, -2, queries - shape[-2])
        return side

    def _pad(self, tensor: Expr, axis: int, extra: int, fill: float = 0.0) -> Expr:
        """``tensor`` with ``extra`` elements of ``fill`` after its ``axis`` (negative: from the last)."""
        if extra == 0:
            return tensor
        for padded, how, result in self._pads:
            if padded.same_as(tensor) and how == (axis, extra, fill):
                return result
        rank = len(static_shape(tensor))
        widths = [0] * (2 * rank)
        widths[2 * (rank + axis) + 1] = extra
        result = self.builder_.emit(relax.op.nn.pad(tensor, widths, pad_value=fill))
        self._pads.append((tensor, (axis, extra, fill), result))
        return result


def _masking_add(attention: Attention) -> Call | None:
    """The last op before the softmax, where it adds a mask with a column per key: its padded columns are
    -inf, and the padded keys need no mask of their own. (Not where another op follows it: -inf times a
    zero is NaN.)"""
    arithmetic = [(op, position) for op, position in attention.before if op_name(op) in ARITHMETIC]
    if not arithmetic or op_name(arithmetic[-1][0]) != "relax.add":
        return None
    op, position = arithmetic[-1]
    side = static_shape(op.args[1 - position])
    return op if side and side[-1] == attention.shape[-1] > 1 else None


def _arithmetic(attention: Attention) -> list[tuple[Call, int]]:
    """The ops of the attention's chains with an operand beside the scores."""
    return [(op, position) for op, position in attention.before + attention.after if op_name(op) in ARITHMETIC]


@tvm.transform.module_pass(opt_level=0, name="PadAttentionTokens")
class PadAttentionTokens:
    """Attentions over token counts that tile badly computed over a few zero tokens more."""

    def __init__(self, fast_math: bool = True):
        self.fast_math = fast_math

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_PadTokens(mod, self.fast_math), mod)
