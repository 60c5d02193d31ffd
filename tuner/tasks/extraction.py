"""Tunable kernels of a workload, with how often each runs and how much work it does."""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.s_tir import meta_schedule as ms

from tuner.errors import ModelError
from tuner.lowering import LoweringOptions, lower_model
from tuner.spaces import metaschedule as msc
from workloads import Workload, WorkloadError, load_workload


@dataclass
class Task:
    name: str
    mod: tvm.IRModule  # {"main": PrimFunc}, keyed as MetaSchedule keys it
    weight: int  # kernel launches per run of the model
    flops: float  # per launch

    @property
    def weighted_flops(self) -> float:
        return self.weight * self.flops


def load_model(model, example_inputs=None, *, batch: int | None = None, dtype: str | None = None) -> Workload:
    """``workloads.load_workload``, its refusals raised as the tuner's ``ModelError``."""
    try:
        return load_workload(model, example_inputs, batch=batch, dtype=dtype)
    except ModelError:
        raise
    except WorkloadError as err:
        raise ModelError(str(err), err.unsupported, err.source) from None


def lower_workload(
    workload: Workload, target: tvm.target.Target, options: LoweringOptions | None = None
) -> tvm.IRModule:
    """What is tuned and compiled: a model lowered to fused kernels (``tuner.lowering``), or a
    single kernel keyed as MetaSchedule keys it. A bf16 model lowered with nothing left in bf16 (every product
    of it faster in fp32 on this CPU, or a CPU with no bf16 unit: ``tuner.lowering.bf16.precision``) computes as
    a fp32 one, and is checked as one from here on: against its framework, at fp32's tolerance."""
    if workload.kind == "tir":
        return msc.normalize_prim_func_module(workload.mod["main"])
    lowered = lower_model(workload.mod, target, options)
    if workload.precision == "bfloat16" and not computes_in_bf16(lowered):
        workload.precision = "float32"
    return lowered


def computes_in_bf16(lowered: tvm.IRModule) -> bool:
    """Whether a kernel of ``lowered`` reads or writes bf16."""
    return any(
        str(param.dtype) == "bfloat16"
        for func in lowered.functions.values()
        if isinstance(func, tvm.tirx.PrimFunc)
        for param in func.params
    )


def extract_tasks(workload: Workload, target: tvm.target.Target, lowered: tvm.IRModule | None = None) -> list[Task]:
    """The tunable kernels of ``workload`` (``lowered``: its ``lower_workload``, if already made)."""
    lowered = lowered if lowered is not None else lower_workload(workload, target)
    if workload.kind == "tir":
        return [Task(workload.name, lowered, 1, msc.prim_func_flops(lowered))]
    extracted = ms.relax_integration.extract_tasks(lowered, target)
    tasks = [
        Task(t.task_name, t.dispatched[0], int(t.weight), msc.prim_func_flops(t.dispatched[0]))
        for t in extracted
        if not t.mod.attrs.get("tirx.is_scheduled", False)
    ]
    return sorted(tasks, key=lambda t: -t.weighted_flops)
