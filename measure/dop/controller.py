"""How many candidates are measured at once: DOPpler's degree-of-parallelism controller.

Measuring several candidates at once raises throughput but can distort the numbers (they share
cores, memory bandwidth, the GPU's L2 and power budget). The controller starts at one, grows while
the numbers stay accurate, and backs off multiplicatively on a loss, in the manner of TCP's binary
increase congestion control:

- Accuracy is checked, not assumed: after each parallel batch a sample of its candidates (20% by
  default) is re-measured serially, and the relative error of the parallel median against the
  serial one is the batch's error. A loss is an error above the threshold (5% by default), or a
  candidate that failed in parallel but runs serially.
- Before the first loss, the DOP doubles (slow start). On a loss at DOP w, the DOP falls to
  ``decrease * w`` and w is remembered as where losses start; later growth binary-searches
  towards w (half the distance per accurate batch), then probes past it one step at a time.
- A loss when probing at or past w again doubles the number of accurate batches to wait before
  the next probe (up to ``max_cooldown``): where parallel measurement never holds (a CPU whose
  cores the candidates share), the controller settles at the DOP below and probes ever more
  rarely.

A run need not start from nothing: ``resume`` starts the controller from the state an earlier run
on the same machine left (``state()``; stored by ``measure.dop.memory``). That state is only a
starting point: every decision still comes from this run's own checks, and a run resumed at a DOP
above one re-measures twice the usual share of its first parallel window, since the machine may
have changed.

Every decision is kept, with the evidence and the reason, for logs and plots; the first one also
says how the run started.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class DopDecision:
    batch: int
    dop: int  # the DOP this batch ran at
    next_dop: int
    checked: int  # candidates re-measured serially
    median_error: float | None
    max_error: float | None
    parallel_only_failures: int
    reason: str
    start: str | None = None  # on a run's first decision: where the controller started, and why

    @property
    def loss(self) -> bool:
        return self.next_dop < self.dop

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DopState:
    """What a controller has learned, for the next run on the same machine to start from."""

    dop: int
    loss_dop: int | None
    cooldown: int
    loss_streak: int


# On a GPU the DOP is not candidates timed at once: timing with CUDA events from several processes counts
# the other processes' kernels time-sliced in between (on one H200 and one H100, experiments/gpu_validation.py
# step 4, parallel timing measured 3.2 and 4.6 candidates/s against serial's 7.2 and 7.6, and one candidate
# came out 3.2x its serial time unnoticed by the sampled checks). One worker owns the GPU and at DOP d loads
# the next d - 1 candidates' libraries while it times one (measure.engine.engine, ``_slots_and_ahead``).
GPU_DEFAULT_MAX_DOP = 3


@dataclass
class DopController:
    max_dop: int
    error_threshold: float = 0.05
    check_fraction: float = 0.2
    decrease: float = 0.5
    dop: int = 1
    loss_dop: int | None = None  # the DOP of the last loss (TCP's W_max)
    max_cooldown: int = 32
    cooldown: int = 0  # accurate batches to wait before probing at loss_dop again
    loss_streak: int = 0  # losses in a row when probing at or past loss_dop
    check_boost: float = 1.0  # times check_fraction to re-measure in the next parallel window
    start: str | None = None  # how this run started, recorded with its first decision
    decisions: list[DopDecision] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_dop < 1:
            raise ValueError(f"max_dop must be at least 1, got {self.max_dop}")
        if not 0 < self.check_fraction <= 1:
            raise ValueError(f"check_fraction must be in (0, 1], got {self.check_fraction}")
        if not 0 < self.decrease < 1:
            raise ValueError(f"decrease must be in (0, 1), got {self.decrease}")
        self.dop = min(max(1, self.dop), self.max_dop)

    def state(self) -> DopState:
        return DopState(self.dop, self.loss_dop, self.cooldown, self.loss_streak)

    def resume(self, state: DopState, since: str, recheck: float = 2.0) -> None:
        """Start from what an earlier run learned (``since``: when, for the log). At a DOP above one
        the first parallel window re-measures ``recheck`` times the usual share."""
        if self.decisions:
            raise RuntimeError("a controller can only resume before its first decision")
        if recheck < 1:
            raise ValueError(f"recheck must be at least 1, got {recheck}")
        self.dop = min(max(1, state.dop), self.max_dop)
        self.loss_dop = state.loss_dop
        self.cooldown = min(max(0, state.cooldown), self.max_cooldown)
        # past this many losses in a row the cooldown is max_cooldown anyway; keeps 2**streak small
        self.loss_streak = min(max(0, state.loss_streak), self.max_cooldown.bit_length())
        self.check_boost = recheck if self.dop > 1 else 1.0
        capped = f", capped at {self.max_dop}" if self.dop < state.dop else ""
        loss = f"loss at {state.loss_dop}" if state.loss_dop is not None else "no loss yet"
        self.start = f"start: remembered DOP {state.dop}{capped} ({loss}, probe cooldown {self.cooldown}) from {since}"

    def to_check(self, batch_size: int, rng: random.Random) -> list[int]:
        """Which of a batch measured at the current DOP to re-measure serially (none at DOP 1)."""
        if self.dop <= 1 or batch_size == 0:
            return []
        fraction = min(1.0, self.check_fraction * self.check_boost)
        count = min(batch_size, max(1, math.ceil(fraction * batch_size)))
        return sorted(rng.sample(range(batch_size), count))

    def update(self, errors: Sequence[float], parallel_only_failures: int = 0) -> DopDecision:
        """Record one batch's evidence (relative errors of the re-measured candidates, and failures
        seen in parallel that did not recur serially) and choose the next DOP."""
        dop = self.dop
        median_error = statistics.median(errors) if errors else None
        max_error = max(errors) if errors else None
        if parallel_only_failures:
            self._lose()
            reason = f"loss: {parallel_only_failures} candidate(s) failed in parallel but ran serially"
        elif max_error is not None and max_error > self.error_threshold:
            self._lose()
            reason = f"loss: error {max_error:.1%} > {self.error_threshold:.0%}"
        else:
            reason = self._grow(checked=bool(errors) or dop == 1)
        if dop > 1:
            self.check_boost = 1.0  # the resumed DOP has had its closer look
        start = None if self.decisions else self.start
        decision = DopDecision(
            len(self.decisions),
            dop,
            self.dop,
            len(errors),
            median_error,
            max_error,
            parallel_only_failures,
            reason,
            start,
        )
        self.decisions.append(decision)
        return decision

    def _lose(self) -> None:
        probing = self.loss_dop is not None and self.dop >= self.loss_dop
        self.loss_streak = self.loss_streak + 1 if probing else 0
        self.cooldown = min(self.max_cooldown, 2**self.loss_streak) if probing else 0
        self.loss_dop = self.dop
        self.dop = max(1, math.floor(self.dop * self.decrease))

    def _grow(self, checked: bool) -> str:
        if not checked:
            return "hold: nothing was re-measured"
        if self.dop >= self.max_dop:
            return f"hold: at the ceiling {self.max_dop}"
        if self.loss_dop is None:
            self.dop = min(self.max_dop, self.dop * 2)
            return "accurate: double (no loss yet)"
        if self.dop >= self.loss_dop:
            self.loss_streak = 0  # a probe at or past the last loss held
        if self.dop < self.loss_dop - 1:
            self.dop = min(self.max_dop, self.dop + max(1, (self.loss_dop - self.dop) // 2))
            return f"accurate: halve the distance to {self.loss_dop}, where the last loss was"
        if self.cooldown > 0:
            self.cooldown -= 1
            return f"hold: {self.cooldown + 1} more accurate batch(es) before probing {self.dop + 1} again"
        self.dop = min(self.max_dop, self.dop + 1)
        return "accurate: probe one past the last loss"


def relative_error(parallel: float, serial: float) -> float:
    """How far a parallel measurement is from the serial one, relative to the serial one."""
    return abs(parallel - serial) / serial
