"""``tuner apply``: compile a model with the schedules a work dir holds."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tvm

from measure import EngineConfig, MeasureEngine

from .compile import best_schedules, compile_workload
from .errors import TunerError
from .lowering import LoweringOptions
from .targets import resolve_target
from .tasks import extract_tasks, load_model, lower_workload
from .workdir import JobRecord, WorkDir, read_meta


def apply(
    work_dir: str | Path,
    model: Any,
    output: str | Path,
    target: str | dict | tvm.target.Target | None = None,
    example_inputs: Sequence[Any] | None = None,
    batch: int | None = None,
    dtype: str | None = None,
) -> Path:
    """Compile ``model`` with the best schedules tuned in ``work_dir`` and write it to ``output``
    (a shared library for ``tvm.runtime.load_module``). Kernels without a tuned schedule keep
    TVM's default one."""
    run_dir, output = WorkDir.existing(work_dir, "apply the schedules of"), Path(output).resolve()
    db = run_dir.open_database(read_only=True)
    try:
        job = read_meta(db, JobRecord)
        if target is None and job is None:
            raise TunerError(f"{run_dir.database} does not say which target it was tuned for: pass --target")
        tvm_target = resolve_target(target if target is not None else json.loads(job.target))
        workload = load_model(model, example_inputs, batch=batch, dtype=dtype)
        lowering = LoweringOptions.from_record(job.lowering) if job else LoweringOptions()  # as the work dir was tuned
        lowered = lower_workload(workload, tvm_target, lowering)
        tasks = extract_tasks(workload, tvm_target, lowered)
        schedules = best_schedules(db, tasks, tvm_target)
    finally:
        db.close()
    if not schedules:
        tuned_for = job.model if job else "another model"
        raise TunerError(
            f"{work_dir} holds no tuned schedule for any of the {len(tasks)} kernels of {workload.name} (it was tuned "
            f"for {tuned_for}): "
            f"apply it to {tuned_for}, or tune {workload.name} first"
        )
    print(f"tuner: {len(schedules)} of {len(tasks)} kernels have tuned schedules in {work_dir}", file=sys.stderr)
    engine = MeasureEngine(tvm_target, run_dir.path, EngineConfig(build_workers=1))
    try:
        return compile_workload(engine, workload, lowered, schedules, output)
    finally:
        engine.close()
