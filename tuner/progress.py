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


def format_phases(seconds: dict[str, float], device_seconds: float = 0.0) -> str:
    """Where a run's wall time went: "search 5.1 s, measure 21.4 s (the device timing 38%), ..."; the
    share is of the measure phase that ``device_seconds`` spent in candidates' timed regions. Where batches
    pipeline, the measure phase is only the loop's wait for results, and the device may have timed longer."""

    def phase(name: str, sec: float) -> str:
        if name != "measure" or not device_seconds or not sec:
            return f"{name} {sec:.1f} s"
        if device_seconds > sec:
            return f"{name} {sec:.1f} s (the device timing {device_seconds:.1f} s, also while the loop searched)"
        return f"{name} {sec:.1f} s (the device timing {device_seconds / sec:.0%})"

    return ", ".join(phase(name, sec) for name, sec in seconds.items())


def filter_summary(ledger: dict) -> str:
    """What the Trimmer filter saved, from a FilterLedger's dict."""
    joules = f", ~{ledger['joules_saved']:.0f} J" if ledger.get("joules_saved") else ""
    return (
        f"filter: {ledger['dropped']} of {ledger['proposed']} proposed candidates predicted poor and never built or "
        "measured "
        f"(~{ledger['seconds_saved']:.0f} s{joules} saved; {ledger['explored']} predicted poor but measured to keep "
        "the model learning)"
    )


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

    def start(self, trials_done: int, budget: int | None, num_tasks: int, what: str, limit: str | None = None) -> None:
        """The run's first line; ``limit`` states its budget (default: the trial budget)."""
        self._started = time.monotonic()
        self._trials_at_start = trials_done
        resumed = f", resuming after {trials_done} measured" if trials_done else ""
        limit = limit or (f"{budget} trials" if budget else "no trial limit")
        self.line(f"tuning {what}: {num_tasks} task(s), {limit}{resumed}")

    def batch(
        self,
        task_index: int,
        num_tasks: int,
        task_name: str,
        trials_done: int,
        budget: int | None,
        task_best: float | None,
        task_flops: float,
        model_latency: float | None,
        filtered: str = "",
        left: float | None = None,
    ) -> None:
        """One line per batch; ``filtered`` says what the cost-model filter dropped, if anything; ``left``:
        seconds of a time budget left to search."""
        elapsed = time.monotonic() - self._started
        new = trials_done - self._trials_at_start
        speed = f" ({task_flops / task_best / 1e9:.1f} GFLOP/s)" if task_best and task_flops else ""
        model = f"  model {format_latency(model_latency)}" if num_tasks > 1 else ""
        trials = f"{trials_done}/{budget}" if budget else f"{trials_done}"
        eta = f"  eta {format_seconds(elapsed / new * (budget - trials_done))}" if budget and new > 0 else ""
        if left is not None:
            eta += f"  left {format_seconds(max(0.0, left))}"
        self.line(
            f"[{task_index + 1}/{num_tasks}] {task_name}  trials {trials}  best {format_latency(task_best)}{speed}"
            f"{model}{filtered}  elapsed {format_seconds(elapsed)}{eta}"
        )

    def line(self, text: str) -> None:
        if self.enabled:
            print(f"tuner: {text}", file=self.stream, flush=True)
