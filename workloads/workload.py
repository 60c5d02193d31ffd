"""The data a model becomes before tuning: an IRModule plus the specs of its inputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import tvm


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one input of a workload."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass
class Workload:
    """A tunable program.

    ``kind`` is ``"relax"`` for a whole model (a Relax IRModule whose ``main`` takes
    ``inputs``; weights are bound as constants) or ``"tir"`` for a single kernel (an
    IRModule holding one PrimFunc ``main`` whose buffer arguments are ``inputs``).
    """

    name: str
    kind: str
    mod: tvm.IRModule
    inputs: list[TensorSpec]
    description: str = ""
    source: str = ""
    # Computes the expected output from the inputs (NumPy arrays, outputs excluded) independently
    # of TVM: NumPy for operators, the PyTorch module for models. None for imported programs.
    reference: Callable[..., object] | None = field(default=None, repr=False)
    # What ``reference`` is (PyTorch, ONNX Runtime, NumPy), for reports; and the inputs the model was
    # imported with (NumPy arrays), on which the compiled model is checked against it. None: random ones.
    reference_name: str = ""
    precision: str = "float32"  # "bfloat16": the lowering computes convolutions and matmuls from bf16
    examples: list | None = field(default=None, repr=False)

    @property
    def is_model(self) -> bool:
        return self.kind == "relax"


def prim_func_inputs(func: tvm.tirx.PrimFunc) -> list[TensorSpec]:
    """The buffer arguments of a PrimFunc (in TVM 0.27 its params are the buffers themselves).

    A dynamic dimension is kept as its symbolic expression so that the caller can name it.
    """
    specs = []
    for param in func.params:
        if not hasattr(param, "shape"):
            raise TypeError(f"argument {param} is not a buffer")
        shape = tuple(int(d) if isinstance(d, (int, tvm.tirx.IntImm)) else d for d in param.shape)
        specs.append(TensorSpec(str(param.name), shape, str(param.dtype)))
    return specs
