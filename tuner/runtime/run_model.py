"""Run a compiled model in a process of its own, once per pair of files:
``python -m tuner.runtime.run_model LIBRARY IN.npz OUT.npz [IN2.npz OUT2.npz ...]``.

The end-to-end check runs each build this way. In one process, TVM 0.27 runs a library loaded after
another build of the same model with the first one's kernels: a tuned model loaded after its
untuned build returned the untuned outputs exactly (``tests/test_never_wrong.py``), which made a
wrong model look right and a comparison of the two read an error of exactly 0.
"""

from __future__ import annotations

import sys

import numpy as np


def main(library: str, *paths: str) -> None:
    """``library`` run on each IN.npz of ``paths`` (IN.npz, OUT.npz, ...), its outputs saved to the OUT.npz after it."""
    # numpy in and out: torch, which tvm_ffi imports whenever it is installed, would add seconds a check
    sys.modules.setdefault("torch", None)
    from .compiled_model import load

    model = load(library)
    for inputs_path, outputs_path in zip(paths[::2], paths[1::2], strict=True):
        with np.load(inputs_path) as saved:
            inputs = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        out = model(*inputs)
        np.savez(outputs_path, *[np.array(o) for o in (out if isinstance(out, list) else [out])])


if __name__ == "__main__":
    main(*sys.argv[1:])
