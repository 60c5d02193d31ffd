"""A compiled model as a callable: numpy arrays or torch tensors in, the same kind out.

Inputs already in the layout TVM wants (contiguous, 64-byte aligned, on the model's device) are
passed without a copy through DLPack; others are copied into input buffers the model keeps. Outputs
come back without a copy: numpy views or torch tensors over the memory the model wrote (on a GPU,
numpy outputs are copied to the host).

A compiled model is a shared library (its kernels and the program that calls them), its weights
beside it (``MODEL.params`` for ``MODEL.so``, ``common.model_weights``) and a small JSON description
(``MODEL.json``: its inputs and target), which ``tuner.load`` reads to run it in another process
without tuning again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import tvm_ffi

from common.model_weights import load_weights, weights_path
from common.target_kind import is_cuda
from measure.timing.in_model import kernel_seconds
from tuner.errors import TunerError
from tuner.targets import resolve_target, target_kind
from workloads import TensorSpec, Workload

_ALIGNMENT = 64  # bytes; TVM's kernels assume their arguments are aligned so


@dataclass(frozen=True)
class ModelDescription:
    """What a compiled library needs beside it to be run: its inputs, target and kind."""

    name: str
    kind: str  # "relax" (a model) or "tir" (a single kernel)
    target: str
    inputs: list[TensorSpec]
    weights: bool = False  # kept beside the library (MODEL.params), not in it

    @classmethod
    def of(cls, workload: Workload, target: tvm.target.Target) -> ModelDescription:
        """The description of ``workload`` compiled for ``target``."""
        return cls(workload.name, workload.kind, str(target), workload.inputs)

    def save(self, library: Path) -> Path:
        path = description_path(library)
        data = {
            "name": self.name,
            "kind": self.kind,
            "target": self.target,
            "inputs": [[s.name, list(s.shape), s.dtype] for s in self.inputs],
            "weights": weights_path(library).exists(),
        }
        path.write_text(json.dumps(data, indent=1) + "\n")
        return path

    @classmethod
    def read(cls, library: Path) -> ModelDescription:
        path = description_path(library)
        if not path.exists():
            raise TunerError(
                f"{library} has no description beside it ({path.name}): export compiled models with "
                "TuneResult.export, which writes both"
            )
        try:
            data = json.loads(path.read_text())
            inputs = [TensorSpec(name, tuple(shape), dtype) for name, shape, dtype in data["inputs"]]
            return cls(data["name"], data["kind"], data["target"], inputs, bool(data.get("weights", False)))
        except (ValueError, KeyError, TypeError) as err:
            raise TunerError(f"{path} is not a model description ({err}): export the model again") from None


def description_path(library: Path) -> Path:
    return Path(library).with_suffix(".json")


class CompiledModel:
    """A tuned model loaded for running: ``model(x)`` returns its output (a list for several)."""

    def __init__(self, library: str | Path, description: ModelDescription, device: tvm.runtime.Device | None = None):
        if description.kind != "relax":
            raise TunerError(
                f"{library} is a single kernel, not a model: load it with tvm.runtime.load_module and call it with "
                "every buffer"
            )
        self.library = Path(library)
        self.description = description
        self.device = device or (tvm.cuda(0) if is_cuda(description.target) else tvm.cpu(0))
        self._on_host = self.device.dlpack_device_type() == tvm.cpu(0).dlpack_device_type()
        if description.weights and not weights_path(self.library).exists():
            raise TunerError(
                f"{self.library} has no weights beside it ({weights_path(self.library).name}): copy them with the "
                "library, or export the model with TuneResult.export, which writes both"
            )
        _set_threads(description.target)
        executable = tvm.runtime.load_module(str(self.library))
        self._vm = tvm.runtime.vm.VirtualMachine(executable, self.device)
        self._main = self._vm["main"]
        self._weights = load_weights(self.library, self.device)  # main's arguments after the inputs
        self._buffers = [tvm.runtime.empty(spec.shape, spec.dtype, self.device) for spec in description.inputs]

    @property
    def inputs(self) -> list[TensorSpec]:
        return self.description.inputs

    def __call__(self, *inputs: Any) -> Any:
        if len(inputs) != len(self.inputs):
            names = ", ".join(spec.name for spec in self.inputs)
            raise TunerError(f"{self.description.name} takes {len(self.inputs)} input(s) ({names}), got {len(inputs)}")
        as_torch = any(_is_torch(x) for x in inputs)
        out = self._main(*[self._argument(i, x) for i, x in enumerate(inputs)], *self._weights)
        if isinstance(out, tvm.runtime.Tensor):
            return self._result(out, as_torch)
        return [self._result(o, as_torch) for o in out]

    def kernel_times(self, *inputs: Any, runs: int = 10) -> dict[str, float]:
        """Median seconds of each kernel (summed over its calls in one inference) as it runs inside
        the model, over ``runs`` inferences on ``inputs`` (``measure.timing.in_model.kernel_seconds``)."""
        arguments = [*(self._argument(i, x) for i, x in enumerate(inputs)), *self._weights]
        return kernel_seconds(self._vm, self._main, arguments, self.device, runs)

    def _argument(self, index: int, value: Any) -> tvm.runtime.Tensor:
        spec = self.inputs[index]
        shape, dtype = tuple(value.shape), str(value.dtype).removeprefix("torch.")
        if shape != tuple(spec.shape) or dtype != spec.dtype:
            raise TunerError(
                f"input {spec.name} of {self.description.name} must be {spec.dtype}{list(spec.shape)}, got "
                f"{dtype}{list(shape)}"
            )
        if self._zero_copy(value):
            return tvm_ffi.from_dlpack(value)
        buffer = self._buffers[index]
        buffer.copyfrom(value.detach().cpu().numpy() if _is_torch(value) else np.ascontiguousarray(value))
        return buffer

    def _zero_copy(self, value: Any) -> bool:
        if _is_torch(value):
            device_ok = (value.device.type == "cpu") == self._on_host
            return (
                device_ok and value.is_contiguous() and value.data_ptr() % _ALIGNMENT == 0 and not value.requires_grad
            )
        if isinstance(value, np.ndarray):
            return self._on_host and value.flags.c_contiguous and value.ctypes.data % _ALIGNMENT == 0
        return False

    def _result(self, out: tvm.runtime.Tensor, as_torch: bool) -> Any:
        if as_torch:
            import torch

            return torch.from_dlpack(out)
        return np.from_dlpack(out) if self._on_host else out.numpy()


def load(path: str | Path, device: tvm.runtime.Device | None = None) -> CompiledModel:
    """A model compiled by ``tune`` (its ``artifact_path`` or an ``export``), ready to run."""
    path = Path(path)
    if not path.exists():
        raise TunerError(f"no compiled model at {path}: pass the .so that tune() or TuneResult.export wrote")
    return CompiledModel(path, ModelDescription.read(path), device)


def _set_threads(target: str) -> None:
    """TVM's thread pool as wide as the target's cores, unless the user set TVM_NUM_THREADS.

    Without it TVM takes half the logical cores on x86 (it assumes two hyperthreads per core): on a
    2-core VM one thread, and the model runs slower than it was tuned. The pool reads the
    variable when it launches work, so setting it here takes effect even if TVM already ran;
    ``runtime.config_threadpool`` cannot raise the count above that default."""
    if os.environ.get("TVM_NUM_THREADS") or target_kind(target) != "llvm":
        return
    cores = resolve_target(json.loads(target) if target.startswith("{") else target).attrs.get("num-cores")
    if cores:
        os.environ["TVM_NUM_THREADS"] = str(int(cores))


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "data_ptr")
