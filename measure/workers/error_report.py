"""One line for a failure in a worker: what the database records of a candidate that failed."""

from __future__ import annotations

import traceback

from common.error_text import error_line
from measure.cuda.errors import cuda_error_line

_STORAGE_ERRORS = ("No space left on device", "Read-only file system", "Disk quota exceeded")


def _storage_line(lines: list[str]) -> str | None:
    """The line saying the disk is full or read-only (a linker's, say): the tuner must see that it
    was the work dir, not the candidate, that failed."""
    return next((line for line in lines if any(e in line for e in _STORAGE_ERRORS)), None)


def describe_error(err: BaseException) -> str:
    """One readable line for the database: the error's type and the line naming it, which is the
    line naming a CUDA error (``measure.cuda.errors``) or a full or read-only disk wherever it is,
    else the message's last line (a candidate's build failure comes after the IR or the kernel's
    source). Terse messages ("not implemented") get the TVM function they came from."""
    text = str(err).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    message = cuda_error_line(text) or _storage_line(lines) or error_line(text, last=True)
    frames = traceback.extract_tb(err.__traceback__)
    if frames and frames[-1].filename.endswith((".cc", ".h")):
        function = frames[-1].name.split("(")[0].split()[-1]
        message += f" (in {function})"
    if isinstance(err, MemoryError) or "bad_alloc" in message:
        message = f"out of memory ({message or 'MemoryError'})"
    return f"{type(err).__name__}: {message}"[:500]
