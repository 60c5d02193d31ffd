"""The table of built-in workloads, looked up by name.

The modules that define workloads register them here as they are imported; ``workloads.catalog``
imports them all, and the package's lookups (``workloads.get_workload``, ...) come from there, so
that a lookup through the package sees every built-in workload. The table knows none of them."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

from .errors import WorkloadError
from .workload import Workload


@dataclass(frozen=True)
class WorkloadEntry:
    """A registered workload: how to build it and where its shapes come from."""

    name: str
    category: str  # "operator" or "model"
    source: str
    build: Callable[[], Workload]
    family: str = ""


_REGISTRY: dict[str, WorkloadEntry] = {}


def register(
    name: str, category: str, source: str, family: str = ""
) -> Callable[[Callable[[], Workload]], Callable[[], Workload]]:
    """Register ``fn`` (which builds the workload) under ``name``."""

    def wrap(fn: Callable[[], Workload]) -> Callable[[], Workload]:
        if name in _REGISTRY:
            raise RuntimeError(f"workload {name!r} registered twice")
        _REGISTRY[name] = WorkloadEntry(name, category, source, fn, family)
        return fn

    return wrap


def list_workloads() -> list[WorkloadEntry]:
    return sorted(_REGISTRY.values(), key=lambda e: (e.category, e.name))


def get_workload(name: str, **options) -> Workload:
    """Build the registered workload ``name``; an unknown name suggests the closest ones.

    Models take ``batch`` and ``dtype`` options; operators have the fixed shapes of the layer
    they come from (fp16 variants are registered as NAME-fp16)."""
    entry = _REGISTRY.get(name)
    if entry is None:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise WorkloadError(
            f"unknown model {name!r}.{hint} Run `tuner workloads` to list the built-in workloads, "
            "or pass a PrimFunc, a Relax IRModule or a torch.nn.Module."
        )
    options = {key: value for key, value in options.items() if value is not None}
    if options and entry.category != "model":
        raise WorkloadError(
            f"{name!r} is an operator with the fixed shapes of the layer it comes from; batch and dtype apply to "
            "models "
            "(operators with a tensor-core path also come as NAME-fp16)"
        )
    workload = entry.build(**options)
    workload.source = workload.source or entry.source
    return workload
