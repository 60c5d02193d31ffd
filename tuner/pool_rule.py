"""The design space of ``tuner.lowering.bf16_pool``'s max pools: one schedule.

The window's maximum of ``lanes`` channels at a time stays in fp32 registers (the reduction's
init and update vectorised over channels, under the window's loops), its rounding to bf16 is
written right after, and rows of the output run in parallel.
"""

from __future__ import annotations

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV
from tvm.tirx import ForKind

BF16_POOL_RULE = "tuner_bf16_pool"
POOL_BLOCK = "bf16_pool_max"
MAX_LANES = 32  # two AVX-512 vectors of fp32


def pool_lanes(channels: int) -> int:
    """The largest power of two up to ``MAX_LANES`` that divides ``channels``."""
    return min(MAX_LANES, channels & -channels)


def schedule_bf16_pool(sch: Schedule, block: SBlockRV) -> list[Schedule]:
    if sch.get(block).name_hint != POOL_BLOCK:  # the cast: placed with the pool it rounds
        return [sch]
    (cast,) = sch.get_consumers(block)
    batch, row, column, channel, window_row, window_column = sch.get_loops(block)
    lanes = pool_lanes(int(sch.get(channel).extent))
    channel_block, lane = sch.split(channel, [None, lanes])
    sch.reorder(channel_block, window_row, window_column, lane)
    sch.reverse_compute_at(cast, channel_block)
    # before the init is taken out: the update alone is no reduction block to TVM
    sch.vectorize(lane)
    sch.parallel(sch.fuse(batch, row))
    init = sch.decompose_reduction(block, window_row)
    for vector_block in (init, cast):
        loop = sch.get_loops(vector_block)[-1]
        if sch.get(loop).kind != ForKind.VECTORIZED:
            sch.vectorize(loop)
    sch.annotate(sch.get_sblock("root"), "schedule_rule", "None")  # no generic annotations on top
    return [sch]
