"""The analytic schedule of a kernel that sums its input over every axis but the last and then scales or maps
the sums (a channels-last global average pool: a squeeze-and-excite block's mean, a classifier's pool): the
image's positions split into one contiguous part per core, each part summed a whole row of channels at a time
into that core's partial sums (``rfactor``), the innermost loop over a vector's lanes for LLVM to vectorise;
then the parts added.

MetaSchedule's design space for such a kernel splits and reorders the reduction as for any other and
draws its choices; the analytic door took a fixed seed's. RegNet's 56 x 56 x 128 mean so ran 174 us alone
on a Zen 5 and 143 us after 98 trials; a vector of channels per parallel task, summed down the image, took
37.5 us (the unscheduled loops 625). Inside a model that was 5x its time alone (82 us against 14 in RegNet's
bf16 build on a 2-core Xeon): the convolution before it wrote the image's rows on both cores, and each core
read every row's slice of its channels, half of them from the other core's cache. A core per part of the
positions reads what it wrote (a producer and this mean: 160 -> 122 us together, ~14 us either alone).
"""

from __future__ import annotations

import math

import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import ScheduleError

from .copy_rule import copy_lanes
from .rows_rule import MIN_VECTOR, names_a_space_of_its_own, reduces, variables_of

MIN_POSITIONS_PER_CORE = 8  # fewer: a pool over a few positions, not worth a launch per core


def column_schedule(mod: tvm.IRModule, lanes: int, cores: int) -> Schedule | None:
    """The schedule above, or None where the kernel is not one reduction over every axis but its input's last,
    the element-wise blocks it feeds after it; where a block names a design space of its own (a bf16 pool's);
    where its channels take no vector, or its positions are too few to split over the cores."""
    sch = Schedule(mod)
    try:
        root = sch.get_sblock("root")
        blocks = sch.get_child_blocks(root)
        if names_a_space_of_its_own(sch, blocks):
            return None
        first = next((i for i, block in enumerate(blocks) if reduces(sch.get(block))), None)
        if first is None or any(reduces(sch.get(block)) for block in blocks[first + 1 :]):
            return None
        for producer in reversed(blocks[:first]):
            sch.compute_inline(producer)
        reduction, *after = sch.get_child_blocks(root)
    except (ScheduleError, ValueError):  # an opaque kernel, a producer that cannot inline
        return None
    if not _sums_all_but_the_last_axis(sch.get(reduction)):
        return None
    *outer, channels = sch.get_loops(reduction)[: len(sch.get(reduction).writes[0].region)]
    over = sch.get_loops(reduction)[len(outer) + 1 :]  # the reduction's loops, the image's positions
    extent, positions = int(sch.get(channels).extent), math.prod(int(sch.get(loop).extent) for loop in over)
    vector = copy_lanes([extent], lanes)
    if vector < MIN_VECTOR or positions < cores * MIN_POSITIONS_PER_CORE:
        return None
    try:
        part, within = sch.split(sch.fuse(*over), [cores, None])
        parts = sch.rfactor(part, 0)
        *outer, channels, part, within = sch.get_loops(parts)
        sch.reorder(part, *outer, within, channels)
        sch.parallel(part)
        sch.vectorize(sch.split(channels, [None, vector])[1])
        sch.decompose_reduction(parts, within)
        for block in after:
            last = sch.get_loops(block)[-1]
            if int(sch.get(last).extent) % vector == 0:
                sch.vectorize(sch.split(last, [None, vector])[1])
    except ScheduleError:
        return None
    return sch


def _sums_all_but_the_last_axis(block: tvm.tirx.Stmt) -> bool:
    """Whether the block reads one input whose last axis is its output's last axis (the same variable) and
    whose other axes are indexed by the reduction's variables, or by variables of extent one."""
    if len(block.writes) != 1 or len(block.reads) != 1:  # a reduction of several outputs (a sum and its squares)
        return False
    (written,) = block.writes
    if not written.region:
        return False
    (read,) = block.reads
    reduced = {iv.var.name for iv in block.iter_vars if iv.iter_type == tvm.tirx.IterVar.CommReduce}
    along = variables_of(written.region[-1].min)
    if not reduced or len(along) != 1 or not read.region or variables_of(read.region[-1].min) != along:
        return False
    single = {iv.var.name for iv in block.iter_vars if int(iv.dom.extent) == 1}  # a batch of one
    others = set().union(*(variables_of(r.min) for r in read.region[:-1]))
    return bool(others & reduced) and others <= reduced | single
