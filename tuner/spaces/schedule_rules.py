"""Design spaces of ours for kernels that MetaSchedule's own rules cannot schedule well.

A kernel's block names such a space with a ``schedule_rule`` annotation; MetaSchedule's
``ApplyCustomRule`` then calls the function registered here under
``s_tir.meta_schedule.<target key>.<name>`` instead of its generic rules. The spaces use MetaSchedule's
sampling instructions, so that the search draws and mutates their tile sizes as it does its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import tvm
import tvm_ffi
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV, ScheduleError

from .bf16_rule import BF16_GEMM_RULE, schedule_bf16_gemm
from .copy_rule import BF16_COPY_RULE, schedule_bf16_copy
from .pool_rule import BF16_POOL_RULE, schedule_bf16_pool
from .register_tiles import VECTOR_LANES, RegisterFile, divisors, power_of_two
from .softmax_rule import SOFTMAX_RULE, schedule_softmax
from .strassen_rule import STRASSEN_OUTPUT_RULE, schedule_strassen_output
from .winograd_rule import WINOGRAD_TRANSFORM_RULE, schedule_winograd_transform

EXPAND_DEPTHWISE_RULE = "tuner_expand_depthwise"

# output rows per tile: more rows share the tile's halo (the expansion and its activation computed again for the
# rows above and below), fewer give more parallel work; with 16 rather than 8, MobileViT-S's fused kernels took
# 0.82-0.96 of their time alone (2-core Xeon), MobileNetV2's and EfficientNet's 0.82-0.98; their AVX2 code
# (``-mcpu=haswell``, timed on the same Xeon) 0.92-0.98
MAX_OUTPUT_ROWS = 16
MAX_OUTPUT_COLUMNS = 8  # depthwise accumulators per row and vector of channels
MAX_CHANNEL_VECTORS = 4  # channel vectors per tile
EXPAND_PIXELS = (2, 4, 6, 8)  # pixels of the expanding GEMM's register tile


# the fused kernel's own blocks (``inverted_residual.expand_depthwise``); any other is an activation's step
_EXPAND_DEPTHWISE_BLOCKS = frozenset({"data_clamped", "expand", "expand_padded", "depthwise", "depthwise_epilogue"})


def schedule_expand_depthwise(sch: Schedule, depthwise: SBlockRV) -> list[Schedule]:
    """A 1x1 expanding convolution and the depthwise convolution that consumes it, computed tile by tile
    (``tuner.lowering.inverted_residual``): each parallel task takes a band of output rows and a group of
    channels, computes the expanded activation that band needs (with its halo) into a buffer that
    stays in the core's cache, then the depthwise convolution over it. The expanded activation never
    goes to memory."""
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint not in _EXPAND_DEPTHWISE_BLOCKS:  # a SiLU's element-wise steps
            sch.compute_inline(block)
    expand = sch.get_sblock("expand")
    sch.compute_inline(sch.get_sblock("data_clamped"))
    depthwise_out = sch.cache_write(depthwise, 0, "local")
    sch.reverse_compute_inline(sch.get_sblock("depthwise_epilogue"))

    batch, rows, columns, channels, kernel_h, kernel_w = sch.get_loops(depthwise)
    row_tiles, tile_rows = sch.split(rows, sch.sample_perfect_tile(rows, n=2, max_innermost_factor=MAX_OUTPUT_ROWS))
    column_tiles, tile_columns = sch.split(
        columns, sch.sample_perfect_tile(columns, n=2, max_innermost_factor=MAX_OUTPUT_COLUMNS)
    )
    channel_vectors, lanes = sch.split(channels, [None, VECTOR_LANES])
    channel_tiles, tile_vectors = sch.split(
        channel_vectors, sch.sample_perfect_tile(channel_vectors, n=2, max_innermost_factor=MAX_CHANNEL_VECTORS)
    )
    sch.reorder(
        batch, row_tiles, channel_tiles, column_tiles, tile_rows, tile_columns, kernel_h, kernel_w, tile_vectors, lanes
    )
    sch.reverse_compute_at(depthwise_out, tile_rows, preserve_unit_loops=True)

    expand_out = sch.cache_write(expand, 0, "local")
    sch.reverse_compute_inline(sch.get_sblock("expand_padded"))
    sch.compute_at(expand_out, channel_tiles, preserve_unit_loops=True)
    sch.compute_at(expand, channel_tiles, preserve_unit_loops=True)
    e_rows, e_columns, e_channels, e_inputs = sch.get_loops(expand)[-4:]
    pixels = sch.sample_categorical(list(EXPAND_PIXELS), [1.0 / len(EXPAND_PIXELS)] * len(EXPAND_PIXELS))
    e_column_tiles, e_tile_columns = sch.split(e_columns, [None, pixels])
    e_vectors, e_lanes = sch.split(e_channels, [None, VECTOR_LANES])
    sch.reorder(e_rows, e_column_tiles, e_inputs, e_tile_columns, e_vectors, e_lanes)
    sch.reverse_compute_at(expand_out, e_column_tiles, preserve_unit_loops=True)

    for loop in (tile_columns, kernel_h, kernel_w, tile_vectors, e_tile_columns, e_vectors):
        sch.unroll(loop)
    for loop in (lanes, e_lanes):
        sch.vectorize(loop)
    for block in (depthwise_out, expand_out):
        sch.vectorize(sch.split(sch.get_loops(block)[-1], [None, VECTOR_LANES])[1])
    sch.parallel(sch.fuse(batch, row_tiles, channel_tiles))
    # keeps MetaSchedule's generic rules from annotating the kernel for parallelising and unrolling
    # again, which its postprocessors would then fail to apply over the loops above
    sch.annotate(sch.get_sblock("root"), "schedule_rule", "None")
    return [sch]


def is_expand_depthwise(mod: tvm.IRModule) -> bool:
    """Whether a kernel is the fused inverted residual that ``schedule_expand_depthwise`` schedules."""
    sch = Schedule(mod)
    try:
        block = sch.get_sblock("depthwise")
    except ScheduleError:  # no block of that name
        return False
    return sch.get(block).annotations.get("schedule_rule") == EXPAND_DEPTHWISE_RULE


class ExpandDepthwiseDraw:
    """The analytic decisions of ``schedule_expand_depthwise``'s samples, asked in the order it draws them
    (output rows, output columns, channel vectors, the expansion's pixels), from the register file:

    - rows: as many as ``MAX_OUTPUT_ROWS`` allows (more rows share the tile's halo);
    - channel vectors: the fewest (of ``VECTOR_LANES`` lanes each; a divisor of the channels' vectors) whose
      expansion tile has enough accumulators to hide the FMA latency (``RegisterFile.enough_accumulators``):
      two on AVX-512 (three where the vectors are 9), one on AVX2, where one such vector takes two registers;
    - columns: the depthwise accumulators (columns x the vectors' registers) within the register file's
      accumulators;
    - pixels: the expansion's register tile (pixels x the vectors' registers) the largest power of two of
      ``EXPAND_PIXELS`` the registers hold beside its weight vectors and a broadcast.

    On a 2-core Xeon (AVX-512) one channel vector left the expansion 8 accumulators, as many as two FMA
    units of 4 cycles' latency keep busy with nothing else in flight: its loop ran at half the FMA peak.
    With two vectors (16 accumulators) MobileViT-S's five fused kernels took 0.82-0.90 of their time alone,
    MobileNetV2's and EfficientNet's of 96 channels 0.77-0.87; their 144-channel ones, 9 vectors, 0.71-0.93
    with three.

    On Zen 3 (AVX2) the seeded draw took 3 vectors and 6-pixel expansions, more than 16 registers hold:
    MobileNetV2's three fused kernels ran 2.5-4x their tuned time; over a grid of this space each kernel
    alone was within 5% of its best with one vector and 4 pixels, 1.6-1.9x slower with 6 pixels (the same
    registers: the rows' columns are not a multiple of 6), 2-4x slower past the registers."""

    def __init__(self, registers: RegisterFile):
        self.registers = registers
        self.per_vector = max(1, VECTOR_LANES // registers.lanes)  # registers one channel vector takes
        self.vectors = 1  # the tile's channel vectors, once drawn
        self.tiles = 0
        # the columns are drawn before the channel vectors: capped for the fewest vectors with enough accumulators
        self.fewest_vectors = min(filter(self._enough, range(1, MAX_CHANNEL_VECTORS + 1)), default=1)

    def _largest_pixels(self, vectors: int, candidates: Sequence[int] = EXPAND_PIXELS) -> int | None:
        """The most pixels of ``candidates`` (a power of two) an expansion tile of ``vectors`` can take."""
        registers = vectors * self.per_vector
        fitting = [p for p in candidates if power_of_two(p) and self.registers.holds(p * registers, registers)]
        return max(fitting, default=None)

    def _accumulators(self, vectors: int) -> int:
        """The expansion tile's accumulators with ``vectors`` channel vectors, 0 where none fits."""
        pixels = self._largest_pixels(vectors)
        return pixels * vectors * self.per_vector if pixels is not None else 0

    def _enough(self, vectors: int) -> bool:
        """Whether an expansion tile of ``vectors`` channel vectors has accumulators enough to hide the FMA latency."""
        return self._accumulators(vectors) >= self.registers.enough_accumulators

    def _channel_vectors(self, extent: int, max_innermost: int) -> int:
        """The fewest of ``extent``'s divisors with enough accumulators, else the one with the most."""
        counts = [d for d in divisors(extent) if d <= min(max_innermost, MAX_CHANNEL_VECTORS) and self._accumulators(d)]
        enough = [d for d in counts if self._enough(d)]
        return min(enough) if enough else max(counts, key=self._accumulators, default=1)

    def perfect_tile(self, extent: int, max_innermost: int) -> list[int]:
        role = self.tiles
        self.tiles += 1
        if role >= 2:
            self.vectors = self._channel_vectors(extent, max_innermost)
            return [extent // self.vectors, self.vectors]
        columns = self.registers.max_accumulators // (self.per_vector * self.fewest_vectors)
        wanted = MAX_OUTPUT_ROWS if role == 0 else columns
        inner = max(d for d in divisors(extent) if d <= min(wanted, max_innermost))
        return [extent // inner, inner]

    def pixels(self, candidates: list[int]) -> int:
        """The index of the expansion's pixels among ``candidates``."""
        pixels = self._largest_pixels(self.vectors, candidates)
        return candidates.index(pixels) if pixels is not None else 0


def register() -> None:
    """Make the rules known to MetaSchedule in this process (idempotent)."""
    rules = (
        (EXPAND_DEPTHWISE_RULE, schedule_expand_depthwise),
        (BF16_GEMM_RULE, schedule_bf16_gemm),
        (STRASSEN_OUTPUT_RULE, schedule_strassen_output),
        (BF16_COPY_RULE, schedule_bf16_copy),
        (BF16_POOL_RULE, schedule_bf16_pool),
        (SOFTMAX_RULE, schedule_softmax),
        (WINOGRAD_TRANSFORM_RULE, schedule_winograd_transform),
    )
    for name, rule in rules:
        tvm_ffi.register_global_func(f"s_tir.meta_schedule.cpu.{name}", rule, override=True)
