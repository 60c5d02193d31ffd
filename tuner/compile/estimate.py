"""What the compile phase (``compile_and_time``) will take, estimated from what the run measured, step by
step as it runs: the model compiled in one build worker, kernel after kernel; its end-to-end check, which
runs the build in a process of its own (and, for a model without a framework to compare with, compiles and
runs its untuned build too); its timing, in windows. A time budget keeps this back (``tuner.search.reserve``).

On a CPU a model's tuned kernels are judged inside it against their analytic schedules (``in_model_choice``):
a second model compiled, both timed kernel by kernel, and the model compiled again where a kernel changes.

What it cannot know before the end: the untuned program's seconds per call (``time_untuned``; only its
compile is counted) and a bisection for a kernel that breaks the model (rare, and said when it happens).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from measure import Engine, TimingConfig
from tuner.search.final_choice import check_seconds
from tuner.search.kernel_costs import KernelCosts
from tuner.tasks.extraction import Task
from workloads import Workload

from .compile import IN_MODEL_RUNS, MODEL_TIMING, MODEL_TIMING_WINDOWS
from .in_model_choice import PASSES

NO_CHECK, AGAINST_FRAMEWORK, AGAINST_UNTUNED = "none", "framework", "untuned"


def timing_seconds(
    model_latency: float, load: float, timing: TimingConfig = MODEL_TIMING, windows: int = MODEL_TIMING_WINDOWS
) -> float:
    """``time_workload``'s windows for a model of ``model_latency`` seconds per call: each loads the library
    in the measuring worker (``load``: what a candidate's timing took there, its loading included), warms up,
    then samples until ``min_repeats`` and the budget (or ``max_repeats``) are reached; a sample of a fast
    model is several calls."""
    sample = max(model_latency, timing.min_sample_seconds)
    sampled = max(timing.min_repeats * sample, min(timing.budget_seconds, timing.max_repeats * sample))
    return windows * (load + timing.warmup_seconds + model_latency + sampled)


@dataclass(frozen=True)
class CompileEstimate:
    """The compile phase of one run, as ``CallClock.compile_seconds``: seconds from the kernels' measured
    costs and the model's estimated seconds per call."""

    kernels: Sequence[str]  # task names
    process_start: Callable[[], float | None]  # what a fresh process pays before it runs the model
    model: bool = True  # a Relax model; False: a single kernel
    check: str = AGAINST_FRAMEWORK  # or AGAINST_UNTUNED, NO_CHECK
    time_untuned: bool = False
    judged: bool = False  # its tuned kernels judged inside the model against their analytic schedules

    @classmethod
    def of(
        cls,
        workload: Workload,
        tasks: Sequence[Task],
        engine: Engine,
        verify: bool,
        time_untuned: bool,
        analytic: bool = True,
    ) -> CompileEstimate:
        """The estimate for a run of ``workload``, checked as ``compile_and_time`` checks it (``analytic``: the
        target has analytic schedules, which a model's tuned kernels are judged against)."""
        if not verify:
            check = NO_CHECK
        elif workload.kind == "relax" and (workload.reference is None or workload.precision == "bfloat16"):
            check = AGAINST_UNTUNED  # as tuner.compile.check.make_referee decides
        else:
            check = AGAINST_FRAMEWORK
        names = [task.name for task in tasks]
        model = workload.kind == "relax"
        return cls(names, engine.process_start_seconds, model, check, time_untuned, model and analytic)

    def __call__(self, costs: KernelCosts, model_latency: float) -> float:
        compile_model = sum(costs.build(kernel) for kernel in self.kernels)
        seconds = compile_model * (2 if self.time_untuned else 1) + timing_seconds(model_latency, costs.run())
        if self.model:  # each kernel timed inside the model, for the report (``IN_MODEL_RUNS`` calls)
            seconds += (IN_MODEL_RUNS + 1) * model_latency
        if self.judged:  # a second model compiled beside the first, both timed inside, the model compiled again
            seconds += compile_model + 2 * PASSES * (IN_MODEL_RUNS + 1) * model_latency
        if self.check == NO_CHECK:
            return seconds
        if not self.model:  # one kernel: its analytic schedule checked alone where it has no verified tuned one
            return seconds + check_seconds(costs, self.kernels[0])
        run_alone = (self.process_start() or 0.0) + model_latency
        if self.check == AGAINST_UNTUNED:
            seconds += run_alone + (0.0 if self.time_untuned else compile_model)
        return seconds + run_alone
