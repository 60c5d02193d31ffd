"""Which task gets the next batch of trials, for a model of many tasks.

``GradientScheduler`` (the default) follows Ansor's task scheduler: the model's latency is the
sum over tasks of launches x best latency, and the next batch goes to the task whose next batch
is expected to reduce that sum most. The expected reduction mixes what the task's last batches
achieved (backward difference) with an optimistic look ahead: the better of "the best improves
by best/batches" and "the task reaches 1/``beta`` of the throughput of the best similar task".
Unlike Ansor's, the second counts only while the task still improves: a task whose last
``window`` batches did not improve its best loses it. Tasks of one operator class are not all
alike (a strided 1x1 convolution does not reach a 3x3 one's throughput), and with it a stuck
task kept its promise forever: one ResNet-18 convolution got 67 of some 100 batches of a run
without improving once.
Trials go where they can still pay: a task that has gone ``retire_after`` batches without a new
best (up to ``max_patience`` times more for a task that weighs more than the average in the
model's latency), or whose share of the model's latency is below ``min_share``, is retired. It gets
no more batches (random exploration picks included) while any other task is still promising; then
the rest of the budget goes, ranked as before, to the retired tasks that are not too small to
matter, and when only tasks too small to matter are left (the others exhausted or stopped), tuning
ends: SqueezeNet in bf16, its products' design spaces exhausted, once spent 700 of its 1,088
trials on a global mean.
Where the machine's calibration gives a task its floor (``TaskProgress.floor``: the kernel at its
precision's peak, or moving its arguments at full bandwidth, whichever is slower), no look ahead
promises a best below it: a kernel at 90% of peak has a tenth of its latency left to gain whatever its
history says, and one at 20% most of it.
``RoundRobinScheduler`` gives every live task a batch in turn.

Both give every task one batch first, and give up on a task that produced no working candidate
in ``max_failed_batches`` batches. Where batches pipeline, a task's batch in flight counts as given;
what it will measure is not known yet, so a task may be picked again before its last batch is in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tuner.errors import TunerError
from tuner.tasks.opclass import base_name

from .objectives import Spending


@dataclass
class TaskProgress:
    weight: int
    flops: float = 0.0
    kind: str = ""  # tasks of one kind (same operators, other shapes) compare throughputs
    floor: float = 0.0  # seconds per launch no schedule can beat (peak FLOPs, full bandwidth); 0: unknown
    best: float | None = None  # seconds per launch
    spent: Spending = field(default_factory=Spending)
    exhausted: bool = False  # its search space has nothing new left
    stopped: str | None = None  # why a per-task objective ended it
    in_flight: int = 0  # batches submitted whose results are still to come (``LoopConfig.pipeline``)

    @property
    def batches(self) -> int:
        return len(self.spent.history)

    @property
    def batches_without_improvement(self) -> int:
        """Batches since the one that set the current best."""
        history = self.spent.history
        count = 0
        while count + 1 < len(history) and history[-2 - count] == history[-1]:
            count += 1
        return count

    @property
    def live(self) -> bool:
        return not self.exhausted and self.stopped is None

    def record_batch(self, trials: int, seconds: float, joules: float | None, batch_best: float | None) -> None:
        if batch_best is not None and (self.best is None or batch_best < self.best):
            self.best = batch_best
        self.spent.add_batch(trials, seconds, joules, self.best)


def task_kind(name: str) -> str:
    """Tasks whose names differ only by instance numbers (fused_conv2d_add_relu, ..._relu1) are one kind."""
    return base_name(name)


class _Scheduler:
    def __init__(self, max_failed_batches: int = 3):
        self.max_failed_batches = max_failed_batches

    def pick(self, tasks: list[TaskProgress]) -> int | None:
        live = [i for i, t in enumerate(tasks) if t.live]
        if not live:
            return None
        # a batch in flight counts as given: every task gets its first before any gets a second
        unvisited = [i for i in live if tasks[i].batches == 0 and not tasks[i].in_flight]
        if unvisited:
            return unvisited[0]
        for i in [i for i in live if tasks[i].best is None and not tasks[i].in_flight]:
            if tasks[i].batches < self.max_failed_batches:
                return i
            tasks[i].exhausted = True
        ranked = [i for i in live if tasks[i].best is not None]
        if ranked:
            return self._choose(tasks, ranked)
        # only tasks whose batch in flight may still give them a working candidate: one of them again
        waiting = [i for i in live if 0 < tasks[i].in_flight < self.max_failed_batches - tasks[i].batches]
        return waiting[0] if waiting else None

    def _choose(self, tasks: list[TaskProgress], ranked: list[int]) -> int | None:
        raise NotImplementedError


class RoundRobinScheduler(_Scheduler):
    """Every live task in turn: the one with the fewest batches so far, the first of those."""

    def _choose(self, tasks: list[TaskProgress], ranked: list[int]) -> int:
        return min(ranked, key=lambda i: (tasks[i].batches + tasks[i].in_flight, i))


class GradientScheduler(_Scheduler):
    def __init__(
        self,
        max_failed_batches: int = 3,
        alpha: float = 0.2,
        beta: float = 2.0,
        window: int = 3,
        epsilon: float = 0.05,
        seed: int = 1,
        retire_after: int = 6,
        min_share: float = 0.005,
        max_patience: float = 4.0,
    ):
        super().__init__(max_failed_batches)
        self.alpha, self.beta, self.window, self.epsilon = alpha, beta, window, epsilon
        self.retire_after, self.min_share, self.max_patience = retire_after, min_share, max_patience
        self.rng = np.random.default_rng(seed)

    def _choose(self, tasks: list[TaskProgress], ranked: list[int]) -> int | None:
        promising = [i for i in ranked if not self.retired(tasks, i)]
        promising = promising or [i for i in ranked if not self.too_small(tasks, i)]
        if not promising:
            return None
        if len(promising) > 1 and self.rng.random() < self.epsilon:
            return int(self.rng.choice(promising))
        gradients = {i: self.gradient(tasks, i) for i in promising}
        return min(promising, key=lambda i: (gradients[i], i))

    def retired(self, tasks: list[TaskProgress], i: int) -> bool:
        """Whether task ``i`` has stopped paying: long without a new best, or too small a part of the model."""
        return tasks[i].batches_without_improvement >= self.patience(tasks, i) or self.too_small(tasks, i)

    def patience(self, tasks: list[TaskProgress], i: int) -> float:
        """Batches without a new best before task ``i`` retires: ``retire_after`` for a task of an average
        share of the model's latency, up to ``max_patience`` times that for one that weighs more.
        Mistral's gate and up projections, 41% of its latency, retired after 7 batches at 180 GFLOP/s;
        its down projection, as stuck until its 7th batch, went on from 181 to 312."""
        measured = sum(t.best is not None for t in tasks)
        return self.retire_after * min(self.max_patience, max(1.0, self._share(tasks, i) * measured))

    def too_small(self, tasks: list[TaskProgress], i: int) -> bool:
        """Whether task ``i``'s share of the model's latency is below ``min_share``."""
        return tasks[i].best is not None and self._share(tasks, i) < self.min_share

    @staticmethod
    def _share(tasks: list[TaskProgress], i: int) -> float:
        """Task ``i``'s share of the model's latency, its launches counted (0 before it has a best)."""
        model = sum(t.weight * t.best for t in tasks if t.best is not None)
        task = tasks[i]
        return task.weight * task.best / model if task.best is not None and model > 0 else 0.0

    def gradient(self, tasks: list[TaskProgress], i: int) -> float:
        """d(model latency)/d(batches of task i), estimated; more negative = more to gain."""
        task = tasks[i]
        best = task.best
        history = [h for h in task.spent.history if h is not None]
        window = min(self.window, len(history) - 1)
        backward = (history[-1] - history[-1 - window]) / window if window > 0 else 0.0
        optimistic = best - best / task.batches
        best_similar = max((t.flops / t.best for t in tasks if t.kind == task.kind and t.best and t.flops), default=0.0)
        if task.flops and best_similar and task.batches_without_improvement < self.window:
            optimistic = min(optimistic, self.beta * task.flops / best_similar)
        if task.floor < best:  # a best below the floor means the floor is wrong (its FLOPs or the peaks)
            optimistic = max(optimistic, task.floor)
        forward = optimistic - best
        return task.weight * (self.alpha * backward + (1 - self.alpha) * forward)


SCHEDULERS = {"gradient": lambda seed: GradientScheduler(seed=seed), "round-robin": lambda seed: RoundRobinScheduler()}


def check_scheduler(name: str) -> None:
    if name not in SCHEDULERS:
        raise TunerError(f"unknown task scheduler {name!r}: choose one of {', '.join(SCHEDULERS)}")


def make_scheduler(name: str, seed: int = 1) -> _Scheduler:
    check_scheduler(name)
    return SCHEDULERS[name](seed)
