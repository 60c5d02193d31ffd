"""Turn what a user hands the tuner into a Workload: a registered name, a TensorIR PrimFunc, a Relax
IRModule, a torch.nn.Module with example inputs, or the path of an ONNX file."""

from __future__ import annotations

import ast
import gc
import importlib
import importlib.util
import re
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from common.error_text import error_line

from .errors import TorchSource, WorkloadError
from .precision import in_precision
from .registry import get_workload
from .workload import TensorSpec, Workload, prim_func_inputs


def load_workload(
    model: Any,
    example_inputs: Sequence[Any] | None = None,
    name: str | None = None,
    batch: int | None = None,
    dtype: str | None = None,
) -> Workload:
    """Return the Workload for ``model``.

    ``example_inputs`` are tensors or shapes: required for a torch module, and for an ONNX model
    whose inputs have symbolic dimensions. ``batch`` chooses a built-in model's batch size.
    ``dtype="float16"`` computes a model's convolutions and matmuls in half precision (inputs and
    outputs stay as they are); a PrimFunc computes in its buffers' dtypes.
    """
    if isinstance(model, Workload):
        return model
    if isinstance(model, str) and not model.endswith(".onnx"):
        return get_workload(model, batch=batch, dtype=dtype)
    if isinstance(model, tvm.tirx.PrimFunc):
        if dtype not in (None, "float32"):
            raise WorkloadError(
                f"dtype={dtype!r} applies to models: a PrimFunc computes in its buffers' dtypes, so write it in float16"
            )
        return from_prim_func(model, name or "primfunc")
    if isinstance(model, (str, Path)) and str(model).endswith(".onnx"):
        workload = from_onnx(Path(model), example_inputs, name)
    elif isinstance(model, tvm.IRModule):
        workload = from_ir_module(model, name or "module")
    elif _is_torch_module(model):
        workload = from_torch(model, example_inputs, name or type(model).__name__)
    else:
        raise WorkloadError(
            f"cannot tune an object of type {type(model).__name__}: pass a registered workload name, "
            "a TensorIR PrimFunc, a Relax IRModule, a torch.nn.Module with example_inputs, or an .onnx path"
        )
    return in_precision(workload, dtype)


def import_optional(module: str, extra: str, why: str) -> Any:
    """Import an optional dependency, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise WorkloadError(f"{why}, which needs {module}: pip install 'tensor-tuner[{extra}]'") from None


def from_prim_func(func: tvm.tirx.PrimFunc, name: str) -> Workload:
    from workloads.operators import prim_func_workload

    try:
        inputs = prim_func_inputs(func)
    except TypeError as err:
        raise WorkloadError(
            f"PrimFunc {name!r} has an argument that is not a buffer; only buffer arguments can be tuned"
        ) from err
    for spec in inputs:
        check_static(f"argument {spec.name}", spec.shape)
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
    inputs = []
    for param in mod["main"].params:
        ty = param.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            raise WorkloadError(f"input {param.name} of {name!r} is not a tensor with a known shape")
        check_static(f"input {param.name}", ty.shape.values)
        inputs.append(TensorSpec(str(param.name), tuple(int(d) for d in ty.shape.values), str(ty.dtype)))
    return Workload(name=name, kind="relax", mod=mod, inputs=inputs, description=f"Relax module {name}")


def from_torch(module: Any, example_inputs: Sequence[Any] | None, name: str) -> Workload:
    """Import a torch.nn.Module through torch.export; ``example_inputs`` are tensors or shapes."""
    torch = import_optional("torch", "torch", f"importing torch module {name}")
    if example_inputs is None:
        raise WorkloadError(
            f"tuning torch module {name} needs example_inputs: a tuple of tensors or of shapes, e.g. "
            "example_inputs=[(1, 3, 224, 224)]"
        )
    examples = tuple(_as_example_tensor(torch, x) for x in _as_sequence(example_inputs))
    from tvm.relax.frontend.torch import from_exported_program

    from .moe_experts import dense_experts  # torch's: imported with it
    from .torch_prepass import FlatOutputs, plain_output, prepare_exported_program

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.export's own deprecation notices
        try:
            with torch.no_grad():
                out = module.eval()(*examples)  # torch.export traces with fake tensors and lets a wrong dtype through
            # a dict or a transformers ModelOutput: its tensors as a tuple (torch_prepass.py)
            with dense_experts(module):  # transformers' experts, every token through every expert (moe_experts.py)
                exported = torch.export.export(module if plain_output(out) else FlatOutputs(module), examples)
        except Exception as err:  # torch raises many types here; they all mean the inputs do not fit the module
            raise WorkloadError(
                f"example inputs {[(*x.shape, str(x.dtype).removeprefix('torch.')) for x in examples]} do not fit "
                f"torch module {name}: "
                f"{error_line(err)}"
            ) from None
    prepare_exported_program(exported)  # what torch accepts and TVM's importer does not (torch_prepass.py)
    failure, unsupported = None, []
    try:
        mod = from_exported_program(exported, unwrap_unit_return_tuple=True)
    except Exception as err:  # noqa: BLE001 - the importer signals unsupported programs with several types
        ops = re.search(r"Unsupported function types (\[.*\])", str(err))
        unsupported = sorted(ast.literal_eval(ops.group(1))) if ops is not None else []
        failure = (
            f"torch module {name} uses operators TVM's importer does not support: {ops.group(1)}"
            if ops is not None
            else f"TVM's torch importer cannot translate module {name}: {error_line(err)}"
        )
    if failure is not None:
        # raised outside the except clause, so that the importer's error (whose traceback holds the failed
        # importer) is not kept as this one's context: the importer's BlockBuilder is freed now, and says
        # "BlockBuilder destroyed with remaining blocks!" while tune()'s descriptor 2 still goes to its log
        gc.collect()
        raise WorkloadError(failure, unsupported, TorchSource(name, module, examples) if unsupported else None)
    workload = from_ir_module(mod, name)
    workload.reference, workload.reference_name = torch_reference(module), "PyTorch"
    workload.examples = [x.detach().cpu().numpy() for x in examples]
    return workload


def torch_reference(module: Any) -> Callable[..., list[np.ndarray]]:
    """The module's outputs (a list of NumPy arrays) for NumPy inputs: the reference a compiled model
    is checked against."""

    def reference(*inputs: np.ndarray) -> list[np.ndarray]:
        import torch

        from .torch_prepass import torch_leaves

        with torch.no_grad():
            out = module(*[torch.from_numpy(np.array(x)) for x in inputs])
        return [t.detach().numpy() for t in torch_leaves(out)]

    return reference


def from_onnx(path: Path, example_inputs: Sequence[Any] | None = None, name: str | None = None) -> Workload:
    """Import an ONNX model; inputs with symbolic dimensions take their shapes from ``example_inputs``."""
    onnx = import_optional("onnx", "onnx", f"importing the ONNX model {path}")
    name = name or path.stem
    if not path.exists():
        raise WorkloadError(f"ONNX file {path} does not exist")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as err:  # onnx raises DecodeError, ValidationError, ...: all mean a broken file
        raise WorkloadError(
            f"{path} is not a valid ONNX model ({error_line(err)}): re-export it, or check the file is complete"
        ) from None
    initializers = {init.name for init in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]
    overrides = list(_as_sequence(example_inputs)) if example_inputs is not None else []
    if overrides and len(overrides) != len(graph_inputs):
        raise WorkloadError(f"{path} has {len(graph_inputs)} inputs but {len(overrides)} example inputs were given")
    shapes, dtypes = {}, _onnx_dtypes(onnx, graph_inputs)
    for index, graph_input in enumerate(graph_inputs):
        dims = [
            d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
            for d in graph_input.type.tensor_type.shape.dim
        ]
        shape = tuple(_shape_of(overrides[index])) if overrides else dims
        if overrides:
            _check_fits_onnx_input(
                f"ONNX input {graph_input.name!r} of {path.name}", dims, overrides[index], dtypes[graph_input.name]
            )
        check_static(
            f"ONNX input {graph_input.name!r} of {path.name}", shape, hint="give its shape with example_inputs"
        )
        shapes[graph_input.name] = list(shape)
    from tvm.relax.frontend.onnx import from_onnx as relax_from_onnx

    try:
        mod = relax_from_onnx(model, shape_dict=shapes, dtype_dict=dtypes)
    except tvm.error.OpNotImplemented as err:
        ops = error_line(err).split(":", 1)[-1].strip()
        raise WorkloadError(f"{path.name} uses ONNX operators TVM's importer does not support: {ops}") from None
    workload = from_ir_module(mod, name)
    if importlib.util.find_spec("onnxruntime") is not None:  # else the model is checked against TVM's defaults
        names = [graph_input.name for graph_input in graph_inputs]
        workload.reference, workload.reference_name = onnx_reference(path, names), "ONNX Runtime"
    return workload


def onnx_reference(path: Path, input_names: list[str]) -> Callable[..., list[np.ndarray]]:
    """ONNX Runtime's outputs of the model at ``path`` for NumPy inputs."""

    def reference(*inputs: np.ndarray) -> list[np.ndarray]:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(None, dict(zip(input_names, inputs, strict=True)))

    return reference


def _check_fits_onnx_input(what: str, declared: Sequence[Any], example: Any, dtype: str) -> None:
    """An example input may fill in the dimensions the file leaves symbolic, not change the others."""
    shape = tuple(_shape_of(example))
    fixed = [d if isinstance(d, int) and d > 0 else None for d in declared]
    if len(shape) != len(fixed) or any(d is not None and d != s for d, s in zip(fixed, shape, strict=True)):
        shown = tuple(d if d is not None else "?" for d in fixed)
        raise WorkloadError(
            f"{what} has shape {shown} but the example input has shape {shape}: give a shape that fits it"
        )
    given = getattr(example, "dtype", None)
    if given is not None and str(given).removeprefix("torch.") != dtype:
        raise WorkloadError(
            f"{what} takes {dtype} but the example input is {str(given).removeprefix('torch.')}: pass {dtype} data or "
            "a shape"
        )


def _onnx_dtypes(onnx: Any, graph_inputs: Sequence[Any]) -> dict[str, str]:
    return {i.name: str(onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)) for i in graph_inputs}


def _is_torch_module(obj: Any) -> bool:
    return any(cls.__module__.startswith("torch.nn") and cls.__name__ == "Module" for cls in type(obj).__mro__)


def _as_sequence(example_inputs: Any) -> Sequence[Any]:
    if isinstance(example_inputs, (list, tuple)) and example_inputs and all(isinstance(d, int) for d in example_inputs):
        return [tuple(example_inputs)]  # a single shape
    return example_inputs if isinstance(example_inputs, (list, tuple)) else [example_inputs]


def _shape_of(x: Any) -> Sequence[int]:
    return tuple(x.shape) if hasattr(x, "shape") else tuple(x)


def _as_example_tensor(torch: Any, x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)) and all(isinstance(d, int) for d in x):
        check_static("example input", x)
        return torch.randn(*x)
    raise WorkloadError(f"example input {x!r} is neither a torch.Tensor nor a shape tuple")


def check_static(what: str, shape: Sequence[Any], hint: str = "bind it to a concrete size") -> None:
    for dim in shape:
        if not isinstance(dim, (int, tvm.tirx.IntImm)):
            raise WorkloadError(f"{what} has a dynamic dimension ({dim}); the tuner needs static shapes: {hint}")
        if int(dim) <= 0:
            raise WorkloadError(f"{what} has a dimension of size {int(dim)}; every dimension must be positive")
