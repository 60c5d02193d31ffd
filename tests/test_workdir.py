"""The work dir module: its paths, telling a work dir from anything else, the typed meta records
(also as runs before the rename wrote them), and settings objects that a run cannot change."""

import dataclasses

import pytest
import tvm

from costmodel import CandidateFilter, FilterSettings
from measure import Engine, EngineConfig, MeasureEngine
from measure.cluster.engine import ClusterEngine, ClusterOptions
from tuner import TunerError
from tuner.database.workdir import JobRecord, JobTask, ResultRecord, TransferRecord, WorkDir, read_meta, write_meta


def test_a_work_dir_names_its_files_and_is_made_where_asked(tmp_path):
    work_dir = WorkDir.create(tmp_path / "a" / "b", "matmul-128", tvm.target.Target("llvm"))
    assert work_dir.path.is_dir() and work_dir.database == tmp_path / "a" / "b" / "tuning.db"
    assert {work_dir.artifact.name, work_dir.untuned.name, work_dir.cost_model.name} == {
        "model.so",
        "untuned.so",
        "cost_model.ubj",
    }


def test_only_a_dir_with_a_database_is_an_earlier_run(tmp_path):
    with pytest.raises(TunerError, match="cannot report on .*: no such directory; pass the --work-dir"):
        WorkDir.existing(tmp_path / "nowhere", "report on")
    with pytest.raises(TunerError, match=r"holds no tuning database \(tuning.db\)"):
        WorkDir.existing(tmp_path, "report on")
    WorkDir(tmp_path).open_database().close()
    assert WorkDir.existing(tmp_path, "report on").path == tmp_path


def test_meta_records_round_trip_and_read_what_older_runs_wrote(tmp_path):
    db = WorkDir(tmp_path).open_database()
    try:
        job = JobRecord("m", "relax", "{}", {"fold": True}, [["x", [1, 3], "float32"]], [JobTask("t", 1, 2, 3.0)])
        write_meta(db, job)
        write_meta(db, ResultRecord(latency_before=2.0, latency_after=1.0, trials=8, stop_reason="trial budget"))
        assert read_meta(db, JobRecord) == job and read_meta(db, JobRecord).weights == {1: 2}
        assert read_meta(db, ResultRecord).trials == 8 and read_meta(db, TransferRecord) is None
        # before kernel ids had their name, the job's tasks said workload_id; a result lacked the scheduler
        db.set_meta("job", {**job.as_dict(), "tasks": [{"name": "t", "workload_id": 5, "weight": 1, "flops": 0.0}]})
        db.set_meta("result", {"latency_before": 1.0, "latency_after": 0.5, "trials": 4, "future_field": 1})
        assert read_meta(db, JobRecord).tasks == [JobTask("t", 5, 1, 0.0)]
        assert read_meta(db, ResultRecord).scheduler == "gradient"
    finally:
        db.close()


def test_both_engines_implement_the_one_contract(tmp_path):
    target = tvm.target.Target("llvm")
    assert not Engine.__abstractmethods__ - set(vars(MeasureEngine)) - set(vars(Engine))
    for engine in (
        MeasureEngine(target, tmp_path, EngineConfig(build_workers=0)),
        ClusterEngine(target, tmp_path, ClusterOptions("local")),
    ):
        assert isinstance(engine, Engine) and engine.log_dir == tmp_path / "logs"
        engine.close()  # never started: closing is still safe


def test_settings_stay_as_given_while_state_lives_in_its_owner():
    settings = FilterSettings(window=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.window = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        EngineConfig().build_workers = 1
    at_work = CandidateFilter(settings)
    at_work.record("t", [3, 2, 1, 0], [1e-3, 2e-3, 3e-3, 4e-3])
    assert at_work.trust("t") == 1.0 and settings == FilterSettings(window=2)
