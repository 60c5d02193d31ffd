"""Kernels of one kind inside a model learn from each other.

A model of a hundred kernels holds few kinds of them (depthwise and 1x1 convolutions, layer norms,
attention matmuls) at many shapes. Before a task's first batch, the best schedules its siblings in
this run have found (same operator class, ``tuner.tasks.opclass``; closest shape first) are replayed on its
kernel with their tile sizes fitted to its loops, as transfer-tuning does across runs, and measured
first: the task starts where its siblings got to. The cost model is one for the whole run already.
"""

from __future__ import annotations

from collections.abc import Sequence

from tvm.s_tir.schedule import Trace

from tuner.database.database import TuningDatabase
from tuner.spaces import metaschedule as msc

from .task_run import TaskRun

SIBLING_TOP_K = 2  # best schedules taken from each sibling
SIBLING_MAX_SEEDS = 4  # seeds queued for a task


def sibling_traces(run: TaskRun, runs: Sequence[TaskRun], db: TuningDatabase, target_key: str) -> list[Trace]:
    """The best schedules of ``run``'s measured siblings, closest shape first."""
    if run.op is None:
        return []
    siblings = sorted(
        (
            other
            for other in runs
            if other is not run and other.trials > 0 and other.op is not None and other.op.matches(run.op)
        ),
        key=lambda other: run.op.distance(other.op),
    )
    traces = []
    for sibling in siblings:
        for record in db.best(sibling.kernel_id, target_key, SIBLING_TOP_K):
            try:
                traces.append(msc.stored_trace(sibling.task.mod, record.trace))
            except Exception:  # noqa: BLE001 - a trace that no longer reads back is simply not offered
                continue
        if len(traces) >= 2 * SIBLING_MAX_SEEDS:  # some will not apply to this kernel's shape
            break
    return traces
