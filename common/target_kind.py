"""Which kind of device a target compiles for, asked the same way everywhere."""

from __future__ import annotations

import tvm


def is_cuda(target: tvm.target.Target | str) -> bool:
    """Whether ``target`` compiles for an NVIDIA GPU: a Target, or a string naming one (the JSON form
    ``str(Target)`` gives, as the database and model descriptions store it; a tag; "cuda -arch=sm_90").
    The one test for it: every package asks this."""
    if isinstance(target, str):
        text = target.strip()
        kind = text.split()[0] if text and not text.startswith("{") else ""
        if not kind or "/" in kind:  # the JSON form or a tag ("nvidia/nvidia-a100"): TVM reads them
            target = tvm.target.Target(text)
        else:
            return kind == "cuda"
    return target.kind.name == "cuda"
