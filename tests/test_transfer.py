"""Transfer-tuning: another run's schedules and cost model, reused on kernels of the same kind."""

import json
import shutil
import sqlite3
import subprocess
import sys

import numpy as np
import pytest
import tvm

from costmodel import CostModel
from tuner import DatabaseError, TunerError, tune
from tuner.database.database import TuningDatabase
from tuner.search.first_candidates import ANALYTIC_SEEDS
from tuner.search.transfer import adapt_tile
from tuner.spaces import metaschedule as msc
from tuner.tasks.opclass import base_name, operator_class
from workloads import get_workload
from workloads.operators import matmul


def _matmul(m, n, k):
    return msc.normalize_prim_func_module(matmul(m, n, k))


def _task(m, n, k, name="matmul"):
    from tuner.tasks.extraction import Task

    return Task(name, _matmul(m, n, k), 1, 2 * m * n * k)


def test_task_names_lose_their_instance_numbers_only():
    assert base_name("fused_batch_norm2_add1_relu2") == "fused_batch_norm_add_relu"
    assert base_name("conv2d16") == base_name("conv2d") == "conv2d"
    assert base_name("fused_matmul_add4") == "fused_matmul_add"
    assert base_name("matmul-128") == "matmul"


def test_kernels_of_one_operator_match_across_shapes_and_others_do_not():
    mm = operator_class(_matmul(128, 128, 128), "matmul-128")
    other_mm = operator_class(_matmul(96, 192, 64), "mm")
    conv_a = operator_class(get_workload("conv2d-resnet18-l2").mod)
    conv_b = operator_class(get_workload("conv2d-resnet50-stem").mod)  # 7x7 stride 2, 3 channels
    depthwise = operator_class(get_workload("depthwise-conv2d-mobilenetv2-b4").mod)
    assert mm.matches(other_mm) and conv_a.matches(conv_b)
    assert (
        mm.matches(operator_class(_matmul(128, 128, 128))) and mm.distance(operator_class(_matmul(128, 128, 128))) == 0
    )
    assert mm.distance(other_mm) > 0
    assert not mm.matches(conv_a) and not conv_a.matches(depthwise)
    fp16 = operator_class(get_workload("matmul-llama2-7b-qproj-fp16").mod)
    assert not fp16.matches(operator_class(get_workload("matmul-llama2-7b-qproj").mod))  # dtypes differ


@pytest.mark.parametrize(
    "decision, extent, expected",
    [
        ([2, 4, 16], 128, [2, 4, 16]),  # fits already
        ([2, 4, 16], 512, [8, 4, 16]),  # larger: the outermost factor takes the rest
        ([2, 4, 16], 64, [1, 4, 16]),  # smaller
        ([4, 2, 1, 8], 112, [7, 2, 1, 8]),
        ([1, 4, 7, 1], 32, [1, 4, 8, 1]),  # a factor that does not divide: the nearest that does
        ([2, 4, 16], 100, [1, 5, 20]),
        ([4, 2, 8], 7, [1, 1, 7]),
        ([1, 1, 64], 96, [2, 1, 48]),  # the innermost stays within the limit (64): not 96
    ],
)
def test_a_tiling_is_adapted_to_a_new_extent(decision, extent, expected):
    adapted = adapt_tile(decision, extent, max_innermost=64)
    assert adapted == expected and int(np.prod(adapted)) == extent


def test_a_matmul_schedule_replays_on_another_shape_and_computes_the_same(llvm_target):
    source = _matmul(128, 128, 128)
    context = msc.make_context(source, llvm_target, 1)
    schedules = [
        msc.sample(source, space, seed, msc.postprocessors(context))
        for seed, space in enumerate(msc.design_spaces(context), 1)
    ]
    stored = [msc.trace_to_json(sch) for sch in schedules if sch is not None]
    target = _matmul(96, 200, 48)
    postprocs = msc.postprocessors(msc.make_context(target, llvm_target, 1))
    for trace_json in stored:
        trace = msc.stored_trace(source, trace_json)
        sch = msc.replay(target, trace, 1, postprocs, retile=adapt_tile)
        assert sch is not None
        tuned, replayed = _tiles(trace), _tiles(sch.trace)
        assert sorted(int(np.prod(t)) for t in replayed) == [48, 96, 200]
        assert replayed == [adapt_tile(old, int(np.prod(new)), 64) for old, new in zip(tuned, replayed, strict=True)]
        lib = tvm.compile(sch.mod, target=llvm_target)
        a, b = np.random.rand(96, 48).astype("float32"), np.random.rand(48, 200).astype("float32")
        c = tvm.runtime.tensor(np.zeros((96, 200), "float32"))
        lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
        np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4)


def _tiles(trace):
    return [[int(f) for f in trace.get_decision(inst)] for inst in trace.insts if inst.kind.name == "SamplePerfectTile"]


def _files(directory):
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def test_transferred_schedules_are_measured_first(tuned_matmul, tmp_path, llvm_target, capsys):
    source_dir = tuned_matmul.work_dir
    before = _files(source_dir)
    target = matmul(96, 192, 64)
    result = tune(target, trials=8, work_dir=tmp_path / "run", batch_size=8, transfer_from=[source_dir], verify=False)
    err = capsys.readouterr().err
    assert f"from 1 source kernels for 1 of 1 tasks (source: {source_dir})" in err
    assert f"cost model warm-started with 16 measurements from {source_dir}" in err
    assert _files(source_dir) == before  # the source work dir is only read

    db = TuningDatabase(result.database_path)
    try:
        summary = db.get_meta("transfer")
        first_batch = {r.candidate for r in db.records()[:8]}  # committed as they finish, in any order
    finally:
        db.close()
    assert summary["cost_model_samples"] == 16
    # the source's best schedules, adapted to the new shape, are the first measured
    source_db = TuningDatabase(tuned_matmul.database_path, read_only=True)
    try:
        best = source_db.best(source_db.kernel_ids()[0], str(llvm_target), 8)
        source_mod = source_db.kernel_mod(best[0].kernel_id)
    finally:
        source_db.close()
    mod = msc.normalize_prim_func_module(target)
    postprocs = msc.postprocessors(msc.make_context(mod, llvm_target, 1))
    seeds = {
        msc.structural_key(msc.replay(mod, msc.stored_trace(source_mod, r.trace), 1, postprocs, retile=adapt_tile).mod)
        for r in best
    }
    assert summary["sources"][0]["schedules"] == summary["seeds_per_task"]["primfunc"] == len(seeds)
    assert seeds <= first_batch


def test_a_source_without_matching_kernels_says_so_and_tuning_goes_on(tuned_matmul, tmp_path, capsys):
    from faulty import copy

    result = tune(
        copy(64), trials=4, work_dir=tmp_path / "run", batch_size=4, transfer_from=[tuned_matmul.work_dir], verify=False
    )
    err = capsys.readouterr().err
    assert f"transfer: no kernel in {tuned_matmul.work_dir} matches this model's kernels; tuning normally" in err
    assert result.trials > 0 and result.tasks[0].best_latency is not None


def test_a_corrupt_or_foreign_source_is_refused_and_left_untouched(tmp_path):
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "tuning.db").write_bytes(b"not a database at all" * 100)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    with sqlite3.connect(foreign / "tuning.db") as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("INSERT INTO meta VALUES ('schema', 'someone-else/3')")
    conn.close()
    for source, reason in ((corrupt, "not a usable tensor-tuner database"), (foreign, "someone-else/3")):
        before = _files(source)
        with pytest.raises(DatabaseError, match="left untouched") as err:
            tune("matmul-128", trials=4, work_dir=tmp_path / "run", transfer_from=[source])
        assert reason in str(err.value) and str(source / "tuning.db") in str(err.value)
        assert _files(source) == before
    assert not (tmp_path / "run").exists()  # refused before anything was set up


def test_a_missing_source_names_the_path_and_the_fix(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for source in (tmp_path / "nowhere", empty):
        with pytest.raises(TunerError, match="--work-dir of an earlier `tuner tune` run") as err:
            tune("matmul-128", trials=4, work_dir=tmp_path / "run", transfer_from=[source])
        assert f"cannot transfer from {str(source)!r}" in str(err.value) and "\n" not in str(err.value)


def test_a_cost_model_from_another_run_warm_starts_this_one_without_its_schedules(tuned_matmul, tmp_path, capsys):
    source_dir = tuned_matmul.work_dir
    before = _files(source_dir)
    result = tune(
        matmul(96, 192, 64),
        trials=8,
        work_dir=tmp_path / "run",
        batch_size=8,
        cost_model_from=[source_dir],
        verify=False,
    )
    assert f"cost model warm-started with 16 measurements from {source_dir}" in capsys.readouterr().err
    assert _files(source_dir) == before
    db = TuningDatabase(result.database_path)
    try:
        assert db.get_meta("cost_model_from") == {"samples": 16} and db.get_meta("transfer") is None
    finally:
        db.close()
    # the first batch the search proposed (after the task's analytic schedule and its neighbours, measured alone)
    # was judged by a trained model (a cold run's first batch is not)
    batches = [json.loads(line) for line in (result.work_dir / "logs" / "costmodel.jsonl").read_text().splitlines()]
    assert [batch["trials"] for batch in batches[:2]] == [ANALYTIC_SEEDS, 8] and batches[1]["tau"] is not None


def test_a_cost_model_source_without_a_saved_model_is_refused_before_anything_is_set_up(tuned_matmul, tmp_path):
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copy(tuned_matmul.database_path, unfinished / "tuning.db")  # a run that stopped before saving its model
    cases = [
        (tmp_path / "nowhere", "no such directory"),
        (unfinished, "holds no cost_model.ubj with its training data"),
    ]
    for source, reason in cases:
        with pytest.raises(TunerError, match=reason) as err:
            tune("matmul-128", trials=4, work_dir=tmp_path / "run", cost_model_from=[source])
        assert f"cannot warm-start the cost model from {str(source)!r}" in str(err.value)
    assert not (tmp_path / "run").exists()


def _trained_model(rng):
    model = CostModel(seed=3)
    x = rng.random((60, 12)).astype("float32")
    model.add("1", x[:40], list(1.0 + x[:40, 0]))
    model.add("2", x[40:], [None, *list(2.0 + x[41:, 1])])
    assert model.fit()
    return model


def test_a_cost_model_saved_in_one_run_loads_in_another_and_predicts_the_same(tmp_path):
    rng = np.random.default_rng(0)
    model = _trained_model(rng)
    path = tmp_path / "cost_model.ubj"
    model.save(path)
    x = rng.random((20, 12)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    script = (
        "import sys, numpy as np; from costmodel import CostModel; m = CostModel(); m.load(sys.argv[1]); "
        "np.save(sys.argv[2], m.predict(np.load(sys.argv[3])))"
    )
    args = [sys.executable, "-c", script, str(path), str(tmp_path / "p.npy"), str(tmp_path / "x.npy")]
    subprocess.run(args, check=True)
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), model.predict(x), rtol=1e-6)

    warm = CostModel(seed=3)  # trained on the same data: the same model
    assert warm.warm_start(path, prefix="other:", width=12) == 60 and warm.trained
    np.testing.assert_allclose(warm.predict(x), model.predict(x), rtol=1e-5)
    with pytest.raises(ValueError, match="12 features per sample, not 493"):
        CostModel().warm_start(path, prefix="other:", width=493)


def test_borrowed_data_does_not_delay_learning_from_this_run(tmp_path):
    rng = np.random.default_rng(1)
    _trained_model(rng).save(tmp_path / "m.ubj")
    model = CostModel()
    model.warm_start(tmp_path / "m.ubj", prefix="other:")
    model.add("own", rng.random((8, 12)).astype("float32"), list(rng.random(8) + 1))
    assert model.update()  # 8 samples of its own after 60 borrowed: retrained at once, not after 6 more
    assert not model.update()


def _transfer_from(source, loop, model, target) -> None:
    from tuner.progress import Progress
    from tuner.search.transfer import read_sources, transfer

    transfer(read_sources([source.work_dir]), loop, model, target, Progress(enabled=False))


def test_the_model_waits_for_every_tasks_first_transferred_schedules_before_it_retrains(
    tuned_matmul, tmp_path, engine, llvm_target
):
    from tuner.search.loop import TuningLoop
    from tuner.search.loop_config import LoopConfig
    from tuner.search.objectives import Objectives

    tasks = [_task(*shape, name=f"matmul{i}") for i, shape in enumerate([(96, 192, 64), (64, 96, 128)])]
    model = CostModel()
    loop = TuningLoop(
        tasks, llvm_target, TuningDatabase(tmp_path / "tuning.db"), engine, model, config=LoopConfig(batch_size=2)
    )
    _transfer_from(tuned_matmul, loop, model, llvm_target)
    assert (
        all(run.search.seeds_waiting for run in loop.runs) and model.trained
    )  # warm-started on the source's 16 measurements
    loop._tune_batch(0, 2, Objectives(), None)
    assert model._trained_on == 0  # task 1 has not measured its transferred schedules yet
    loop._tune_batch(1, 2, Objectives(), None)
    assert all(run.search.seeds_waiting for run in loop.runs)  # more are queued than one batch takes
    assert model._trained_on == 4  # but every task has measured some: it learns from them


def test_the_filter_never_drops_a_transferred_schedule(tuned_matmul, tmp_path, engine, llvm_target):
    from costmodel import FilterSettings
    from tuner.search.loop import TuningLoop
    from tuner.search.loop_config import LoopConfig
    from tuner.search.objectives import Objectives

    # trusts any model fully and calls anything rated below the task's best poor
    eager = FilterSettings(min_tau=-1.0, full_trust_tau=-0.9, poor_ratio=1.0001, max_drop=0.9, exploration=0.01)
    model = CostModel()
    db = TuningDatabase(tmp_path / "tuning.db")
    loop = TuningLoop(
        [_task(96, 192, 64)], llvm_target, db, engine, model, config=LoopConfig(batch_size=16, filter=eager)
    )
    loop.filter.record("elsewhere", [3, 2, 1, 0], [1e-3, 2e-3, 3e-3, 4e-3])  # trust a new task borrows: 1
    _transfer_from(tuned_matmul, loop, model, llvm_target)
    seeds = len(loop.runs[0].search._seeds)
    assert seeds > 2 and loop.filter.trust(loop.runs[0].group) == 1.0
    loop._tune_batch(0, 16, Objectives(), None)
    # transfer-tuning measures what it replays, all of it (and the task's analytic candidates, queued first)
    assert loop.ledger.dropped == 0 and len(db.records()) == seeds + ANALYTIC_SEEDS
