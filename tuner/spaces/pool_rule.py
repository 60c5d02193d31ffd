"""The design space of ``tuner.lowering.bf16.pool``'s max pools: one schedule.

The window's highest and lowest 16-bit integers of ``lanes`` channels at a time stay in
registers (each reduction's init and update vectorised over channels, under the window's loops),
the choice between them is written right after, and rows of the output run in parallel.
"""

from __future__ import annotations

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

BF16_POOL_RULE = "tuner_bf16_pool"
POOL_BLOCKS = ("bf16_pool_highest", "bf16_pool_lowest")  # the window's reductions, before their choice
POOL_OUTPUT = "bf16_pool"  # the choice: the block the schedule starts from
MAX_LANES = 32  # int16 in an AVX-512 vector


def pool_lanes(channels: int) -> int:
    """The largest power of two up to ``MAX_LANES`` that divides ``channels``."""
    return min(MAX_LANES, channels & -channels)


def schedule_bf16_pool(sch: Schedule, block: SBlockRV) -> list[Schedule]:
    if sch.get(block).name_hint != POOL_OUTPUT:  # the reductions (and, decomposed, their inits and updates)
        return [sch]
    batch, row, _, channel = sch.get_loops(block)
    channel_block, lane = sch.split(channel, [None, pool_lanes(int(sch.get(channel).extent))])
    sch.vectorize(lane)
    reductions = [sch.get_sblock(name) for name in POOL_BLOCKS]
    for reduction in reductions:
        sch.compute_at(reduction, channel_block, preserve_unit_loops=True)
        *_, lanes, window_row, window_column = sch.get_loops(reduction)
        sch.reorder(window_row, window_column, lanes)
        sch.vectorize(lanes)  # before the init is taken out: the update alone is no reduction block to TVM
    sch.parallel(sch.fuse(batch, row))
    for reduction in reductions:
        init = sch.decompose_reduction(reduction, sch.get_loops(reduction)[-3])
        sch.vectorize(sch.get_loops(init)[-1])
    sch.annotate(sch.get_sblock("root"), "schedule_rule", "None")  # no generic annotations on top
    return [sch]
