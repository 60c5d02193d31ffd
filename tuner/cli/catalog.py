"""``tuner workloads``: what each built-in workload is, its FLOPs and its distinct kernels.

Counting a model's kernels means building it (PyTorch, then task extraction), so the results are
cached under ~/.cache/tensor-tuner (or $TENSOR_TUNER_CACHE_DIR), keyed by the source code of the workload
definitions and of the lowering.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import workloads
from common.host import user_cache_dir
from tuner.targets import resolve_target
from tuner.tasks.extraction import extract_tasks
from workloads import WorkloadEntry, WorkloadError, get_workload


@dataclass
class TaskInfo:
    name: str
    weight: int
    flops: float


@dataclass
class WorkloadInfo:
    name: str
    category: str
    family: str
    source: str
    flops: float | None = None  # per run of the whole workload
    tasks: list[TaskInfo] = field(default_factory=list)
    unavailable: str | None = None  # why it could not be built here

    @property
    def distinct_tasks(self) -> int:
        return len(self.tasks)


def describe(entry: WorkloadEntry) -> WorkloadInfo:
    """Build the workload and extract its tasks for this CPU."""
    info = WorkloadInfo(entry.name, entry.category, entry.family, entry.source)
    try:
        workload = get_workload(entry.name)
    except WorkloadError as err:  # a model whose framework is not installed
        info.unavailable = str(err)
        return info
    tasks = extract_tasks(workload, resolve_target("llvm"))
    info.tasks = [TaskInfo(t.name, t.weight, t.flops) for t in tasks]
    info.flops = sum(t.weight * t.flops for t in tasks)
    return info


def catalog(
    entries: list[WorkloadEntry], on_build: Callable[[str], None] | None = None, cache: Path | None = None
) -> list[WorkloadInfo]:
    """Every entry described, from the cache where it is current."""
    cache = cache or user_cache_dir() / "catalog.json"
    stored = _load(cache)
    fingerprint = _definitions_fingerprint()
    infos = []
    for entry in entries:
        cached = stored.get(entry.name)
        if cached and cached.get("fingerprint") == fingerprint and not cached.get("unavailable"):
            info = WorkloadInfo(**{k: v for k, v in cached.items() if k != "fingerprint"})
            info.tasks = [TaskInfo(**t) for t in cached["tasks"]]
        else:
            if on_build and entry.category == "model":  # operators describe in milliseconds
                on_build(entry.name)
            info = describe(entry)
            stored[entry.name] = {**asdict(info), "fingerprint": fingerprint}
        infos.append(info)
    _save(cache, stored)
    return infos


def _definitions_fingerprint() -> str:
    """Of the source the counts depend on: the workloads' definitions and how models are lowered
    into tasks (a change to the lowering changes a model's kernels)."""
    tuner_dir = Path(__file__).parent.parent
    sources = [
        *Path(workloads.__file__).parent.rglob("*.py"),
        *(tuner_dir / "lowering").rglob("*.py"),
        *(tuner_dir / "tasks").rglob("*.py"),
    ]
    digest = hashlib.sha1()
    for path in sorted(sources):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _load(cache: Path) -> dict:
    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}


def _save(cache: Path, stored: dict) -> None:
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(stored))
    except OSError:
        pass  # a read-only home only costs the rebuild next time
