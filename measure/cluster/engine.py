"""The measurement engine on a Ray cluster: ``MeasureEngine``'s interface, with builds as Ray
tasks on the cluster's CPUs and measurements in one measuring actor per GPU (or per host for a
CPU target), each with its own DOP controller.

The Ray driver runs in a child process (``measure.cluster.driver``), because Ray ends a driver whose
cluster goes away; here that child's death is a ``ClusterLost``, and everything the tuner
committed before it stays committed.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import tvm

from measure.contract import Engine, EngineConfig, device_kind, host_target
from measure.engine.building import REFERENCE_KEY
from measure.engine.runners import raise_if_no_device
from measure.timing.sampling import TimingConfig
from measure.types import BuildResult, MeasureInput, MeasureResult, VerifyResult
from measure.workers.worker import WorkerCrashed, WorkerError, WorkerProcess, WorkerTimeout

__all__ = ["ClusterEngine", "ClusterLost", "ClusterOptions", "ClusterUnavailable"]

# seconds Ray's driver waits for a cluster that stopped answering before it gives up
RECONNECT_SECONDS = "20"


class ClusterUnavailable(RuntimeError):
    """The cluster could not be reached or cannot measure for this target."""


class ClusterLost(RuntimeError):
    """The cluster went away during the run."""


@dataclass
class ClusterOptions:
    address: str  # "auto", "HOST:PORT" (a `ray start --head` node), "ray://HOST:PORT", or "local"
    per_gpu: bool | None = None  # one measuring actor per GPU (default for CUDA) or per host (CPU)
    local_cpus: int | None = None  # address "local": CPUs of the private Ray instance (default: all)
    local_gpus: int = 0  # address "local": GPUs to declare (placement only where none exist)
    startup_timeout: float = 300.0  # for the measuring actors to start
    poll_seconds: float = 1.0


class ClusterEngine(Engine):
    """A Ray cluster's CPUs building and its measuring actors timing."""

    def __init__(
        self, target: tvm.target.Target, work_dir: Path, options: ClusterOptions, config: EngineConfig | None = None
    ):
        super().__init__(target, work_dir, config)
        self.options = options
        self.monitor = None  # NVML runs beside each measuring actor; its energy comes with the results
        self.description: dict = {}
        self._activity: dict = {}
        env = {"RAY_gcs_rpc_server_reconnect_timeout_s": RECONNECT_SECONDS}
        self._driver = WorkerProcess("cluster", "ray-driver", self.log_dir / "ray-driver.log", env)

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Connect to the cluster and start the measuring actors; raises ClusterUnavailable."""
        check_reachable(self.options.address)
        per_gpu = self.options.per_gpu if self.options.per_gpu is not None else self.device == "cuda"
        request = dict(
            address=self.options.address,
            target=str(self.target),
            cuda=self.device == "cuda",
            config=self.config,
            per_gpu=per_gpu,
            local_cpus=self.options.local_cpus,
            local_gpus=self.options.local_gpus,
            startup_timeout=self.options.startup_timeout,
        )
        try:
            self.description = self._driver.call("connect", self.options.startup_timeout + 120, **request)
        except (WorkerError, WorkerCrashed, WorkerTimeout) as err:
            self._driver.kill()
            raise ClusterUnavailable(_reason(err)) from None

    def close(self) -> None:
        try:
            self._driver.call("shutdown", 30)
        except (WorkerError, WorkerCrashed, WorkerTimeout):
            pass
        self._driver.close()

    def started_line(self) -> str:
        nodes, measurers = self.description["nodes"], self.description["measurers"]
        devices = ", ".join(sorted({m["device"] for m in measurers if m["device"]}))
        return (
            f"cluster at {self.options.address}: {len(nodes)} node(s), {sum(n['cpus'] for n in nodes):.0f} CPUs; "
            f"{len(measurers)} measuring actor(s) on {devices}"
        )

    @property
    def energy_measurable(self) -> bool:
        measurers = self.description.get("measurers", [])
        return bool(measurers) and all(m["energy"] for m in measurers)

    @property
    def pipelines_batches(self) -> bool:
        """No: the driver holds one batch (a second ``submit`` drops the first's unfinished work)."""
        return False

    def measurers(self) -> list[dict]:
        """The measuring actors as of the latest reply: name, device, state, measured, dop, in_flight, restarts, pid."""
        return self._activity.get("measurers", [])

    # -- measuring ------------------------------------------------------------------------------
    def measure(
        self,
        inputs: Sequence[MeasureInput],
        timing: TimingConfig | None = None,
        serial: bool = False,
        group: str | None = None,
    ) -> Iterator[MeasureResult]:
        """As ``MeasureEngine.measure``: one result per input, as each comes back from the cluster.
        All candidates of one ``group`` are measured on devices of one model."""
        timing = timing or self.config.timing
        self._call("submit", None, inputs=list(inputs), timing=timing.as_dict(), serial=serial, group=group)
        while True:
            reply = self._call("poll", self.options.poll_seconds + 300, wait=self.options.poll_seconds)
            self._activity = reply["activity"]
            yield from reply["results"]
            if reply["lost"]:
                raise ClusterLost(reply["lost"])
            if reply["done"]:
                return

    def build(self, inputs: Sequence[MeasureInput]) -> list[tuple[BuildResult, str]]:
        """Build candidates on the cluster; each result comes with the node that built it (no
        artifacts come back: this is for measuring build throughput)."""
        return self._call("build", None, inputs=list(inputs))

    def verify(
        self, reference: tvm.IRModule, candidate: tvm.IRModule, rtol: float, group: str | None = None
    ) -> VerifyResult:
        ref_target = host_target(self.target)
        request = dict(
            reference_target=str(ref_target), reference_device=device_kind(ref_target), rtol=rtol, group=group
        )
        return self._call(
            "verify",
            None,
            reference=MeasureInput(REFERENCE_KEY, reference),
            candidate=MeasureInput("candidate", candidate),
            **request,
        )

    def compile_program(self, artifact: Path, timeout: float = 1800.0, **request) -> Path:
        self._call("compile_program", timeout + 60, artifact=str(artifact), timeout=timeout, **request)
        return artifact

    def time_program(
        self,
        artifact: Path,
        kind: str,
        args: Sequence,
        timing: TimingConfig | None = None,
        timeout: float | None = None,
    ) -> list[float]:
        # no limit here: stopping the driver's call would take the cluster's driver down with it
        timing = timing or self.config.timing
        return self._call(
            "time_program", None, artifact=str(artifact), kind=kind, args=list(args), timing=timing.as_dict()
        )

    def settle(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for measuring actors being restarted to be back."""
        self._activity = self._call("settle", wait + 60, wait=wait)

    def activity(self) -> str | None:
        """Per node, how many candidates it built; per measuring actor, its state and work."""
        if not self._activity:
            return None
        built = ", ".join(f"{node} {count}" for node, count in sorted(self._activity["built_on"].items()))
        measurers = []
        for m in self._activity["measurers"]:
            state = f"DOP {m['dop']}, {m['in_flight']} chunk(s) in flight" if m["state"] == "up" else m["state"]
            restarts = f", restarted {m['restarts']}x" if m["restarts"] else ""
            measurers.append(f"{m['name']} ({m['device']}): {m['measured']} measured, {state}{restarts}")
        return f"cluster: built on {built or 'no node yet'} | " + " | ".join(measurers)

    def _call(self, op: str, call_timeout: float | None, /, **request):
        try:
            return self._driver.call(op, call_timeout, **request)
        except (WorkerCrashed, WorkerTimeout) as err:
            raise ClusterLost(f"the Ray driver stopped: {_reason(err)}") from None
        except WorkerError as err:
            raise_if_no_device(str(err))
            raise


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast, with a plain reason, where nothing listens at a HOST:PORT address (Ray itself
    retries for tens of seconds and then names its own internals)."""
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ClusterUnavailable(
            f"{address!r} is not a Ray address: give 'auto', 'local', HOST:PORT or ray://HOST:PORT"
        )
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        raise ClusterUnavailable(f"nothing answers at {address} ({err.strerror or err})") from None


def _reason(err: Exception) -> str:
    return str(err).removeprefix("ClusterError: ")
