"""The factors of a CPU-tiled block, from its loop extents and the machine's facts: the planning half of the
analytic configuration (``analytic``).

MetaSchedule's CPU design space tiles a product (a matmul, a convolution: any block MultiLevelTiling
takes) as ``SSRSRS``: each spatial loop split in four (S0 S1 S2 S3), each reduction loop in two (R0 R1),
nested S0 S1 R0 S2 R1 S3. The plan sets every factor, BLIS's way (Low et al., TOMS 2016):

- **S3, the register tile**: the last spatial loop (the one vectorised) in ``nv`` vectors of the
  register's lanes, the innermost other spatial loop in ``mr`` rows: ``mr x nv`` accumulators. As many
  as the registers hold beside a step's operands (``RegisterFile.fits``: one register left for each of a
  step's weight vectors and one for the broadcast: AVX2's 3x4 tile would need 17 and spill), up to what
  keeps the FMA ports busy with a margin (12 on AVX-512), and of those tiles the one with the most FMAs per
  load (``mr x nv`` over ``mr + nv``: each step loads ``nv`` weight vectors and broadcasts ``mr`` inputs).
  Rows of 13 or 14 positions tile as 13 x 2 and 14 x 2 (26 and 28 accumulators, 29 and 31 registers):
  7-15% faster than the 13 x 1 and 7 x 2 tiles of the random draws' bound (``max_accumulators``, 24),
  measured alone on a 2-core Xeon (SqueezeNet's 13 x 13 classifier, RegNet's 14 x 14 products). ``nv`` is
  1, 2 or 4:
  LLVM makes slow code of a vector loop three registers wide (BERT's 3072-wide products at 4 GFLOP/s with
  48 columns, 104 with 64).
  A loop that offers no such factors takes the nearest it has (197 rows: 1).
- **R1, the reduction run** between loading the accumulators and storing them: as long as the weights
  it reads (R1 steps of ``nv`` vectors) fit in half of L1, at most MetaSchedule's innermost limit (64);
  the innermost reduction loop first (a convolution's input channels), then the window's.
- **S0, the parallel tasks**: as many as the cores divide evenly, at least one per core, split where the
  least is read (a task over rows reads all the weights, one over columns all the inputs: a late
  convolution's 9 MB of weights go by output channels, an early one's image by rows), then nearest
  ``TASKS_PER_CORE`` per core; where those tie, rows before columns and the outermost row loops first. Each
  core then writes a contiguous range of the output, as a fused element-wise kernel does (a parallel loop hands
  each thread a contiguous range), and the next kernel finds its share in its own core's L2. Split by its rows'
  halves and column quarters, the attention block's QK^T product wrote every head's scores from both cores and
  the softmax after it, split by heads, read half of them from the other core (a 2-core Emerald Rapids: 99 us
  in the model against 38 alone); by heads first, the model ran 0.90 of its time, MobileNetV2 0.92, RegNet 0.95.
  Where the tasks copy an input before they compute (a grouped convolution's pad, each task padding its band of
  the image: ``block_reads.copied_by_tasks``), enough tasks come first that a task's share fits in half of L2:
  RegNet's first strided convolution wrote 1.7 MB of pad in each of 4 tasks, then read it back past a 2 MiB L2;
  in 8 tasks it ran in 0.85-0.88 of its time alone (2-core Emerald Rapids).
- **S2, the block of tiles one reduction run covers** (inside a task), in BLIS's order: rows while their
  inputs of one run and their outputs (kept across the runs by MetaSchedule's write cache) fit in a quarter
  of L2 and their inputs over the whole reduction, read again for every column tile, in half of it; weight
  columns only where that leaves a single row tile, while their run fits in half of L2; S1 takes the rest.
  With the columns inside the rows, a block's weights (48 KB for the calibration's product) went through L1
  once per row tile; with one column tile, its weights serve every row of the block while in L1 (alone on a
  2-core Xeon: the calibration's product 299 -> 317 GFLOP/s; BERT-base whole 92.0 -> 84.5 ms; RegNet,
  ResNet-18, SqueezeNet unchanged within 1%). Only where the schedule packs the weights (a model's constant
  weights): a run of a matmul's weights as given is R1 rows N floats apart, which a power-of-two N puts in
  the same L1 sets; there the columns stay inside the rows (matmul-1024 15%, Llama-2's 32 x 4096 x 4096 30%
  slower in BLIS's order). Where one run
  covers the whole reduction (R0 all 1: a convolution's stem, 1x1 convolutions over 64 channels or fewer,
  depthwise windows, Winograd's batched products), S1 takes it all: a block would only hold each tile's
  results back from its epilogue, which MetaSchedule computes after S1 (on a 2-core Xeon, alone:
  SqueezeNet's products 1,326 -> 1,086 us a model, RegNet's 843 -> 573, EfficientNet's 1,445 -> 1,223,
  MobileNetV2's 839 -> 745, ResNet-18's 2,970 -> 2,728). Where a task's weights exceed its share of L3, S1's
  blocks of rows would each stream them from memory again: all the task's rows go in the block instead, while
  their inputs fit in half of that share (Llama-3-8B's FFN products, 235 MB of weights each: 43-78% -> 79-91% of
  the FMA peak on a 2-core Zen 4; no kernel of 12 other models changes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .machine import MachineFacts
from .register_tiles import divisors, power_of_two

FLOAT_BYTES = 4
TASKS_PER_CORE = 4  # parallel tasks per core where the loops allow: a slow core costs a quarter of a task
MAX_JOBS_PER_CORE = 16  # MetaSchedule's limit on the parallel loop's extent, per core
MAX_WINDOW = 7  # a reduction loop this short is a convolution's window: its inputs are re-read from cache
# A block annotation: the spatial loop just outside the rows holds this many more vectors of weights (columns)
# that share a step's broadcasts (``lowering.grouped_conv1d``'s output channels of a group), all in the tile.
COLUMN_VECTORS_ATTR = "tuner.column_vectors"


@dataclass(frozen=True)
class TiledLoop:
    """One loop of a CPU-tiled block, as its design space splits it."""

    index: int  # of its SamplePerfectTile instruction in the trace
    role: str  # "spatial", "vector" (the block's last spatial loop) or "reduction"
    extent: int
    levels: int  # factors it is split into
    max_innermost: int


@dataclass(frozen=True)
class BlockPlan:
    """The configuration of one CPU-tiled block: each loop's factors, outermost level first."""

    factors: dict[int, list[int]]  # by instruction index
    accumulators: int  # of the register tile
    reduction_run: int  # R1 steps
    tasks: int  # parallel tasks S0 makes
    loops: tuple[TiledLoop, ...] = ()

    @property
    def row_loop(self) -> TiledLoop | None:
        """The loop of the register tile's rows: the innermost spatial loop of more than one iteration outside the
        vectorised one (None where there is none)."""
        rows = [loop for loop in self.loops if loop.role == "spatial" and loop.extent > 1]
        return rows[-1] if rows else None

    @property
    def tile_rows(self) -> int:
        """Rows of the register tile (1 where there is no row loop)."""
        row = self.row_loop
        return self.factors[row.index][-1] if row is not None else 1


def plan_block(
    loops: Sequence[TiledLoop],
    facts: MachineFacts,
    column_vectors: int = 1,
    packed_weights: bool = True,
    copied_by_tasks: int = 0,
) -> BlockPlan:
    """The factors of every loop of a CPU-tiled block (see the module's docstring); with ``column_vectors``
    (``COLUMN_VECTORS_ATTR``), the spatial loop outside the rows whole in the register tile; ``packed_weights``:
    whether the schedule lays the weights out in the tile's order (a model's constant weights, its
    ``layout_free_buffers``), so that a column tile's run of them is one contiguous piece; ``copied_by_tasks``:
    the bytes of an input the parallel tasks copy among them before they compute (a grouped convolution's pad,
    each task padding its part of the image)."""
    spatial = [loop for loop in loops if loop.role != "reduction"]
    reductions = [loop for loop in loops if loop.role == "reduction"]
    vector = spatial[-1]
    columns = spatial[-3] if column_vectors > 1 and len(spatial) >= 3 else None
    if columns is not None and columns.extent != column_vectors:
        columns, column_vectors = None, 1
    rows = [loop for loop in spatial[:-1] if loop.extent > 1 and loop is not columns]
    row = rows[-1] if rows else None
    inner = {loop.index: 1 for loop in loops}

    mr, nr = _register_tile(vector, row, facts, column_vectors, tile_bound(loops, facts))
    inner[vector.index] = nr
    if row is not None:
        inner[row.index] = mr
    if columns is not None:
        inner[columns.index] = column_vectors
    lanes = facts.registers.lanes
    vectors = -(-nr // lanes) * column_vectors

    run_budget = max(1, facts.l1_bytes // 2 // (vectors * lanes * FLOAT_BYTES))
    run = 1
    for loop in reversed(reductions):
        factor = _largest_divisor(loop.extent, min(loop.max_innermost, max(1, run_budget // run)))
        inner[loop.index] = factor
        run *= factor

    rest = {loop.index: loop.extent // inner[loop.index] for loop in spatial}
    window = math.prod(loop.extent for loop in reductions if loop.extent <= MAX_WINDOW)
    reduction = math.prod(loop.extent for loop in reductions)
    weight_bytes = reduction * vector.extent * FLOAT_BYTES
    input_bytes = math.prod(loop.extent for loop in rows) * (reduction // window) * FLOAT_BYTES
    outer = {
        **dict.fromkeys(rest, 1),
        **_parallel_split(rows, vector, rest, weight_bytes, input_bytes, copied_by_tasks, facts),
    }
    tasks = math.prod(outer.values())
    for index, factor in outer.items():
        rest[index] //= factor

    block = _block_of_tiles(rows, vector, inner, rest, run, reduction, window, facts, packed_weights)

    factors = {}
    whole_run = all(inner[loop.index] == loop.extent for loop in reductions)
    for loop in spatial:
        serial = rest[loop.index] // block[loop.index]
        levels = [outer[loop.index], serial, block[loop.index], inner[loop.index]]
        if whole_run:  # one run covers the reduction: each tile then its epilogue, no block between them
            levels = [outer[loop.index], serial * block[loop.index], 1, inner[loop.index]]
        factors[loop.index] = _levels(levels, loop.levels)
    for loop in reductions:
        factors[loop.index] = _levels([loop.extent // inner[loop.index], inner[loop.index]], loop.levels)
    return BlockPlan(factors, mr * vectors, run, tasks, tuple(loops))


def _block_of_tiles(
    rows: Sequence[TiledLoop],
    vector: TiledLoop,
    inner: dict[int, int],
    rest: dict[int, int],
    run: int,
    reduction: int,
    window: int,
    facts: MachineFacts,
    packed_weights: bool,
) -> dict[int, int]:
    """S2's factors (the module's docstring): with ``packed_weights``, row tiles first, each row's inputs of one
    run and its outputs within a quarter of L2 and the block's inputs over the whole reduction (re-read once per
    column tile) within half of it, then weight columns only where that leaves one row tile; without, weight
    columns first, then rows. Where a task's weights exceed its share of L3, every row is in the block instead
    (``_streams_weights``)."""
    nr = inner[vector.index]
    block = dict.fromkeys(rest, 1)
    columns = _largest_divisor(rest[vector.index], max(1, facts.l2_bytes // 2 // (run * nr * FLOAT_BYTES)))
    if not packed_weights:
        block[vector.index] = columns
    width = nr * block[vector.index]
    inputs_per_row = reduction // window
    for loop in reversed(rows):
        height = math.prod(inner[r.index] * block[r.index] for r in rows)
        room = facts.l2_bytes // 4 // (height * max(width, run) * FLOAT_BYTES)
        if packed_weights:
            room = min(room, facts.l2_bytes // 2 // (height * inputs_per_row * FLOAT_BYTES))
        block[loop.index] = _largest_divisor(rest[loop.index], max(1, room))
    task_rows = math.prod(inner[loop.index] * rest[loop.index] for loop in rows)
    task_weight_bytes = reduction * nr * rest[vector.index] * FLOAT_BYTES
    if packed_weights and _streams_weights(task_rows, task_weight_bytes, inputs_per_row, max(nr, run), facts):
        block.update({loop.index: rest[loop.index] for loop in rows})
    if packed_weights and all(block[loop.index] == 1 for loop in rows):
        block[vector.index] = columns
    return block


def _streams_weights(
    task_rows: int, task_weight_bytes: int, inputs_per_row: int, run_width: int, facts: MachineFacts
) -> bool:
    """Whether a task's weights, more than its share of L3, would come from memory again for every block of rows
    S1 walks (its rows outside its columns), while all its rows' inputs fit in half of that share and one run of
    them with its outputs in a quarter of L2: then every row goes in the block, each weight tile read once and used
    by all of them. Llama-3-8B's FFN down product (128 x 14336 x 4096, 235 MB of weights; 2-core Zen 4,
    2026-12-06) read its weights 16 times, 8 rows a block: 154 ms, 42% of the FMA peak, 74 predicted."""
    return (
        task_weight_bytes > facts.l3_bytes
        and task_rows * inputs_per_row * FLOAT_BYTES <= facts.l3_bytes // 2
        and task_rows * run_width * FLOAT_BYTES <= facts.l2_bytes // 4
    )


def _parallel_split(
    rows: Sequence[TiledLoop],
    vector: TiledLoop,
    rest: dict[int, int],
    weight_bytes: int,
    input_bytes: int,
    copied_by_tasks: int,
    facts: MachineFacts,
) -> dict[int, int]:
    """S0's factors: the parallel tasks. A task count the cores divide evenly, at least one per core; of
    those, one whose share of ``copied_by_tasks`` fits in half of L2 (module docstring); then the split that
    reads the least, counted in L2-fulls (a task over rows reads all the weights, one over columns all the
    inputs: a late layer's 9 MB of weights are split by columns, an early layer's image by rows); then the count
    nearest ``TASKS_PER_CORE`` per core; then rows before columns, the outermost first (each core's outputs
    contiguous, where the next kernel reads them: module docstring)."""
    cores = facts.cores
    limit = MAX_JOBS_PER_CORE * cores
    row_splits: list[dict[int, int]] = [{}]
    for loop in rows:  # every combination of the row loops' divisors, up to the limit
        row_splits = [
            {**split, loop.index: d}
            for split in row_splits
            for d in divisors(rest[loop.index])
            if math.prod(split.values()) * d <= limit
        ]

    def key(split: dict[int, int], columns: int):
        across_rows = math.prod(split.values())
        tasks = across_rows * columns
        imbalance = -(-tasks // cores) * cores / tasks
        read = (across_rows * weight_bytes + columns * input_bytes) // facts.l2_bytes
        copy_spills = copied_by_tasks > tasks * (facts.l2_bytes // 2)
        outermost_first = tuple(-split.get(loop.index, 1) for loop in rows)
        return (
            tasks < cores,
            round(imbalance, 3),
            copy_spills,
            read,
            abs(tasks - TASKS_PER_CORE * cores),
            columns,
            outermost_first,
        )

    options = [
        (split, columns)
        for split in row_splits
        for columns in divisors(rest[vector.index])
        if math.prod(split.values()) * columns <= limit
    ]
    split, columns = min(options, key=lambda option: key(*option))
    return {**{loop.index: split.get(loop.index, 1) for loop in rows}, vector.index: columns}


def tile_bound(loops: Sequence[TiledLoop], facts: MachineFacts) -> Callable[[int, int], bool]:
    """Whether a register tile of (accumulators, a step's vectors) suits a block of ``loops``: every register the
    step leaves (``RegisterFile.fits``), but for a reduction over a window alone (a depthwise convolution's),
    which broadcasts nothing, each FMA loading its own input vector: it stays within ``RegisterFile.holds``
    (MobileNetV2's 14 x 14 depthwise kernels 13 us as 7 x 2, 16 us as 14 x 2)."""
    window_only = all(loop.extent <= MAX_WINDOW for loop in loops if loop.role == "reduction")
    return facts.registers.holds if window_only else facts.registers.fits


def _register_tile(
    vector: TiledLoop,
    row: TiledLoop | None,
    facts: MachineFacts,
    column_vectors: int,
    fits: Callable[[int, int], bool],
) -> tuple[int, int]:
    """(rows, columns) of the register tile: the most accumulators the registers hold, up to what keeps the
    FMA ports busy with a margin (``RegisterFile.enough_accumulators``), then the most FMAs per load. Past that
    many, more accumulators buy nothing and a tall thin tile costs a broadcast per FMA: wav2vec 2.0's encoder
    convolutions over 399 and 1599 positions (3 x 7 x 19, 3 x 13 x 41) took 21 x 1 and 13 x 1 tiles over 3 x 4
    ones and ran at 34% and 65% of the FMA peak (their rows 4 KiB apart, every one in the same L1 set). A tile
    one vector wide (columns of an odd count of vectors: ViT's 208 padded keys are 13) broadcasts for every FMA
    whatever its height, so past enough accumulators it takes the fewest rows: 26 rows bought 26/27 FMAs a load
    against 13/14, and held twice the rows' inputs and outputs in flight; in the model on a 2-core Xeon with AMX,
    ViT's Q.K^T 113 -> 87 us, EfficientNet's six such 1x1 convolutions 781 -> 751, DINOv2's Q.K^T 261 -> 251.

    ``column_vectors`` more vectors of weights per step (a grouped convolution's output channels) multiply the
    accumulators, and each row's broadcast then feeds several FMAs, so it stays in a register too: SEW's 3 x 8
    tile (24 accumulators, 3 weights, 8 broadcasts) spilled and ran at half the speed of 3 x 6. ``fits``: the
    block's ``tile_bound``."""
    lanes = facts.registers.lanes
    widths = [
        d for d in divisors(vector.extent) if d % lanes == 0 and d <= vector.max_innermost and power_of_two(d // lanes)
    ]
    if not widths:  # no whole vectors: the widest factor up to one vector
        widths = [_largest_divisor(vector.extent, min(lanes, vector.max_innermost))]
    heights = [d for d in divisors(row.extent) if d <= row.max_innermost] if row is not None else [1]
    best = None
    for width in widths:
        vectors = -(-width // lanes) * column_vectors
        for height in heights:
            accumulators = height * vectors
            broadcasts = height if column_vectors > 1 else 0
            if not fits(accumulators, vectors + broadcasts):
                continue
            # then the most FMAs a load; one vector wide, a broadcast an FMA at any height: the fewest rows
            then = accumulators / (height + vectors) if vectors > 1 else -accumulators
            key = (min(accumulators, facts.registers.enough_accumulators), then)
            if best is None or key > best[0]:
                best = (key, height, width)
    if best is None:  # even one row of the narrowest width is over: one row
        return 1, min(widths)
    return best[1], best[2]


def _largest_divisor(n: int, limit: int) -> int:
    return max(d for d in divisors(n) if d <= max(1, limit))


def _levels(factors: list[int], levels: int) -> list[int]:
    """Four factors (S0 S1 S2 S3) or two (R0 R1) fitted to a split of ``levels``: the outer ones merged."""
    while len(factors) > levels:
        factors = [factors[0] * factors[1], *factors[2:]]
    return [1] * (levels - len(factors)) + factors
