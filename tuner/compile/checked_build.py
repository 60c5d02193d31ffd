"""Compile a model so that no tuned kernel can sink it or make it wrong.

A tuned schedule that breaks the model's compile, or whose kernel makes the model's output differ
from its reference, is found by bisection (each probe a compile, and a run of the model) and left
out: that kernel keeps TVM's default schedule, and a line says which and why.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import tvm

from common.error_text import error_line
from common.model_weights import move_model, remove_model
from measure import Engine
from measure.workers.worker import WorkerCrashed, WorkerError, WorkerTimeout
from tuner.errors import TunerError
from tuner.search.parallel import parallel_map
from workloads import Workload

from .check import (
    DEFAULT_SCHEDULES,
    ModelCheck,
    checks_against_default_schedules,
    make_referee,
    no_device_here,
    reference_label,
    relative_error,
    run_compiled,
    run_compiled_sets,
    tolerance_for,
)
from .compile import KernelChoice, Program, compile_workload, schedules_of

# The default-schedule build the check takes as its reference, compiled by LLVM at -O1: its unscheduled loops
# gain nothing from -O3 but the time it takes (HF ResNet-50 in bf16: 11.0 s to compile and export at -O3, 2.9 at
# -O1, 0.65 at -O0; a run 4.3, 4.4 and 19.9 s). A timed untuned build (``time_untuned``) keeps LLVM's default.
REFERENCE_LLVM_OPT_LEVEL = 1


def find_culprits(suspects: Sequence[str], fails_with: Callable[[list[str]], bool]) -> list[str]:
    """The members of ``suspects`` whose presence makes ``fails_with(kept)`` true, given that it is
    false for none kept and true for all: bisection, about two probes per culprit and halving."""

    def search(group: list[str], kept: list[str]) -> list[str]:
        if len(group) == 1:
            return group
        left, right = group[: len(group) // 2], group[len(group) // 2 :]
        bad = search(left, kept) if fails_with(kept + left) else []
        kept = kept + [name for name in left if name not in bad]
        if fails_with(kept + right):
            bad += search(right, kept)
        return bad

    return search(list(suspects), []) if suspects else []


class CheckedBuild:
    """The compile of one model with its chosen schedules, and its end-to-end check."""

    def __init__(
        self,
        engine: Engine,
        workload: Workload,
        program: Program,
        choices: list[KernelChoice],
        target: tvm.target.Target,
        untuned: Path,
        say: Callable[[str], None],
    ):
        self.engine, self.workload, self.program, self.choices = engine, workload, program, choices
        self.target, self.untuned, self.say = target, untuned, say
        self.tuned = [c.task.name for c in choices if c.trace is not None]
        self.left_out: dict[str, str] = {}
        self.check_seconds = 0.0  # spent running the model and its reference, and finding culprits
        self._probes = 0

    def build(self, artifact: Path, check: bool = True, compiled: Path | None = None) -> ModelCheck:
        """Compile into ``artifact`` (leaving out the schedules that break it), then check the model
        against its reference (leaving out the schedules that make it wrong). ``compiled``: the model compiled
        with these choices already, moved into place instead."""
        skipped = "a single kernel: checked while tuning" if self.workload.kind != "relax" else None
        skipped = skipped or (None if check else "turned off") or no_device_here(self.target)
        reference = not skipped and checks_against_default_schedules(self.workload) and not self.untuned.exists()
        if compiled is not None:  # the check compiles its reference when it first runs it
            move_model(compiled, artifact)
        else:
            self._compile_leaving_out_breakers(artifact, reference)
        if skipped:
            return ModelCheck("", None, None, tolerance_for(self.workload), skipped=skipped, left_out=self.left_out)
        started = time.monotonic()
        try:
            return self._check(artifact)
        finally:
            self.check_seconds = time.monotonic() - started

    # -- compile ----------------------------------------------------------------------------------
    def _compile(self, kept: Sequence[str], artifact: Path) -> str | None:
        """Compile keeping the schedules of ``kept``; the error line if it fails."""
        leave_out = frozenset(c.task.name for c in self.choices if c.trace is not None) - set(kept)
        try:
            compile_workload(self.engine, self.program, schedules_of(self.choices, leave_out), artifact)
        except (WorkerError, WorkerCrashed, WorkerTimeout) as err:  # a compiler that failed, crashed or hung
            return error_line(err)
        return None

    def _compile_leaving_out_breakers(self, artifact: Path, with_reference: bool = False) -> None:
        """``with_reference``: the default-schedule build the check takes as its reference compiled beside it, on
        a build worker of its own (a compile is one core's work: HF ResNet-50's in bf16, 7 s each)."""
        if with_reference:
            jobs = (lambda: self._compile(self.tuned, artifact), self._compile_reference)
            failure = parallel_map(lambda job: job(), jobs)[0]
        else:
            failure = self._compile(self.tuned, artifact)
        if failure is None:
            return
        self.say(f"the compile with every tuned schedule failed ({failure}); finding the kernel(s) that break it")
        breakers = find_culprits(self.tuned, lambda kept: self._probe_compile(kept, artifact) is not None)
        for name in breakers:
            self._leave_out(name, f"its schedule breaks the model's compile ({failure})")
        last = self._compile(self.tuned, artifact)
        if last is not None:
            raise TunerError(f"the model does not compile even with TVM's default schedules: {last}")

    def _probe_compile(self, kept: Sequence[str], artifact: Path) -> str | None:
        """``_compile`` into a probe beside ``artifact``, removed afterwards."""
        probe = self._probe_path(artifact)
        try:
            return self._compile(kept, probe)
        finally:
            remove_model(probe)

    def _leave_out(self, name: str, why: str) -> None:
        self.left_out[name] = why
        self.tuned.remove(name)
        self.say(f"{name}: built with TVM's default schedule: {why}")

    def _probe_path(self, artifact: Path) -> Path:
        self._probes += 1
        return artifact.with_name(f"{artifact.stem}.probe{self._probes}{artifact.suffix}")

    # -- check ------------------------------------------------------------------------------------
    def _outputs(self, artifact: Path, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return run_compiled(artifact, self.workload, self.target, inputs)

    def _compile_reference(self) -> None:
        compile_workload(self.engine, self.program, [], self.untuned, REFERENCE_LLVM_OPT_LEVEL)

    def _run_untuned(self, input_sets: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        if not self.untuned.exists():
            self._compile_reference()
        return run_compiled_sets(self.untuned, self.workload, self.target, input_sets)

    def _check(self, artifact: Path) -> ModelCheck:
        referee = make_referee(self.workload, self._run_untuned)
        outputs = self._outputs(artifact, referee.inputs)
        error = referee.error(outputs)
        result = ModelCheck(
            referee.name, error, referee.scale, referee.tolerance, referee.degenerate, left_out=self.left_out
        )
        if referee.framework is not None:  # a bf16 model's error against its framework's fp32
            error_there = relative_error(outputs, referee.framework)
            result = replace(result, precision_error=error_there, precision_reference=reference_label(self.workload))
        if result.ok:
            return result
        self.say(f"the compiled model differs from {referee.name} by {error:.1e}: finding the kernel(s) responsible")
        if referee.name != DEFAULT_SCHEDULES and not referee.matches(self._run_untuned([referee.inputs])[0]):
            return replace(result, lowering_wrong=True)

        def wrong_with(kept: list[str]) -> bool:
            probe = self._probe_path(artifact)
            try:
                if self._compile(kept, probe) is not None:
                    return True
                return not referee.matches(self._outputs(probe, referee.inputs))
            finally:
                remove_model(probe)

        for name in find_culprits(self.tuned, wrong_with):
            self._leave_out(name, f"the model's output was wrong with its schedule (error {error:.1e})")
        self._compile(self.tuned, artifact)
        error = referee.error(self._outputs(artifact, referee.inputs))
        return replace(result, error=error, left_out=self.left_out)
