"""Attention over long sequences computed a block of queries at a time, so that each block's scores
stay in the CPU's caches between the kernels that write and read them.

``softmax(Q K^T) V`` writes its scores (heads x queries x keys floats) to memory, reads them back in
the softmax and once more in the second product: at 1,500 positions (Whisper on 30 s of audio) that
is 54 MB per layer, passed over three times at the speed of memory. Split along the queries, each
block's scores (a few MB) are written and read back while they are still in the last-level cache.
The blocks are of one size, so each of their kernels is one task; one kernel splits the queries
(fused with the layout ops that produce them) and one joins the blocks' outputs.

The attention is found by ``attention_pattern``; its softmax kernel is computed again for each block.

Off by default (``LoweringOptions(attention_blocks=True)`` turns it on): on Whisper-tiny's encoder at
1,500 positions, tuned at 32 trials per kernel on a 2-core Zen 5, the model took 369 ms in blocks against
253 ms whole (``experiments/attention_blocks.py``). Its attention there is bound by the products, not by
memory: the blocks' first product ran slower on 100 queries than on 1,500 (14.8 against 12.5 ms per
layer), and the tuned softmax of a block was 4x slower per element than the whole one (28 against 6.6 ms
per layer), so the softmax's saved passes over memory (at most its 6.6 ms) could not pay.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, expr_functor

from common.relax_functions import rewrite_functions

from .attention_pattern import ARITHMETIC, Attention, AttentionFinder, reapply, side_operand_rows
from .fast_math import row_softmax
from .graph import is_float32, op_name

# Split where the scores outgrow the caches of a few cores; each block's scores fit in a
# last-level cache slice.
MIN_SCORE_BYTES = 16 << 20
BLOCK_SCORE_BYTES = 4 << 20
MIN_BLOCK_ROWS = 16  # fewer, and the products' tiles run short


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
class _AttentionBlocks(AttentionFinder):
    def __init__(self, mod: IRModule, fast_math: bool):
        super().__init__(mod)
        self.fast_math = fast_math

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        found = self.find(call)
        if found is None:
            return call
        shape = found.shape
        blocks = query_blocks(shape[-2], int(np.prod(shape[:-2])) * shape[-1] * 4)
        return call if blocks == 1 else self._in_blocks(found, blocks)

    def _in_blocks(self, attention: Attention, blocks: int) -> Expr:
        queries, keys = attention.scores.args
        fast = self.fast_math and is_float32(attention.softmax)
        split = self.builder_.emit(relax.op.split(queries, blocks, axis=-2))
        # operands with a row per query (a causal mask): split as the queries are
        pieces = {
            op: self.builder_.emit(relax.op.split(op.args[1 - position], blocks, axis=-2))
            for op, position in attention.before + attention.after
            if op_name(op) in ARITHMETIC and side_operand_rows(op, position) > 1
        }
        name = attention.softmax.args[0].name_hint
        outputs = []
        for block in range(blocks):
            side = {op: self.builder_.emit(relax.TupleGetItem(split_op, block)) for op, split_op in pieces.items()}
            block_queries = self.builder_.emit(relax.TupleGetItem(split, block))
            part = self.builder_.emit(relax.op.matmul(block_queries, keys, attention.scores.attrs.out_dtype))
            part = reapply(self.builder_, attention.before, part, side)
            part = self.builder_.emit(
                self.builder_.call_te(row_softmax, part, fast, attention.safe, primfunc_name_hint=name)
            )
            part = reapply(self.builder_, attention.after, part, side)
            product = attention.product
            outputs.append(self.builder_.emit(relax.op.matmul(part, product.args[1], product.attrs.out_dtype)))
        return relax.op.concat(outputs, axis=-2)


@tvm.transform.module_pass(opt_level=0, name="AttentionInQueryBlocks")
class AttentionInQueryBlocks:
    """Attentions whose scores outgrow the caches computed a block of queries at a time."""

    def __init__(self, fast_math: bool = True):
        self.fast_math = fast_math

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_AttentionBlocks(mod, self.fast_math), mod)
