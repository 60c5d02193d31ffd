"""The bf16 tensor intrinsics' PrimFuncs kept on disk between processes.

TVMScript parses an intrinsic's description and implementation in 60-80 ms (the 69 that SqueezeNet's bf16 tuning
names: 4.4 s), and the tuning process pays it, then every build worker that meets the intrinsic again; TVM's JSON
of the same two PrimFuncs loads in 5 ms. An entry is keyed by the intrinsic's name, TVM's version and the source
of the modules that write intrinsics, so a change to any of them parses afresh; an entry that does not load is
parsed and written again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import tvm

from common.host import user_cache_dir, write_atomically

# the modules whose source decides what an intrinsic's name stands for
_WRITERS = ("bf16_dot.py", "amx_dot.py", "dot_kernel.py")

Pair = tuple[tvm.tirx.PrimFunc, tvm.tirx.PrimFunc]


@functools.cache
def _version() -> str:
    digest = hashlib.sha256(tvm.__version__.encode())
    for name in _WRITERS:
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:16]


def entry_path(name: str) -> Path:
    return user_cache_dir() / "intrinsics" / _version() / f"{name}.json"


def cached_intrinsic(name: str, parse: Callable[[], Pair]) -> Pair:
    """The (description, implementation) of intrinsic ``name``: from the cache, else ``parse()``d and cached."""
    path = entry_path(name)
    try:
        entry = json.loads(path.read_text())
        return tvm.ir.load_json(entry["description"]), tvm.ir.load_json(entry["implementation"])
    except Exception:  # noqa: BLE001 - absent, unreadable or written by another TVM: parsed afresh
        pass
    description, implementation = parse()
    pair = {"description": description, "implementation": implementation}
    text = json.dumps({part: tvm.ir.save_json(func) for part, func in pair.items()})
    try:
        if not path.parent.is_dir():
            _forget_other_versions(path.parent)
        write_atomically(path, text)  # build workers may write the same entry at once
    except OSError:
        pass  # a read-only or full cache costs the next process a parse, nothing more
    return description, implementation


def _forget_other_versions(current: Path) -> None:
    """Entries written by other code or another TVM: nothing reads them again."""
    if current.parent.is_dir():
        for other in current.parent.iterdir():
            if other != current:
                shutil.rmtree(other, ignore_errors=True)
