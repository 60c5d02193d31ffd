"""What the loop records of its batches: each result in the work dir's database, the filter's summary for a
batch's progress line, the cost model's rank quality (``costmodel.jsonl``) and the batch's timeline through
the engine (``batches.jsonl``); and the run given up where nothing measured has worked."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from costmodel import CandidateFilter, FilterDecision, FilterLedger, RankQuality
from measure import MeasureResult
from tuner.database.database import TuningDatabase
from tuner.database.workdir import stop_on_storage_failure
from tuner.errors import TunerError

from .in_flight import Batch
from .task_search import Candidate


def record_result(
    db: TuningDatabase, kernel_id: int, target_key: str, candidate: Candidate, result: MeasureResult, elapsed: float
) -> None:
    """``result`` committed as ``candidate``'s record; a failure to store it ends the run."""
    if not result.ok:
        stop_on_storage_failure(result.error)
    db.commit(
        kernel_id,
        target_key,
        candidate.key,
        candidate.trace_json,
        result.status,
        samples=result.samples,
        error=result.error,
        args=result.args,
        build_seconds=result.build_seconds,
        run_seconds=result.run_seconds,
        elapsed=elapsed,
        measurement=result.measurement_details(),
    )


def give_up_if_nothing_works(successes: int, failures: Counter[str], give_up_after: int, log_dir: Path) -> None:
    """Raise where ``give_up_after`` candidates have failed and none has worked yet."""
    failed = sum(failures.values())
    if successes == 0 and failed >= give_up_after:
        reason, count = failures.most_common(1)[0]
        raise TunerError(
            f"all {failed} candidates measured so far failed ({count} with {reason}); stopping rather than "
            f"spending the rest of the budget: see the worker logs in {log_dir}"
        )


def filter_summary(decision: FilterDecision, quality: RankQuality, ledger: FilterLedger) -> str:
    tau = f"  model tau {quality.tau:+.2f}" if quality.tau is not None else ""
    if not ledger.dropped:
        return tau
    return (
        f"{tau}  filtered {len(decision.dropped)} "
        f"(total {ledger.dropped}/{ledger.proposed}, ~{ledger.seconds_saved:.0f} s saved)"
    )


def write_batch_logs(
    quality_log: Path,
    batch_log: Path,
    batch: Batch,
    quality: RankQuality,
    candidate_filter: CandidateFilter,
    trials_done: int,
    pipelined: bool,
    waited: float,
) -> None:
    """One line each to ``quality_log`` (the model's rank quality and the filter's state) and ``batch_log``
    (when the batch went to the engine, when its first and last results came out, how long the loop waited)."""
    run, decision = batch.run, batch.decision
    entry = {"time": time.time(), "task": run.task.name, "trials": trials_done, **quality.as_dict()}
    entry |= {
        "pooled_tau": candidate_filter.rank_quality(run.group),
        "trust": decision.trust,
        "threshold": decision.threshold,
        "dropped": len(decision.dropped),
        "explored": len(decision.explored),
    }
    measuring = batch.measuring
    timeline = {
        "time": time.time(),
        "task": run.task.name,
        "candidates": len(batch.candidates),
        "pipelined": pipelined,
        "submitted": measuring.submitted,
        "first_result": measuring.first_result,
        "last_result": measuring.last_result,
        "waited": waited,
    }
    quality_log.parent.mkdir(parents=True, exist_ok=True)
    for path, line in ((quality_log, entry), (batch_log, timeline)):
        with open(path, "a") as log:
            log.write(json.dumps(line) + "\n")
