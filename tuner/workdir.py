"""The work dir: the names of what a run keeps in it, making it, and one tuner at a time in it.

The lock is an OS-level one on a file inside the dir: ``flock`` is released by the kernel when its
holder exits in any way, SIGKILL included, so a dead holder never leaves a stale lock behind; the
file keeps the holder's pid and command line only so that a second tuner can say who holds it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from pathlib import Path

from tvm.target import Target

from .errors import TunerError

DATABASE_FILE = "tuning.db"
ARTIFACT_FILE = "model.so"
UNTUNED_FILE = "untuned.so"  # the same lowering with TVM's default schedules: what tuning is measured against
COST_MODEL_FILE = "cost_model.ubj"
LOCK_FILE = ".tuner.lock"


def prepare_work_dir(work_dir: str | Path | None, name: str, target: Target) -> Path:
    """Create the work dir if needed and make sure it can be written to."""
    path = Path(work_dir) if work_dir is not None else Path("tuner-runs") / f"{name}-{target.kind.name}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise TunerError(
            f"cannot write to work dir {str(path)!r} ({err.strerror or err}): choose a directory you can write to"
        ) from None
    return path


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
                f"work dir {str(self.path.parent)!r} is in use by {holder}: wait for it to finish (or stop it), or choose another --work-dir"
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
