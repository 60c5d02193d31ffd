"""Cost objectives that end tuning: a trial, wall-time, energy or money budget, and "no longer
improving". The same rules apply to one task (the task is dropped) and to the whole model (the
run ends); whichever is met first ends it, and the reason says which.

For the whole run, time (and money, time at a price) is the call's wall clock: ``Spending.seconds``
counts from the call and ``Spending.reserved`` is what the run keeps for after its search (the final
choice, the compile; ``tuner.search.reserve``), so the search ends while the call can still return in
time.
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
    reserved: float = 0.0  # seconds still to come after the search; counted against time and money
    reserved_for_choice: float = 0.0  # of them, the final choice's (the rest: the compile phase's)
    in_flight: int = 0  # trials submitted whose results are still to come; counted against trials

    def add_batch(self, trials: int, seconds: float, joules: float | None, best: float | None) -> None:
        self.trials += trials
        self.seconds += seconds
        if joules is not None:
            self.joules += joules
        self.history.append(best)


def money_spent(spending: Spending, price_per_hour: float) -> float:
    return (spending.seconds + spending.reserved) / 3600.0 * price_per_hour


def time_limit(objectives: Objectives) -> float | None:
    """The seconds a run may last under its time and money budgets; None where neither is set."""
    limits = [objectives.seconds] if objectives.seconds is not None else []
    if objectives.money is not None:
        limits.append(objectives.money / objectives.price_per_hour * 3600.0)
    return min(limits, default=None)


def time_left(objectives: Objectives, spent: Spending) -> float | None:
    """Seconds of the time (or money) budget left to search, the reserve kept; None without such a budget."""
    limit = time_limit(objectives)
    return None if limit is None else limit - spent.seconds - spent.reserved


def kept_for_after(spent: Spending) -> str:
    """The reserve in words, with its two phases, so that a run's phase times say which estimate was off."""
    choice = spent.reserved_for_choice
    return (
        f"{spent.reserved:.0f} s kept for the final choice ({choice:.0f} s) and the compile, check and in-model "
        f"choice ({spent.reserved - choice:.0f} s)"
    )


def short_of_time(objectives: Objectives, spent: Spending) -> str:
    """Why a run ends just short of its time (or money) budget: what is left would not hold another batch."""
    limit = time_limit(objectives)
    budget = "time" if limit == objectives.seconds else "money"
    spent_text = f"{spent.seconds:.0f} s of {limit:.0f} s"
    return f"{budget} budget: {spent_text}, {kept_for_after(spent)}, too little left for another batch"


def met(objectives: Objectives, spent: Spending) -> str | None:
    """The first objective ``spent`` has reached, as a reason for the log and the report; None if none."""
    if objectives.trials is not None and spent.trials + spent.in_flight >= objectives.trials:
        return f"trial budget: {spent.trials + spent.in_flight} of {objectives.trials} trials measured"
    if objectives.seconds is not None and spent.seconds + spent.reserved >= objectives.seconds:
        kept = f", {kept_for_after(spent)}" if spent.reserved else " spent"
        return f"time budget: {spent.seconds:.0f} s of {objectives.seconds:.0f} s{kept}"
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
