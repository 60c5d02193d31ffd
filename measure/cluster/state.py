"""What the cluster driver keeps track of: its measuring actors, the batch in flight and its
candidates, and which device model measures which task."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from measure.types import BuildResult, MeasureInput


class ClusterError(RuntimeError):
    """The cluster cannot do what was asked (no such cluster, no GPU for a CUDA target, ...)."""


@dataclass
class Measurer:
    handle: Any
    options: dict
    name: str = "starting"
    device: str | None = None
    state: str = "starting"  # starting, up, down (restarting), dead
    window: int = 5
    dop: int = 1
    energy: bool = False
    measured: int = 0
    restarts: int = 0
    in_flight: int = 0
    error: str | None = None  # why it died, if it did
    pid: int | None = None

    def take(self, info: dict) -> None:
        self.name, self.device, self.window, self.dop, self.energy = (
            info["name"],
            info["device"],
            info["window"],
            info["dop"],
            info["energy"],
        )
        self.measured, self.pid = info["measured"], info["pid"]
        self.state = "up"


@dataclass
class Pending:
    """A candidate of the current batch, from build to result."""

    item: MeasureInput
    attempts: int = 0
    built: BuildResult | None = None
    blob: Any = None  # an ObjectRef to the artifact's bytes


@dataclass
class Batch:
    timing: dict
    serial: bool
    device: str
    expected: int
    returned: int = 0
    queue: list[Pending] = field(default_factory=list)  # built, waiting for a measurer
    group: str | None = None  # the task its candidates are of

    @property
    def finished(self) -> bool:
        return self.returned >= self.expected


def assign_device(group: str | None, measurers: Counter, groups: dict) -> str:
    """The device model that measures ``group`` (a task): the one it had while that model still has
    measurers, else the one with the most measurers per group already on it (the idler on a tie). ``measurers`` counts
    measurers per model; ``groups`` (group -> model) is updated."""
    if groups.get(group) in measurers:
        return groups[group]
    if not measurers:
        return groups.get(group, "")
    load = Counter(groups.values())
    groups[group] = max(measurers, key=lambda device: (measurers[device] / (1 + load[device]), -load[device]))
    return groups[group]
