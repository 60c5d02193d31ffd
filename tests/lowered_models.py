"""Running a lowered model, built by real TVM, against the PyTorch module it came from."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from codegen.build import build_lowered_model


def error_against_torch(
    model,  # a torch.nn.Module
    lowered: tvm.IRModule,
    target: tvm.target.Target,
    x: np.ndarray,
    database: ms.database.Database | None = None,
) -> float:
    """The largest deviation of the lowered model's output on ``x`` from ``model``'s, relative to the
    latter's largest value; built with ``database``'s schedules (none: TVM's default ones)."""
    import torch  # only where the caller has it: its tests skip without

    executable = build_lowered_model(lowered, target, database or ms.database.MemoryDatabase())
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy().astype(np.float64)
    return float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))
