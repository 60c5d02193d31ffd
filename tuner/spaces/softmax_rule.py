"""The design space of ``tuner.lowering.softmax_rows``'s softmaxes: one schedule, a row per task.

Every row is a parallel task that computes its maximum, its exponentials, their sum, its reciprocal and the
quotients one after the other, over the row held in cache: the reductions' partial results (up to
``MAX_CHAINS`` vectors, independent chains) vectorised under their loop over the row's vectors and combined
pairwise, a vector per step; the element-wise loops split into whole vectors (vectorised) and the rest. Each
quotient is its exponential times the row's reciprocal: a vector division issues once in 10-16 cycles where
a product issues twice a cycle. A product fusion put after the softmax that reads each quotient more than
once (MobileViTV2's, broadcasting it over the channels) takes each row's share right after the row.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

SOFTMAX_RULE = "tuner_softmax"
LANES = 16  # fp32 in an AVX-512 vector
QUOTIENTS = ("softmax", "safe_softmax")
MAX_CHAINS = 4  # vectors of a row's running maximum or sum, independent: an add's latency times its throughput
_HALVES = tuple(f"_half{2**step}" for step in range(1, (LANES * MAX_CHAINS).bit_length() - 1))
# computed per row, each after the blocks that read it are placed (their combinations are inlined)
_PER_ROW = (
    "row_reciprocal",
    "row_sum_rest",
    "row_sum_of_lanes",
    *(f"row_sum{half}" for half in _HALVES),
    "row_sum_lanes",
    "exp",
    "row_max_rest",
    "row_max_of_lanes",
    *(f"row_max{half}" for half in _HALVES),
    "row_max_lanes",
)


def schedule_softmax(sch: Schedule, block: SBlockRV) -> list[Schedule]:
    if sch.get(block).name_hint not in QUOTIENTS:  # placed with the quotient
        return [sch]
    original = sch.copy()
    try:
        return [_by_rows(sch, block)]
    except tvm.s_tir.ScheduleError:  # a kernel that fusion shaped otherwise: its rows left serial
        return [original]


def _by_rows(sch: Schedule, block: SBlockRV) -> Schedule:
    blocks = {sch.get(b).name_hint: b for b in sch.get_child_blocks(sch.get_sblock("root"))}
    broadcasting = []
    for name, other in blocks.items():
        if name in _PER_ROW or name in QUOTIENTS:
            continue
        try:  # the shift, exp's formula, the reductions' combinations, what fusion put before them
            sch.compute_inline(other)
        except tvm.s_tir.ScheduleError:  # what fusion put after them
            try:
                sch.reverse_compute_inline(other)
            except (tvm.s_tir.ScheduleError, tvm.error.InternalError):  # TVM 0.27 raises the second for some
                broadcasting.append(other)  # reads a row's quotients more than once: MobileViTV2's product
    *outer, _ = sch.get_loops(block)
    row = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    for name in _PER_ROW:
        if name in blocks:
            sch.compute_at(blocks[name], row, preserve_unit_loops=True)
    for consumer in broadcasting:  # each row's share of it right after the row, while its quotients are in cache
        sch.reverse_compute_at(consumer, row, preserve_unit_loops=True)
        _vectorize_whole(sch, consumer)
    for name in ("row_max_lanes", "row_sum_lanes"):
        if name in blocks:  # [..., lane, c]: the lanes innermost, a vector per step over the row
            *_, lane, vectors = sch.get_loops(blocks[name])
            sch.reorder(vectors, lane)
            sch.vectorize(lane)
    for name in blocks:
        if any(name.endswith(half) for half in _HALVES):  # the partial results' pairwise steps, a vector each
            sch.vectorize(sch.get_loops(blocks[name])[-1])
    for elementwise in (blocks["exp"], block):
        _vectorize_whole(sch, elementwise)
    sch.parallel(row)
    sch.annotate(sch.get_sblock("root"), "schedule_rule", "None")  # no generic annotations on top
    return sch


def running_chains(length: int, lanes: int) -> int:
    """Vectors of ``lanes`` running results a reduction over a row of ``length`` keeps: the most, a power of two
    up to ``MAX_CHAINS`` (their results are halved pairwise), that leave the row no more values for a scalar rest
    than one vector would and give each chain two or more steps."""
    chains = MAX_CHAINS
    while chains > 1 and (length % (lanes * chains) != length % lanes or length // (lanes * chains) < 2):
        chains //= 2
    return chains


def _vectorize_whole(sch: Schedule, block: SBlockRV) -> None:
    """The element-wise loop over the row: its whole vectors vectorised, the rest (if any) after them."""
    loop = sch.get_loops(block)[-1]
    extent = int(sch.get(loop).extent)
    rest = extent % LANES
    if extent < LANES:
        return
    if rest:
        loop, _ = sch.loop_partition(loop, [extent - rest, None])
    sch.vectorize(sch.split(loop, [None, LANES])[1])
