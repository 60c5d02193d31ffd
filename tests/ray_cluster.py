"""A real Ray cluster on this machine for tests: a head node and extra nodes, each its own
`ray start --block` process group on free loopback ports, stopped without touching any other
Ray instance on the machine (so no `ray stop`). Its temp dir (the nodes' logs) is removed after
it unless the block it ran in raised or ``keep_logs`` was set."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalRayCluster:
    def __init__(self, num_cpus: int = 2, num_gpus: int = 0, resources: dict | None = None):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.client_address = f"ray://127.0.0.1:{free_port()}"  # Ray Client's server on the head
        self.temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
        self.nodes: list[subprocess.Popen] = []
        self.keep_logs = False
        client_port = self.client_address.rsplit(":", 1)[1]
        self._start(["--head", f"--port={self.port}", f"--temp-dir={self.temp_dir}", "--include-dashboard=false",
                     f"--ray-client-server-port={client_port}"], num_cpus, num_gpus, resources)  # fmt: skip
        self.wait_for_nodes(1)

    def add_node(self, num_cpus: int = 1, num_gpus: int = 0, resources: dict | None = None) -> None:
        """Start another node (a raylet of its own) that joins this cluster over loopback."""
        self._start([f"--address={self.address}"], num_cpus, num_gpus, resources)
        self.wait_for_nodes(len(self.nodes))

    def _start(self, args: list[str], num_cpus: int, num_gpus: int, resources: dict | None) -> None:
        ports = [f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}",
                 f"--runtime-env-agent-port={free_port()}", f"--node-manager-port={free_port()}",
                 f"--object-manager-port={free_port()}"]  # fmt: skip
        command = [
            RAY,
            "start",
            "--block",
            "--disable-usage-stats",
            f"--num-cpus={num_cpus}",
            f"--num-gpus={num_gpus}",
            *args,
            *ports,
        ]
        if resources:
            command.append(f"--resources={json.dumps(resources)}")
        log = open(Path(self.temp_dir) / f"node-{len(self.nodes)}.log", "wb")
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
        self.nodes.append(
            subprocess.Popen(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        )

    def wait_for_nodes(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = subprocess.run([RAY, "status", f"--address={self.address}"], capture_output=True, text=True)
            if status.returncode == 0 and status.stdout.split("Pending:")[0].count(" node_") >= count:
                return
            if any(node.poll() is not None for node in self.nodes):
                raise RuntimeError(f"a Ray node exited: see {self.temp_dir}/node-*.log")
            time.sleep(1)
        raise RuntimeError(
            f"{count} Ray node(s) did not come up within {timeout:.0f} s: see {self.temp_dir}/node-*.log"
        )

    def stop(self) -> None:
        """Stop every node (the whole process group of each `ray start --block`)."""
        for node in reversed(self.nodes):
            _kill_group(node, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for node in self.nodes:
            try:
                node.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _kill_group(node, signal.SIGKILL)
            node.wait()

    def __enter__(self) -> LocalRayCluster:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.stop()
        if exc_type is None and not self.keep_logs:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def _kill_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
