"""The schedules around a kernel's analytic one (AutoConfig's "dynamic measurement" as a few-shot
search): the next design space's analytic schedule, then the plan one step each way (a register row, a
cache block, the reduction run), measured first by a search that starts from the analytic point.
"""

from __future__ import annotations

from collections.abc import Sequence

import tvm
from tvm.s_tir import Schedule

from .analytic import AnalyticSchedule, by_fusion, configure_in, replay_plans, rule_schedule
from .block_plan import BlockPlan, tile_bound
from .machine import MachineFacts
from .register_tiles import divisors


def analytic_candidates(
    mod: tvm.IRModule, spaces: Sequence[Schedule], postprocs: Sequence, facts: MachineFacts | None, count: int
) -> list[AnalyticSchedule]:
    """Up to ``count`` schedules around the analytic point, the analytic schedule first (AutoConfig's
    "dynamic measurement" as a few-shot search): the next design space's analytic schedule (the
    epilogue fused elsewhere), then the plan one step each way (``neighbour_plans``). Where one of our own
    rules takes the kernel (``analytic.rule_schedule``), its schedule is the analytic one, the design space's
    follow it: the search measures the schedule ``trials=0`` compiles (BERT's layer norms, left to the design
    space, were tuned to 16 us where the norm rule's ran 9-10)."""
    ruled = rule_schedule(mod, facts)
    found: list[tuple[Schedule, AnalyticSchedule]] = []
    for space in by_fusion(mod, spaces):
        configured = configure_in(mod, space, postprocs, facts)
        if configured is not None:
            found.append((space, configured))
        if len(found) == 2:
            break
    if not found:
        return [ruled] if ruled is not None and count > 0 else []
    chosen: list[AnalyticSchedule] = ([ruled] if ruled is not None else []) + [configured for _, configured in found]
    space, first = found[0]
    for plans in neighbour_plans(first.plans, facts):
        if len(chosen) >= count:
            break
        sch = replay_plans(mod, space, plans, postprocs)
        if sch is not None:
            chosen.append(AnalyticSchedule(sch, plans))
    return chosen[:count]


# One step each way from the analytic plan, most promising first: (loop's role, from level, to level),
# levels counted from the outermost (S0 S1 S2 S3; R0 R1). A step moves the smallest prime factor.
_STEPS = (
    ("row", 3, 2),  # one register row fewer
    ("vector", 1, 2),  # a cache block twice as wide
    ("reduction", 1, 0),  # half the reduction run
    ("vector", 2, 1),  # a cache block half as wide
    ("row", 2, 3),  # one register row more
    ("reduction", 0, 1),  # twice the reduction run
    ("row", 1, 2),  # a cache block twice as tall
    ("row", 2, 1),  # and half as tall
)


def neighbour_plans(plans: Sequence[BlockPlan], facts: MachineFacts | None) -> list[tuple[BlockPlan, ...]]:
    """The plans one step from ``plans`` in each of ``_STEPS`` that the loops allow (the register tile
    within the registers, the innermost factors within MetaSchedule's limits), each step applied to
    every block; the order of ``_STEPS``."""
    neighbours = []
    for step in _STEPS:
        moved = tuple(_step(plan, step, facts) for plan in plans)
        if any(new is not None for new in moved):
            neighbours.append(tuple(new or old for new, old in zip(moved, plans, strict=True)))
    return neighbours


def _step(plan: BlockPlan, step: tuple[str, int, int], facts: MachineFacts | None) -> BlockPlan | None:
    role, source, destination = step
    spatial = [loop for loop in plan.loops if loop.role != "reduction"]
    reductions = [loop for loop in plan.loops if loop.role == "reduction"]
    loop = {"row": plan.row_loop, "vector": spatial[-1] if spatial else None}.get(
        role, reductions[-1] if reductions else None
    )
    if loop is None or loop.levels != len(plan.factors[loop.index]) or max(source, destination) >= loop.levels:
        return None
    factors = list(plan.factors[loop.index])
    primes = [d for d in divisors(factors[source]) if d > 1]
    if not primes:
        return None
    prime = primes[0]
    factors[source] //= prime
    factors[destination] *= prime
    if factors[-1] > loop.max_innermost:
        return None
    accumulators, run = plan.accumulators, plan.reduction_run
    if role == "reduction":
        run = run // plan.factors[loop.index][-1] * factors[-1]
    if role == "row":
        vectors = plan.accumulators // plan.factors[loop.index][-1]
        accumulators = vectors * factors[-1]
        if facts is not None and not tile_bound(plan.loops, facts)(accumulators, vectors):
            return None
    return BlockPlan({**plan.factors, loop.index: factors}, accumulators, run, plan.tasks, plan.loops)
