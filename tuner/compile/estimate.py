"""What the compile phase (``compile_and_time``) will take, estimated from what the run measured, step by
step as it runs: the model compiled in one build worker, kernel after kernel; its end-to-end check, which
runs the build in a process of its own (and, for a model without a framework to compare with, compiles and
runs its untuned build too); its timing, in windows. A time budget keeps this back (``tuner.search.reserve``).

On a CPU a model's tuned kernels are judged inside it against their analytic schedules (``in_model_choice``):
a second model compiled, both timed kernel by kernel, and the model compiled again where a kernel changes.

A model's weights cost each step that handles them, whatever its kernels: written once for the build workers,
read and written again by every compile, loaded by every process that runs the model (a measuring worker
keeps one model loaded: the judged models, timed in alternation, load theirs at each timing). DeBERTa-v2's
1 GB of weights (Zen 5, 2026-12-04): 4.0 s to write, 13.6 s for two compiles side by side whose kernels build
in 1.3, 0.8-0.9 s a load; 27 s of compile phase estimated at 9 without them, the call 33 s past its budget.

The untuned program, where it is the check's reference, runs the model's FLOPs at TVM's plain loops' rate
(``UNTUNED_MODEL_FLOPS_PER_SECOND``), not at the tuned model's milliseconds. What it cannot know before the
end: the untuned program's timing (``time_untuned``; only its compile is counted) and a bisection for a
kernel that breaks the model (rare, and said when it happens).
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
# A model's weights written, read or loaded per second by one of the steps above, leaning low: DeBERTa-v2's steps
# (the module's docstring) came to 1.7 s per GB and pass, this VM's fresh memory at 0.3-15 GB/s from one minute
# to the next
WEIGHT_BYTES_PER_SECOND = 0.5e9
# What a model built with TVM's default schedules (plain loops), the reference of a check without a framework
# (a bf16 model's), computes per second, leaning low: trials=0's checks of seven bf16 models took 6-21 s on a
# 2-core Xeon (2026-12-04), about 2 s per GFLOP of the model for its two runs; BERT-base's untuned fp32 build
# ran 22 GFLOP in 14 s on a Zen 4, ResNet-50's 8.2 in 7.0
UNTUNED_MODEL_FLOPS_PER_SECOND = 1e9


def untuned_calls(workload: Workload) -> int:
    """How often the check calls a model's default-schedule build (``tuner.compile.check.make_referee``): on its
    inputs and on others, where no framework answers whether the output depends on the input; else once (a bf16
    model: HF ResNet-50's check 11.8 s, 20 s of its estimate while it counted two calls, 2026-12-06)."""
    return 2 if workload.reference is None else 1


def timing_seconds(
    model_latency: float, load: float, timing: TimingConfig = MODEL_TIMING, windows: int = MODEL_TIMING_WINDOWS
) -> float:
    """``time_workload``'s windows for a model of ``model_latency`` seconds per call: each loads the library
    in the measuring worker (``load``: what a candidate's timing took there, its loading included), then
    times the model (``TimingConfig.seconds_for``: a sample of a fast model is several calls)."""
    return windows * (load + timing.seconds_for(model_latency))


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
    weight_bytes: int = 0  # a model's weights (``codegen.weights.weight_bytes``)
    kernel_flops: float = 0.0  # a single kernel's (``model`` False), checked against its unscheduled loops
    untuned_runs: float = 0.0  # seconds the check's calls of the default-schedule build take (``AGAINST_UNTUNED``)

    @classmethod
    def of(
        cls,
        workload: Workload,
        tasks: Sequence[Task],
        engine: Engine,
        verify: bool,
        time_untuned: bool,
        analytic: bool = True,
        weight_bytes: int = 0,
    ) -> CompileEstimate:
        """The estimate for a run of ``workload`` (``weight_bytes``: its lowered model's weights), checked as
        ``compile_and_time`` checks it (``analytic``: the target has analytic schedules, which a model's tuned
        kernels are judged against)."""
        if not verify:
            check = NO_CHECK
        elif workload.kind == "relax" and (workload.reference is None or workload.precision == "bfloat16"):
            check = AGAINST_UNTUNED  # as tuner.compile.check.make_referee decides
        else:
            check = AGAINST_FRAMEWORK
        names = [task.name for task in tasks]
        model = workload.kind == "relax"
        judged = model and analytic
        flops = 0.0 if model else tasks[0].flops
        untuned_runs = 0.0
        if check == AGAINST_UNTUNED:
            untuned_runs = untuned_calls(workload) * sum(task.weight * task.flops for task in tasks)
            untuned_runs /= UNTUNED_MODEL_FLOPS_PER_SECOND
        return cls(
            names, engine.process_start_seconds, model, check, time_untuned, judged, weight_bytes, flops, untuned_runs
        )

    def __call__(self, costs: KernelCosts, model_latency: float) -> float:
        compile_model = sum(costs.build(kernel) for kernel in self.kernels)
        seconds = compile_model * (2 if self.time_untuned else 1) + timing_seconds(model_latency, costs.run())
        if self.model:  # each kernel timed inside the model, for the report (``IN_MODEL_RUNS`` calls)
            seconds += (IN_MODEL_RUNS + 1) * model_latency
        if self.judged:  # a second model compiled beside the first, both timed inside, the model compiled again
            seconds += compile_model + 2 * PASSES * (IN_MODEL_RUNS + 1) * model_latency
        seconds += self._weight_passes() * self.weight_bytes / WEIGHT_BYTES_PER_SECOND
        if self.check == NO_CHECK:
            return seconds
        if not self.model:  # one kernel: its analytic schedule checked alone where it has no verified tuned one
            return seconds + check_seconds(costs, self.kernels[0], self.kernel_flops)
        process_start = self.process_start() or 0.0
        if self.check == AGAINST_UNTUNED:  # the untuned build compiled and run, in a process of its own
            seconds += process_start + self.untuned_runs + (0.0 if self.time_untuned else compile_model)
        return seconds + process_start + model_latency

    def _weight_passes(self) -> int:
        """How often the weights are written, read or loaded (the module's docstring): once for the build
        workers; twice (read, written) by each compile: the model's (the judged pair's, where no kernel changes:
        the tuned one of the pair is kept), the untuned one's; once by each load: the model's timing, each judged
        model's ``PASSES`` timings, each checking process."""
        if not self.weight_bytes:
            return 0
        compiles = (2 if self.judged else 1) + (1 if self.time_untuned or self.check == AGAINST_UNTUNED else 0)
        loads = 1 + (2 * PASSES if self.judged else 0) + (1 if self.time_untuned else 0)
        loads += {NO_CHECK: 0, AGAINST_FRAMEWORK: 1, AGAINST_UNTUNED: 2}[self.check]
        return 1 + 2 * compiles + loads
