"""Turn what a user hands the tuner (a name, a PrimFunc, a Relax module, a torch module) into a Workload."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tvm
from tvm import relax

from .errors import WorkloadError
from .operators import prim_func_workload
from .registry import get_workload
from .workload import TensorSpec, Workload, prim_func_inputs


def load_workload(model: Any, example_inputs: Sequence[Any] | None = None, name: str | None = None) -> Workload:
    """Return the Workload for ``model``: a registered name, a PrimFunc, an IRModule or a torch.nn.Module."""
    if isinstance(model, Workload):
        return model
    if isinstance(model, str):
        return get_workload(model)
    if isinstance(model, tvm.tirx.PrimFunc):
        return from_prim_func(model, name or "primfunc")
    if isinstance(model, tvm.IRModule):
        return from_ir_module(model, name or "module")
    if _is_torch_module(model):
        return from_torch(model, example_inputs, name or type(model).__name__)
    raise WorkloadError(
        f"cannot tune an object of type {type(model).__name__}: pass a registered workload name, "
        "a TensorIR PrimFunc, a Relax IRModule, or a torch.nn.Module with example_inputs"
    )


def from_prim_func(func: tvm.tirx.PrimFunc, name: str) -> Workload:
    try:
        inputs = prim_func_inputs(func)
    except TypeError as err:
        raise WorkloadError(f"PrimFunc {name!r} has an argument that is not a buffer; only buffer arguments can be tuned") from err
    for spec in inputs:
        _check_static(f"argument {spec.name}", spec.shape)
    return prim_func_workload(name, func, f"PrimFunc {name}")


def from_ir_module(mod: tvm.IRModule, name: str) -> Workload:
    relax_funcs = [gv for gv, f in mod.functions.items() if isinstance(f, relax.Function)]
    if not relax_funcs:
        prim_funcs = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
        if len(prim_funcs) != 1:
            raise WorkloadError(
                f"IRModule {name!r} holds {len(prim_funcs)} PrimFuncs and no Relax function; "
                "pass a single PrimFunc, or a Relax module whose `main` calls them"
            )
        return from_prim_func(prim_funcs[0], name)
    if "main" not in [gv.name_hint for gv in relax_funcs]:
        raise WorkloadError(f"Relax module {name!r} has no `main` function: name the entry function `main`")
    main = mod["main"]
    inputs = []
    for param in main.params:
        ty = param.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            raise WorkloadError(f"input {param.name} of {name!r} is not a tensor with a known shape")
        _check_static(f"input {param.name}", ty.shape.values)
        inputs.append(TensorSpec(str(param.name), tuple(int(d) for d in ty.shape.values), str(ty.dtype)))
    return Workload(name=name, kind="relax", mod=mod, inputs=inputs, description=f"Relax module {name}")


def from_torch(module: Any, example_inputs: Sequence[Any] | None, name: str) -> Workload:
    """Import a torch.nn.Module through torch.export; ``example_inputs`` are tensors or shapes."""
    torch = _import_torch()
    if example_inputs is None:
        raise WorkloadError(
            f"tuning torch module {name} needs example_inputs: a tuple of tensors or of shapes, e.g. example_inputs=[(1, 3, 224, 224)]"
        )
    examples = tuple(_as_example_tensor(torch, x) for x in _as_sequence(example_inputs))
    from tvm.relax.frontend.torch import from_exported_program

    try:
        exported = torch.export.export(module.eval(), examples)
    except Exception as err:  # torch raises many types here; they all mean the inputs or module do not fit
        raise WorkloadError(f"torch.export could not trace {name} with the given example_inputs: {_first_line(err)}") from err
    mod = from_exported_program(exported, unwrap_unit_return_tuple=True)
    return from_ir_module(mod, name)


def _is_torch_module(obj: Any) -> bool:
    return any(cls.__module__.startswith("torch.nn") and cls.__name__ == "Module" for cls in type(obj).__mro__)


def _import_torch():
    try:
        import torch
    except ImportError as err:
        raise WorkloadError("importing a torch module needs torch: pip install 'tensor-tuner[torch]'") from err
    return torch


def _as_sequence(example_inputs: Any) -> Sequence[Any]:
    if isinstance(example_inputs, (list, tuple)) and example_inputs and all(isinstance(d, int) for d in example_inputs):
        return [tuple(example_inputs)]  # a single shape
    return example_inputs if isinstance(example_inputs, (list, tuple)) else [example_inputs]


def _as_example_tensor(torch: Any, x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)) and all(isinstance(d, int) for d in x):
        _check_static("example input", x)
        return torch.randn(*x)
    raise WorkloadError(f"example input {x!r} is neither a torch.Tensor nor a shape tuple")


def _check_static(what: str, shape: Sequence[Any]) -> None:
    for dim in shape:
        if not isinstance(dim, (int, tvm.tirx.IntImm)):
            raise WorkloadError(
                f"{what} has a dynamic dimension ({dim}); the tuner needs static shapes: bind it to a concrete size"
            )
        if int(dim) <= 0:
            raise WorkloadError(f"{what} has a dimension of size {int(dim)}; every dimension must be positive")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
