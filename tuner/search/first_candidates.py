"""A task's first candidates, queued before its first batch: its analytic schedule and the schedules one
step around it (``tuner.spaces.neighbours.analytic_candidates``), then its siblings' best (``siblings``).
The analytic schedule's predicted latency is kept in the database beside its candidate's key, so that the
report can set the prediction against the measurement.
"""

from __future__ import annotations

import tvm

from tuner.database.database import TuningDatabase
from tuner.database.workdir import ANALYTIC_SEEDS_KEY
from tuner.spaces import metaschedule as msc
from tuner.spaces.machine import MachineFacts
from tuner.spaces.neighbours import analytic_candidates
from tuner.spaces.prediction import predict_kernel
from tuner.spaces.retile import adapt_tile

from .siblings import SIBLING_MAX_SEEDS, sibling_traces
from .task_run import TaskRun

ANALYTIC_SEEDS = 4  # the analytic schedule and three around it: what 2 and 4 trials per kernel measure


def queue_first_candidates(
    run: TaskRun, runs: list[TaskRun], db: TuningDatabase, target: tvm.target.Target, facts: MachineFacts | None
) -> str:
    """Queue ``run``'s first candidates; returns what was queued, for its progress line ("" if nothing)."""
    search = run.search
    around = analytic_candidates(run.task.mod, search.spaces, search.postprocs, facts, ANALYTIC_SEEDS)
    configured = search.add_seeds([candidate.sch for candidate in around])
    if around and facts is not None:
        predicted = predict_kernel(run.task.mod, run.task.flops, around[0], target)
        seeds = db.get_meta(ANALYTIC_SEEDS_KEY, {})
        seeds[str(run.kernel_id)] = {
            "candidate": msc.structural_key(around[0].sch.mod),
            "predicted": predicted,
            "tiled": around[0].product,
        }
        db.set_meta(ANALYTIC_SEEDS_KEY, seeds)
    traces = sibling_traces(run, runs, db, str(target))
    used = search.add_transferred(traces, SIBLING_MAX_SEEDS, replay_seed=1, retile=adapt_tile)
    return "".join(f"  {n} {what}" for n, what in ((configured, "analytic"), (len(used), "from sibling kernels")) if n)
