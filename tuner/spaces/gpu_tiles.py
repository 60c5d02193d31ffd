"""Fresh samples of MetaSchedule's GPU tiling drawn within the limits its GPU verifier enforces.

MetaSchedule's CUDA design space ("SSSRRSRS" multi-level tiling, its first three spatial levels bound to
blockIdx.x, vthread.x and threadIdx.x, or for tensor cores to blockIdx.y, blockIdx.x and threadIdx.y over
warps of 16x16 tiles; both inputs read through shared memory at the outer reduction loop) draws every
loop's tile factors at random, builds the schedule, lowers it and only then checks it (``VerifyGPUCode``).
Most draws fail that check: on sm_90, 93% of a 1024^3 matmul's, 96% of a ResNet-50 3x3 convolution's and
82% of an fp16 GEMM's on tensor cores, for a block of more than 1024 (or fewer than 32) threads or tiles
that need more than 48 KB of shared memory. Each failure costs as much as a success (the trace applied,
the kernel lowered), so a batch of 16 candidates took 2,600 draws and 6-10 s of the search on two cores.

``GpuTileDraw`` draws a tiled block's factors the way MetaSchedule does (each prime power of a loop's
extent spread uniformly over its levels, the innermost factor within the space's limit), all of the
block's loops at once, and draws again while the block's threads or its shared-memory tiles are out of
bounds; MetaSchedule draws everything else. The shared tiles are counted as the lowered kernel allocates
them: each cached input's region, its rows padded as the trace's ``StorageAlign`` says, times a software
pipeline's copies, and for tensor cores the accumulators staged in ``shared.dyn`` (one warp-level slice of
the first spatial axis by the warps' whole tile of the others, as the write-back walks them). Both checks
are necessary conditions of the verifier's (it also counts what these leave out: a conservative count
gives a lower bound), so the samples that pass are the ones MetaSchedule's own draws would have passed, in
the same proportions, and the verifier still has the last word. Blocks in other forms (the cross-thread
reductions, element-wise kernels) keep MetaSchedule's own draw.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm.s_tir import SBlockRealize
from tvm.sym import Analyzer, IntervalSet

from common.target_kind import is_cuda

from .register_tiles import TILING_ANNOTATION, prime_powers

# The bound levels of the tilings the draw knows, outermost first: SIMT's, and tensor cores' (threadIdx.y: warps)
GPU_BINDS = (("blockIdx.x", "vthread.x", "threadIdx.x"), ("blockIdx.y", "blockIdx.x", "threadIdx.y"))
BOUND_LEVELS = len(GPU_BINDS[0])
THREAD_LOW = "meta_schedule.thread_extent_low_inclusive"
THREAD_HIGH = "meta_schedule.thread_extent_high_inclusive"
PIPELINE_STAGES = "software_pipeline_stage"  # the stage of each statement under a pipelined loop
MAX_JOINT_DRAWS = 256  # draws of one block's tiles before leaving it to MetaSchedule (and the verifier)
WARP_EXECUTION = "warp_execution"  # a block whose every thread-level unit is a warp
DISABLE_ENV = "TENSOR_TUNER_GPU_TILES"  # "0": every fresh sample as MetaSchedule draws it, to compare


@dataclass(frozen=True)
class GpuLimits:
    max_threads: int  # per block
    max_shared_bytes: int  # per block
    warp: int = 32  # threads a warp-level tile (tensor cores) runs on


def gpu_limits(target: tvm.target.Target) -> GpuLimits | None:
    """What a CUDA target's blocks may use; None for other targets and where ``DISABLE_ENV`` is "0"."""
    if not is_cuda(target) or os.environ.get(DISABLE_ENV) == "0":
        return None
    attrs = target.attrs
    return GpuLimits(
        int(attrs["max_threads_per_block"]), int(attrs["max_shared_memory_per_block"]), int(attrs["thread_warp_size"])
    )


@dataclass(frozen=True)
class TiledBlock:
    """A block of a design space's trace tiled in one of the forms of ``GPU_BINDS``."""

    structure: str  # e.g. "SSSRRSRS"
    tiles: tuple[int, ...]  # its SamplePerfectTile instructions, in the order of its loops
    splits: tuple[tuple[int, int], ...]  # each one's (levels, largest innermost factor)
    binds: tuple[str, ...]  # what its first levels are bound to
    low: int  # fewest threads the block may have
    high: int  # most
    shared_reads: tuple[int, ...]  # its reads cached in shared memory (indices into the block's reads)
    buffered: int = 1  # copies of each shared tile a software pipeline keeps (its stages apart, plus one)
    warps: bool = False  # each thread-level unit is a warp (tensor cores)
    aligned: tuple[tuple[int, int, int, int], ...] = ()  # (read, axis, factor, offset) of its padded shared tiles
    staged: bool = False  # its output is staged in shared memory (tensor cores' accumulators, in shared.dyn)

    def is_spatial(self, tile: int) -> bool:
        return self.splits[tile][0] == self.structure.count("S")

    @property
    def thread_level(self) -> int:
        return next(level for level, bind in enumerate(self.binds) if bind.startswith("threadIdx"))

    @property
    def grid_levels(self) -> int:
        """Its outer spatial levels bound to blockIdx: a shared tile spans the levels inside them."""
        return sum(bind.startswith("blockIdx") for bind in self.binds)


@dataclass
class _BlockInTrace:
    """What the instructions after a block's tiling annotation have said about it so far."""

    block: object  # its SBlockRV (the outer block, once blockized for tensor cores)
    structure: str
    tiles: list[int] = field(default_factory=list)
    splits: list[tuple[int, int]] = field(default_factory=list)
    reordered: bool = False  # its loops are tiled: later SamplePerfectTiles are not its tiles
    binds: list[str] = field(default_factory=list)
    limits: dict[str, int] = field(default_factory=dict)
    buffered: int = 1
    warps: bool = False
    copies: list[tuple[object, int]] = field(default_factory=list)  # (the shared copy's block, its read)
    aligned: list[tuple[int, int, int, int]] = field(default_factory=list)
    staged: bool = False

    def read(self, index: int, inst) -> None:
        kind, attrs = inst.kind.name, inst.attrs
        annotation = str(attrs[0]) if kind == "Annotate" else None
        if kind == "Blockize" and not self.reordered:
            self.block = inst.outputs[0]  # tensor cores: the 16x16 tiles' block is the one tiled
        elif annotation == WARP_EXECUTION and not self.reordered:
            self.warps = True
        elif kind == "SamplePerfectTile" and not self.reordered:
            self.tiles.append(index)
            self.splits.append((int(attrs[0]), int(attrs[1])))
        elif kind == "Reorder" and self.tiles:
            self.reordered = True
        elif kind == "Bind":
            self.binds.append(str(attrs[0]))
        elif annotation in (THREAD_LOW, THREAD_HIGH) and inst.inputs[0].same_as(self.block):
            self.limits[annotation] = int(inst.inputs[1])
        elif annotation == PIPELINE_STAGES:
            stages = [int(stage) for stage in inst.inputs[1]]
            self.buffered = max(stages) - min(stages) + 1
        elif kind == "CacheRead" and str(attrs[1]) == "shared" and inst.inputs[0].same_as(self.block):
            self.copies.append((inst.outputs[0], int(attrs[0])))
        elif kind == "CacheWrite" and str(attrs[1]) == "shared.dyn" and inst.inputs[0].same_as(self.block):
            self.staged = True
        elif kind == "StorageAlign" and int(attrs[0]) == 0:  # the shared copy's rows padded (against bank conflicts)
            read = next((read for copy, read in self.copies if inst.inputs[0].same_as(copy)), None)
            if read is not None:
                self.aligned.append((read, int(attrs[1]), int(attrs[2]), int(attrs[3])))

    def tiled(self) -> TiledBlock | None:
        """The block, where its tiling is a form the draw knows."""
        binds = tuple(self.binds[:BOUND_LEVELS])
        if binds not in GPU_BINDS or not {THREAD_LOW, THREAD_HIGH} <= set(self.limits):
            return None
        return TiledBlock(
            self.structure,
            tuple(self.tiles),
            tuple(self.splits),
            binds,
            self.limits[THREAD_LOW],
            self.limits[THREAD_HIGH],
            tuple(read for _, read in self.copies),
            self.buffered,
            self.warps,
            tuple(self.aligned),
            self.staged,
        )


def tiled_blocks(insts: Sequence) -> list[TiledBlock]:
    """The blocks of a GPU design space's trace tiled in a form of ``GPU_BINDS`` (none where it has none)."""
    readings: list[_BlockInTrace | None] = []
    for index, inst in enumerate(insts):
        if inst.kind.name == "Annotate" and str(inst.attrs[0]) == TILING_ANNOTATION:
            structure = str(inst.inputs[1])
            bound_spatial = structure.startswith("S" * BOUND_LEVELS) and "R" in structure
            readings.append(_BlockInTrace(inst.inputs[0], structure) if bound_spatial else None)
        elif readings and readings[-1] is not None:
            readings[-1].read(index, inst)
    return [block for reading in readings if reading is not None and (block := reading.tiled()) is not None]


def perfect_tile(rng: np.random.Generator, extent: int, levels: int, max_innermost: int) -> list[int]:
    """``extent`` split into ``levels`` factors as MetaSchedule's SamplePerfectTile draws them: each prime
    power's exponent spread uniformly over the levels (stars and bars), drawn again while the innermost
    factor is over ``max_innermost`` (-1: no limit)."""
    powers = prime_powers(extent)
    while True:
        factors = [1] * levels
        for prime, power in powers:
            cuts = sorted(rng.choice(power + levels - 1, levels - 1, replace=False)) + [power + levels - 1]
            last = -1
            for level, cut in enumerate(cuts):
                factors[level] *= prime ** int(cut - last - 1)
                last = cut
        if max_innermost == -1 or factors[-1] <= max_innermost:
            return factors


class _Refused(Exception):
    """A mutated trace's tiles break a block's limits: stop applying it."""


class GpuTileDraw:
    """The decisions of one sample of a GPU design space, as a decision provider for
    ``Trace.apply_to_schedule`` (called for each instruction in order). At a tiled block's first tile, its
    loops' factors are drawn together until the block is within ``limits`` (a fresh sample), or, where the
    trace carries decisions (a mutant), those are checked and the trace refused if they are not."""

    def __init__(
        self,
        sch: tvm.s_tir.Schedule,
        blocks: list[TiledBlock],
        limits: GpuLimits,
        seed: int,
        decisions: dict[int, list[int]] | None = None,
    ):
        self.sch = sch
        self.first_tile = {block.tiles[0]: block for block in blocks}
        self.limits = limits
        self.rng = np.random.default_rng(seed)
        self.given = decisions or {}  # instruction index -> the trace's decision (a mutant's)
        self.planned: dict[int, list[int]] = {}
        self.position = 0

    def __call__(self, inst, inputs, attrs, decision):
        index = self.position
        self.position += 1
        block = self.first_tile.get(index)
        if block is not None:
            self._plan(block, inputs[0])
        return self.planned.pop(index, decision)

    def _plan(self, block: TiledBlock, first_loop) -> None:
        nest = _loop_nest(self.sch.get(first_loop), len(block.tiles))
        if nest is None:
            return  # not the loop nest the space was made from: MetaSchedule draws
        loops, realize = nest
        extents = [int(loop.extent) for loop in loops]
        footprint = _SharedFootprint(block, loops, realize)
        if all(index in self.given for index in block.tiles):
            tiles = [list(self.given[index]) for index in block.tiles]
            if not self._fits(block, tiles, footprint):
                raise _Refused
            return
        for _ in range(MAX_JOINT_DRAWS):
            tiles = [
                perfect_tile(self.rng, extent, levels, innermost)
                for extent, (levels, innermost) in zip(extents, block.splits, strict=True)
            ]
            if self._fits(block, tiles, footprint):
                self.planned.update(zip(block.tiles, tiles, strict=True))
                return

    def _fits(self, block: TiledBlock, tiles: list[list[int]], footprint: _SharedFootprint) -> bool:
        units = math.prod(tile[block.thread_level] for i, tile in enumerate(tiles) if block.is_spatial(i))
        threads = units * (self.limits.warp if block.warps else 1)
        if not block.low <= threads <= min(block.high, self.limits.max_threads):
            return False
        return footprint.bytes(tiles) <= self.limits.max_shared_bytes


def _loop_nest(loop, count: int):
    """The ``count`` loops from ``loop`` down, each the only statement of the one above, and the block
    they run; None where the nest is not that."""
    loops, stmt = [], loop
    while isinstance(stmt, tvm.tirx.For) and len(loops) < count:
        loops.append(stmt)
        stmt = stmt.body
    if len(loops) != count or not isinstance(stmt, SBlockRealize):
        return None
    if not all(isinstance(extent, tvm.tirx.IntImm) for extent in (loop.extent for loop in loops)):
        return None
    return loops, stmt


class _SharedFootprint:
    """Bytes of a block's shared-memory tiles for its tile factors: each cached read's region over the
    block's tile (every level inside the block's blockIdx and outer reduction loops), within the buffer, its
    rows padded as the trace aligns them; and where the block's output is staged in shared memory (tensor
    cores), the staged part: one warp-level slice of its first spatial axis by the warps' whole tile of the
    others (the write-back walks the first axis's inner levels one slice at a time)."""

    def __init__(self, block: TiledBlock, loops: list, realize):
        self.block = block
        by_loop_var = {loop.loop_var: position for position, loop in enumerate(loops)}
        self.axis_of: dict = {}  # block iter var -> its loop's position
        for iter_var, value in zip(realize.block.iter_vars, realize.iter_values, strict=True):
            if isinstance(value, tvm.tirx.Var) and value in by_loop_var:
                self.axis_of[iter_var.var] = by_loop_var[value]
        reads, writes = realize.block.reads, realize.block.writes
        self.regions = {read: reads[read] for read in block.shared_reads if read < len(reads)}
        self.padding = {read: (axis, factor, offset) for read, axis, factor, offset in block.aligned}
        self.staged = writes[0] if block.staged and len(writes) == 1 else None

    def bytes(self, tiles: list[list[int]]) -> int:
        block, analyzer = self.block, Analyzer()
        # a shared tile spans the levels inside the grid's (spatial) and inside the outer reduction loop
        inner = [math.prod(tile[block.grid_levels if block.is_spatial(i) else 1 :]) for i, tile in enumerate(tiles)]
        total = sum(
            block.buffered * _region_bytes(analyzer, region, self._domain(inner), self.padding.get(read))
            for read, region in self.regions.items()
        )
        if self.staged is not None:
            spatial = [i for i in range(len(tiles)) if block.is_spatial(i)]
            level = block.thread_level
            staged = [
                tiles[i][level] if i == spatial[0] else math.prod(tiles[i][level:]) if i in spatial else 1
                for i in range(len(tiles))
            ]
            total += _region_bytes(analyzer, self.staged, self._domain(staged), None)
        return total

    def _domain(self, extents: list[int]) -> dict:
        return {var: IntervalSet(0, extents[axis] - 1) for var, axis in self.axis_of.items()}


def _region_bytes(analyzer: Analyzer, region, domain: dict, padding: tuple[int, int, int] | None) -> int:
    """Bytes of ``region`` over ``domain``, within its buffer; with ``padding`` (axis, factor, offset), the
    stride of that axis raised to ``factor * k + offset`` as ``storage_align`` does."""
    spans = []
    for bound, size in zip(region.region, region.source.shape, strict=True):
        span = _span(analyzer, bound, domain)
        spans.append(1 if span is None else min(span, int(size)) if isinstance(size, tvm.tirx.IntImm) else span)
    elements = math.prod(spans)
    if padding is not None and spans:
        axis, factor, offset = padding
        axis %= len(spans)
        row = math.prod(spans[axis + 1 :])
        elements = math.prod(spans[: axis + 1]) * (row + (offset - row) % factor)
    return elements * tvm.DataType(str(region.source.dtype)).bits // 8


def _span(analyzer: Analyzer, bound, domain: dict) -> int | None:
    """Elements a region's dimension spans over ``domain``; None where that has no constant bound (the
    dimension then counts as one element, which keeps the footprint a lower bound)."""
    low = analyzer.int_set(bound.min, domain).min_value
    high = analyzer.int_set(bound.min + bound.extent - 1, domain).max_value
    try:
        span = analyzer.simplify(high - low + 1)
    except (TypeError, ValueError, RuntimeError):  # an infinite bound
        return None
    return int(span) if isinstance(span, tvm.tirx.IntImm) else None


def checking(trace, limits: GpuLimits | None, seed: int):
    """For ``replay(..., decide=...)``: a provider that stops applying ``trace`` (a mutant's) as soon as its
    tiles put a block out of ``limits``, before the schedule is finished and lowered; None where there is
    nothing to check."""
    blocks = tiled_blocks(trace.insts) if limits is not None else []
    if not blocks:
        return None
    decisions = {
        index: [int(factor) for factor in trace.decisions[inst]]
        for index, inst in enumerate(trace.insts)
        if inst.kind.name == "SamplePerfectTile" and inst in trace.decisions
    }
    return lambda sch: GpuTileDraw(sch, blocks, limits, seed, decisions)
