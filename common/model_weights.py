"""A compiled model's weights, kept beside its library: ``MODEL.params`` for ``MODEL.so``.

A compiled model's ``main`` takes its inputs, then its weights (in the layouts its kernels read them
in). Kept out of the library, they are written once in TVM's own parameter format, which the TVM
runtime alone reads (a measuring worker has nothing more), instead of being compiled into it: BERT-base's
434 MB took 12 s to export inside a library and 1.6 s to load from one. A library with no weights file
beside it holds its weights itself (as libraries compiled before did) and takes its inputs alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import tvm

SUFFIX = ".params"


def weights_path(library: str | Path) -> Path:
    return Path(library).with_suffix(SUFFIX)


def save_weights(path: str | Path, weights: Sequence[tvm.runtime.Tensor]) -> None:
    """Write ``weights`` (in ``main``'s order) to ``path``."""
    tvm.runtime.save_param_dict_to_file({str(i): w for i, w in enumerate(weights)}, str(path))


def read_weights(path: str | Path) -> list[tvm.runtime.Tensor]:
    """The weights ``save_weights`` wrote to ``path``, in their order, on the host."""
    saved = tvm.runtime.load_param_dict_from_file(str(path))
    return [saved[key] for key in sorted(saved.keys(), key=int)]


def load_weights(library: str | Path, device: tvm.runtime.Device) -> list[tvm.runtime.Tensor]:
    """The weights of the compiled model ``library`` on ``device``: the arguments ``main`` takes after
    its inputs; none where the library holds its own."""
    path = weights_path(library)
    if not path.exists():
        return []
    weights = read_weights(path)
    if device.dlpack_device_type() == tvm.cpu(0).dlpack_device_type():
        return weights
    return [w.copyto(device) for w in weights]


def remove_model(library: str | Path) -> None:
    """Delete a compiled model: its library and its weights, where they exist."""
    for path in (Path(library), weights_path(library)):
        path.unlink(missing_ok=True)


def move_model(library: str | Path, to: str | Path) -> None:
    """Move a compiled model (its library, and its weights where it has them) to ``to``, replacing any there."""
    remove_model(to)
    for path, moved in ((Path(library), Path(to)), (weights_path(library), weights_path(to))):
        if path.exists():
            path.replace(moved)
