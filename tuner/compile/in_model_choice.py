"""Each tuned kernel judged inside the model against its analytic schedule, where the two differ.

The search times a candidate alone, called back to back on the same arguments: its weights stay in the
caches between calls and the threads stay awake. Inside a model each kernel runs once per inference, its
weights cold and its input where the kernel before it left it, and schedules rank differently there.
DistilBERT tuned for three minutes (Zen 5) ran 9.4-9.6 ms against 8.6-8.7 for its ``trials=0`` build: every
product and norm the search chose was slower inside the model than its analytic schedule (the FFN's first
product 1.77 ms a launch against 1.49, where alone its record had timed 1.25 against 1.46). The transfer-
tuning paper's refinement policy compares the same two times (``../shared/research/papers.md``).

So where a kernel's chosen record is not its analytic schedule, the model is compiled a second time with the
analytic schedules in the records' place, the kernels of both models are timed inside them in alternation
(``PASSES`` each, the fastest pass kept, as ``phase._in_model_seconds`` keeps the pass that adds up to least),
and a kernel takes its analytic schedule where that ran faster in the model by more than ``MARGIN``, checked as
every analytic schedule in a model is: by the model's end-to-end check (a difference bisected to its kernels, as
for any build), not kernel by kernel (25 such checks took 11 s of MobileViT-S's compile). The decision is kept
in the work dir's database (``IN_MODEL_CHOICES_KEY``), so that a later compile (``tuner apply``, a resumed
run) makes it again while the record it beat is still the kernel's best; a better record is judged afresh.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import tvm

from common.error_text import error_line
from common.model_weights import remove_model
from measure import Engine
from measure.workers.worker import WorkerCrashed, WorkerError, WorkerTimeout
from tuner.database.database import TuningDatabase
from tuner.database.workdir import IN_MODEL_CHOICES_KEY
from tuner.search.parallel import parallel_map
from tuner.spaces import metaschedule as msc
from tuner.spaces.analytic import AnalyticSchedule, configure_kernel
from workloads import Workload

from .compile import (
    IN_MODEL_RUNS,
    KernelChoice,
    Program,
    compile_workload,
    in_model_seconds,
    input_args,
    schedules_of,
)

PASSES = 2  # each model's kernels timed this many times, in alternation with the other's
# The analytic schedule is taken where it ran at most this share of the tuned one's time: between passes of
# one model a kernel's time moved by up to 2% (DistilBERT's products)
MARGIN = 0.97
# ... and the model is compiled again only where what they save together is at least this share of the model: a
# compile of MobileViT-S took 16 s to gain 0.7% (three kernels at 0.90-0.96 of their records' times)
MIN_GAIN = 0.01


@dataclass(frozen=True)
class Judgement:
    """One kernel's two schedules timed inside the model: seconds per inference (all its launches)."""

    tuned: float
    analytic: float

    @property
    def analytic_wins(self) -> bool:
        return self.analytic < MARGIN * self.tuned


def contenders(choices: list[KernelChoice], target: tvm.target.Target) -> dict[str, AnalyticSchedule]:
    """Per kernel built with a tuned record: its analytic schedule, where that is not the record's own."""

    def analytic_of(choice: KernelChoice) -> AnalyticSchedule | None:
        if choice.record is None:
            return None
        configured = configure_kernel(choice.task.mod, target)
        if configured is None or msc.structural_key(configured.sch.mod) == choice.record.candidate:
            return None
        return configured

    found = parallel_map(analytic_of, choices)
    return {c.task.name: a for c, a in zip(choices, found, strict=True) if a is not None}


def judge(
    time_kernels: Callable[[Path], dict[str, float]], tuned: Path, analytic: Path, names: list[str]
) -> dict[str, Judgement]:
    """Each of ``names`` timed inside the ``tuned`` model and inside the ``analytic`` one (``time_kernels``:
    seconds per inference by symbol), ``PASSES`` times each in alternation, each kernel's fastest pass kept."""
    fastest: dict[Path, dict[str, float]] = {tuned: {}, analytic: {}}
    for _ in range(PASSES):
        for model in (tuned, analytic):
            times = time_kernels(model)
            for name in names:
                seconds = in_model_seconds(times, name)
                if seconds is not None:
                    fastest[model][name] = min(seconds, fastest[model].get(name, seconds))
    return {
        name: Judgement(fastest[tuned][name], fastest[analytic][name])
        for name in names
        if name in fastest[tuned] and name in fastest[analytic]
    }


@dataclass
class InModelChoice:
    """What ``choose_in_model`` decided: the ``choices`` to build, each judged kernel's ``judged`` times, and
    the model compiled with the choices as they came (``tuned_model``) where no kernel changed: the model
    itself, to be moved into place rather than compiled again; None where it must be compiled."""

    choices: list[KernelChoice]
    judged: dict[str, Judgement] = field(default_factory=dict)
    tuned_model: Path | None = None

    @property
    def switched(self) -> list[str]:
        return [c.task.name for c in self.choices if c.beaten is not None and c.task.name in self.judged]


def choose_in_model(
    engine: Engine,
    workload: Workload,
    program: Program,
    choices: list[KernelChoice],
    target: tvm.target.Target,
    scratch: Path,
    db: TuningDatabase,
    say: Callable[[str], None],
) -> InModelChoice:
    """``choices`` with each tuned kernel that ran slower inside the model than its analytic schedule given that
    schedule instead, both models compiled as probes in ``scratch`` (a library a measuring worker has loaded is
    never compiled over). Nothing is judged for a single kernel, off a CPU, or where a model cannot be compiled
    or timed (the compile phase finds why). The analytic schedules taken are checked as a ``trials=0`` model's
    are: by the model's end-to-end check."""
    challengers = contenders(choices, target) if workload.kind == "relax" else {}
    if not challengers:
        return InModelChoice(choices)
    say(f"{len(challengers)} tuned kernel(s) timed inside the model against their analytic schedules")
    tuned_model, analytic_model = scratch / "judged-tuned.so", scratch / "judged-analytic.so"
    challenged = [
        replace(c, record=None, configured=challengers[c.task.name]) if c.task.name in challengers else c
        for c in choices
    ]
    args = input_args(workload)
    try:
        # on two build workers at once: MobileViT-S's model took 17 s to compile, its probes one after the other 34
        pairs = ((choices, tuned_model), (challenged, analytic_model))
        parallel_map(lambda pair: compile_workload(engine, program, schedules_of(pair[0]), pair[1]), pairs)
        totals: dict[Path, list[float]] = {tuned_model: [], analytic_model: []}

        def times(model: Path) -> dict[str, float]:
            by_symbol = engine.kernel_times(model, args, IN_MODEL_RUNS)
            totals[model].append(sum(by_symbol.values()))
            return by_symbol

        judged = judge(times, tuned_model, analytic_model, list(challengers))
    except (WorkerError, WorkerCrashed, WorkerTimeout) as err:
        say(f"the tuned kernels are not judged inside the model: {error_line(err)}")
        remove_model(tuned_model)
        return InModelChoice(choices)
    finally:
        remove_model(analytic_model)
    kept = [name for name, judgement in judged.items() if judgement.analytic_wins]
    gain = sum(judged[name].tuned - judged[name].analytic for name in kept)
    if kept and gain < MIN_GAIN * min(totals[tuned_model]):
        say(
            f"{len(kept)} kernel(s) ran faster inside the model with their analytic schedule, by {gain * 1e3:.3f} ms "
            f"in all: under {MIN_GAIN:.0%} of the model, not worth a compile; their tuned schedules kept"
        )
        kept = []
    if not kept:
        return InModelChoice(choices, judged, tuned_model)
    remove_model(tuned_model)
    _remember(db, [c for c in choices if c.task.name in kept], judged)
    chosen = [
        replace(c, record=None, configured=challengers[c.task.name], beaten=c.record) if c.task.name in kept else c
        for c in choices
    ]
    return InModelChoice(chosen, judged)


def _remember(db: TuningDatabase, switched: list[KernelChoice], judged: dict[str, Judgement]) -> None:
    remembered = db.get_meta(IN_MODEL_CHOICES_KEY, {})
    for choice in switched:
        judgement = judged[choice.task.name]
        remembered[str(choice.record.kernel_id)] = {
            "beat": choice.record.id,
            "tuned_s": judgement.tuned,
            "analytic_s": judgement.analytic,
        }
    db.set_meta(IN_MODEL_CHOICES_KEY, remembered)
