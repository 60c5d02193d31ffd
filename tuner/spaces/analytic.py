"""Analytic configuration (AutoConfig's idea): one deterministic schedule per kernel, derived from its
loop extents and the machine's facts, with nothing measured.

MetaSchedule's CPU design space tiles a product (a matmul, a convolution: any block MultiLevelTiling
takes) as ``SSRSRS``: each spatial loop split in four (S0 S1 S2 S3), each reduction loop in two (R0 R1),
nested S0 S1 R0 S2 R1 S3. The configuration sets every factor (``block_plan``: the register tile, the reduction
run, the parallel tasks and the block of tiles, from the registers and the caches), and:

- **Unroll**: ``UNROLL_STEPS`` (the register tile unrolled, the reduction run kept a loop).
- **A tiled product's input producers** (a convolution's pad) are computed at the root: inlined, their
  bounds test sits in the innermost loop (ResNet-18's 7x7 3x3 convolutions 1.6x slower); inside the tiles,
  each tile recomputes its halo. A grouped convolution's pad is computed inside its parallel tasks, each
  task padding the part of the image it reads: it does a group's FLOPs per channel read, so its pad at the
  root was a large part of its time (RegNet's five grouped convolutions alone 1-24% faster, on a 2-core Xeon).
  A strided one's under a register tile of at most ``MAX_INLINED_PAD_ROWS`` rows is inlined instead: it reads an
  image four times its output for as much arithmetic, and the copy took a tenth of RegNet's first one (a
  sampled profile, Emerald Rapids).
  In the model, inlined: RegNet's 4-row and 7-row tiles 3-8% faster (the first 1,700 -> 1,580 us), its 14-row
  one 7% slower (alone, all four within 2% either way).
  A reshape that moves nothing (the same flat offset: MobileViT's 4x256x144 patches read as 1024x144 rows) is
  inlined: at the root it is a copy of the whole input and a parallel launch of its own (MobileViT-S's
  1024x144x144 product 249 -> 185 us alone, on a 2-core Xeon).
  A depthwise convolution's pad is inlined: with no reduction over the
  channels its test is one per vector of channels, and at the root its copy is a pass of its own that
  MetaSchedule leaves unvectorised over more than 64 channels (MobileNetV2's depthwise kernels 538 -> 303 us,
  ConvNeXt's 494 -> 399, EfficientNet's 1,099 -> 836, in fp32 on a 2-core Xeon).

MobileNet's fused inverted residual (our ``tuner_expand_depthwise`` space) takes its tiles from the register
file (``schedule_rules.ExpandDepthwiseDraw``). A copy across axes (a transpose, fused with what scales and pads
it) takes parallel rows of vectors (``rows_rule``), which MetaSchedule's design space cannot express. A kernel
of another design space (element-wise, reductions, our other rules) takes its design space's decisions as
MetaSchedule draws them with a fixed seed: the same schedule every time. Where the design spaces differ only in
where the write cache goes, the first one that applies is taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import ScheduleError, Trace

from common.error_text import error_line

from . import metaschedule as msc
from .bf16_rule import space_accumulators, space_unit
from .block_plan import COLUMN_VECTORS_ATTR, BlockPlan, TiledLoop, plan_block
from .block_reads import (
    block_points,
    consumer_reads,
    copied_by_tasks,
    is_view,
    read_by_groups,
    read_strided,
    reduced_axes,
    wraps,
)
from .column_rule import column_schedule
from .machine import MachineFacts
from .norm_rule import norm_schedule
from .pool_rule import max_pool_schedule
from .register_tiles import TILING_ANNOTATION, RegisterFile, tile_roles
from .rows_rule import reduces, rows_schedule
from .schedule_rules import ExpandDepthwiseDraw, is_expand_depthwise

UNROLL_STEPS = 64
ANALYTIC_SEED = 1
ROOT = -1  # SampleComputeLocation's decision for the root
INLINED = -2
MAX_INLINED_PAD_ROWS = 8  # a strided grouped convolution's pad is inlined under a register tile this tall or less


def tiled_blocks(mod: tvm.IRModule, space: Schedule) -> list[list[TiledLoop]]:
    """The CPU-tiled blocks of a design space, each as the loops it splits, with their extents."""
    insts = list(space.trace.insts)
    roles = tile_roles(insts)
    extents: dict[int, int] = {}

    def record(sch: Schedule):
        position = iter(range(len(insts)))

        def provide(inst, inputs, attrs, decision):
            index = next(position)
            if roles[index] in ("spatial", "vector", "reduction"):
                extent = sch.get(inputs[0]).extent
                if isinstance(extent, tvm.tirx.IntImm):
                    extents[index] = int(extent)
            return decision

        return provide

    msc.replay(mod, Trace(insts, {}), ANALYTIC_SEED, [], decide=record)
    blocks: list[list[TiledLoop]] = []
    previous = None
    for index, (inst, role) in enumerate(zip(insts, roles, strict=True)):
        if role not in ("spatial", "vector", "reduction"):
            continue
        if index not in extents:  # a symbolic extent: no plan for this block
            return []
        if not blocks or (previous == "reduction" and role != "reduction"):
            blocks.append([])
        blocks[-1].append(TiledLoop(index, role, extents[index], int(inst.attrs[0]), int(inst.attrs[1])))
        previous = role
    return blocks


class AnalyticDraw:
    """A decision provider for ``Trace.apply_to_schedule`` on ``sch``: the plan's factors for the tiled
    loops, the unroll limit ``UNROLL_STEPS``, a product's input producers (a pad) computed at the root, and
    the schedule's own (seeded) draw for everything else."""

    def __init__(
        self,
        plans: Sequence[BlockPlan],
        roles: Sequence[str | None],
        sch: Schedule,
        rule: ExpandDepthwiseDraw | None = None,
    ):
        self.factors = {index: f for plan in plans for index, f in plan.factors.items()}
        self.tile_rows = max((plan.tile_rows for plan in plans), default=1)
        self.roles = roles
        self.sch = sch
        self.rule = rule  # our own design space's decisions, where the kernel is one it configures
        self.position = 0

    def __call__(self, inst, inputs, attrs, decision):
        index = self.position
        self.position += 1
        if index in self.factors:
            return self.factors[index]
        if self.rule is not None and inst.kind.name == "SamplePerfectTile":
            return self.rule.perfect_tile(int(self.sch.get(inputs[0]).extent), int(attrs[1]))
        if self.rule is not None and inst.kind.name == "SampleCategorical":
            return self.rule.pixels([int(c) for c in attrs[0]])
        if self.roles[index] == "unroll":
            limits = [int(limit) for limit in attrs[0]]
            return max(range(len(limits)), key=lambda i: (limits[i] <= UNROLL_STEPS, limits[i]))
        if inst.kind.name == "SampleComputeLocation" and self._feeds_a_tiled_product(inputs[0]):
            if read_by_groups(self.sch, inputs[0]):
                if self.tile_rows <= MAX_INLINED_PAD_ROWS and read_strided(self.sch, inputs[0]):
                    return INLINED
                return self._in_parallel_tasks(inputs[0])
            if is_view(self.sch.get(inputs[0])):
                return INLINED
            return ROOT if self._reduced_over_channels(inputs[0]) else INLINED
        if inst.kind.name == "SampleComputeLocation" and (
            self._read_broadcast(inputs[0]) or self._read_through_remainder(inputs[0])
        ):
            return ROOT
        return None

    def _reduced_over_channels(self, block_rv) -> bool:
        """Whether a reader of the block reduces over what it reads of it beyond a window: a reduction along
        an axis of its own, or beside outputs that index its other operands too (a matmul's, a convolution's
        channels, a grouped one's); a depthwise convolution's reductions all run beside the image positions."""
        return any(not names - reduced - others for names, reduced, others in reduced_axes(self.sch, block_rv))

    def _in_parallel_tasks(self, block_rv) -> int:
        """The location inside the tiled reader's parallel tasks (under its last S0 loop): each task pads the
        part of the image it reads, while that part is in its cache. TVM takes the innermost loop of more than
        one iteration at or above it (or the root, if there is none). Not inside S1: a column tile narrower
        than a group there pads its group's channels at a dynamic offset, which MetaSchedule rejects
        (DisallowDynamicLoop: RegNet's 17 groups over 2 tasks went unscheduled, 38 ms for 0.3), and tiles of
        one group pad it again each."""
        readers = [self.sch.get(c) for c in self.sch.get_consumers(block_rv)]
        reader = next(block for block in readers if TILING_ANNOTATION in block.annotations)
        spatial = sum(v.iter_type == tvm.tirx.IterVar.DataPar for v in reader.iter_vars)
        return spatial - 1

    def _read_through_remainder(self, block_rv) -> bool:
        """Whether a consumer reads the block's output at indices that take a remainder (a flat offset
        unravelled, as TVM's reshape leaves one it cannot simplify: ``(c * 49 + x // 96 + h) % 196``): TVM
        cannot bound the region a loop of the consumer reads through it, so computed at one of its loops the
        block would be computed whole once per iteration (Hiera's query pooling copied its 1.8 MB input 392
        times: 2.0 ms for a 21 us kernel)."""
        return any(any(wraps(r.min) for r in region.region) for _, region in consumer_reads(self.sch, block_rv))

    def _read_broadcast(self, block_rv) -> bool:
        """Whether a reduction's result is read by a block of more points (a row's sum by each of the row's
        elements): computed inside that block's loops, the reduction would be done again for every point of
        the axes it is broadcast along (T5's RMS norm summed its row once per column, 512 times: 2.7 ms for
        an 8 us kernel; ConvNeXtV2's response norm averaged its channels once per element). So is a block that
        reads a reduction's result, and one read through blocks of its own points (Llama-3-8B's RMS norm, its
        sum split in two, the second half and the rsqrt after it: 16.8 ms for a 95 us kernel)."""
        block = self.sch.get(block_rv)
        producers = self.sch.get_producers(block_rv)
        if not (reduces(block) or any(reduces(self.sch.get(p)) for p in producers)):
            return False
        return self._broadcast_below(block_rv, block_points(block, tvm.tirx.IterVar.DataPar))

    def _broadcast_below(self, block_rv, points: int) -> bool:
        """Whether a consumer of the block, or of its consumers of ``points`` points, has more points."""
        for consumer in self.sch.get_consumers(block_rv):
            consumer_points = block_points(self.sch.get(consumer), tvm.tirx.IterVar.DataPar)
            if consumer_points > points or (consumer_points == points and self._broadcast_below(consumer, points)):
                return True
        return False

    def _feeds_a_tiled_product(self, block_rv) -> bool:
        """Whether a block is read by a product this schedule tiles (a convolution's pad: see the module's
        docstring). Not a Winograd transform's input gather: at the root, a pass of its own (2x slower)."""
        return any(TILING_ANNOTATION in self.sch.get(c).annotations for c in self.sch.get_consumers(block_rv))


@dataclass(frozen=True)
class AnalyticSchedule:
    sch: Schedule
    plans: tuple[BlockPlan, ...]  # of its CPU-tiled blocks (none for other kernels)

    @property
    def bf16_unit(self) -> str | None:
        """The unit (``AVX512``, ``AMX``) whose tiles of our bf16 rule compute its product; None for another kernel."""
        return space_unit(self.sch)

    @property
    def product(self) -> bool:
        """Whether it is a product with a tile of its own: a register tile and cache blocks, or our bf16 rule's."""
        return bool(self.plans) or self.bf16_unit is not None


def analytic_schedule(
    mod: tvm.IRModule, spaces: Sequence[Schedule], postprocs: Sequence, facts: MachineFacts | None
) -> AnalyticSchedule | None:
    """The kernel's analytic schedule in the first of its design spaces that takes it, postprocessed;
    None where none does. Spaces whose epilogue (or write cache) is computed deepest inside the tiles come
    first: written while its block is still in cache, not in a pass of its own over the whole output."""
    ordered = by_fusion(mod, spaces)
    for space in ordered:
        configured = configure_in(mod, space, postprocs, facts)
        if configured is not None:
            return configured
    return drawn_schedule(mod, ordered, postprocs, facts)


def drawn_schedule(
    mod: tvm.IRModule, spaces: Sequence[Schedule], postprocs: Sequence, facts: MachineFacts | None
) -> AnalyticSchedule | None:
    """Where every space rejects the plans: the seeded draw of the first space that gives one, its register
    tile filling the registers, with no plan (predicted as an untiled kernel). TVM's default schedule of a
    product is 26-680x slower: RegNet's last grouped convolution, its plans rejected (``DisallowDynamicLoop``)
    until its pad moved out of S1, ran 38 ms for 0.3."""
    registers = facts.registers if facts is not None else None
    for space in spaces:
        sch = msc.sample(mod, space, ANALYTIC_SEED, postprocs, registers)
        if sch is not None:
            return AnalyticSchedule(sch, ())
    return None


def configure_in(
    mod: tvm.IRModule, space: Schedule, postprocs: Sequence, facts: MachineFacts | None
) -> AnalyticSchedule | None:
    """The analytic schedule of ``mod`` in one design space; None where the space does not take it."""
    plans = ()
    if facts is not None:
        columns = column_vectors(mod)
        packed = msc.packs_weights(mod)
        copied = copied_by_tasks(mod)
        plans = tuple(plan_block(block, facts, columns, packed, copied) for block in tiled_blocks(mod, space))
    ours = facts is not None and is_expand_depthwise(mod)  # our own space, configured from the registers
    sch = replay_plans(mod, space, plans, postprocs, facts.registers if ours else None)
    return AnalyticSchedule(sch, plans) if sch is not None else None


def column_vectors(mod: tvm.IRModule) -> int:
    """The ``COLUMN_VECTORS_ATTR`` a block of the kernel is annotated with; 1 where none is."""
    sch = Schedule(mod)
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except ScheduleError:  # an extern kernel: one opaque block
        return 1
    annotated = [sch.get(block).annotations.get(COLUMN_VECTORS_ATTR) for block in blocks]
    return max((int(value) for value in annotated if value is not None), default=1)


def replay_plans(
    mod: tvm.IRModule,
    space: Schedule,
    plans: Sequence[BlockPlan],
    postprocs: Sequence,
    rule_registers: RegisterFile | None = None,
) -> Schedule | None:
    """``space`` replayed on ``mod`` with the plans' factors (``AnalyticDraw``), postprocessed; with
    ``rule_registers``, our expand-depthwise space's samples decided for that register file."""
    insts = list(space.trace.insts)
    roles = tile_roles(insts)

    def draw(sch: Schedule) -> AnalyticDraw:
        rule = ExpandDepthwiseDraw(rule_registers) if rule_registers is not None else None
        return AnalyticDraw(plans, roles, sch, rule)

    return msc.replay(mod, Trace(insts, {}), ANALYTIC_SEED, postprocs, decide=draw)


def by_fusion(mod: tvm.IRModule, spaces: Sequence[Schedule]) -> list[Schedule]:
    """The design spaces, the one whose epilogue is computed deepest inside the tiles first; the shallowest
    first where an epilogue writes more than the product computes (a pad after a convolution): TVM 0.27
    computes such an epilogue at the product's tiles over the product's region only, leaving the rest of
    its output unwritten (ConvThenPad in tests/test_never_wrong.py). Among spaces of one depth, a bf16
    product's with the most accumulators first: MetaSchedule hands the rule's spaces back in reverse, and
    ResNet's bf16 convolutions took 1x2 and 1x4 tiles, 1.4-9x slower than the 7x2 and 4x4 a few trials found
    (experiments/README.md, "Fast from the first minute")."""
    by_tile = sorted(spaces, key=space_accumulators, reverse=True)
    return sorted(by_tile, key=_fusion_depth, reverse=_epilogues_within_product(mod))


def _epilogues_within_product(mod: tvm.IRModule) -> bool:
    """Whether every consumer of a product (a block with a reduction) spans no more points than the
    product's spatial loops."""
    sch = Schedule(mod)
    spatial, reduction = tvm.tirx.IterVar.DataPar, tvm.tirx.IterVar.CommReduce
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except ScheduleError:  # no block named root (an extern kernel, one opaque block): no product either
        return True
    for block_rv in blocks:
        block = sch.get(block_rv)
        if block_points(block, reduction) == 1:
            continue
        if any(
            block_points(sch.get(consumer), spatial) > block_points(block, spatial)
            for consumer in sch.get_consumers(block_rv)
        ):
            return False
    return True


def _fusion_depth(space: Schedule) -> int:
    """How deep in its tiles a design space computes its epilogue or write cache: the level of the split
    loop it is computed at (0: S0); -1 where it computes none inside them."""
    insts = list(space.trace.insts)
    level = {}
    for inst in insts:
        if inst.kind.name == "Split":
            for position, loop in enumerate(inst.outputs):
                level[loop] = position
    return max((level.get(inst.inputs[1], -1) for inst in insts if inst.kind.name == "ReverseComputeAt"), default=-1)


class Configuration(NamedTuple):
    """A kernel's analytic schedule, or on a CPU target why it has none (it keeps TVM's default schedule)."""

    schedule: AnalyticSchedule | None
    missing: str | None = None


def configure_kernel(mod: tvm.IRModule, target: tvm.target.Target) -> AnalyticSchedule | None:
    """The analytic schedule of a kernel on a CPU target; None on other targets (a GPU's kernels without
    a tuned schedule take TVM's rule-based ones) and where MetaSchedule makes no design space of it: it
    keeps TVM's default schedule then."""
    return configuration(mod, target).schedule


def configuration(mod: tvm.IRModule, target: tvm.target.Target) -> Configuration:
    """``configure_kernel``, saying why a CPU kernel has no analytic schedule."""
    if target.kind.name != "llvm":
        return Configuration(None)
    facts = MachineFacts.of(target)
    ruled = rule_schedule(mod, facts)  # before the design spaces, which such a kernel does not need
    if ruled is not None:
        return Configuration(ruled)
    try:
        context = msc.make_context(mod, target, ANALYTIC_SEED)
        spaces = msc.design_spaces(context)
    except RuntimeError as err:  # MetaSchedule refused the kernel or the target (one without num-cores, say)
        return Configuration(None, f"MetaSchedule makes no design space of it ({error_line(err)})")
    configured = analytic_schedule(mod, spaces, msc.postprocessors(context), facts)
    if configured is None:
        return Configuration(None, f"TVM's postprocessors reject every schedule of its {len(spaces)} design space(s)")
    return Configuration(configured)


def rule_schedule(mod: tvm.IRModule, facts: MachineFacts | None) -> AnalyticSchedule | None:
    """The schedule of one of our own rules (``rows_rule``, ``norm_rule``, ``column_rule``, ``pool_rule``) where
    one takes the kernel: a schedule MetaSchedule's design space cannot express, or its seeded draw does not find,
    so its search does not start from it by itself."""
    for rule in (rows_schedule, norm_schedule, column_schedule, max_pool_schedule) if facts is not None else ():
        ruled = rule(mod, facts.registers.lanes, facts.cores)
        if ruled is not None:
            return AnalyticSchedule(ruled, ())
    return None
