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
vectorises ``VECTOR_EXTENT`` elements at a time. Only where its innermost axis is a multiple of that does a
vector lie within one row of it; across rows, the gate's values are gathered lane by lane: EfficientNet's gates
over 144, 240, 480 and 672 channels ran 2-5x slower marked (its 56x56x144 one 207 -> 478 us in the model), its
gate over 1152 channels faster (28 -> 19 us). Those consumers are left as they were.
"""

from __future__ import annotations

import math

import tvm
from tvm.ir.module import IRModule
from tvm.s_tir import SBlock, SBlockRealize, Schedule

MIN_BROADCAST = 8  # reads of each value per computation of it, from which it is computed once
VECTOR_EXTENT = 64  # MetaSchedule's vector of a root loop nest on CPUs (ParallelizeVectorizeUnroll's default)
NO_INLINE = ("meta_schedule.inline_rule", "disable")


def _spatial(block: SBlock) -> bool:
    return all(int(iv.iter_type) == tvm.tirx.IterVar.DataPar for iv in block.iter_vars)


def _domain(block: SBlock) -> int:
    return math.prod(int(iv.dom.extent) for iv in block.iter_vars)


def _broadcasts(consumer: SBlock, block: SBlock) -> bool:
    """Whether spatial ``consumer`` reads ``block``'s values ``MIN_BROADCAST`` times over or more, in whole
    vectors of its innermost axis."""
    innermost = int(consumer.iter_vars[-1].dom.extent) if consumer.iter_vars else 1
    return _spatial(consumer) and _domain(consumer) >= MIN_BROADCAST * _domain(block) and innermost % VECTOR_EXTENT == 0


def broadcast_blocks(func: tvm.tirx.PrimFunc) -> list[str]:
    """Names of ``func``'s spatial blocks that a spatial consumer reads ``MIN_BROADCAST`` times over or more
    (``_broadcasts``)."""
    sch = Schedule(IRModule({"main": func}))
    root = func.body.block.name_hint if isinstance(func.body, SBlockRealize) else "root"
    names = []
    for rv in sch.get_child_blocks(sch.get_sblock(root, func_name="main")):
        block = sch.get(rv)
        if not _spatial(block) or len(block.writes) != 1:
            continue
        if any(_broadcasts(sch.get(c), block) for c in sch.get_consumers(rv)):
            names.append(block.name_hint)
    return names


def keep_broadcast_values(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with its broadcast blocks (``broadcast_blocks``) marked for AutoInline to leave alone."""
    names = broadcast_blocks(func)
    if not names:
        return func
    sch = Schedule(IRModule({"main": func}))
    for name in names:
        sch.annotate(sch.get_sblock(name, func_name="main"), *NO_INLINE)
    return sch.mod["main"]


@tvm.transform.module_pass(opt_level=0, name="ComputeBroadcastValuesOnce")
class ComputeBroadcastValuesOnce:
    """After FuseTIR: every kernel's broadcast values (``broadcast_blocks``) computed once."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        for gv, func in list(mod.functions_items()):
            if isinstance(func, tvm.tirx.PrimFunc):
                kept = keep_broadcast_values(func)
                if not kept.same_as(func):
                    mod[gv] = kept
        return mod
