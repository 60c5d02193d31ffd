"""Which task gets the next batch of trials."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TaskProgress:
    weight: int
    best: float | None = None  # seconds per launch
    batches: int = 0
    stale: int = 0  # batches in a row without a new best
    exhausted: bool = False

    def record_batch(self, batch_best: float | None) -> None:
        self.batches += 1
        if batch_best is not None and (self.best is None or batch_best < self.best):
            self.best = batch_best
            self.stale = 0
        else:
            self.stale += 1


class TaskScheduler:
    """Every task gets one batch in turn; after that the next batch goes to the task whose kernels
    take the largest share of the model's time, halved for each batch in a row that did not improve
    it. A task that never produced a working candidate is given up after ``max_failed_batches``."""

    def __init__(self, max_failed_batches: int = 3):
        self.max_failed_batches = max_failed_batches

    def pick(self, tasks: list[TaskProgress]) -> int | None:
        live = [i for i, t in enumerate(tasks) if not t.exhausted]
        if not live:
            return None
        unvisited = [i for i in live if tasks[i].batches == 0]
        if unvisited:
            return unvisited[0]
        failing = [i for i in live if tasks[i].best is None]
        for i in failing:
            if tasks[i].batches < self.max_failed_batches:
                return i
            tasks[i].exhausted = True
        ranked = [i for i in live if tasks[i].best is not None]
        if not ranked:
            return None
        return max(ranked, key=lambda i: tasks[i].weight * tasks[i].best * 0.5 ** tasks[i].stale)
