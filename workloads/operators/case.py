"""An operator workload: a TE computation at the shapes of one real layer, its NumPy reference, and
how a PrimFunc becomes a workload."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import te

from ..workload import Workload, prim_func_inputs

# (dtype of the inputs) -> (input placeholders, output)
Compute = Callable[[str], tuple[list[te.Tensor], te.Tensor]]


@dataclass(frozen=True)
class OperatorCase:
    family: str
    name: str
    source: str
    compute: Compute
    reference: Callable[..., np.ndarray]
    fp16: bool = False  # also registered as NAME-fp16

    def workload(self, dtype: str = "float32") -> Workload:
        inputs, output = self.compute(dtype)
        suffix = "" if dtype == "float32" else "-fp16"
        description = f"{self.family}, {self.source}, {'fp16 in / fp32 out' if suffix else 'fp32'}"
        return prim_func_workload(
            self.name + suffix, te.create_prim_func([*inputs, output]), description, self.source, self.reference
        )


def prim_func_workload(
    name: str,
    func: tvm.tirx.PrimFunc,
    description: str,
    source: str = "",
    reference: Callable[..., np.ndarray] | None = None,
) -> Workload:
    """Wrap a PrimFunc as a workload whose inputs are the function's buffer arguments."""
    func = func.with_attr("global_symbol", "main")
    mod = tvm.IRModule({"main": func})
    return Workload(
        name=name,
        kind="tir",
        mod=mod,
        inputs=prim_func_inputs(func),
        description=description,
        source=source,
        reference=reference,
    )


# Accumulation and output type for every input dtype: fp16 inputs accumulate in fp32, the
# tensor-core way.
ACCUMULATE = "float32"
