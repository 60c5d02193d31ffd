"""The tuner's agent on a Ray cluster, in a process of its own (``measure.workers.main``'s "cluster" role).

Ray ends a driver process whose cluster goes away; running the driver here keeps the tuner alive
to commit what it has and end the run cleanly (``cluster.ClusterEngine`` sees this process die).

One batch of candidates is in flight at a time. Builds are Ray tasks spread over the nodes' CPUs;
built candidates queue for the measuring actors of the batch's device model, each fed chunks of
its own DOP controller's window size, at most two at once, so one is queued while the other is
timed. A chunk's results return together: if its actor dies, none of them were handed back, and
the whole chunk is queued again for another actor (or the same one, restarted). So every
candidate is handed back exactly once. On a CPU target a batch's builds all finish before its
timing starts, as on one machine, since compiling beside a timed CPU kernel distorts it.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common.error_text import error_line
from common.model_weights import weights_path
from measure.contract import EngineConfig
from measure.engine.engine import SERIAL_WINDOW
from measure.engine.runners import DeviceUnavailable
from measure.timeouts import AdaptiveTimeout
from measure.types import BuildResult, MeasureInput, MeasureResult, Status, VerifyResult

from . import nodes as cluster_nodes
from .connect import init_remote
from .state import Batch, ClusterError, Measurer, Pending, assign_device

MAX_ATTEMPTS = 3  # times a candidate is sent out again after the node or actor handling it was lost
IN_FLIGHT_PER_MEASURER = 2


class ClusterDriver:
    def __init__(self) -> None:
        self.measurers: list[Measurer] = []
        self.batch: Batch | None = None
        self.builds: dict[Any, Pending] = {}  # build result ref -> candidate
        self.chunks: dict[Any, tuple[Measurer, list[Pending]]] = {}
        self.pings: dict[Any, Measurer] = {}
        self.built_on: Counter[str] = Counter()
        self.groups: dict[str | None, str] = {}  # comparison group -> device model measuring it
        self.lost_since: float | None = None
        self.replacements = 0
        self.ray: Any = None

    # -- connecting ---------------------------------------------------------------------------
    def connect(
        self,
        address: str,
        target: str,
        cuda: bool,
        config: EngineConfig,
        per_gpu: bool,
        local_cpus: int | None,
        local_gpus: int,
        startup_timeout: float,
    ) -> dict:
        import ray

        self.ray, self.target, self.cuda, self.config = ray, target, cuda, config
        self.build_timeout = AdaptiveTimeout(config.build_timeout)
        package_root = str(Path(__file__).resolve().parents[2])  # the checkout holding measure/, codegen/, common/
        runtime_env = {
            "env_vars": {
                "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
            }
        }
        common = dict(
            runtime_env=runtime_env, logging_level=logging.ERROR, log_to_driver=False, namespace="tensor-tuner"
        )
        try:
            if address == "local":
                ray.init(num_cpus=local_cpus, num_gpus=local_gpus, include_dashboard=False, **common)
            else:
                init_remote(ray, address, common)
        except Exception as err:  # noqa: BLE001 - Ray raises ConnectionError, ValueError, RuntimeError here
            raise ClusterError(f"cannot connect to the Ray cluster at {address!r}: {err}") from None
        self._build = ray.remote(num_cpus=1, max_retries=MAX_ATTEMPTS, scheduling_strategy="SPREAD")(
            cluster_nodes.build_task
        )
        self._compile = ray.remote(num_cpus=1, max_retries=1)(cluster_nodes.compile_task)
        # max_restarts=-1: Ray restarts a dead measuring actor wherever its resources are free again
        self._actor = ray.remote(max_restarts=-1, max_task_retries=0)(cluster_nodes.MeasuringActor)
        self.per_gpu = per_gpu
        for options in self._placements():
            self._start_measurer(options)
        self._wait_for_measurers(startup_timeout)
        return self.describe()

    def _placements(self) -> list[dict]:
        """One measuring actor per GPU, or on a CPU target one per host (its cores are the device)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n for n in self.ray.nodes() if n["Alive"]]
        if self.per_gpu:
            gpus = int(sum(n["Resources"].get("GPU", 0) for n in nodes))
            if gpus == 0:
                raise ClusterError(
                    "the Ray cluster has no GPUs: start its GPU nodes with `ray start ... --num-gpus N`, "
                    "or measure per host (CPU targets)"
                )
            return [dict(num_gpus=1, num_cpus=0) for _ in range(gpus)]
        hosts: dict[str, dict] = {}
        for node in sorted(nodes, key=lambda n: -n["Resources"].get("CPU", 0)):
            hosts.setdefault(node["NodeManagerAddress"], node)
        return [
            dict(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            for n in hosts.values()
        ]

    def _start_measurer(self, options: dict) -> Measurer:
        handle = self._actor.options(**options).remote(self.target, self.config, self.per_gpu)
        measurer = Measurer(handle, options)
        self.measurers.append(measurer)
        self.pings[handle.describe.remote()] = measurer
        return measurer

    def _wait_for_measurers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.pings and time.monotonic() < deadline:
            ready, _ = self.ray.wait(list(self.pings), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            for ref in ready:
                self._handle_ping(ref)
        if not any(m.state == "up" for m in self.measurers):
            states = "; ".join(m.state + (f" ({m.error})" if m.error else "") for m in self.measurers)
            raise ClusterError(
                f"no measuring actor started within {timeout:.0f} s ({len(self.measurers)} placed: {states}); "
                "see the Ray logs of the cluster"
            )

    def describe(self) -> dict:
        nodes = [
            {
                "node": f"{n['NodeManagerHostname']}/{n['NodeID'][:6]}",
                "cpus": n["Resources"].get("CPU", 0),
                "gpus": n["Resources"].get("GPU", 0),
            }
            for n in self.ray.nodes()
            if n["Alive"]
        ]
        measurers = [{"name": m.name, "device": m.device, "state": m.state, "energy": m.energy} for m in self.measurers]
        return {"nodes": nodes, "measurers": measurers}

    # -- a batch --------------------------------------------------------------------------------
    def submit(self, inputs: list[MeasureInput], timing: dict, serial: bool, group: str | None) -> None:
        self._drop_batch()
        self.batch = Batch(timing, serial, self._device_for(group), len(inputs), group=group)
        for item in inputs:
            self._start_build(Pending(item))

    def poll(self, wait: float) -> dict:
        """Advance the batch for up to ``wait`` seconds; return the results that came in, whether
        the batch is done, what the cluster is doing, and why it is lost if it is."""
        results: list[MeasureResult] = []
        deadline = time.monotonic() + wait
        lost = None
        while self.batch and not self.batch.finished and not results:
            self._dispatch()
            lost = self._lost()
            refs = [*self.builds, *self.chunks, *self.pings]
            remaining = deadline - time.monotonic()
            if lost or remaining <= 0:
                break
            if not refs:
                time.sleep(min(0.5, remaining))
                continue
            ready, _ = self.ray.wait(refs, num_returns=1, timeout=remaining)
            if ready:
                ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                self._handle(ref, results)
        if self.batch:
            self.batch.returned += len(results)
        self.settle(0)
        done = self.batch is None or self.batch.finished
        return {"results": results, "done": done, "activity": self.activity(), "lost": lost}

    def settle(self, wait: float) -> dict:
        """Take in the measurers' answers to pings (restarted or dead), waiting up to ``wait``
        seconds for all of them; returns the activity."""
        deadline = time.monotonic() + wait
        while self.pings:
            ready, _ = self.ray.wait(
                list(self.pings), num_returns=len(self.pings), timeout=max(0.0, deadline - time.monotonic())
            )
            for ref in ready:
                self._handle_ping(ref)
            if time.monotonic() >= deadline:
                break
        return self.activity()

    def _device_for(self, group: str | None) -> str:
        up = Counter(m.device for m in self.measurers if m.state in ("up", "down"))
        return assign_device(group, up, self.groups)

    def _submit_build(
        self, item: MeasureInput, target: str, cuda: bool, keep_layout_rewrite: bool, timeout: float | None = None
    ) -> tuple[Any, Any]:
        """A build task: refs to (its result and node, the artifact's bytes); ``timeout``: the
        candidates' adaptive one unless given."""
        return self._build.options(num_returns=2).remote(
            item, target, cuda, keep_layout_rewrite, timeout or self.build_timeout.value
        )

    @property
    def _batch_group(self) -> str | None:
        """The task the current batch's candidates are of."""
        return self.batch.group if self.batch is not None else None

    def _start_build(self, pending: Pending) -> None:
        pending.attempts += 1
        timeout = self.build_timeout.value_for(self._batch_group)
        result, pending.blob = self._submit_build(pending.item, self.target, self.cuda, False, timeout)
        self.builds[result] = pending

    def _dispatch(self) -> None:
        batch = self.batch
        if batch is None or not batch.queue or (not self.cuda and self.builds):
            return
        size = SERIAL_WINDOW if batch.serial else None
        ready = [m for m in self.measurers if m.state == "up" and m.device == batch.device]
        while batch.queue and any(m.in_flight < IN_FLIGHT_PER_MEASURER for m in ready):
            for measurer in sorted(ready, key=lambda m: m.in_flight):
                if not batch.queue or measurer.in_flight >= IN_FLIGHT_PER_MEASURER:
                    continue
                chunk, batch.queue = batch.queue[: size or measurer.window], batch.queue[size or measurer.window :]
                ref = measurer.handle.measure.remote(
                    [p.built for p in chunk], batch.timing, batch.serial, *[p.blob for p in chunk]
                )
                self.chunks[ref] = (measurer, chunk)
                measurer.in_flight += 1

    def _handle(self, ref: Any, results: list[MeasureResult]) -> None:
        if ref in self.builds:
            self._handle_build(ref, self.builds.pop(ref), results)
        elif ref in self.chunks:
            self._handle_chunk(ref, *self.chunks.pop(ref), results)
        elif ref in self.pings:
            self._handle_ping(ref)

    def _handle_build(self, ref: Any, pending: Pending, results: list[MeasureResult]) -> None:
        ray = self.ray
        try:
            built, node = ray.get(ref)
        except ray.exceptions.RayTaskError as err:  # the build task itself raised: a bug, not a node loss
            cause = error_line(err, last=True)[:300]  # Ray's report ends with the task's own exception
            results.append(MeasureResult(pending.item.key, Status.BUILD_ERROR, error=f"build task failed: {cause}"))
            return
        except ray.exceptions.RayError as err:  # the node or worker went away, past Ray's own retries
            self._retry_or_fail(pending, Status.BUILD_CRASH, err, results)
            return
        self.built_on[node] += 1
        if not built.ok:
            results.append(built.as_failure())
            return
        self.build_timeout.record(built.seconds, self._batch_group)
        pending.built = built
        if self.batch is not None:
            self.batch.queue.append(pending)

    def _handle_chunk(self, ref: Any, measurer: Measurer, chunk: list[Pending], results: list[MeasureResult]) -> None:
        ray = self.ray
        measurer.in_flight -= 1
        try:
            measured, info = ray.get(ref)
        except ray.exceptions.RayActorError:
            measurer.state = "down"
            self.pings[measurer.handle.describe.remote()] = measurer
            self.batch.queue[:0] = chunk  # none of it was handed back: measure it all again
            return
        except ray.exceptions.RayError as err:
            if isinstance(
                getattr(err, "cause", None), DeviceUnavailable
            ):  # nothing measures on that node: say so, don't retry
                raise DeviceUnavailable(f"{err.cause} (measuring actor {measurer.name})") from None
            for pending in chunk:  # an artifact was lost with its node: build it again
                self._retry_or_fail(pending, Status.RUN_ERROR, err, results)
            return
        measurer.take(info)
        results.extend(measured)

    def _handle_ping(self, ref: Any) -> None:
        measurer = self.pings.pop(ref)
        try:
            info = self.ray.get(ref)
        except self.ray.exceptions.ActorDiedError as err:
            measurer.state, measurer.error = "dead", error_line(err, last=True)[:300]  # Ray's report ends with why
            # a GPU elsewhere may take its place (a host's measurer has no substitute); a measurer
            # that cannot start at all would be replaced for ever, hence the limit
            if self.per_gpu and self.replacements < 2 * len(self.measurers):
                self.replacements += 1
                self._start_measurer(measurer.options)
            return
        except self.ray.exceptions.RayActorError:  # unavailable for now: ask again
            self.pings[measurer.handle.describe.remote()] = measurer
            return
        if measurer.state == "down":
            measurer.restarts += 1
        measurer.take(info)

    def _retry_or_fail(self, pending: Pending, status: str, err: Exception, results: list[MeasureResult]) -> None:
        if pending.attempts >= MAX_ATTEMPTS:
            cause = error_line(err, last=True)[:300]
            results.append(
                MeasureResult(pending.item.key, status, error=f"lost {pending.attempts} times on the cluster: {cause}")
            )
        else:
            self._start_build(pending)

    def _lost(self, patience: float = 120.0) -> str | None:
        """Why the batch cannot go on: candidates wait and no measurer of their device has been up for
        ``patience`` s."""
        batch = self.batch
        if batch is None or any(m.state == "up" and m.device == batch.device for m in self.measurers):
            self.lost_since = None
            return None
        if not batch.queue and not self.chunks:
            return None
        self.lost_since = self.lost_since or time.monotonic()
        if time.monotonic() - self.lost_since < patience:
            return None
        return f"no measuring actor for {batch.device or 'the target'} has been up for {patience:.0f} s"

    def _drop_batch(self) -> None:
        """Forget a batch the caller stopped reading (its builds are cancelled)."""
        for ref in self.builds:
            self.ray.cancel(ref)
        for measurer, _ in self.chunks.values():
            measurer.in_flight -= 1
        self.builds.clear()
        self.chunks.clear()
        self.batch = None

    def activity(self) -> dict:
        return {
            "built_on": dict(self.built_on),
            "measurers": [
                {
                    "name": m.name,
                    "device": m.device,
                    "state": m.state,
                    "measured": m.measured,
                    "dop": m.dop,
                    "in_flight": m.in_flight,
                    "restarts": m.restarts,
                    "pid": m.pid,
                }
                for m in self.measurers
            ],
        }

    # -- single requests ------------------------------------------------------------------------
    def _any_measurer(self, device: str | None = None) -> Measurer:
        for measurer in self.measurers:
            if measurer.state == "up" and (device is None or measurer.device == device):
                return measurer
        raise ClusterError("no measuring actor is up on the cluster")

    def _build_one(self, item: MeasureInput, target: str, cuda: bool) -> tuple[BuildResult, Any]:
        """One build for a verification, allowed the reference's time (see ``Engine.verify``)."""
        result, blob = self._submit_build(item, target, cuda, True, self.config.reference_timeout)
        built, _ = self.ray.get(result)
        return built, blob

    def build(self, inputs: list[MeasureInput]) -> list[tuple[BuildResult, str]]:
        """Build candidates on the cluster and return each result with the node that built it
        (the artifacts are dropped: for measuring build throughput)."""
        return self.ray.get([self._submit_build(item, self.target, self.cuda, False)[0] for item in inputs])

    def verify(
        self,
        reference: MeasureInput,
        candidate: MeasureInput,
        reference_target: str,
        reference_device: str,
        rtol: float,
        group: str | None,
    ) -> VerifyResult:
        ref, ref_blob = self._build_one(reference, reference_target, False)
        cand, cand_blob = self._build_one(candidate, self.target, self.cuda)
        for built in (ref, cand):
            if not built.ok:
                return VerifyResult(None, f"could not build the {built.key} to compare: {built.error}")
        measurer = self._any_measurer(self.groups.get(group))
        return self.ray.get(measurer.handle.compare.remote(ref, cand, reference_device, rtol, ref_blob, cand_blob))

    def compile_program(self, artifact: str, timeout: float, **request: Any) -> str:
        request["target"] = self.target
        given = request.pop("weights", None)  # a path here: its bytes travel
        weights = Path(given).read_bytes() if given is not None else None
        library, model_weights = self.ray.get(self._compile.remote(request, self.cuda, timeout, weights))
        Path(artifact).parent.mkdir(parents=True, exist_ok=True)
        Path(artifact).write_bytes(library)
        if model_weights is not None:
            weights_path(artifact).write_bytes(model_weights)
        return artifact

    def time_program(self, artifact: str, kind: str, args: list, timing: dict) -> list[float]:
        devices = Counter(self.groups.values()) or Counter(m.device for m in self.measurers if m.state == "up")
        measurer = self._any_measurer(devices.most_common(1)[0][0] if devices else None)
        blob = self.ray.put(Path(artifact).read_bytes())
        weights = weights_path(artifact)
        weights_blob = self.ray.put(weights.read_bytes()) if weights.exists() else None
        return self.ray.get(measurer.handle.time_program.remote(kind, args, timing, blob, weights_blob))

    def shutdown(self) -> None:
        if self.ray is None:
            return
        self._drop_batch()
        for measurer in self.measurers:
            self.ray.kill(measurer.handle)
        self.ray.shutdown()


_driver = ClusterDriver()

HANDLERS = {
    "connect": _driver.connect,
    "submit": _driver.submit,
    "poll": _driver.poll,
    "settle": _driver.settle,
    "build": _driver.build,
    "verify": _driver.verify,
    "compile_program": _driver.compile_program,
    "time_program": _driver.time_program,
    "shutdown": _driver.shutdown,
}
