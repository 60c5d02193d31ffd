"""The tuning database: SQLite under the work dir, every result committed as it arrives.

Stock TVM can use it directly (``as_tvm_database`` implements MetaSchedule's Database interface,
so ``ms.relax_integration.compile_relax`` and ``ms.tir_integration.compile_tir`` apply it), or take
it away in MetaSchedule's JSON format (``export_json``).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.arg_info import ArgInfo
from tvm.s_tir.meta_schedule.database import PyDatabase, TuningRecord, Workload

from tuner.errors import DatabaseError
from tuner.spaces import metaschedule as msc

SCHEMA = "tensor-tuner/2"
_MIGRATIONS = {"tensor-tuner/1": "ALTER TABLE records ADD COLUMN measurement TEXT"}
_TABLES = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE workloads (id INTEGER PRIMARY KEY, shash TEXT NOT NULL, mod_json TEXT NOT NULL, name TEXT);
CREATE INDEX workloads_by_hash ON workloads(shash);
CREATE TABLE records (
    id INTEGER PRIMARY KEY,
    workload_id INTEGER NOT NULL REFERENCES workloads(id),
    target TEXT NOT NULL,
    candidate TEXT NOT NULL,
    trace TEXT NOT NULL,
    status TEXT NOT NULL,
    latency REAL,
    samples TEXT,
    error TEXT,
    args TEXT,
    build_seconds REAL,
    run_seconds REAL,
    elapsed REAL NOT NULL,
    created REAL NOT NULL,
    verified INTEGER,
    measurement TEXT,  -- JSON: how it was measured (DOP, parallel samples, NVML energy and flags)
    UNIQUE (workload_id, target, candidate)
);
"""


@dataclass
class Record:
    """One measured candidate."""

    id: int
    kernel_id: int
    target: str
    candidate: str
    trace: str
    status: str
    latency: float | None
    samples: list[float]
    error: str | None
    args: list | None
    elapsed: float
    verified: bool | None


def _read_only_uri(path: Path) -> str:
    """An SQLite URI that reads ``path`` without writing anything: a database with a write-ahead log
    beside it (a run in progress, or one that crashed) is opened read-only, which needs that log;
    otherwise as immutable, since a read-only open would create the log files next to it."""
    wal = path.with_name(path.name + "-wal")
    return f"{path.resolve().as_uri()}?mode=ro" + ("" if wal.exists() else "&immutable=1")


class TuningDatabase:
    def __init__(self, path: Path | str, *, read_only: bool = False):
        """Open (creating it if needed) the database at ``path``; ``read_only`` opens an existing
        one, of this schema or an older one, without ever writing to it (nor migrating it)."""
        self.path = Path(path)
        self._mods: dict[int, tvm.IRModule] = {}
        fix = (
            "pass the work dir of a `tuner tune` run"
            if read_only
            else "choose another --work-dir or move the file away"
        )
        self._conn: sqlite3.Connection | None = None
        try:
            if read_only:
                self._conn = sqlite3.connect(_read_only_uri(self.path), uri=True, isolation_level=None)
                self._check_readable(fix)
            else:
                self._conn = sqlite3.connect(str(self.path), isolation_level=None)
                self._check_or_create(fix)
        except (sqlite3.DatabaseError, DatabaseError) as err:
            if self._conn is not None:
                self._conn.close()
            if isinstance(err, DatabaseError):
                raise
            raise DatabaseError(
                f"{self.path} is not a usable tensor-tuner database ({err}); it was left untouched: {fix}"
            ) from None

    def _schema(self) -> tuple[str | None, set[str]]:
        """The schema named in the meta table (None if there is none) and the tables present."""
        tables = {row[0] for row in self._conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        row = self._conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone() if "meta" in tables else None
        return (row[0] if row else None), tables

    def _foreign(self, schema: str | None, tables: set[str], fix: str) -> DatabaseError:
        if schema and schema.startswith(SCHEMA.split("/")[0] + "/"):
            return DatabaseError(
                f"{self.path} was written by a newer tensor-tuner (schema {schema}; this one reads {SCHEMA}); it was "
                "left untouched: "
                "upgrade tensor-tuner to use it, or choose another work dir"
            )
        found = schema or "tables " + (", ".join(sorted(tables)) or "none")
        return DatabaseError(
            f"{self.path} is a SQLite file of something else ({found}), not a {SCHEMA} database; it was left "
            f"untouched: {fix}"
        )

    def _check_readable(self, fix: str) -> None:
        schema, tables = self._schema()
        if schema != SCHEMA and schema not in _MIGRATIONS:
            raise self._foreign(schema, tables, fix)

    def _check_or_create(self, fix: str) -> None:
        schema, tables = self._schema()
        if not tables:
            self._conn.executescript(f"BEGIN; {_TABLES} COMMIT;")
            self._conn.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA,))
        else:
            if schema in _MIGRATIONS:  # an older database of ours: bring it up to date
                self._conn.executescript(
                    f"BEGIN; {_MIGRATIONS[schema]}; UPDATE meta SET value='{SCHEMA}' WHERE key='schema'; COMMIT;"
                )
                schema = SCHEMA
            if schema != SCHEMA:
                raise self._foreign(schema, tables, fix)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")

    def close(self) -> None:
        self._conn.close()

    # -- job description ----------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        self._conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self._conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    # -- workloads ------------------------------------------------------------------------------
    def find_kernel(self, mod: tvm.IRModule) -> int | None:
        """The workload ``mod`` is: structurally equal, and with the same block names (the records'
        traces name blocks: a lowering that renamed them makes a new workload)."""
        shash = msc.structural_key(mod)
        names = None
        for (kernel_id,) in self._conn.execute("SELECT id FROM workloads WHERE shash=?", (shash,)):
            stored = self.kernel_mod(kernel_id)
            if tvm_ffi.structural_equal(stored, mod):
                names = names if names is not None else msc.block_names(mod)
                if msc.block_names(stored) == names:
                    return kernel_id
        return None

    def kernel_id(self, mod: tvm.IRModule, name: str | None = None) -> int:
        """The id of ``mod``'s workload, committing it if new."""
        found = self.find_kernel(mod)
        if found is not None:
            return found
        cursor = self._conn.execute(
            "INSERT INTO workloads (shash, mod_json, name) VALUES (?, ?, ?)",
            (msc.structural_key(mod), tvm.ir.save_json(mod), name),
        )
        self._mods[cursor.lastrowid] = mod
        return cursor.lastrowid

    def kernel_mod(self, kernel_id: int) -> tvm.IRModule:
        if kernel_id not in self._mods:
            (text,) = self._conn.execute("SELECT mod_json FROM workloads WHERE id=?", (kernel_id,)).fetchone()
            self._mods[kernel_id] = tvm.ir.load_json(text)
        return self._mods[kernel_id]

    def kernel_name(self, kernel_id: int) -> str | None:
        (name,) = self._conn.execute("SELECT name FROM workloads WHERE id=?", (kernel_id,)).fetchone()
        return name

    def kernel_ids(self) -> list[int]:
        return [row[0] for row in self._conn.execute("SELECT id FROM workloads ORDER BY id")]

    # -- records --------------------------------------------------------------------------------
    def commit(
        self,
        kernel_id: int,
        target: str,
        candidate: str,
        trace: str,
        status: str,
        samples: list[float] | None = None,
        error: str | None = None,
        args: list | None = None,
        build_seconds: float | None = None,
        run_seconds: float | None = None,
        elapsed: float = 0.0,
        measurement: dict | None = None,
    ) -> int:
        """Store one result durably; a candidate already stored is left as it is."""
        latency = statistics.median(samples) if status == "ok" and samples else None
        cursor = self._conn.execute(
            "INSERT OR IGNORE INTO records (workload_id, target, candidate, trace, status, latency, samples, error, "
            "args,"
            " build_seconds, run_seconds, elapsed, created, measurement) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
            "?, ?)",
            (
                kernel_id,
                target,
                candidate,
                trace,
                status,
                latency,
                json.dumps(samples or []),
                error,
                json.dumps(args) if args is not None else None,
                build_seconds,
                run_seconds,
                elapsed,
                time.time(),
                json.dumps(measurement) if measurement else None,
            ),
        )
        return cursor.lastrowid

    def add_samples(self, record_id: int, samples: list[float], discarded: Sequence[float] = ()) -> None:
        """Attach a re-measurement: the latency becomes the median of the new ``samples``; they are kept, with
        ``discarded`` (a re-timing set aside as interference), after the earlier ones."""
        (old,) = self._conn.execute("SELECT samples FROM records WHERE id=?", (record_id,)).fetchone()
        self._conn.execute(
            "UPDATE records SET samples=?, latency=? WHERE id=?",
            (json.dumps(json.loads(old) + samples + list(discarded)), statistics.median(samples), record_id),
        )

    def set_verified(self, record_id: int, ok: bool, detail: str | None = None) -> None:
        if ok:
            self._conn.execute("UPDATE records SET verified=1 WHERE id=?", (record_id,))
        else:
            self._conn.execute(
                "UPDATE records SET verified=0, status='wrong_result', error=? WHERE id=?", (detail, record_id)
            )

    def count_records(self) -> int:
        (n,) = self._conn.execute("SELECT COUNT(*) FROM records").fetchone()
        return n

    def best(self, kernel_id: int, target: str, k: int = 1) -> list[Record]:
        """The ``k`` fastest successful records of a workload (wrong results excluded)."""
        return self._select(
            "WHERE workload_id=? AND target=? AND status='ok' ORDER BY latency ASC, id ASC LIMIT ?",
            (kernel_id, target, k),
        )

    def best_verified(self, kernel_id: int, target: str) -> Record | None:
        """The fastest record of a workload whose output was checked and matched."""
        found = self._select(
            "WHERE workload_id=? AND target=? AND status='ok' AND verified=1 ORDER BY latency ASC, id ASC LIMIT 1",
            (kernel_id, target),
        )
        return found[0] if found else None

    def count_status(self, kernel_id: int, target: str, status: str) -> int:
        (n,) = self._conn.execute(
            "SELECT COUNT(*) FROM records WHERE workload_id=? AND target=? AND status=?", (kernel_id, target, status)
        ).fetchone()
        return n

    def records(self, target: str | None = None) -> list[Record]:
        if target is None:
            return self._select("ORDER BY id", ())
        return self._select("WHERE target=? ORDER BY id", (target,))

    def targets(self) -> list[str]:
        return [row[0] for row in self._conn.execute("SELECT DISTINCT target FROM records ORDER BY id")]

    def measured_seconds(self, target: str) -> list[tuple[int, float | None, float | None]]:
        """(kernel id, build seconds, run seconds) of each candidate that built and ran for ``target``."""
        return self._conn.execute(
            "SELECT workload_id, build_seconds, run_seconds FROM records WHERE target=? AND status='ok'", (target,)
        ).fetchall()

    def elapsed_so_far(self) -> float:
        (value,) = self._conn.execute("SELECT MAX(elapsed) FROM records").fetchone()
        return float(value or 0.0)

    def _select(self, where: str, params: tuple) -> list[Record]:
        rows = self._conn.execute(
            "SELECT id, workload_id, target, candidate, trace, status, latency, samples, error, args, elapsed, "
            "verified FROM records " + where,
            params,
        )
        return [
            Record(
                id=r[0],
                kernel_id=r[1],
                target=r[2],
                candidate=r[3],
                trace=r[4],
                status=r[5],
                latency=r[6],
                samples=json.loads(r[7] or "[]"),
                error=r[8],
                args=json.loads(r[9]) if r[9] else None,
                elapsed=r[10],
                verified=None if r[11] is None else bool(r[11]),
            )
            for r in rows
        ]

    # -- stock TVM interoperability -----------------------------------------------------------
    def as_tvm_database(self, target: tvm.target.Target) -> ms.Database:
        """This database as a MetaSchedule Database for ``target`` (records of other targets are hidden)."""
        return _MetaScheduleView(self, target)

    def tvm_record(self, record: Record, target: tvm.target.Target) -> TuningRecord:
        mod = self.kernel_mod(record.kernel_id)
        trace = msc.schedule_from_json(mod, record.trace).trace
        args = [ArgInfo.from_json(["TENSOR", dtype, shape]) for dtype, shape in record.args] if record.args else None
        return TuningRecord(trace, Workload(mod), record.samples or None, target, args)

    def export_json(self, directory: Path | str, target: tvm.target.Target) -> tuple[Path, Path]:
        """Write the successful records for ``target`` in MetaSchedule's JSON database format."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = (directory / "database_workload.json", directory / "database_tuning_record.json")
        for path in paths:
            path.unlink(missing_ok=True)
        stock = ms.database.JSONDatabase(str(paths[0]), str(paths[1]), allow_missing=True)
        key = str(target)
        for kernel_id in self.kernel_ids():
            stock.commit_workload(self.kernel_mod(kernel_id))
            for record in self.best(kernel_id, key, k=1_000_000):
                stock.commit_tuning_record(self.tvm_record(record, target))
        return paths


@tvm.ir.utils.derived_object
class _MetaScheduleView(PyDatabase):
    def __init__(self, db: TuningDatabase, target: tvm.target.Target):
        super().__init__()
        self.db = db
        self.target = target
        self.key = str(target)

    def has_workload(self, mod: tvm.IRModule) -> bool:
        return self.db.find_kernel(mod) is not None

    def commit_workload(self, mod: tvm.IRModule) -> Workload:
        self.db.kernel_id(mod)
        return Workload(mod)

    def commit_tuning_record(self, record: TuningRecord) -> None:
        kernel_id = self.db.kernel_id(record.workload.mod)
        sch = tvm.s_tir.Schedule(record.workload.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        samples = [float(s) for s in record.run_secs] if record.run_secs else []
        ok = bool(samples) and max(samples) < 1e9  # MetaSchedule records failures as 1e10 s
        args = [list(a.as_json()[1:]) for a in record.args_info] if record.args_info else None
        self.db.commit(
            kernel_id, self.key, msc.structural_key(sch.mod), msc.trace_to_json(sch), "ok" if ok else "run_error",
            samples=samples if ok else None, args=args,
        )  # fmt: skip

    def get_top_k(self, workload: Workload, top_k: int) -> list[TuningRecord]:
        kernel_id = self.db.find_kernel(workload.mod)
        if kernel_id is None:
            return []
        return [self.db.tvm_record(r, self.target) for r in self.db.best(kernel_id, self.key, top_k)]

    def get_all_tuning_records(self) -> list[TuningRecord]:
        return [self.db.tvm_record(r, self.target) for r in self.db.records(self.key) if r.status == "ok"]

    def __len__(self) -> int:
        return len(self.db.records(self.key))
