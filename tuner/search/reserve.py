"""A time budget is the user's wall clock: the call returns within it, everything after the search included.

The clock starts at the call (``CallClock.started``). The search stops once the time since then plus the
reserve reaches the budget; the reserve is what still has to happen after the search, estimated again
before each batch from what the run measured: the final choice (each tuned kernel's best re-timed and
verified, ``FinalChoice.seconds``) and the compile phase (``tuner.compile.estimate``), both made of
measured costs (a kernel's candidate builds and timings, a worker's start-up) times how often the phase
pays them. The terms lean high (a sum of candidate builds, each paying its own fixed costs, stands for one
whole-model compile; a worker's start-up under the load of the run's own start for the check's fresh
process), so ``MARGIN`` is small: it covers what they leave out, a best that turns out wrong and makes the
next one checked, a re-timing repeated after a burst of interference.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .kernel_costs import KernelCosts

MARGIN = 1.1
# A call may end this share of its budget past it rather than leave a tuned kernel unverified (the final choice's
# last resort; the reserve aims inside the budget): a user who gave 3 minutes takes 3:18, not an untuned kernel.
OVERRUN = 0.1


def _nothing_to_compile(costs: KernelCosts, model_latency: float) -> float:
    return 0.0


@dataclass(frozen=True)
class CallClock:
    """The clock of a run's time budget. ``compile_seconds(costs, model_latency)`` estimates the compile
    phase from the kernels' measured costs and the model's estimated seconds per call."""

    started: float  # time.monotonic() at the call
    compile_seconds: Callable[[KernelCosts, float], float] = _nothing_to_compile

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def reserve(final_choice_seconds: float, compile_seconds: float) -> float:
    """Seconds kept back for after the search: its two phases, estimated, with the margin."""
    return MARGIN * (final_choice_seconds + compile_seconds)


def reserve_parts(final_choice_seconds: float, compile_seconds: float) -> tuple[float, float]:
    """``reserve`` and its final choice's share, with the margin."""
    return reserve(final_choice_seconds, compile_seconds), MARGIN * final_choice_seconds
