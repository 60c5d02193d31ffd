"""The final choice's re-timing: one far slower than tuning measured is a burst of interference, timed again;
the re-timed candidates are ranked by their re-timings, before any candidate timed at another moment."""

from __future__ import annotations

import json
import sqlite3
import statistics

import faulty
from tvm.s_tir import Schedule

from measure import MeasureInput, TimingConfig
from tuner.database.database import TuningDatabase
from tuner.progress import Progress
from tuner.search.final_choice import FinalChoice
from tuner.search.kernel_costs import KernelCosts
from tuner.search.retiming import SUSPECT_RATIO, faster, retime, suspect
from tuner.search.scheduler import TaskProgress
from tuner.search.task_run import TaskRun
from tuner.spaces import metaschedule as msc
from tuner.tasks.extraction import Task

TIMING = TimingConfig(min_repeats=3, max_repeats=5, budget_seconds=0.05)
BURST = [5.98e-3] * 22  # SqueezeNet's 3.6-us concatenation, re-timed while something else held a core
CALM = [3.6e-6, 3.5e-6, 3.7e-6]


def test_a_retiming_far_slower_than_tuning_is_suspect_and_the_faster_of_two_is_kept():
    assert suspect(BURST, 3.6e-6)
    assert not suspect(CALM, 3.6e-6)
    assert not suspect([SUSPECT_RATIO * 3.6e-6], 3.6e-6)
    assert faster(BURST, CALM).samples == CALM and faster(BURST, CALM).discarded == BURST
    assert faster(CALM, BURST).samples == CALM and faster(CALM, BURST).discarded == BURST


def test_only_a_suspect_retiming_is_timed_again(engine):
    inputs = [MeasureInput(f"copy{i}", faulty.copy(64 * (i + 1))) for i in range(2)]
    # copy0's tuned latency is below what any call takes: its re-timing looks like a burst
    retimed = dict(retime(engine, inputs, {"copy0": 1e-12, "copy1": 1.0}, TIMING))
    assert set(retimed) == {"copy0", "copy1"}
    assert retimed["copy1"].samples and retimed["copy1"].discarded == []
    assert retimed["copy0"].samples and retimed["copy0"].discarded
    assert statistics.median(retimed["copy0"].samples) <= statistics.median(retimed["copy0"].discarded)


def test_a_discarded_retiming_is_kept_in_the_record_but_is_not_its_latency(tmp_path):
    db = TuningDatabase(tmp_path / "t.db")
    wid = db.kernel_id(faulty.copy(64), "copy")
    db.commit(wid, "llvm", "k1", "[]", "ok", samples=[3.7e-6, 3.6e-6])
    (record,) = db.best(wid, "llvm")
    db.add_samples(record.id, CALM, BURST)
    (record,) = db.best(wid, "llvm")
    assert record.latency == statistics.median(CALM)
    db.close()
    with sqlite3.connect(tmp_path / "t.db") as conn:
        (samples,) = conn.execute("SELECT samples FROM records WHERE id=?", (record.id,)).fetchone()
    assert json.loads(samples) == [3.7e-6, 3.6e-6, *CALM, *BURST]


def _copy_split(mod, factor: int) -> str:
    sch = Schedule(mod)
    (loop,) = sch.get_loops(sch.get_sblock("b"))
    sch.split(loop, [None, factor])
    return msc.trace_to_json(sch)


def test_the_re_timed_candidates_are_ranked_by_their_re_timings_not_against_older_latencies(tmp_path, engine):
    mod = faulty.copy(4096)
    db = TuningDatabase(tmp_path / "t.db")
    kernel_id, target = db.kernel_id(mod, "copy"), str(engine.target)
    # "a" and "b" read fastest while tuning, "c" slower: tuning times taken at another speed of the machine than
    # the final choice's (here one no machine has, 1 ns for a 16 kB copy). Their re-timings, microseconds, are
    # slower than c's old figure, which was not taken beside them and must not win against them.
    for candidate, factor, latency in (("a", 4, 1e-9), ("b", 8, 1.1e-9), ("c", 16, 1e-8)):
        db.commit(kernel_id, target, candidate, _copy_split(mod, factor), "ok", samples=[latency])
    run = TaskRun(Task("copy", mod, 1, 0.0), kernel_id, None, TaskProgress(weight=1, best=1e-9), None)
    choice = FinalChoice(db, engine, target, 2, TIMING, verify=True, progress=Progress(enabled=False))
    choice.choose([run], KernelCosts(), model=None)
    assert run.best is not None and run.best.candidate in {"a", "b"} and run.best.verified
    assert run.best.latency > 1e-8  # its re-timing, not what tuning read
    assert db.best_verified(kernel_id, target).candidate == run.best.candidate  # what compile will take


def test_an_earlier_runs_choice_is_re_timed_beside_the_top_so_compile_takes_the_final_choice(tmp_path, engine):
    mod = faulty.copy(4096)
    db = TuningDatabase(tmp_path / "t.db")
    kernel_id, target = db.kernel_id(mod, "copy"), str(engine.target)
    # "old": an earlier run's verified choice, its latency taken then; this run's "a" and "b" read faster while
    # tuning and are the top two re-timed. Left as it stands, old's figure would beat their re-timings in compile.
    db.commit(kernel_id, target, "old", _copy_split(mod, 16), "ok", samples=[1e-8])
    (old,) = db.best(kernel_id, target, 1)
    db.set_verified(old.id, True)
    for candidate, factor, latency in (("a", 4, 1e-9), ("b", 8, 1.1e-9)):
        db.commit(kernel_id, target, candidate, _copy_split(mod, factor), "ok", samples=[latency])
    run = TaskRun(Task("copy", mod, 1, 0.0), kernel_id, None, TaskProgress(weight=1, best=1e-9), None)
    choice = FinalChoice(db, engine, target, 2, TIMING, verify=True, progress=Progress(enabled=False))
    choice.choose([run], KernelCosts(), model=None)
    records = {r.candidate: r for r in db.best(kernel_id, target, 3)}
    assert records["old"].latency > 1e-8  # re-timed beside the others
    assert run.best is not None and db.best_verified(kernel_id, target).candidate == run.best.candidate
