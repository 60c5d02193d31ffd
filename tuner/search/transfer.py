"""Transfer-tuning (Gibson et al.): start a model's search from schedules tuned for other models.

For each task of the model, the kernels of the source work dirs of the same operator class
(``tuner.tasks.opclass``: same computation, any shapes) are taken closest shape first; the best
schedules tuned for them are replayed on the task's kernel, their tile sizes adapted to its loop
extents (``adapt_tile``), and those that apply are queued as the task's first candidates
(``TuningLoop.add_transferred``): measured first, they become the elites the evolution starts from.
The cost model is warm-started with the data the source runs trained theirs on.

Source work dirs are only read: their databases are opened read-only and never migrated.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import tvm
from tvm.s_tir.schedule import Trace

from costmodel import CostModel
from costmodel.model import training_data_path
from tuner.database.database import Record
from tuner.database.workdir import TransferRecord, WorkDir
from tuner.errors import DatabaseError, TunerError
from tuner.progress import Progress
from tuner.spaces import metaschedule as msc
from tuner.spaces.retile import adapt_tile
from tuner.targets import target_kind
from tuner.tasks.opclass import OperatorClass, kernel_class

from .loop import TuningLoop


@dataclass(frozen=True)
class TransferConfig:
    top_k: int = 8  # best schedules replayed from each matching source kernel
    max_seeds: int = 16  # schedules seeded per task, from the closest source kernels first
    replay_seed: int = 1  # for the rare decision a replay has to draw anew


@dataclass
class SourceKernel:
    """A kernel tuned in a source work dir, with its best measured schedules."""

    work_dir: Path
    kernel_id: int
    name: str
    mod: tvm.IRModule
    op: OperatorClass
    records: dict[str, list[Record]]  # target key -> the best successful records, fastest first
    _traces: dict[int, Trace | None] = field(default_factory=dict)

    def best(self, target: tvm.target.Target, k: int) -> list[Record]:
        """The ``k`` fastest records for ``target``, or else for targets of the same kind."""
        key = str(target)
        if key in self.records:
            return self.records[key][:k]
        same_kind = [r for t, rs in self.records.items() if target_kind(t) == target.kind.name for r in rs]
        return sorted(same_kind, key=lambda r: r.latency)[:k]

    def trace(self, record: Record) -> Trace | None:
        """The record's trace (parsed once); None if it no longer applies to its own kernel."""
        if record.id not in self._traces:
            try:
                self._traces[record.id] = msc.stored_trace(self.mod, record.trace)
            except Exception:  # a trace TVM cannot read back (another TVM version): not usable
                self._traces[record.id] = None
        return self._traces[record.id]


@dataclass
class TransferSource:
    work_dir: Path
    kernels: list[SourceKernel]
    cost_model: Path | None  # the saved cost model, if the run got that far


def read_sources(work_dirs: Sequence[str | Path], config: TransferConfig | None = None) -> list[TransferSource]:
    """Read the kernels and best schedules of each source work dir, read-only.

    Raises TunerError for a missing dir or one without a database, DatabaseError for a file that
    is corrupt or not a tensor-tuner database (which is left untouched)."""
    config = config or TransferConfig()
    return [_read_source(WorkDir.existing(d, "transfer from"), config.top_k) for d in _as_paths(work_dirs)]


def _as_paths(work_dirs: Sequence[str | Path] | str | Path) -> list[Path]:
    return [Path(work_dirs)] if isinstance(work_dirs, (str, Path)) else [Path(d) for d in work_dirs]


def read_model_sources(work_dirs: Sequence[str | Path]) -> list[TransferSource]:
    """Sources for ``warm_start`` alone: each work dir's saved cost model, no schedules. Raises
    TunerError for a missing dir or one whose run saved no cost model with its training data."""
    sources = []
    for path in _as_paths(work_dirs):
        work_dir = WorkDir.existing(path, "warm-start the cost model from")
        if not training_data_path(work_dir.cost_model).is_file():
            raise TunerError(
                f"cannot warm-start the cost model from {str(path)!r}: it holds no {work_dir.cost_model.name} with its "
                "training data (its run stopped before saving one); tune it to the end, or leave it out"
            )
        sources.append(TransferSource(work_dir.path, [], work_dir.cost_model))
    return sources


def _read_source(work_dir: WorkDir, top_k: int) -> TransferSource:
    db = work_dir.open_database(read_only=True)
    try:
        targets = db.targets()
        kernels = []
        for kernel_id in db.kernel_ids():
            records = {t: db.best(kernel_id, t, top_k) for t in targets}
            records = {t: rs for t, rs in records.items() if rs}
            if records:
                mod = db.kernel_mod(kernel_id)
                name = db.kernel_name(kernel_id) or f"kernel{kernel_id}"
                op = kernel_class(mod, name)
                if op is not None:
                    kernels.append(SourceKernel(work_dir.path, kernel_id, name, mod, op, records))
    except sqlite3.DatabaseError as err:
        raise DatabaseError(
            f"{work_dir.database} is not a usable tensor-tuner database ({err}); it was left untouched"
        ) from None
    finally:
        db.close()
    cost_model = work_dir.cost_model
    return TransferSource(work_dir.path, kernels, cost_model if cost_model.exists() else None)


# -- applying a transfer to a tuning run ---------------------------------------------------------
def transfer(
    sources: Sequence[TransferSource],
    loop: TuningLoop,
    cost_model: CostModel,
    target: tvm.target.Target,
    progress: Progress,
    config: TransferConfig | None = None,
) -> TransferRecord:
    """Warm-start ``cost_model`` and seed every task of ``loop`` from ``sources``."""
    samples = warm_start(cost_model, sources, loop.feature_width, progress)
    return replace(seed_tasks(sources, loop, target, progress, config), cost_model_samples=samples)


def warm_start(
    cost_model: CostModel,
    sources: Sequence[TransferSource],
    width: int,
    progress: Progress,
    strict: bool = False,
    prefix: str = "transfer",
) -> int:
    """Add the source runs' cost-model training data to ``cost_model`` (as groups named ``prefix``,
    the source's index, ":" and its own group); returns the samples added.
    A source model that cannot be used is reported and skipped (the transfer of schedules still
    works), or with ``strict`` (the model is all the source gives) raises TunerError."""
    added = 0
    for index, source in enumerate(sources):
        if source.cost_model is None:
            progress.line(f"transfer: {source.work_dir} has no saved cost model; it does not warm-start this one")
            continue
        try:
            n = cost_model.warm_start(source.cost_model, prefix=f"{prefix}{index}:", width=width, fit=False)
        except Exception as err:  # unreadable, or saved by another version
            if strict:
                raise TunerError(
                    f"cannot warm-start the cost model from {str(source.work_dir)!r}: {err}; leave it out"
                ) from None
            progress.line(f"transfer: the cost model in {source.work_dir} is not used ({err})")
            continue
        added += n
        progress.line(f"cost model warm-started with {n} measurements from {source.work_dir}")
    if added:
        cost_model.fit()
    return added


def seed_tasks(
    sources: Sequence[TransferSource],
    loop: TuningLoop,
    target: tvm.target.Target,
    progress: Progress,
    config: TransferConfig | None = None,
) -> TransferRecord:
    """Queue each task's transferred schedules as its first candidates."""
    config = config or TransferConfig()
    kernels = [k for source in sources for k in source.kernels]
    offered: dict[str, list[tuple[Trace, SourceKernel]]] = {}
    uses = {source.work_dir: _SourceUse() for source in sources}
    for run in loop.runs:
        task, op = run.task, run.op  # op None: a kernel no class describes, offered nothing
        matching = sorted((k for k in kernels if op is not None and k.op.matches(op)), key=lambda k: op.distance(k.op))
        for kernel in matching:
            uses[kernel.work_dir].matching.add(kernel.kernel_id)
        offered[task.name] = [
            (trace, kernel)
            for kernel in matching
            for record in kernel.best(target, config.top_k)
            if (trace := kernel.trace(record)) is not None
        ]
    used = loop.add_transferred(
        {name: [trace for trace, _ in pairs] for name, pairs in offered.items()},
        config.max_seeds,
        config.replay_seed,
        retile=adapt_tile,
    )
    for name, indices in used.items():
        for index in indices:
            kernel = offered[name][index][1]
            uses[kernel.work_dir].add(kernel, name)
    for work_dir, use in uses.items():
        progress.line(use.describe(work_dir, len(offered), target))
    return TransferRecord(
        sources=[use.as_dict(work_dir) for work_dir, use in uses.items()],
        seeds_per_task={name: len(indices) for name, indices in used.items()},
    )


@dataclass
class _SourceUse:
    """What one source work dir contributed."""

    schedules: int = 0
    kernels: set[int] = field(default_factory=set)  # that gave a schedule
    tasks: set[str] = field(default_factory=set)  # that got one
    matching: set[int] = field(default_factory=set)  # kernels of the same class as some task

    def add(self, kernel: SourceKernel, task: str) -> None:
        self.schedules += 1
        self.kernels.add(kernel.kernel_id)
        self.tasks.add(task)

    def as_dict(self, work_dir: Path) -> dict:
        return {
            "work_dir": str(work_dir),
            "schedules": self.schedules,
            "source_kernels": len(self.kernels),
            "tasks": len(self.tasks),
            "matching_kernels": len(self.matching),
        }

    def describe(self, work_dir: Path, num_tasks: int, target: tvm.target.Target) -> str:
        if self.schedules:
            return (
                f"transfer: {self.schedules} schedules from {len(self.kernels)} source kernels "
                f"for {len(self.tasks)} of {num_tasks} tasks (source: {work_dir})"
            )
        if self.matching:
            return (
                f"transfer: {len(self.matching)} kernels in {work_dir} match this model's, but none of their "
                f"{target.kind.name} schedules applies to its kernels; tuning normally"
            )
        return f"transfer: no kernel in {work_dir} matches this model's kernels; tuning normally"
