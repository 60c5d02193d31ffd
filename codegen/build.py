"""Building: a scheduled kernel, or a whole lowered model with the best schedules a database holds, compiled
into a shared library (what a build worker runs), with the module passes that build needs."""

from __future__ import annotations

import functools
import importlib
import json
import time

import tvm
from tvm.relax.transform import SplitLayoutRewritePreproc
from tvm.s_tir import SBlock, SBlockRealize
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Trace
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

from common.model_weights import read_weights, save_weights, weights_path
from common.target_kind import is_cuda

from .script_parsing import light_frame_stacks
from .weight_prefetch import tir_pipeline
from .weights import attach_weights, detach_weights


class BuildError(RuntimeError):
    pass


@functools.lru_cache(maxsize=8)
def _target(target_json: str) -> tvm.target.Target:
    return tvm.target.Target(json.loads(target_json))


def kernel_args(mod: tvm.IRModule) -> list[list]:
    """[dtype, shape] of each argument of the kernel's ``main``."""
    return [[str(p.dtype), [int(d) for d in p.shape]] for p in mod["main"].params]


def _has_device_code(executable) -> bool:
    return any(getattr(m, "kind", "") == "cuda" for m in executable.mod.imports)


def build_kernel(mod: tvm.IRModule, target: str, artifact: str, keep_layout_rewrite: bool = False) -> dict:
    """Compile a scheduled kernel and export it to ``artifact`` (a .so).


    By default the weight-layout rewrite that MetaSchedule adds is stripped, as the compiled model
    does it once ahead of time; ``keep_layout_rewrite`` keeps it so the kernel takes the original
    layouts (for checking its output against the unscheduled function).
    """
    tvm_target = _target(target)
    if not keep_layout_rewrite:
        mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    start = time.perf_counter()
    with tvm_target:
        executable = tvm.compile(mod, target=tvm_target, tir_pipeline=tir_pipeline(tvm_target))
    if is_cuda(tvm_target) and not _has_device_code(executable):
        raise BuildError("no CUDA kernel was generated: the schedule binds no GPU threads")
    executable.export_library(artifact)
    return {"artifact": artifact, "args": kernel_args(mod), "seconds": time.perf_counter() - start}


def cuda_source(mod: tvm.IRModule, target: str) -> str:
    """The CUDA C a scheduled kernel compiles to, to see what the code generator made of it."""
    tvm_target = _target(target)
    with tvm_target:
        executable = tvm.compile(mod, target=tvm_target)
    for module in executable.mod.imports:
        if module.kind == "cuda":
            return module.inspect_source("cuda")
    raise BuildError("no CUDA kernel was generated: the schedule binds no GPU threads")


def compile_program(
    mod: tvm.IRModule,
    kind: str,
    target: str,
    schedules: list,
    artifact: str,
    weights: str | None = None,
    llvm_opt_level: int | None = None,
) -> dict:
    """Compile a whole workload with the given tuned schedules and export it to ``artifact``.


    ``schedules`` holds (kernel module, trace JSON) pairs. A model (``kind`` "relax") comes lowered
    to fused kernels, as its tasks were extracted (``tuner.lowering``): each kernel with a tuned
    schedule gets it (kernels without one keep TVM's default schedule) and the constants the
    schedules want in another layout are transformed once, here. A single kernel gets its schedule
    applied directly, keeping its input layouts.

    A model's weights come apart from it (``codegen.weights.detach_weights``), in the file ``weights``,
    and go out apart from its library, in ``common.model_weights``' file beside ``artifact``.
    ``llvm_opt_level``: LLVM's optimisation level for an llvm target (its default: 3).
    """
    tvm_target = _target(target)
    if llvm_opt_level is not None and tvm_target.kind.name == "llvm":
        tvm_target = tvm.target.Target({**tvm_target.export(), "opt-level": llvm_opt_level})
    start = time.perf_counter()
    if kind == "relax":
        if weights is not None:
            mod = attach_weights(mod, read_weights(weights))
        database = _memory_database(schedules, tvm_target)
        executable, model_weights = build_model_without_weights(mod, tvm_target, database)
        executable.export_library(artifact)
        save_weights(weights_path(artifact), model_weights)
        return {"artifact": artifact, "seconds": time.perf_counter() - start}
    if schedules:
        sch = tvm.s_tir.Schedule(mod)
        Trace.apply_json_to_schedule(json.loads(schedules[0][1]), sch)
        mod = sch.mod
    elif is_cuda(tvm_target):
        mod = default_gpu_schedule(mod, tvm_target)
    return build_kernel(mod, target, artifact, keep_layout_rewrite=True)


def default_gpu_schedule(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """TVM's own GPU schedules (DLight), the untuned baseline on a GPU."""
    from tvm.s_tir import dlight as dl

    with target, light_frame_stacks():  # its Matmul rule imports TVM's tensor intrinsics: parsed quickly
        return dl.ApplyDefaultSchedule(
            dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()
        )(mod)


def build_lowered_model(
    mod: tvm.IRModule, target: tvm.target.Target, database: ms.database.Database
) -> tvm.runtime.Executable:
    """A lowered model (fused kernels called from Relax), built with the best schedules ``database``
    holds for its kernels, its weights inside the executable."""
    return _build(_scheduled(mod, target, database), target)


def build_model_without_weights(
    mod: tvm.IRModule, target: tvm.target.Target, database: ms.database.Database
) -> tuple[tvm.runtime.Executable, list[tvm.runtime.Tensor]]:
    """``build_lowered_model``, its weights (in the layouts the kernels read them in) taken out: the
    executable's ``main`` takes them after its inputs (``codegen.weights``)."""
    scheduled, weights = detach_weights(_scheduled(mod, target, database))
    return _build(scheduled, target), weights


def _scheduled(mod: tvm.IRModule, target: tvm.target.Target, database: ms.database.Database) -> tvm.IRModule:
    """``mod``'s kernels with the schedules of ``database`` (TVM's default ones on a GPU for the rest),
    and its weights in the layouts those schedules read them in."""
    from tvm import relax

    with target, database, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(
            [
                relax.transform.MetaScheduleApplyDatabase(),  # reads the target and database in scope
                *([_DefaultGpuSchedule()] if is_cuda(target) else []),
                # a tuned kernel that reads a weight in another layout gets a separate transform of that
                # weight; on constants, FoldConstant runs it now instead of at every call
                NestBlocklessRoots(),  # else SplitLayoutRewritePreproc rejects extern kernels (cumsum)
                relax.transform.SplitLayoutRewritePreproc(),
                relax.transform.FoldConstant(),
                relax.transform.DeadCodeElimination(["main"]),
            ]
        )(mod)


def _build(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.runtime.Executable:
    """A scheduled model compiled into a VM executable."""
    from tvm import relax

    # TVM 0.27's relax.pipeline dispatches to the backend packages, which do not export their
    # dataflow-lowering passes: take them from the backends' own pipeline modules
    backend = importlib.import_module(f"tvm.relax.backend.{'cuda' if is_cuda(target) else 'cpu_generic'}.pipeline")
    with target, tvm.transform.PassContext(opt_level=3):
        passes = [*backend.dataflow_lower_passes(target), *backend.finalize_passes(target)]
        return relax.build(
            mod, target=target, relax_pipeline=tvm.transform.Sequential(passes), tir_pipeline=tir_pipeline(target)
        )


def _layout_rewrite_splits(func: tvm.tirx.PrimFunc) -> bool:
    """Whether relax's SplitLayoutRewritePreproc accepts the kernel on its own."""
    try:
        SplitLayoutRewritePreproc()(tvm.IRModule({"main": func}))
    except tvm.error.InternalError:
        return False
    return True


def _under_a_new_root(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with its root block nested, unchanged, in a new empty root block."""
    return func.with_body(SBlockRealize([], True, SBlock([], [], [], "root", func.body)))


@tvm.transform.module_pass(opt_level=0, name="NestBlocklessRoots")
class NestBlocklessRoots:
    """Make kernels that SplitLayoutRewritePreproc rejects acceptable to it.


    TVM's extern-style kernels (topi's cumsum, sort, topk, ..., built with the IR builder) are one
    opaque block of plain loops with no block inside: its root. SplitLayoutRewritePreproc requires a
    compute block under every root ("There should be a compute block if there is only one subtree
    under the root") and rejects them, tuned or not, failing the whole model's compile. Nested under
    a new root block they have one, and mean the same; they have no layout rewrite to split.
    A kernel still rejected after that is left as it is (the pass then names the error)."""

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        nested = {}
        for gv, func in mod.functions_items():
            if isinstance(func, tvm.tirx.PrimFunc) and not _layout_rewrite_splits(func):
                candidate = _under_a_new_root(func)
                if _layout_rewrite_splits(candidate):
                    nested[gv] = candidate
        if not nested:
            return mod
        mod = mod.clone()
        for gv, func in nested.items():
            mod.update_func(gv, func)
        return mod


@tvm.transform.module_pass(opt_level=0, name="DefaultGpuSchedule")
class _DefaultGpuSchedule:
    """TVM's own GPU schedules (DLight) for the kernels left without a tuned one."""

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return default_gpu_schedule(mod, tvm.target.Target.current())


def _memory_database(schedules: list, target: tvm.target.Target) -> ms.database.Database:
    database = ms.database.MemoryDatabase()
    for kernel, trace_json in schedules:
        sch = tvm.s_tir.Schedule(kernel)
        Trace.apply_json_to_schedule(json.loads(trace_json), sch)
        workload = database.commit_workload(kernel)
        database.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, [1.0], target, None))
    return database
