"""A long-lived child process that serves requests one at a time, isolated from the tuner.

The child pays its start-up (importing TVM, loading LLVM) once. A request that runs past its
timeout gets the child killed; a child that dies (a segfault in a candidate, say) is reported
with its signal and the tail of its log. Either way the next call starts a fresh child.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from measure.cuda.errors import cuda_error_line

_HEADER = struct.Struct("!Q")


class WorkerError(Exception):
    """The request failed inside the worker (an exception there); the worker lives on."""


class WorkerCrashed(Exception):
    """The worker process died while serving the request."""


class WorkerTimeout(Exception):
    """The request ran past its timeout; the worker was killed."""


def send_message(fd: int, message: Any) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    data = _HEADER.pack(len(payload)) + payload
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def receive_message(fd: int, deadline: float | None = None) -> Any:
    """Read one message; raise EOFError if the peer closed, TimeoutError past ``deadline``."""
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    return pickle.loads(_read_exact(fd, size, deadline))


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    chunks, remaining = [], size
    while remaining:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


class WorkerProcess:
    """One child ``python -m measure.workers.main ROLE`` and the pipes to talk to it."""

    def __init__(
        self,
        role: str,
        name: str,
        log_path: Path,
        env: dict[str, str] | None = None,
        startup_timeout: float = 300.0,
    ):
        self.role = role
        self.name = name
        self.log_path = Path(log_path)
        self.env = env or {}
        self.startup_timeout = startup_timeout
        self.startup_seconds: float | None = None
        self.import_seconds: float | None = None  # the child's own count: its imports, before it was ready
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._to_child: int | None = None
        self._from_child: int | None = None
        self._ready = False
        self._started_at = 0.0
        self._log_mark = 0  # size of the log when the current request was sent: its own output follows

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        """Spawn the child if it is not running; returns at once (the child imports in the background)."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self._cleanup()
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_mark = _size(self.log_path)
        env = {**os.environ, **self.env}
        # The child must find the measure package even when the tuner runs from a source checkout.
        package_root = str(Path(__file__).resolve().parents[2])  # the checkout holding measure/, codegen/, common/
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "measure.workers.main", str(request_read), str(reply_write), self.role],
                pass_fds=(request_read, reply_write),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        os.close(request_read)
        os.close(reply_write)
        self._to_child, self._from_child = request_write, reply_read
        self._ready = False
        self._started_at = time.monotonic()

    def wait_ready(self) -> float:
        """Block until the child has finished its start-up; returns how long start-up took."""
        self.start()
        if not self._ready:
            deadline = self._started_at + self.startup_timeout
            try:
                kind, info = receive_message(self._from_child, deadline)
            except TimeoutError:
                self.kill()
                raise WorkerTimeout(f"{self.name} did not start within {self.startup_timeout:.0f} s") from None
            except EOFError:
                raise WorkerCrashed(f"{self.name} died during start-up: {self._death_reason()}") from None
            if kind != "ready":
                raise WorkerCrashed(f"{self.name} failed to start: {info}")
            self._ready = True
            self.startup_seconds = time.monotonic() - self._started_at
            self.import_seconds = info.get("seconds") if isinstance(info, dict) else None
        return self.startup_seconds or 0.0

    def call(self, op: str, timeout: float | None, /, **kwargs: Any) -> Any:
        """Run ``op`` in the child; raise WorkerError, WorkerTimeout or WorkerCrashed on failure."""
        self._send(op, kwargs)
        kind, payload = self._receive(timeout)
        if kind == "error":
            raise WorkerError(payload)
        return payload

    def stream(self, op: str, item_timeout: float | None, /, **kwargs: Any) -> Iterator[Any]:
        """Run ``op``, a generator in the child, yielding each item it sends as it comes; each item
        has ``item_timeout`` seconds from the one before. Failures raise as in ``call``, after the
        items that came before them were yielded."""
        self._send(op, kwargs)
        while True:
            kind, payload = self._receive(item_timeout)
            if kind == "item":
                self._log_mark = _size(self.log_path)  # a crash's reason is in what the next item wrote
                yield payload
            elif kind == "error":
                raise WorkerError(payload)
            else:
                return

    def _send(self, op: str, kwargs: dict) -> None:
        self.wait_ready()
        self._log_mark = _size(self.log_path)
        try:
            send_message(self._to_child, (op, kwargs))
        except BrokenPipeError:
            raise WorkerCrashed(self._crashed()) from None

    def _receive(self, timeout: float | None) -> tuple[str, Any]:
        """The child's next message, within ``timeout`` seconds (the child is killed past it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            return receive_message(self._from_child, deadline)
        except TimeoutError:
            self.kill()
            raise WorkerTimeout(f"timed out after {timeout:.1f} s") from None
        except EOFError:
            raise WorkerCrashed(self._crashed()) from None

    def _crashed(self) -> str:
        reason = self._death_reason()
        self._cleanup()
        self.restarts += 1
        return reason

    def kill(self) -> None:
        """End the child (if it has not ended by itself); the next call starts a fresh one."""
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._proc.wait()
            self.restarts += 1
        self._cleanup()

    def close(self) -> None:
        """Ask the child to exit; kill it if it does not within a few seconds."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                send_message(self._to_child, ("exit", {}))
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self._proc is not None and self._proc.poll() is None:
            self.kill()
        self._cleanup()

    def _death_reason(self) -> str:
        code = self._proc.wait() if self._proc else None
        if code is not None and code < 0:
            what = f"killed by {signal.Signals(-code).name}"
        else:
            what = f"exited with code {code}"
        tail = _last_meaningful_line(self.log_path, self._log_mark)
        return f"worker {what}" + (f" ({tail})" if tail else "")

    def _cleanup(self) -> None:
        for fd in (self._to_child, self._from_child):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._to_child = self._from_child = None
        self._proc = None
        self._ready = False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _last_meaningful_line(path: Path, since: int = 0, max_bytes: int = 8192) -> str:
    """What the log says last since byte ``since`` (the current request's output); a line naming a
    CUDA error wins, since what follows it (an abort's stack) says less."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(since, f.tell() - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    cuda_error = cuda_error_line(text)
    if cuda_error:
        return cuda_error[:300]
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and not line.startswith(("File ", "Thread ", "Current thread", "Extension modules")):
            return line[:300]
    return ""
