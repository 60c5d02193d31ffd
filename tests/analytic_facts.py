"""Machine facts and tiled loops the analytic configuration's tests plan for (test_analytic, test_prediction,
test_first_candidates, test_grouped_conv1d)."""

from __future__ import annotations

import math

from tuner.spaces.block_plan import TiledLoop
from tuner.spaces.machine import MachineFacts
from tuner.spaces.register_tiles import RegisterFile

AVX512 = MachineFacts(
    RegisterFile(lanes=16, registers=32), cores=2, l1_bytes=32 << 10, l2_bytes=1 << 20, l3_bytes=16 << 20
)
AVX2 = MachineFacts(
    RegisterFile(lanes=8, registers=16), cores=4, l1_bytes=32 << 10, l2_bytes=256 << 10, l3_bytes=8 << 20
)


def loops_of(spatial: list[int], reduction: list[int]) -> list[TiledLoop]:
    """A block's loops as MetaSchedule's CPU space tiles them: the spatial ones in four levels, the last vectorised,
    the reductions in two."""
    loops = [TiledLoop(i, "spatial", extent, 4, 64) for i, extent in enumerate(spatial)]
    loops[-1] = TiledLoop(len(spatial) - 1, "vector", spatial[-1], 4, 64)
    return loops + [TiledLoop(len(spatial) + i, "reduction", extent, 2, 64) for i, extent in enumerate(reduction)]


def check_factors(loops: list[TiledLoop], plan) -> None:
    """Every loop's factors multiply to its extent, one a tile level, the innermost within MetaSchedule's limit."""
    for loop in loops:
        assert math.prod(plan.factors[loop.index]) == loop.extent, loop
        assert len(plan.factors[loop.index]) == loop.levels
        assert plan.factors[loop.index][-1] <= loop.max_innermost
