"""Runs inside a build worker: what it is asked to build (``codegen.build``), and a built CUDA library loaded
as a measuring host would."""

from __future__ import annotations

import tvm

from codegen.build import BuildError, build_kernel, compile_program, cuda_source
from codegen.tensor_cores import ensure_intrinsics_of


def load_cuda_artifact(artifact: str, kernels: list[str]) -> dict:
    """Load a built library as a measuring host does and report its CUDA module: the format of the
    code it carries (fatbin, cubin or ptx) and which of ``kernels`` its function table has."""
    library = tvm.runtime.load_module(artifact)
    cuda = [module for module in library.imports if module.kind == "cuda"]
    if not cuda:
        raise BuildError(f"{artifact} holds no CUDA module")
    module = cuda[0]
    found = [name for name in kernels if module.implements_function(name, query_imports=False)]
    return {
        "format": next((fmt for fmt in ("fatbin", "cubin", "ptx") if _holds_code_as(module, fmt)), None),
        "kernels": found,
    }


def _holds_code_as(module, fmt: str) -> bool:
    """Whether a CUDA module's code is in format ``fmt``: it hands its code back only when asked in
    its own format, and binary code does not decode as text."""
    try:
        return bool(module.inspect_source(fmt))
    except UnicodeDecodeError:
        return True


def warm_up() -> None:
    """Load LLVM and the lowering passes once, so the first real build is not charged for it."""
    from tvm import te

    a = te.placeholder((4,), name="a")
    b = te.compute((4,), lambda i: a[i] + 1.0, name="b")
    tvm.compile(te.create_prim_func([a, b]), target="llvm")


def _compile_program_with_intrinsics(**request) -> dict:
    """``compile_program``, with the tensor intrinsics registered first where a schedule's trace
    tensorizes (replaying it needs them; they are imported once per build worker, when first needed)."""
    for _, trace in request.get("schedules", []):
        ensure_intrinsics_of(trace)
    return compile_program(**request)


HANDLERS = {
    "build_kernel": build_kernel,
    "compile_program": _compile_program_with_intrinsics,
    "cuda_source": cuda_source,
    "load_cuda_artifact": load_cuda_artifact,
}
