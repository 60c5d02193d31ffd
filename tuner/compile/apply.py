"""``tuner apply``: compile a model with the schedules a work dir holds."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tvm

from measure import EngineConfig, MeasureEngine
from tuner.database.workdir import JobRecord, WorkDir, read_meta
from tuner.errors import TunerError
from tuner.lowering import LoweringOptions
from tuner.quiet import native_logs_quiet
from tuner.runtime.compiled_model import ModelDescription
from tuner.targets import resolve_target
from tuner.tasks.extraction import extract_tasks, load_model, lower_workload

from .checked_build import CheckedBuild
from .compile import choose_schedules, program_of


def apply(
    work_dir: str | Path,
    model: Any,
    output: str | Path,
    target: str | dict | tvm.target.Target | None = None,
    example_inputs: Sequence[Any] | None = None,
    batch: int | None = None,
    dtype: str | None = None,
    verbose: bool = False,
) -> Path:
    """Compile ``model`` with the best verified schedules tuned in ``work_dir`` and write it to
    ``output`` (a shared library for ``tvm.runtime.load_module``, with its weights and its description
    beside it for ``tuner.load``), then check it against the model's own framework on its example inputs.
    Kernels without a verified schedule, or whose schedule breaks the compile or the model's output,
    keep TVM's default one. TVM's own log lines go to the work dir's ``logs/libraries.log`` unless
    ``verbose``."""
    run_dir, output = WorkDir.existing(work_dir, "apply the schedules of"), Path(output).resolve()
    with native_logs_quiet(verbose) as native_log:
        if os.access(run_dir.path, os.W_OK):
            native_log.keep_in(run_dir.logs)
        return _apply(run_dir, model, output, target, example_inputs, batch, dtype)


def _apply(
    run_dir: WorkDir,
    model: Any,
    output: Path,
    target: str | dict | tvm.target.Target | None,
    example_inputs: Sequence[Any] | None,
    batch: int | None,
    dtype: str | None,
) -> Path:
    db = run_dir.open_database(read_only=True)
    try:
        job = read_meta(db, JobRecord)
        if target is None and job is None:
            raise TunerError(f"{run_dir.database} does not say which target it was tuned for: pass --target")
        tvm_target = resolve_target(target if target is not None else json.loads(job.target))
        workload = load_model(model, example_inputs, batch=batch, dtype=dtype)
        lowering = LoweringOptions.from_record(job.lowering) if job else LoweringOptions()  # as the work dir was tuned
        if lowering.bfloat16:  # checked with bf16's tolerance, whatever dtype the call named
            workload.precision = "bfloat16"
        lowered = lower_workload(workload, tvm_target, lowering)
        tasks = extract_tasks(workload, tvm_target, lowered)
        choices = choose_schedules(db, tasks, tvm_target, verified_only=job.verify if job else True)
    finally:
        db.close()
    if not any(choice.record or choice.beaten for choice in choices):
        tuned_for = job.model if job else "another model"
        raise TunerError(
            f"{run_dir} holds no verified schedule for any of the {len(tasks)} kernels of {workload.name} (it was "
            f"tuned for {tuned_for}): apply it to {tuned_for}, or tune {workload.name} first"
        )
    tuned = sum(1 for choice in choices if choice.record)
    _say(f"{tuned} of {len(tasks)} kernels have verified schedules in {run_dir}")
    judged = [choice.task.name for choice in choices if choice.beaten]
    if judged:
        _say(f"{len(judged)} kernel(s) take their analytic schedule, faster inside the model: {', '.join(judged)}")
    for choice in choices:
        if choice.why_default:
            _say(f"{choice.task.name}: built with TVM's default schedule: {choice.why_default}")
    engine = MeasureEngine(tvm_target, run_dir.path, EngineConfig(build_workers=1))
    try:
        with tempfile.TemporaryDirectory(prefix="tuner-apply-") as scratch:
            untuned = Path(scratch) / "untuned.so"  # compiled only if the check needs it
            with program_of(workload, lowered, Path(scratch)) as program:
                check = CheckedBuild(engine, workload, program, choices, tvm_target, untuned, _say).build(output)
    finally:
        engine.close()
    ModelDescription.of(workload, tvm_target).save(output)
    _say(check.line())
    return output


def _say(line: str) -> None:
    print(f"tuner: {line}", file=sys.stderr, flush=True)
