"""The work dir: what a run keeps in it and under which names, making it, opening its database
read-only or for writing, the job records the database's meta table holds, and one tuner at a time
in it.

The lock is an OS-level one on a file inside the dir: ``flock`` is released by the kernel when its
holder exits in any way, SIGKILL included, so a dead holder never leaves a stale lock behind; the
file keeps the holder's pid and command line only so that a second tuner can say who holds it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TypeVar

from tvm.target import Target

from tuner.errors import TunerError

from .database import TuningDatabase

DATABASE_FILE = "tuning.db"
ARTIFACT_FILE = "model.so"
UNTUNED_FILE = "untuned.so"  # the same lowering with TVM's default schedules: what tuning is measured against
COST_MODEL_FILE = "cost_model.ubj"
LOCK_FILE = ".tuner.lock"


class WorkDir:
    """A run's folder: ``WorkDir.create`` for a run that writes to it, ``WorkDir.existing`` for one
    that reads what an earlier run wrote."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    database = property(lambda self: self.path / DATABASE_FILE)
    artifact = property(lambda self: self.path / ARTIFACT_FILE)
    untuned = property(lambda self: self.path / UNTUNED_FILE)
    cost_model = property(lambda self: self.path / COST_MODEL_FILE)
    logs = property(lambda self: self.path / "logs")

    @classmethod
    def create(cls, path: str | Path | None, name: str, target: Target) -> WorkDir:
        """The work dir of a run (default: tuner-runs/NAME-KIND), made if needed and checked writable."""
        path = Path(path) if path is not None else Path("tuner-runs") / f"{name}-{target.kind.name}"
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            raise TunerError(
                f"cannot write to work dir {str(path)!r} ({err.strerror or err}): choose a directory you can write to"
            ) from None
        return cls(path)

    @classmethod
    def existing(cls, path: str | Path, purpose: str) -> WorkDir:
        """An earlier run's work dir, to read for ``purpose`` (e.g. "transfer from"); a TunerError
        naming the fix where ``path`` is not one."""
        work_dir = cls(path)
        if not work_dir.path.is_dir():
            problem = "no such directory"
        elif not work_dir.database.is_file():
            problem = f"it holds no tuning database ({DATABASE_FILE})"
        else:
            return work_dir
        raise TunerError(
            f"cannot {purpose} {str(work_dir.path)!r}: {problem}; pass the --work-dir of an earlier `tuner tune` run"
        )

    def open_database(self, *, read_only: bool = False) -> TuningDatabase:
        """The tuning database, for writing (created if needed) or read-only (never written to)."""
        return TuningDatabase(self.database, read_only=read_only)

    def lock(self) -> WorkDirLock:
        return WorkDirLock(self.path)


# -- the job records in the database's meta table ------------------------------------------------
Meta = TypeVar("Meta", bound="_MetaRecord")


class _MetaRecord:
    """A dataclass stored as JSON under ``KEY`` in the meta table; fields a newer or older run did
    not write take their defaults."""

    KEY = ""

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls: type[Meta], data: dict) -> Meta:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def read_meta(db: TuningDatabase, record: type[Meta]) -> Meta | None:
    data = db.get_meta(record.KEY)
    return None if data is None else record.from_dict(data)


def write_meta(db: TuningDatabase, record: _MetaRecord) -> None:
    db.set_meta(record.KEY, record.as_dict())


@dataclass(frozen=True)
class JobTask:
    name: str
    kernel_id: int  # the task's kernel in the database
    weight: int  # launches per model run
    flops: float

    @classmethod
    def from_dict(cls, data: dict) -> JobTask:
        kernel_id = data["kernel_id"] if "kernel_id" in data else data["workload_id"]  # its name until 0.1
        return cls(data["name"], kernel_id, data["weight"], data["flops"])


@dataclass(frozen=True)
class JobRecord(_MetaRecord):
    """What was tuned: the model, the target and the tasks (written when the tasks are known)."""

    KEY = "job"
    model: str
    kind: str  # "relax" (a model) or "tir" (a kernel)
    target: str  # the target's JSON
    lowering: dict = field(default_factory=dict)  # LoweringOptions.as_dict()
    inputs: list = field(default_factory=list)  # [name, shape, dtype] per input
    tasks: list[JobTask] = field(default_factory=list)
    cold_cache: bool = False  # CPU kernels timed with their arguments flushed from the caches
    verify: bool = True  # only schedules whose output was checked reach a compiled model

    @classmethod
    def from_dict(cls, data: dict) -> JobRecord:
        return super().from_dict({**data, "tasks": [JobTask.from_dict(t) for t in data.get("tasks", [])]})

    @property
    def weights(self) -> dict[int, int]:
        return {t.kernel_id: t.weight for t in self.tasks}


@dataclass(frozen=True)
class ResultRecord(_MetaRecord):
    """How the last run ended."""

    KEY = "result"
    latency_before: float | None = None  # seconds per model run with TVM's default schedules
    latency_after: float | None = None  # and tuned
    trials: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # per phase
    stop_reason: str | None = None
    scheduler: str = "gradient"
    device_seconds: float = 0.0  # of the measure phase, the device in candidates' timed regions
    check: dict | None = None  # the compiled model against the model's own framework (tuner.compile.check.ModelCheck)
    fell_back: dict[str, str] = field(default_factory=dict)  # kernel name: why it keeps TVM's default schedule
    kernels: dict[str, dict] = field(default_factory=dict)  # kernel name: tuner.compile.figures.KernelFigures
    machine_speed: float | None = None  # against its calibration, while the kernels were timed in the model


@dataclass(frozen=True)
class TransferRecord(_MetaRecord):
    """What transfer-tuning brought to the run (``tuner.search.transfer``)."""

    KEY = "transfer"
    sources: list[dict] = field(default_factory=list)  # per source work dir: schedules, kernels, tasks seeded
    seeds_per_task: dict[str, int] = field(default_factory=dict)
    cost_model_samples: int = 0


@dataclass(frozen=True)
class CostModelSourceRecord(_MetaRecord):
    """Measurements of earlier runs (``cost_model_from``) the cost model was warm-started with."""

    KEY = "cost_model_from"
    samples: int = 0


# The filter's ledger (``costmodel.FilterLedger.as_dict``) and its judged batches
# (``CandidateFilter.state``): written after every batch, read back on resume.
FILTER_LEDGER_KEY = "trimmer"
FILTER_STATE_KEY = "trimmer_judged"
# Each task's analytic schedule as the search measured it first: {kernel id: {"candidate": its structural
# key, "predicted": seconds by the analytic model}}, for the report's predicted against measured.
ANALYTIC_SEEDS_KEY = "analytic_seeds"
# Kernels that keep their analytic schedule because it ran faster inside the model than their best record
# (``tuner.compile.in_model_choice``): {kernel id: {"beat": the record's id, "tuned_s", "analytic_s": seconds
# per inference of each in the model}}.
IN_MODEL_CHOICES_KEY = "in_model_choices"


# errno of a failure of the work dir's storage -> (what happened, what to do)
STORAGE_FAILURES = {
    errno.ENOSPC: ("the work dir's disk is full", "free some space (or move the work dir elsewhere)"),
    errno.EROFS: ("the work dir became read-only", "make it writable again"),
}


def storage_errno(err: BaseException | str) -> int | None:
    """ENOSPC or EROFS when ``err`` (or an error line) is the work dir's storage failing, else None."""
    text = str(err).lower()
    code = getattr(err, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT) or any(
        e in text for e in ("disk is full", "no space left", "quota exceeded")
    ):
        return errno.ENOSPC
    if code == errno.EROFS or "readonly database" in text or "read-only file system" in text:
        return errno.EROFS
    return None


def stop_on_storage_failure(error: str | None) -> None:
    """A candidate that failed because the work dir can no longer be written (its artifact could
    not be saved) is not the candidate's failure: end the run before it is recorded as one."""
    code = storage_errno(error or "")
    if code is not None:
        raise OSError(code, error)


class WorkDirBusy(TunerError):
    """Another live process is tuning in this work dir."""


class WorkDirLock:
    """Held from ``acquire()`` to ``release()`` (or the end of the process)."""

    def __init__(self, work_dir: Path):
        self.path = Path(work_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> WorkDirLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise WorkDirBusy(
                f"work dir {str(self.path.parent)!r} is in use by {holder}: wait for it to finish (or stop it), or "
                "choose another --work-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()} ({' '.join(sys.argv)[:200]})".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None

    def __enter__(self) -> WorkDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
