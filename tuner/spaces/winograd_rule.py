"""The design space of a Winograd kernel's transforms (``tuner.lowering.winograd``): the input's into the
Winograd domain before the batched GEMM, the inverse after it.

A transform is ``M^T x M`` per tile and channel, computed one side at a time (a ``<name>_rows`` block, then the
transform's own). Its arithmetic is a few dozen terms with constant coefficients per tile and channel, and the
channels are independent: each parallel task takes a tile, and for each vector of its channels computes the
rows side into registers (``local``: 36 vectors for F(4x4, 3x3)) and the output from them, every loop over the
tile unrolled so that the coefficients are constants in the instructions. The input transform reads its tile
straight from the padded image (the tile gather inlined).

MetaSchedule's own CPU rule for these blocks (``conv2d_nhwc_winograd_data_pack``) keeps the channel loop outside
the tile's unrolled loops, so nothing was vectorised: one float per instruction, and the transforms were most of a
small Winograd kernel's time. Each kernel alone on a 2-core Zen 4, analytic schedules, that rule's and this one in
turn (2026-12-06): 0.41-0.95x as long, the zoo attention block's 16x16 64-channel convolutions 112 -> 46 us, VGG-16's
56x56 128-channel one 5.6 -> 2.9 ms, ResNet-18's 0.60-0.91x; each now within 10% of its prediction.
"""

from __future__ import annotations

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from .register_tiles import VECTOR_LANES, divisors

WINOGRAD_TRANSFORM_RULE = "tuner_winograd_transform"
ROWS_SUFFIX = "_rows"  # the name of a transform's first block is its own's and this
INPUT_TILE = "input_tile"  # the gather of the input's tiles from the padded image


def schedule_winograd_transform(sch: Schedule, transform: SBlockRV) -> list[Schedule]:
    """The transform's schedule (see the module's docstring); ``transform`` is its second block."""
    rows = sch.get_sblock(sch.get(transform).name_hint + ROWS_SUFFIX)
    for producer in sch.get_producers(rows):
        if sch.get(producer).name_hint == INPUT_TILE:
            sch.compute_inline(producer)
    x, y, tile, channels = sch.get_loops(transform)
    extent = int(sch.get(channels).extent)
    lanes = max(d for d in divisors(extent) if d <= VECTOR_LANES)
    vectors, lane = sch.split(channels, [None, lanes])
    sch.reorder(tile, vectors, x, y, lane)
    sch.compute_at(rows, vectors, preserve_unit_loops=True)
    sch.set_scope(rows, 0, "local")
    row_x, row_b, _, row_lane, row_a = sch.get_loops(rows)[-5:]
    sch.reorder(row_a, row_lane)
    for loop in (x, y, row_x, row_b, row_a):
        sch.unroll(loop)
    return [sch]
