"""A design space for bf16 kernels that copy by a condition (a concatenation; the first convolution's
padded image, whose channels, 3, are its innermost axis and are not vectorised: its rows' pixels
are cut into the padding and the image's own, which then copy without a test per value).

MetaSchedule vectorises an injective kernel only where the loops it fuses innermost fit its
vector limit; a concatenation of two 55x55x64 bf16 activations into 128 channels fused none (the
channel loop alone is 128), and its scalar 16-bit copies ran at 14.7 GB/s (105 us, SqueezeNet's
fire modules): the same kernel in fp32 ran at 104 GB/s, which LLVM vectorised on its own. Here the
innermost axis is split by the lanes that every buffer's innermost extent divides (so a
concatenation's condition on that axis is the same for a whole vector) and vectorised: 21.5 us.
"""

from __future__ import annotations

import math

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.sym import Analyzer

BF16_COPY_RULE = "tuner_bf16_copy"
MAX_LANES = 64  # two AVX-512 vectors of bf16
PADDED_IMAGE = "bf16_padded_image"  # the block of ``bf16_flat.bf16_padded_image``


def copy_lanes(extents: list[int], most: int = MAX_LANES) -> int:
    """The largest power of two up to ``most`` (a power of two) that divides every innermost extent."""
    common = math.gcd(*extents)
    return min(most, common & -common)


def schedule_bf16_copy(sch: Schedule, block: SBlockRV) -> list[Schedule]:
    buffers = [param for param in sch.mod["main"].params if hasattr(param, "shape")]
    lanes = copy_lanes([int(buffer.shape[-1]) for buffer in buffers])
    loops = sch.get_loops(block)
    if lanes > 1:
        sch.vectorize(sch.split(loops[-1], [None, lanes])[1])
        parallel = loops[:-1]
    else:  # rows in parallel, each row's loops serial (the padded image: 67 us, 149 with every loop fused)
        parallel = loops[:-2] or loops[:1]
        if sch.get(block).name_hint == PADDED_IMAGE:
            _cut_at_image(sch, block, loops[-2])
    if parallel:
        sch.parallel(sch.fuse(*parallel) if len(parallel) > 1 else parallel[0])
    sch.annotate(sch.get_sblock("root"), "schedule_rule", "None")  # no generic annotations on top
    return [sch]


def _cut_at_image(sch: Schedule, block: SBlockRV, pixels: LoopRV) -> None:
    """The padded image's pixel loop as the pixels left of the image, the image's and those right of it:
    the image's convert with no test whether they are inside, and LLVM vectorises them (MobileNetV2's
    226x234 padded image: 79 -> 23 us alone, Emerald Rapids). Pixel x reads the image's column x - first."""
    stmt = sch.get(block)
    (image,) = [region for region in stmt.reads if len(region.source.shape) == 4]
    first = int(Analyzer().simplify(stmt.iter_vars[2].var - image.region[3].min))
    count = int(image.source.shape[3])
    extent = int(sch.get(pixels).extent)
    # loop_partition takes the parts before the last, the last as None
    parts = [part for part in (first, count) if part > 0]
    if sum(parts) >= extent:
        parts.pop()
    if parts:
        sch.loop_partition(pixels, [*parts, None])
