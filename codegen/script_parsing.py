"""TVMScript parsed without the cost of ``inspect.stack()``.

TVMScript's ``@T.prim_func`` asks for its caller's frames with ``inspect.stack()`` (to find closure
variables and to tell a class body), and that reads a source line for every frame on the stack and, for
each frame whose file does not exist (the import machinery's frozen frames, during an import), searches
every loaded module. Importing TVM's tensor intrinsics (``tvm.s_tir.tensor_intrin``: some seventy
functions parsed, each under a dozen import frames) spent 90% of its time there: 23.6 s, 2.4 s without,
on a 2-core Xeon with TVM loaded (2,000 modules). :func:`light_frame_stacks` makes ``inspect.stack``
return the same frames with the source line of the first three only (the parser reads the third's) while
a block parses.
"""

from __future__ import annotations

import inspect
import linecache
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LINES_KEPT = 3  # frames whose source line is read: TVMScript looks at the third (is it a class body?)
_lock = threading.Lock()
_depth = 0
_original_stack = inspect.stack


def _light_stack(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack(context)``: its callers' frames, outermost last, a source line for the first three."""
    frame = sys._getframe(1)
    infos = []
    while frame is not None:
        code = frame.f_code
        line = ""
        if context > 0 and len(infos) < _LINES_KEPT:
            line = linecache.getline(code.co_filename, frame.f_lineno, frame.f_globals)
        lines, index = ([line], 0) if line else (None, None)
        infos.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, lines, index))
        frame = frame.f_back
    return infos


@contextmanager
def light_frame_stacks() -> Iterator[None]:
    """While inside, ``inspect.stack`` is :func:`_light_stack` (nested and concurrent uses are counted)."""
    global _depth
    with _lock:
        _depth += 1
        inspect.stack = _light_stack
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                inspect.stack = _original_stack
