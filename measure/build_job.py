"""Runs inside a build worker: compile one candidate and export it as a shared library."""

from __future__ import annotations

import functools
import json
import time

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Trace
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock


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
        executable = tvm.compile(mod, target=tvm_target)
    if tvm_target.kind.name == "cuda" and not _has_device_code(executable):
        raise BuildError("no CUDA kernel was generated: the schedule binds no GPU threads")
    executable.export_library(artifact)
    return {"artifact": artifact, "args": kernel_args(mod), "seconds": time.perf_counter() - start}


def warm_up() -> None:
    """Load LLVM and the lowering passes once, so the first real build is not charged for it."""
    from tvm import te

    a = te.placeholder((4,), name="a")
    b = te.compute((4,), lambda i: a[i] + 1.0, name="b")
    tvm.compile(te.create_prim_func([a, b]), target="llvm")



def compile_program(mod: tvm.IRModule, kind: str, target: str, schedules: list, artifact: str) -> dict:
    """Compile a whole workload with the given tuned schedules and export it to ``artifact``.

    ``schedules`` holds (kernel module, trace JSON) pairs. A Relax model is compiled by MetaSchedule's
    ``compile_relax`` from an in-memory database of them (kernels without one keep TVM's default
    schedule); a single kernel gets its schedule applied directly, keeping its input layouts.
    """
    tvm_target = _target(target)
    start = time.perf_counter()
    if kind == "relax":
        executable = ms.relax_integration.compile_relax(_memory_database(schedules, tvm_target), mod, tvm_target, params=None)
        executable.export_library(artifact)
        return {"artifact": artifact, "seconds": time.perf_counter() - start}
    if schedules:
        sch = tvm.s_tir.Schedule(mod)
        Trace.apply_json_to_schedule(json.loads(schedules[0][1]), sch)
        mod = sch.mod
    elif tvm_target.kind.name == "cuda":
        mod = default_gpu_schedule(mod, tvm_target)
    return build_kernel(mod, target, artifact, keep_layout_rewrite=True)


def default_gpu_schedule(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """TVM's own GPU schedules (DLight), the untuned baseline on a GPU."""
    from tvm.s_tir import dlight as dl

    with target:
        return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)


def _memory_database(schedules: list, target: tvm.target.Target) -> ms.database.Database:
    database = ms.database.MemoryDatabase()
    for kernel, trace_json in schedules:
        sch = tvm.s_tir.Schedule(kernel)
        Trace.apply_json_to_schedule(json.loads(trace_json), sch)
        workload = database.commit_workload(kernel)
        database.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, [1.0], target, None))
    return database


HANDLERS = {"build_kernel": build_kernel, "compile_program": compile_program}
