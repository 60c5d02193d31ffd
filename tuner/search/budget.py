"""A run's budget when the user names none, and the words the first progress line states it in.

A fixed total (64 candidates) is less than one per kernel for most real models; a budget per
kernel grows with the model. A model with no trials, no trials per task and no stop objective
gets ``DEFAULT_TRIALS_PER_TASK`` per kernel, and at least ``DEFAULT_MIN_TRIALS`` in all.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.progress import format_seconds

from .objectives import Objectives

DEFAULT_TRIALS_PER_TASK = 32
DEFAULT_MIN_TRIALS = 64


@dataclass(frozen=True)
class Budget:
    trials: int | None  # in total; None: only the stop objectives (or trials_per_task) end the run
    trials_per_task: int | None
    defaulted: bool = False  # nothing was given: the default per-kernel budget

    @property
    def measures_nothing(self) -> bool:
        """No trials at all: every kernel takes its analytic schedule (``trials=0``)."""
        return self.trials == 0 or self.trials_per_task == 0

    def total_trials(self, num_tasks: int) -> int | None:
        """The trial budget once the tasks are known."""
        if self.trials_per_task is None:
            return self.trials
        total = self.trials_per_task * num_tasks
        return max(total, DEFAULT_MIN_TRIALS) if self.defaulted else total


def choose_budget(trials: int | None, trials_per_task: int | None, stop: Objectives | None) -> Budget:
    """What the user gave, or the default when nothing would end the run."""
    if trials is None and trials_per_task is None and (stop is None or stop.empty):
        return Budget(None, DEFAULT_TRIALS_PER_TASK, defaulted=True)
    return Budget(trials, trials_per_task)


def describe_budget(budget: Budget, objectives: Objectives) -> str:
    """ "608 trials (32 per kernel, the default: ...), at most 15:00", for the first progress line."""
    parts = []
    if objectives.trials is not None:
        per_task = ""
        if budget.trials_per_task is not None:
            per_task = f" ({budget.trials_per_task} per kernel"
            if budget.defaulted:
                per_task += ", the default: --trials-per-task, --trials or --max-minutes to change"
            per_task += ")"
        parts.append(f"{objectives.trials} trials{per_task}")
    if objectives.seconds is not None:
        parts.append(f"at most {format_seconds(objectives.seconds)} in all (compile included)")
    if objectives.joules is not None:
        parts.append(f"at most {objectives.joules:g} J")
    if objectives.money is not None:
        parts.append(f"at most {objectives.money:g} at {objectives.price_per_hour:g} per device-hour")
    if objectives.patience is not None:
        parts.append(f"until {objectives.patience} batches improve less than {objectives.min_improvement:.0%}")
    return ", ".join(parts) or "no limit"
