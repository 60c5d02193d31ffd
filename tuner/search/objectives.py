"""Cost objectives that end tuning: a trial, wall-time, energy or money budget, and "no longer
improving". The same rules apply to one task (the task is dropped) and to the whole model (the
run ends); whichever is met first ends it, and the reason says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.errors import TunerError


@dataclass(frozen=True)
class Objectives:
    """Any combination of budgets; None means no limit of that kind.

    ``patience`` and ``min_improvement`` together: stop once the best latency has not improved by
    ``min_improvement`` (relative, 0.01 = 1%) over the last ``patience`` batches.
    """

    trials: int | None = None
    seconds: float | None = None
    joules: float | None = None
    money: float | None = None
    price_per_hour: float | None = None  # of the device, in the currency of ``money``
    patience: int | None = None
    min_improvement: float = 0.01

    def __post_init__(self) -> None:
        for name in ("trials", "seconds", "joules", "money", "price_per_hour", "patience"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise TunerError(f"the {name} objective must be a positive number, got {value!r}")
        if self.money is not None and self.price_per_hour is None:
            raise TunerError("a money budget needs the device's price per hour: give price_per_hour (--price-per-hour)")
        if not 0 <= self.min_improvement < 1:
            raise TunerError(f"min_improvement is a fraction in [0, 1), got {self.min_improvement!r}")

    @property
    def empty(self) -> bool:
        return all(getattr(self, n) is None for n in ("trials", "seconds", "joules", "money", "patience"))


@dataclass
class Spending:
    """What a task or the whole run has used so far, and its best latency after each batch."""

    trials: int = 0
    seconds: float = 0.0
    joules: float = 0.0
    history: list[float | None] = field(default_factory=list)  # best latency after each batch

    def add_batch(self, trials: int, seconds: float, joules: float | None, best: float | None) -> None:
        self.trials += trials
        self.seconds += seconds
        if joules is not None:
            self.joules += joules
        self.history.append(best)


def money_spent(spending: Spending, price_per_hour: float) -> float:
    return spending.seconds / 3600.0 * price_per_hour


def met(objectives: Objectives, spent: Spending) -> str | None:
    """The first objective ``spent`` has reached, as a reason for the log and the report; None if none."""
    if objectives.trials is not None and spent.trials >= objectives.trials:
        return f"trial budget: {spent.trials} of {objectives.trials} trials measured"
    if objectives.seconds is not None and spent.seconds >= objectives.seconds:
        return f"time budget: {spent.seconds:.0f} s of {objectives.seconds:.0f} s spent"
    if objectives.joules is not None and spent.joules >= objectives.joules:
        return f"energy budget: {spent.joules:.0f} J of {objectives.joules:.0f} J spent"
    if objectives.money is not None:
        cost = money_spent(spent, objectives.price_per_hour)
        if cost >= objectives.money:
            return (
                f"money budget: {cost:.4g} of {objectives.money:.4g} spent at {objectives.price_per_hour:g} per "
                "device-hour"
            )
    if objectives.patience is not None:
        plateau = _plateau(spent.history, objectives.patience, objectives.min_improvement)
        if plateau:
            return plateau
    return None


def _plateau(history: list[float | None], patience: int, min_improvement: float) -> str | None:
    if len(history) <= patience:
        return None
    before, now = history[-1 - patience], history[-1]
    if before is None or now is None:
        return None
    gain = (before - now) / before
    if gain < min_improvement:
        return (
            f"no improvement: best improved {max(gain, 0.0):.1%} over the last {patience} batch(es), less than "
            f"{min_improvement:.0%}"
        )
    return None


def check_measurable(objectives: Objectives, energy_available: bool, scope: str) -> None:
    """An energy budget on a device that reports no energy would never end anything: say so up front."""
    if objectives.joules is not None and not energy_available:
        raise TunerError(
            f"an energy budget ({scope}) needs energy readings from NVML, which this target does not give "
            "(a CPU target, or a GPU driver without energy counters): use a time or money budget instead"
        )
