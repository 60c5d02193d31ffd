"""The tuning database: durable, resumable, and usable by stock TVM."""

import pickle
import sqlite3

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from tuner.database.database import TuningDatabase
from tuner.errors import DatabaseError
from workloads import get_workload


def test_ir_modules_pickle_and_serialize():
    """apache-tvm-ffi 0.1.15 segfaults here; this catches an upgrade that brings it back."""
    mod = get_workload("matmul-128").mod
    assert tvm_ffi.structural_equal(pickle.loads(pickle.dumps(mod)), mod)
    assert tvm_ffi.structural_equal(tvm.ir.load_json(tvm.ir.save_json(mod)), mod)


def _run_and_compare(lib, n=128):
    a, b = np.random.rand(n, n).astype("float32"), np.random.rand(n, n).astype("float32")
    c = tvm.runtime.tensor(np.zeros((n, n), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4)


def test_stock_tvm_applies_our_database(tuned_matmul, llvm_target):
    mod = get_workload("matmul-128").mod
    db = TuningDatabase(tuned_matmul.database_path)
    try:
        best = db.best(db.find_kernel(mod), str(llvm_target), 1)[0]
        sch = ms.tir_integration.compile_tir(db.as_tvm_database(llvm_target), mod, llvm_target)
        assert sch is not None
        from tuner.spaces.metaschedule import structural_key

        assert structural_key(sch.mod) == best.candidate
        _run_and_compare(tvm.compile(sch.mod, target=llvm_target))
    finally:
        db.close()


def test_exported_json_is_read_by_stock_metaschedule(tuned_matmul, llvm_target, tmp_path):
    db = TuningDatabase(tuned_matmul.database_path)
    try:
        db.export_json(tmp_path, llvm_target)
        n_ok = len([r for r in db.records(str(llvm_target)) if r.status == "ok"])
    finally:
        db.close()
    stock = ms.database.JSONDatabase(work_dir=str(tmp_path))
    assert len(stock.get_all_tuning_records()) == n_ok
    sch = ms.tir_integration.compile_tir(stock, get_workload("matmul-128").mod, llvm_target)
    _run_and_compare(tvm.compile(sch.mod, target=llvm_target))


def test_every_result_is_committed_with_failures_and_reasons(tmp_path):
    db = TuningDatabase(tmp_path / "t.db")
    wid = db.kernel_id(get_workload("matmul-128").mod, "mm")
    db.commit(wid, "llvm", "k1", "[]", "ok", samples=[2e-3, 1e-3, 3e-3])
    db.commit(wid, "llvm", "k2", "[]", "build_timeout", error="build timed out after 10.0 s")
    db.commit(wid, "llvm", "k1", "[]", "ok", samples=[9.0])  # a candidate is stored once
    db.close()
    with sqlite3.connect(tmp_path / "t.db") as conn:  # a fresh connection sees both: nothing was buffered
        rows = conn.execute("SELECT candidate, status, latency, error FROM records ORDER BY id").fetchall()
    assert rows == [("k1", "ok", 2e-3, None), ("k2", "build_timeout", None, "build timed out after 10.0 s")]


def test_a_foreign_or_corrupt_file_is_refused_and_left_untouched(tmp_path):
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"not a database at all" * 100)
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE people (name TEXT)")
    for path in (corrupt, foreign):
        before = path.read_bytes()
        with pytest.raises(DatabaseError, match="left untouched"):
            TuningDatabase(path)
        assert path.read_bytes() == before


def test_a_first_version_database_is_brought_up_to_date_keeping_its_records(tmp_path):
    db = TuningDatabase(tmp_path / "tuning.db")
    wid = db.kernel_id(get_workload("matmul-128").mod, "mm")
    db.commit(wid, "llvm", "k1", "[]", "ok", samples=[1e-3])
    db.close()
    conn = sqlite3.connect(tmp_path / "tuning.db")  # as the first schema left it
    conn.executescript(
        "ALTER TABLE records DROP COLUMN measurement; UPDATE meta SET value='tensor-tuner/1' WHERE key='schema';"
    )
    conn.close()
    db = TuningDatabase(tmp_path / "tuning.db")
    db.commit(wid, "llvm", "k2", "[]", "ok", samples=[2e-3], measurement={"dop": 2, "parallel_samples": [2.2e-3]})
    assert [r.candidate for r in db.records()] == ["k1", "k2"]
    row = db._conn.execute("SELECT measurement FROM records WHERE candidate='k2'").fetchone()
    assert '"dop": 2' in row[0]
