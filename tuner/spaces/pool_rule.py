"""The design space of ``tuner.lowering.bf16.pool``'s max pools: one schedule; and the analytic schedule of
an fp32 max pool (``max_pool_schedule``), the same loops over TVM's own pool.

The window's highest and lowest 16-bit integers of ``lanes`` channels at a time stay in
registers (each reduction's init and update vectorised over channels, under the window's loops),
the choice between them is written right after, and rows of the output run in parallel.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV, ScheduleError

BF16_POOL_RULE = "tuner_bf16_pool"
POOL_BLOCKS = ("bf16_pool_highest", "bf16_pool_lowest")  # the window's reductions, before their choice
POOL_OUTPUT = "bf16_pool"  # the choice: the block the schedule starts from
MAX_LANES = 32  # int16 in an AVX-512 vector
MIN_FP32_VECTOR = 4  # fewer channels than this: the pool is left to MetaSchedule's draw


def pool_lanes(channels: int, lanes: int = MAX_LANES) -> int:
    """The largest power of two up to ``lanes`` that divides ``channels``."""
    return min(lanes, channels & -channels)


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


def max_pool_schedule(mod: tvm.IRModule, lanes: int, cores: int) -> Schedule | None:
    """The analytic schedule of an fp32 max pool over channels-last images (TVM's ``pool_max`` block, its
    padding a block before it): the padding inlined, each output pixel's channels in vectors of up to
    ``lanes`` that take the window's maximum in registers, rows of output pixels in parallel. None for any
    other kernel, or where the channels are fewer than a vector.

    MetaSchedule's draw for a pool leaves the padding a pass of its own and the window's loops innermost:
    SqueezeNet 1.1's three 3x3 pools (64-256 channels) took 0.23, 0.11 and 0.06 ms on a 2-core Xeon, 2.5x
    their bytes' time."""
    sch = Schedule(mod)
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        *producers, pool = blocks
        if sch.get(pool).annotations.get("schedule_rule") != "meta_schedule.pool_max" or len(producers) > 1:
            return None
        for producer in producers:
            sch.compute_inline(producer)
    except (ScheduleError, ValueError):  # an opaque kernel, a producer that cannot inline, no block at all
        return None
    loops = sch.get_loops(pool)
    if len(loops) != 6 or str(sch.get(pool).writes[0].source.dtype) != "float32" or not _channels_last(sch.get(pool)):
        return None
    batch, row, column, channel, window_row, window_column = loops
    vector = pool_lanes(int(sch.get(channel).extent), lanes)
    if vector < MIN_FP32_VECTOR:
        return None
    channel_block, lane = sch.split(channel, [None, vector])
    sch.reorder(channel_block, window_row, window_column, lane)
    rows = int(sch.get(batch).extent) * int(sch.get(row).extent)
    # both before the init is taken out: the update alone is no reduction block to TVM
    sch.vectorize(lane)
    sch.parallel(sch.fuse(batch, row) if rows >= cores else sch.fuse(batch, row, column))
    init = sch.decompose_reduction(pool, window_row)
    sch.vectorize(sch.get_loops(init)[-1])
    return sch


def _channels_last(pool: tvm.tirx.Stmt) -> bool:
    """Whether the pool reads its image's last axis at its own fourth variable, the channel it writes: a
    channels-last pool (an NCHW one slides its window along that axis)."""
    channel = pool.iter_vars[3].var
    return all(region.region[-1].min.same_as(channel) for region in pool.reads)
