"""TVM's C++ log lines (and the libraries' Python warnings) kept off the user's terminal.

TVM writes its warnings and info lines from C++ straight to file descriptor 2 (the importer's
"Fast mode segfaults when there are out-of-bounds indices", once per embedding; MetaSchedule's
"Sketch 0: tensorizing with ...", once per kernel; "BlockBuilder destroyed with remaining
blocks!"); no setting of TVM's silences them. So for the length of a run, descriptor 2 points at a
log file, and Python's own ``sys.stderr`` (progress lines, warnings, errors) at a copy of the
terminal's descriptor: what the tuner says still reaches the user, what TVM says goes to the file.
Worker processes started meanwhile inherit the file as their descriptor 2. Python warnings raised
meanwhile (torch.export's deprecations, say) go to the same file.

``TENSOR_TUNER_VERBOSE=1`` (``tune(verbose=True)``, ``tuner tune --verbose``) leaves everything on
the terminal.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

VERBOSE_ENV = "TENSOR_TUNER_VERBOSE"
LOG_NAME = "libraries.log"  # in the work dir's logs folder

_lock = threading.Lock()
_active = 0


def verbose_requested(verbose: bool = False) -> bool:
    return verbose or os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class NativeLog:
    """Where the run's C++ log lines go: a scratch file, appended at the end to ``libraries.log`` in the
    folder ``keep_in`` names (the run's logs folder, once the work dir is known)."""

    def __init__(self, scratch: Path | None):
        self.scratch = scratch
        self.log_dir: Path | None = None

    def keep_in(self, log_dir: Path) -> None:
        self.log_dir = log_dir

    def close(self) -> None:
        if self.scratch is None:
            return
        if self.log_dir is not None and self.scratch.stat().st_size:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with open(self.scratch, "rb") as source, open(self.log_dir / LOG_NAME, "ab") as out:
                shutil.copyfileobj(source, out)
        self.scratch.unlink(missing_ok=True)


@contextlib.contextmanager
def native_logs_quiet(verbose: bool = False) -> Iterator[NativeLog]:
    """Send descriptor 2 to a log file while the block runs; a nested use changes nothing (the
    outer one's file takes the lines)."""
    global _active
    with _lock:
        quiet = _active == 0 and not verbose_requested(verbose)
        _active += 1
    if not quiet:
        try:
            yield NativeLog(None)
        finally:
            with _lock:
                _active -= 1
        return
    handle, name = tempfile.mkstemp(prefix="tensor-tuner-tvm-", suffix=".log")
    log = NativeLog(Path(name))
    sys.stderr.flush()
    saved = os.dup(2)
    python_stream = sys.stderr
    swapped = _writes_to_fd2(python_stream)
    try:
        if swapped:
            sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
        os.dup2(handle, 2)
        shown = warnings.showwarning
        warnings.showwarning = _warning_to_fd2
        yield log
    finally:
        warnings.showwarning = shown
        if swapped:
            sys.stderr.close()
            sys.stderr = python_stream
        os.dup2(saved, 2)
        os.close(saved)
        os.close(handle)
        log.close()
        with _lock:
            _active -= 1


def _warning_to_fd2(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    os.write(2, warnings.formatwarning(message, category, filename, lineno, line).encode("utf-8", "backslashreplace"))


def _writes_to_fd2(stream: object) -> bool:
    """Whether Python's stderr is descriptor 2 itself (a terminal or a file), not a capture of its own."""
    try:
        return stream.fileno() == 2  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False
