"""The analytic schedule of a kernel that moves data across its axes (a transpose, a head split, with the
scaling and the padding fused into it): its output in rows, the rows in parallel, each row vectorised.

MetaSchedule's design space for an element-wise kernel has one schedule: every loop fused into one, split
into parallel chunks of 64 elements, each chunk vectorised. Where a row's length is not a multiple of 64,
a chunk crosses rows, and where the input is read across its axes, each lane's address is its own divisions
and remainders of the fused index: a gather computed lane by lane. The padded attention's keys of DeiT-S
(198 tokens of 3 heads of 64 read across into 3 x 64 x 208, scaled and padded) took 32 us so, 4.9 predicted;
as rows of 208 in parallel, each cut into vectors of 16: 4x faster (experiments/README.md, "Copies across
axes"). Kernels read along their own rows keep MetaSchedule's schedule (the fused index of a contiguous
read simplifies back to itself), and so do rows a whole number of its chunks long.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import ScheduleError

from .copy_rule import copy_lanes

MIN_VECTOR = 4  # a shorter vector than this costs its shuffles more than it saves: the row is left to LLVM
METASCHEDULE_CHUNK = 64  # the elements MetaSchedule's element-wise schedule vectorises at a time


def rows_schedule(mod: tvm.IRModule, lanes: int, cores: int) -> Schedule | None:
    """``mod`` as parallel rows of vectors of up to ``lanes``; None where it is not a kernel of one
    element-wise output (after inlining its producers) that reads an input across its axes, or where its
    rows are too few to keep ``cores`` busy, shorter than a vector, or a multiple of MetaSchedule's chunk
    (whose chunks then do not cross rows: GPT-2's keys, 12 x 64 rows of 128, 75 us so, 94 as rows)."""
    sch = Schedule(mod)
    try:
        root = sch.get_sblock("root")
        blocks = sch.get_child_blocks(root)
        if not blocks or any(reduces(sch.get(block)) for block in blocks):
            return None
        for producer in reversed(blocks[:-1]):
            sch.compute_inline(producer)
        (block,) = sch.get_child_blocks(root)
    except (ScheduleError, ValueError):  # an opaque kernel, a producer that cannot inline, two outputs
        return None
    loops = sch.get_loops(block)
    if len(loops) < 2 or not reads_across(sch.get(block)):
        return None
    row = int(sch.get(loops[-1]).extent)
    rows = 1
    for loop in loops[:-1]:
        rows *= int(sch.get(loop).extent)
    if row < lanes or rows < cores or row % METASCHEDULE_CHUNK == 0:
        return None
    vector = copy_lanes([row], lanes)
    if vector >= MIN_VECTOR:
        sch.vectorize(sch.split(loops[-1], [None, vector])[1])
    sch.parallel(sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0])
    return sch


def reads_across(block: tvm.tirx.Stmt) -> bool:
    """Whether the block reads some input's last axis by another of its own variables than the one its
    output's last axis is written by (a transpose); broadcast reads that use none do not count."""
    (written,) = block.writes
    if not written.region:  # a scalar written: no rows
        return False
    along = variables_of(written.region[-1].min)
    if not along:
        return False
    for read in block.reads:
        if not read.region:  # a scalar read (a constant of the kernel's): no axis at all
            continue
        used = variables_of(read.region[-1].min)
        if used and not used & along:
            return True
    return False


def variables_of(expr: tvm.tirx.Expr) -> set[str]:
    """The names of the variables ``expr`` uses."""
    return {var.name for var in tvm.tirx.analysis.undefined_vars(expr, [])}


def reduces(block: tvm.tirx.Stmt) -> bool:
    """Whether a block (an ``SBlock``) has a reduction loop."""
    return any(var.iter_type == tvm.tirx.IterVar.CommReduce for var in block.iter_vars)


def names_a_space_of_its_own(sch: Schedule, blocks: list) -> bool:
    """Whether one of ``blocks`` names a design space of its own (a ``schedule_rule`` annotation: a bf16 pool's,
    our fused blocks'), which a rule of ours then leaves the kernel to."""
    return any("schedule_rule" in sch.get(block).annotations for block in blocks)
