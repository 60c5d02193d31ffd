"""Values a kernel reads broadcast are computed once, not once per element that reads them.

A squeeze-and-excitation gate fuses into one kernel with the multiply that applies it: a 1x1 convolution of
the pooled channels, its bias, a sigmoid, and the feature map times the gate channel by channel. MetaSchedule's
AutoInline inlines the element-wise chain into its consumer, so the sigmoid (fast_math's polynomial exp) was
computed for every element of the 56x56x128 map instead of once per channel: RegNet's first gate took 113 us
alone, 24 us with the 128 gate values computed once (the map's multiply then a pass at the memory's speed).

A spatial block whose consumer is also spatial and iterates ``MIN_BROADCAST`` times the block's own domain or
more (the consumer reads each value that many times over) is marked for AutoInline to leave alone
(``meta_schedule.inline_rule``); its own element-wise producers still inline into it, and the product before
it still takes it as its epilogue. A consumer that reduces (a convolution reading its padded input) reuses what
it reads by design and is not a broadcast.

The consumer is then a loop nest of its own at the kernel's root, which MetaSchedule fuses whole and
vectorises ``VECTOR_EXTENT`` elements at a time. Only where its innermost axis is a multiple of that vector does
a vector lie within one row of it; across rows, the gate's values are gathered lane by lane: EfficientNet's
gates over 144, 240, 480 and 672 channels ran 2-5x slower marked (its 56x56x144 one 207 -> 478 us in the
model), its gate over 1152 channels faster (28 -> 19 us). Such a kernel records the widest vector its
consumers' rows hold whole (``metaschedule.root_vector``: 48 lanes for 144 channels), which its design space's
ParallelizeVectorizeUnroll takes (``metaschedule.make_context``); one whose innermost axis is no multiple of
``LANES`` is left as it was.
"""

from __future__ import annotations

import math

import tvm
from tvm.ir.module import IRModule
from tvm.s_tir import SBlock, SBlockRealize, Schedule

from tuner.spaces.metaschedule import ROOT_VECTOR_ATTR, VECTOR_EXTENT
from tuner.spaces.rows_rule import variables_of

MIN_BROADCAST = 8  # reads of each value per computation of it, from which it is computed once
LANES = 16  # fp32 lanes of the widest vector registers (AVX-512); a vector is a whole number of them
NO_INLINE = ("meta_schedule.inline_rule", "disable")


def _spatial(block: SBlock) -> bool:
    return all(int(iv.iter_type) == tvm.tirx.IterVar.DataPar for iv in block.iter_vars)


def _domain(block: SBlock) -> int:
    return math.prod(int(iv.dom.extent) for iv in block.iter_vars)


def _innermost(block: SBlock) -> int:
    return int(block.iter_vars[-1].dom.extent) if block.iter_vars else 1


def _product(block: SBlock) -> bool:
    """Whether a block sums products of two or more operands over its reduction (a matmul, a convolution), as
    MetaSchedule's tiling takes: not a norm's mean, which sums one."""
    reduced = {iv.var.name for iv in block.iter_vars if int(iv.iter_type) != tvm.tirx.IterVar.DataPar}
    over_reduction = [any(variables_of(axis.min) & reduced for axis in region.region) for region in block.reads]
    return sum(over_reduction) >= 2


def _after_a_product(sch: Schedule, block_rv, besides: SBlock | None = None) -> bool:
    """Whether a block reads a product's output, directly or through element-wise blocks (a bias added first),
    other than through ``besides``: it is the product's epilogue."""
    producers = [p for p in sch.get_producers(block_rv) if besides is None or not sch.get(p).same_as(besides)]
    return any(_product(sch.get(p)) or (_spatial(sch.get(p)) and _after_a_product(sch, p)) for p in producers)


def row_vector(extent: int) -> int | None:
    """The widest vector, up to ``VECTOR_EXTENT`` and in whole ``LANES``, that rows of ``extent`` hold a whole
    number of; None where ``extent`` is no multiple of ``LANES``."""
    return max((v for v in range(LANES, VECTOR_EXTENT + 1, LANES) if extent % v == 0), default=None)


def _broadcasts(consumer: SBlock, block: SBlock) -> bool:
    """Whether spatial ``consumer`` reads ``block``'s values ``MIN_BROADCAST`` times over or more, in whole
    vectors of its innermost axis."""
    recomputed = _domain(consumer) >= MIN_BROADCAST * _domain(block)
    return _spatial(consumer) and recomputed and row_vector(_innermost(consumer)) is not None


def broadcasts(func: tvm.tirx.PrimFunc) -> dict[str, int]:
    """``func``'s spatial blocks that a spatial consumer reads ``MIN_BROADCAST`` times over or more
    (``_broadcasts``), by name, each with the widest vector its consumers' rows hold (``row_vector``). Not one
    whose consumer is also a product's epilogue (reads a product's output, directly or past a bias: Mixtral's and
    GPT-OSS's expert products scaled by each token's routing weight): MetaSchedule's tiling of the product moves
    its epilogue into its tiles, which it cannot where another producer of the epilogue stays a loop nest of its
    own after the product; the kernel had no design space at all, and ran unscheduled (753 ms for a 3 ms
    product)."""
    sch = Schedule(IRModule({"main": func}))
    root = func.body.block.name_hint if isinstance(func.body, SBlockRealize) else "root"
    found = {}
    for rv in sch.get_child_blocks(sch.get_sblock(root, func_name="main")):
        block = sch.get(rv)
        if not _spatial(block) or len(block.writes) != 1:
            continue
        readers = [
            sch.get(c)
            for c in sch.get_consumers(rv)
            if _broadcasts(sch.get(c), block) and not _after_a_product(sch, c, besides=block)
        ]
        if readers:
            found[block.name_hint] = min(row_vector(_innermost(c)) or LANES for c in readers)
    return found


def broadcast_blocks(func: tvm.tirx.PrimFunc) -> list[str]:
    """Names of ``func``'s broadcast blocks (``broadcasts``)."""
    return list(broadcasts(func))


def keep_broadcast_values(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with its broadcast blocks (``broadcasts``) marked for AutoInline to leave alone, and the vector
    its root loop nests take where narrower than MetaSchedule's (``ROOT_VECTOR_ATTR``)."""
    found = broadcasts(func)
    if not found:
        return func
    sch = Schedule(IRModule({"main": func}))
    for name in found:
        sch.annotate(sch.get_sblock(name, func_name="main"), *NO_INLINE)
    marked, vector = sch.mod["main"], min(found.values())
    return marked if vector == VECTOR_EXTENT else marked.with_attr(ROOT_VECTOR_ATTR, vector)


@tvm.transform.module_pass(opt_level=0, name="ComputeBroadcastValuesOnce")
class ComputeBroadcastValuesOnce:
    """After FuseTIR: every kernel's broadcast values (``broadcasts``) computed once."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        for gv, func in list(mod.functions_items()):
            if isinstance(func, tvm.tirx.PrimFunc):
                kept = keep_broadcast_values(func)
                if not kept.same_as(func):
                    mod[gv] = kept
        return mod
