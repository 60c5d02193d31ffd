"""The one line of an error's text that names what went wrong, for messages that must stay on one
line (a database record, a ``WorkloadError``, a doctor's finding, an experiment's table).

It imports nothing of the project (``measure``'s package imports nothing eagerly), so ``workloads``
and ``tuner`` use it too without pulling in the measuring side. Recognising a CUDA error (``measure.cuda.errors``) or a
full disk is the caller's business: this knows only where messages put their point.
"""

from __future__ import annotations

import re

__all__ = ["error_line"]

# A traceback's own lines: Python's header and frames (Ray's task errors carry the remote one),
# and the numbered or "at ..." frames of C++ back-traces; frames are indented, the header is not.
_FRAME = re.compile(r'(Traceback \(most recent call last\)|\s+(File "|at |\d+: ))')


def error_line(err: BaseException | str, *, last: bool = False) -> str:
    """The line of ``err``'s message (or of the text ``err``) that names the error, stripped.

    A traceback in the text is passed over: the message is what follows its last frame (the
    frames' indented source lines excluded). Of the message's non-blank lines the first is
    returned, as most messages lead with what went wrong and follow with detail (torch's hints,
    ONNX's checker context, TVM's target options); ``last=True`` returns the last instead, for
    texts that end with the cause (Ray's reports of a dead actor, nvcc's output after the kernel's
    source, a candidate's build failure after the IR). An empty message gives the exception's
    type name (the empty string for empty text)."""
    text = err if isinstance(err, str) else str(err)
    lines = text.splitlines()
    frames = [i for i, line in enumerate(lines) if _FRAME.match(line)]
    if frames:
        after = lines[frames[-1] + 1 :]
        start = next((i for i, line in enumerate(after) if line.strip() and not line[0].isspace()), None)
        lines = after[start:] if start is not None else [line for line in lines if not _FRAME.match(line)]
    lines = [line.strip() for line in lines if line.strip()]
    if lines:
        return lines[-1] if last else lines[0]
    return "" if isinstance(err, str) else type(err).__name__
