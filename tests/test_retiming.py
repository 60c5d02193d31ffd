"""The final choice's re-timing: one far slower than tuning measured is a burst of interference, timed again."""

from __future__ import annotations

import json
import sqlite3
import statistics

import faulty

from measure import MeasureInput, TimingConfig
from tuner.database.database import TuningDatabase
from tuner.search.retiming import SUSPECT_RATIO, faster, retime, suspect

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
