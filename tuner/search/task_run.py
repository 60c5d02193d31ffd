"""One task as the tuning loop runs it: its kernel, its search, its progress and its best record so far."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.database.database import Record
from tuner.tasks.extraction import Task
from tuner.tasks.opclass import OperatorClass

from .scheduler import TaskProgress
from .task_search import TaskSearch


@dataclass
class TaskRun:
    task: Task
    kernel_id: int
    search: TaskSearch
    progress: TaskProgress
    op: OperatorClass | None  # None: a kernel the class cannot describe (no root block), without siblings
    trials: int = 0
    best: Record | None = None
    sibling_seeded: bool = False  # its siblings' schedules were offered before its first batch
    measured_here: bool = False  # candidates measured in this process: the engine keeps its fastest builds

    @property
    def group(self) -> str:
        """The task's key for the cost model's training groups and the engine's comparison groups."""
        return str(self.kernel_id)
