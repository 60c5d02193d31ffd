"""The libraries of each task's fastest candidates, kept once timed, so that the final choice
re-measures them without building them again.

The final choice re-times each task's fastest few candidates with more repeats. Building them a
second time cost as much as the first: on the 2-core VMs a model's final choice was mostly builds
(one candidate of a transposed residual took 15 s to build, twice per run).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from measure.types import BuildResult, MeasureInput, MeasureResult


class KeptBuilds:
    """Per group (a task), the built libraries of its ``per_group`` fastest timed candidates."""

    def __init__(self, per_group: int):
        self.per_group = per_group
        self._kept: dict[str, dict[str, tuple[float, BuildResult]]] = {}
        self._lock = threading.Lock()  # one batch takes while another, timed in another thread, offers

    def take(self, group: str | None, inputs: Sequence[MeasureInput]) -> tuple[list[BuildResult], list[MeasureInput]]:
        """The kept builds of ``inputs`` (out of the keeping until offered back) and the inputs that
        still need building."""
        with self._lock:
            kept = self._kept.get(group, {}) if group is not None else {}
            reused = [kept.pop(item.key)[1] for item in inputs if item.key in kept]
        reused_keys = {built.key for built in reused}
        return reused, [item for item in inputs if item.key not in reused_keys]

    def offer(self, group: str | None, built: BuildResult, result: MeasureResult) -> None:
        """Keep ``built``'s library if its candidate is among its group's fastest; delete the library
        that is not (this one, or the one it displaces)."""
        if group is None or self.per_group <= 0 or result.latency is None or not built.artifact:
            remove_artifact(built.artifact)
            return
        with self._lock:
            kept = self._kept.setdefault(group, {})
            previous = kept.pop(built.key, None)
            if previous is not None and previous[1].artifact != built.artifact:
                remove_artifact(previous[1].artifact)
            kept[built.key] = (result.latency, built)
            if len(kept) > self.per_group:
                slowest = max(kept, key=lambda key: kept[key][0])
                remove_artifact(kept.pop(slowest)[1].artifact)


def remove_artifact(path: str | None) -> None:
    """Delete a built library, if there is one (a failed build has none)."""
    if not path:
        return
    try:
        os.unlink(path)
    except OSError:
        pass
