"""Live progress of a tuning run, one line per measured batch."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def format_seconds(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_phases(seconds: dict[str, float]) -> str:
    """Where a run's wall time went: "search 5.1 s, measure 21.4 s, ..."."""
    return ", ".join(f"{phase} {sec:.1f} s" for phase, sec in seconds.items())


def format_latency(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1e-1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-4:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


class Progress:
    def __init__(self, enabled: bool = True, stream: TextIO | None = None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self._started = time.monotonic()
        self._trials_at_start = 0

    def start(self, trials_done: int, budget: int, num_tasks: int, what: str) -> None:
        self._started = time.monotonic()
        self._trials_at_start = trials_done
        resumed = f", resuming after {trials_done} measured" if trials_done else ""
        self.line(f"tuning {what}: {num_tasks} task(s), {budget} trials{resumed}")

    def batch(
        self,
        task_index: int,
        num_tasks: int,
        task_name: str,
        trials_done: int,
        budget: int,
        task_best: float | None,
        task_flops: float,
        model_latency: float | None,
    ) -> None:
        elapsed = time.monotonic() - self._started
        new = trials_done - self._trials_at_start
        eta = elapsed / new * (budget - trials_done) if new > 0 else 0.0
        speed = f" ({task_flops / task_best / 1e9:.1f} GFLOP/s)" if task_best and task_flops else ""
        model = f"  model {format_latency(model_latency)}" if num_tasks > 1 else ""
        self.line(
            f"[{task_index + 1}/{num_tasks}] {task_name}  trials {trials_done}/{budget}  best {format_latency(task_best)}{speed}"
            f"{model}  elapsed {format_seconds(elapsed)}  eta {format_seconds(eta)}"
        )

    def line(self, text: str) -> None:
        if self.enabled:
            print(f"tuner: {text}", file=self.stream, flush=True)
