"""What runs on a Ray cluster's nodes: build tasks and the measuring actors.

Ray imports this module on its workers; the driver (``driver``) wraps these functions
and the actor class with ``ray.remote``. A build runs in a build worker process of its own, kept
for the Ray worker's lifetime, so a candidate that crashes the compiler is a failed build, not a
dead Ray worker. Artifacts travel as bytes through Ray's object store: no shared file system is
needed between the node that builds a candidate and the one that times it.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import uuid
from dataclasses import replace
from pathlib import Path

from common.host import cpu_model
from common.model_weights import SUFFIX, remove_model, weights_path
from measure.engine.building import build_with
from measure.timing.sampling import TimingConfig
from measure.types import BuildResult, MeasureInput, MeasureResult, VerifyResult
from measure.workers.env import CUDA_BUILD_ENV
from measure.workers.worker import WorkerProcess

_builder: WorkerProcess | None = None  # this Ray worker's build worker


def node_label() -> str:
    """This Ray node: host name and the start of Ray's node id (two nodes may share a host)."""
    import ray

    return f"{platform.node()}/{ray.get_runtime_context().get_node_id()[:6]}"


def _scratch_dir() -> Path:
    path = Path(tempfile.gettempdir()) / f"tensor-tuner-{os.getuid()}" / f"ray-{os.getpid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _build_worker(cuda: bool) -> WorkerProcess:
    global _builder
    if _builder is None:
        env = {CUDA_BUILD_ENV: "1"} if cuda else {}
        _builder = WorkerProcess("build", f"ray-builder-{os.getpid()}", _scratch_dir() / "builder.log", env)
    return _builder


def _take_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    path.unlink(missing_ok=True)
    return data


def build_task(
    item: MeasureInput, target: str, cuda: bool, keep_layout_rewrite: bool, timeout: float
) -> tuple[tuple[BuildResult, str], bytes | None]:
    """Build one candidate here; returns (the result and this node's label, the artifact's bytes)."""
    artifact = _scratch_dir() / f"{uuid.uuid4().hex}.so"
    built = build_with(_build_worker(cuda), item, target, str(artifact), keep_layout_rewrite, timeout)
    blob = _take_bytes(artifact) if built.ok else None
    built.artifact = None  # a path on this node means nothing elsewhere
    return (built, node_label()), blob


def compile_task(request: dict, cuda: bool, timeout: float, weights: bytes | None = None) -> tuple[bytes, bytes | None]:
    """Compile a whole program here (``codegen.build.compile_program``, a model's ``weights`` file's bytes
    given apart); returns the library's bytes and a model's weights' (``common.model_weights``)."""
    artifact = _scratch_dir() / f"{uuid.uuid4().hex}.so"
    if weights is not None:
        given = artifact.with_name(f"{artifact.stem}-given{SUFFIX}")
        given.write_bytes(weights)
        request = {**request, "weights": str(given)}
    try:
        _build_worker(cuda).call("compile_program", timeout, artifact=str(artifact), **request)
    finally:
        if weights is not None:
            given.unlink(missing_ok=True)
    model_weights = weights_path(artifact)
    return _take_bytes(artifact), _take_bytes(model_weights) if model_weights.exists() else None


class MeasuringActor:
    """One device's measurements: a measure-only engine (runner processes and a DOP controller of
    its own) timing the candidates the driver sends it, one chunk per call."""

    def __init__(self, target: str, config, per_gpu: bool):
        import ray
        import tvm

        from measure.contract import device_kind
        from measure.engine.engine import MeasureEngine

        self.target = tvm.target.Target(json.loads(target))
        gpu_ids = ray.get_gpu_ids() if per_gpu else []
        gpu = int(gpu_ids[0]) if gpu_ids else None
        self.dir = Path(tempfile.mkdtemp(prefix="measurer-", dir=_scratch_dir()))
        # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU: the engine's NVML monitor finds that GPU
        # by its UUID (Ray's GPU id is not NVML's index where the node shows only some of its GPUs).
        self.engine = MeasureEngine(self.target, self.dir, replace(config, build_workers=0))
        self.engine.start()
        self.kind = device_kind(self.target)
        self.name = f"{node_label()}/gpu{gpu}" if gpu is not None else f"{node_label()}/{self.kind}"
        self.device = self._device_name()
        self.measured = 0

    def _device_name(self) -> str:
        if self.kind == "cuda":
            return self.engine.gpu_name() or "GPU of unknown model (NVML unavailable)"
        return f"{cpu_model()} x{os.cpu_count() or 1}"

    def describe(self) -> dict:
        return {
            "name": self.name,
            "device": self.device,
            "window": self.engine.window_size(False),
            "dop": self.engine.dop.dop,
            "energy": self.engine.energy_measurable,
            "measured": self.measured,
            "pid": os.getpid(),
        }

    def _write(self, blob: bytes) -> str:
        path = self.dir / f"{uuid.uuid4().hex}.so"
        path.write_bytes(blob)
        return str(path)

    def measure(
        self, builds: list[BuildResult], timing: dict, serial: bool, *blobs: bytes
    ) -> tuple[list[MeasureResult], dict]:
        """Time built candidates (``blobs``: their artifacts, in order) as the local engine would."""
        local = [replace(built, artifact=self._write(blob)) for built, blob in zip(builds, blobs, strict=True)]
        results = list(self.engine.measure_built(local, TimingConfig(**timing), serial))
        for result in results:
            result.device, result.node = self.device, self.name
        self.measured += len(results)
        return results, self.describe()

    def compare(
        self,
        reference: BuildResult,
        candidate: BuildResult,
        reference_device: str,
        rtol: float,
        reference_blob: bytes,
        candidate_blob: bytes,
    ) -> VerifyResult:
        ref = replace(reference, artifact=self._write(reference_blob))
        cand = replace(candidate, artifact=self._write(candidate_blob))
        try:
            return self.engine.compare_built(ref, cand, reference_device, rtol)
        finally:
            for built in (ref, cand):
                Path(built.artifact).unlink(missing_ok=True)

    def time_program(
        self, kind: str, args: list, timing: dict, blob: bytes, weights: bytes | None = None
    ) -> list[float]:
        artifact = Path(self._write(blob))
        if weights is not None:
            weights_path(artifact).write_bytes(weights)
        try:
            return self.engine.time_program(artifact, kind, args, TimingConfig(**timing))
        finally:
            remove_model(artifact)
