"""How a tuning loop runs: its batch size, search, scheduler, filter, final choice and pipelining."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from costmodel import FilterSettings
from measure import TimingConfig

from .task_search import SearchConfig


@dataclass(frozen=True)
class LoopConfig:
    batch_size: int | None = None  # default: about an eighth of each task's share of the trials
    search: SearchConfig = field(default_factory=SearchConfig)
    scheduler: str = "gradient"  # or "round-robin"
    filter: FilterSettings = field(default_factory=FilterSettings)
    remeasure_top: int = 5  # re-measured at the end with final_timing before the best is chosen
    final_timing: TimingConfig = field(
        default_factory=lambda: TimingConfig(min_repeats=5, max_repeats=50, budget_seconds=0.25)
    )
    verify: bool = True
    analytic_start: bool = True  # each search's first candidates: its analytic schedule and three around it
    give_up_after: int = 32  # failures in a row, with no success at all yet, that end the run
    # Submit batch k+1 before batch k is finished (its search runs on a model one batch stale). None: where
    # the engine times candidates while others build (a GPU's), as that is where the device waited for the loop.
    pipeline: bool | None = None


def auto_batch_size(budget: int | None, num_tasks: int) -> int:
    if budget is None:
        return 16
    per_task = budget / max(1, num_tasks)
    return int(min(64, max(8, math.ceil(per_task / 8))))
