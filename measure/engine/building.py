"""One build request to a build worker, its failures turned into results; how many build workers a machine takes."""

from __future__ import annotations

import os

import tvm_ffi

from common.host import available_memory_bytes
from measure.types import BuildResult, MeasureInput, Status
from measure.workers.worker import WorkerCrashed, WorkerError, WorkerProcess, WorkerTimeout

REFERENCE_KEY = "reference"  # the key of the unscheduled function a candidate is verified against


def default_build_workers() -> int:
    memory_bound = max(1, available_memory_bytes() // (2 << 30))  # ~2 GiB per compiling worker
    return max(1, min(os.cpu_count() or 1, memory_bound))


def artifact_stem(item: MeasureInput) -> str:
    """The name of ``item``'s artifact, before a counter: a candidate's names its program, so that injected
    faults (measure/workers/faults.py) follow it from its tuning into its verification."""
    if item.key == REFERENCE_KEY:
        return REFERENCE_KEY
    return f"candidate-{tvm_ffi.structural_hash(item.mod) & 0xFFFFFFFF:08x}"


def build_with(
    worker: WorkerProcess, item: MeasureInput, target: str, artifact: str, keep_layout_rewrite: bool, timeout: float
) -> BuildResult:
    """Build ``item`` in ``worker`` into ``artifact``; a failing, hanging or crashing build is a result."""
    request = dict(mod=item.mod, target=target, artifact=artifact, keep_layout_rewrite=keep_layout_rewrite)
    try:
        built = worker.call("build_kernel", timeout, **request)
    except WorkerError as err:
        return BuildResult(item.key, Status.BUILD_ERROR, error=str(err))
    except WorkerTimeout as err:
        return BuildResult(item.key, Status.BUILD_TIMEOUT, error=f"build {err}")
    except WorkerCrashed as err:
        return BuildResult(item.key, Status.BUILD_CRASH, error=f"build crashed: {err}")
    return BuildResult(item.key, Status.OK, artifact=built["artifact"], args=built["args"], seconds=built["seconds"])
