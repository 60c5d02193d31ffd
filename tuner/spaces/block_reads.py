"""What a kernel's blocks are and read of one another: the facts the analytic draw places a producer by (a
grouped reader, a view, an index through a remainder) and the planner sizes its parallel tasks by (what they
copy before computing). Read from the blocks' iteration variables and access regions; nothing is scheduled."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import ScheduleError
from tvm.sym import Analyzer

from .bf16_rule import is_one
from .rows_rule import variables_of


def read_by_groups(sch: Schedule, block_rv) -> bool:
    """Whether a reader reduces over the block's channels a group at a time: the channel it reads is its
    reduction's beside an output's (``g * 64 + c``), as in a grouped convolution. Such a convolution does a
    group's FLOPs per channel read, so its pad, a pass of its own at the root, is a large part of its time
    (RegNet's strided 3x3 convolutions over 64-channel groups: 16-20% alone, unpadded inputs against padded)."""
    return any(
        names - reduced and not names - reduced - others for names, reduced, others in reduced_axes(sch, block_rv)
    )


def consumer_reads(sch: Schedule, block_rv) -> Iterator[tuple[tvm.tirx.Stmt, tvm.tirx.BufferRegion]]:
    """(reader, region) for each region a consumer of the block reads of what the block writes."""
    written = [region.source for region in sch.get(block_rv).writes]
    for consumer in sch.get_consumers(block_rv):
        block = sch.get(consumer)
        for region in block.reads:
            if any(region.source.same_as(buffer) for buffer in written):
                yield block, region


def read_strided(sch: Schedule, block_rv) -> bool:
    """Whether a reader steps through the block's output more than one element an output point along some axis
    (a strided convolution's ``y * 2 + ry``): it reads a larger image, for as much arithmetic, than its output."""
    return any(
        any(_scaled(axis.min, _spatial_names(reader)) for axis in region.region)
        for reader, region in consumer_reads(sch, block_rv)
    )


def _spatial_names(block: tvm.tirx.Stmt) -> set[str]:
    return {v.var.name for v in block.iter_vars if v.iter_type == tvm.tirx.IterVar.DataPar}


def _scaled(index: tvm.tirx.PrimExpr, names: set[str]) -> bool:
    """Whether ``index`` multiplies one of the variables ``names`` by a constant above 1."""
    if isinstance(index, tvm.tirx.Mul):
        for var, factor in ((index.a, index.b), (index.b, index.a)):
            if isinstance(var, tvm.tirx.Var) and var.name in names and isinstance(factor, tvm.tirx.IntImm):
                return int(factor) > 1
    return any(_scaled(getattr(index, operand), names) for operand in ("a", "b") if hasattr(index, operand))


def copied_by_tasks(mod: tvm.IRModule) -> int:
    """Bytes of what the kernel's parallel tasks copy before they compute: the pads its grouped convolutions
    read by groups (``AnalyticDraw``: each task pads its part of the image), 0 where there are none. A strided
    one's pad counts too where ``AnalyticDraw`` inlines it after the plan (under a short register tile): the
    tasks are sized as they were measured."""
    sch = Schedule(mod)
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except ScheduleError:  # an extern kernel: one opaque block
        return 0
    copied = 0
    for block_rv in blocks:
        if sch.get_consumers(block_rv) and read_by_groups(sch, block_rv):
            copied += sum(tensor_bytes(region.source) for region in sch.get(block_rv).writes)
    return copied


def tensor_bytes(tensor) -> int:
    """Bytes of a buffer or tensor of static shape."""
    return math.prod(int(extent) for extent in tensor.shape) * tvm.DataType(str(tensor.dtype)).bits // 8


def reduced_axes(sch: Schedule, block_rv):
    """(variables, reduced variables, variables of the other operands) of each axis along which a reader
    of the block reduces over what it reads of it."""
    written = [region.source for region in sch.get(block_rv).writes]
    for consumer in sch.get_consumers(block_rv):
        block = sch.get(consumer)
        reductions = [v for v in block.iter_vars if v.iter_type != tvm.tirx.IterVar.DataPar]
        reduced = {v.var.name for v in reductions if not is_one(v.dom.extent)}
        ours, others = [], set()
        for region in block.reads:
            if any(region.source.same_as(buffer) for buffer in written):
                ours.append(region)
            else:
                others |= set().union(*(variables_of(axis.min) for axis in region.region))
        for region in ours:
            for axis in region.region:
                names = variables_of(axis.min)
                if names & reduced:
                    yield names, reduced, others


def is_view(block: tvm.tirx.Stmt) -> bool:
    """Whether a block copies an input element to the same flat offset and keeps its innermost axis (rows
    merged or split, an expand_dims): nothing computed, nothing tested, a reader's vectors read as they lie,
    so inlined into its reader it costs nothing. A reshape across the innermost axis (6x10 read as 4x15)
    would leave a division in the reader's vectorised loop."""
    store = block.body
    if not isinstance(store, tvm.tirx.BufferStore) or not isinstance(store.value, tvm.ir.expr.TensorLoad):
        return False
    load = store.value
    source = load.source
    if not store.indices or not load.indices or not store.indices[-1].same_as(load.indices[-1]):
        return False
    analyzer = Analyzer()
    if not analyzer.can_prove_equal(store.buffer.shape[-1], source.shape[-1]):
        return False
    for v in block.iter_vars:
        analyzer.bind(v.var, tvm.ir.Range.from_min_extent(v.dom.min, v.dom.extent))
    return analyzer.can_prove_equal(_flat(store.buffer.shape, store.indices), _flat(source.shape, load.indices))


def _flat(shape: Sequence[tvm.tirx.PrimExpr], indices: Sequence[tvm.tirx.PrimExpr]) -> tvm.tirx.PrimExpr:
    offset = tvm.tirx.const(0, "int64")
    for extent, index in zip(shape, indices, strict=True):
        offset = offset * extent + index
    return offset


def wraps(index: tvm.tirx.PrimExpr) -> bool:
    """Whether an index expression takes a remainder anywhere in it."""
    if isinstance(index, (tvm.tirx.FloorMod, tvm.tirx.Mod)):
        return True
    return any(wraps(getattr(index, operand)) for operand in ("a", "b") if hasattr(index, operand))


def block_points(block: tvm.tirx.Stmt, kind: int) -> int:
    """The points a block's variables of ``kind`` (spatial, reduction) span; a dynamic extent counts as huge."""
    extents = [v.dom.extent for v in block.iter_vars if v.iter_type == kind]
    return math.prod(int(e) if isinstance(e, tvm.tirx.IntImm) else 1 << 30 for e in extents)
