"""The analytic schedule of a kernel that reduces each row of its output and then writes the row (a layer
norm, an RMS norm, a softmax that ``tuner.lowering.softmax_rows`` did not rebuild): a row per parallel
task, its reductions taken over whole vectors into up to ``softmax_rule.MAX_CHAINS`` vectors of partial
results each (independent chains, ``softmax_rule.running_chains``), those combined pairwise, then the row
written a vector at a time.

MetaSchedule's design space for such a kernel draws where each reduction is computed, how its loop is
split for ``rfactor`` and whether the row is vectorised; the analytic door took the draws of a fixed seed.
BERT-base's layer norm (128 rows of 768) so became two scalar reductions over factors of 3 and 8 and an
unvectorised row: 18-21 us alone on a Zen 5, where a 3-minute search found 9.8 us after 712 trials; this
schedule takes 8.7-10 us (ViT-S's, DeiT-S's and GPT-2's: 1.6-2.1x faster than the seeded draw).
Here every reduction is computed at the row, in the order its consumers need it, its loop split into
``vector`` lanes (the largest power of two up to the register's fp32 lanes that divides the row) and
factored over them, the lanes vectorised; the row's output is vectorised the same way. With one vector of
partial results, a row's reduction was one chain of dependent vector adds, then 16 dependent scalar adds over
the lanes; with up to 4 vectors (as many as leave each two or more steps) and the lanes halved pairwise
(``rfactor`` again per step), BERT-base's, GPT-2's and ViT-S's layer norms ran in 0.64-0.66 of their time
alone (a 2-core Emerald Rapids, interleaved in one process). The row stays in
the core's L1 between the passes. The results are those of the unscheduled kernel up to the order of
the additions.
"""

from __future__ import annotations

import math

import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV, ScheduleError

from .copy_rule import copy_lanes
from .rows_rule import MIN_VECTOR, names_a_space_of_its_own, reduces, variables_of
from .softmax_rule import running_chains


def norm_schedule(mod: tvm.IRModule, lanes: int, cores: int) -> Schedule | None:
    """``mod`` as parallel rows, each reduced over vectors of up to ``lanes`` and written a vector at a time;
    None where it is not a kernel whose blocks, after inlining its element-wise ones, are reductions of the
    output's rows over their last axis followed by one element-wise output, where a block names a design
    space of its own, where its rows are too few to keep ``cores`` busy, or no vector of ``MIN_VECTOR`` or
    more lanes divides a row."""
    sch = Schedule(mod)
    try:
        root = sch.get_sblock("root")
        blocks = sch.get_child_blocks(root)
        if names_a_space_of_its_own(sch, blocks):
            return None
        reductions = [block for block in blocks if reduces(sch.get(block))]
        if not reductions or reduces(sch.get(blocks[-1])):
            return None
        for block in blocks[:-1]:
            if not reduces(sch.get(block)):
                sch.compute_inline(block)
        *reductions, output = sch.get_child_blocks(root)
    except ScheduleError:  # an opaque kernel, an element-wise block that cannot inline
        return None
    *outer, along = sch.get_loops(output)
    if not outer or not all(_reduces_the_row(sch, r, outer, along) for r in reductions):
        return None
    rows, row = math.prod(int(sch.get(loop).extent) for loop in outer), int(sch.get(along).extent)
    vector = copy_lanes([row], lanes)
    if rows < cores or vector < MIN_VECTOR:
        return None
    width = vector * running_chains(row, vector)  # the row is whole vectors: no scalar rest
    try:
        partials = [[_over_lanes(sch, reduction, width), *_pairwise(sch, reduction, width)] for reduction in reductions]
        row_loop = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        *producers, _ = sch.get_child_blocks(root)
        for block in reversed(producers):  # a block computed at the row after every block reading it
            sch.compute_at(block, row_loop, preserve_unit_loops=True)
        sch.parallel(row_loop)
        sch.vectorize(sch.split(sch.get_loops(output)[-1], [None, vector])[1])
        steps = []
        for partial in (block for chain in partials for block in chain):
            # at the row, a block's loops follow its variables: the lanes (rfactor's first) outermost
            _, lane, *_, over = sch.get_loops(partial)
            sch.reorder(over, lane)
            sch.vectorize(lane)
            steps.append((partial, over))
        # last: a reduction without its initialisation is no longer one that parallel and vectorize accept
        for partial, over in steps:  # the partial results zeroed before the row's vectors (or the pair's)
            sch.decompose_reduction(partial, over)
        for reduction in reductions:
            sch.decompose_reduction(reduction, sch.get_loops(reduction)[1])
    except ScheduleError:  # a reduction that another order or layout keeps out of the row
        return None
    return sch


def _reduces_the_row(sch: Schedule, block: SBlockRV, outer: list, along) -> bool:
    """Whether a reduction block's loops are the output's rows and one reduction loop as long as a row, its
    reduction reads along an input's last axis, and every block reading it reads it at its own row."""
    *spatial, last = sch.get_loops(block)
    stmt = sch.get(block)
    reduce_vars = [v.var.name for v in stmt.iter_vars if v.iter_type == tvm.tirx.IterVar.CommReduce]
    if len(reduce_vars) != 1 or len(spatial) != len(outer):
        return False
    extents = [int(sch.get(loop).extent) for loop in (*spatial, last)]
    if extents != [int(sch.get(loop).extent) for loop in (*outer, along)]:
        return False
    if not any(reduce_vars[0] in variables_of(read.region[-1].min) for read in stmt.reads):
        return False
    (written,) = stmt.writes
    return all(_reads_at_its_row(sch.get(reader), written.source) for reader in sch.get_consumers(block))


def _reads_at_its_row(block: tvm.tirx.Stmt, buffer: tvm.tirx.Buffer) -> bool:
    """Whether ``block`` reads ``buffer`` (a reduction's result) at its own row: indexed by its first
    data-parallel variables, in order."""
    rows = [v.var for v in block.iter_vars if v.iter_type == tvm.tirx.IterVar.DataPar]
    for read in block.reads:
        if read.source.same_as(buffer):
            indices = [r.min for r in read.region]
            if len(indices) > len(rows) or not all(i.same_as(v) for i, v in zip(indices, rows, strict=False)):
                return False
    return True


def _pairwise(sch: Schedule, reduction: SBlockRV, width: int) -> list[SBlockRV]:
    """``reduction`` over its ``width`` partial results taken pairwise: each step a block of half as many (the
    first half plus the second), the reduction left with two; log2(width) - 1 steps, where one running result
    waited out each add's latency in turn."""
    steps = []
    while width > 2:
        *_, loop = sch.get_loops(reduction)
        _, half = sch.split(loop, [2, width // 2])
        steps.append(sch.rfactor(half, factor_axis=len(sch.get(reduction).writes[0].source.shape)))
        width //= 2
    return steps


def _over_lanes(sch: Schedule, reduction: SBlockRV, vector: int) -> SBlockRV:
    """A reduction's loop over the row split into its vectors and their ``vector`` lanes, and factored over the
    lanes: the block of the partial results (returned), then ``reduction`` over those."""
    *_, loop = sch.get_loops(reduction)
    _, lane = sch.split(loop, [None, vector])
    return sch.rfactor(lane, factor_axis=len(sch.get(reduction).writes[0].source.shape))
