"""Tunable kernels of a workload, with how often each runs and how much work it does."""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.relax import pipeline as relax_pipeline
from tvm.s_tir import meta_schedule as ms

from workloads import Workload

from . import metaschedule as msc


@dataclass
class Task:
    name: str
    mod: tvm.IRModule  # {"main": PrimFunc}, keyed as MetaSchedule keys it
    weight: int  # kernel launches per run of the model
    flops: float  # per launch

    @property
    def weighted_flops(self) -> float:
        return self.weight * self.flops


def fuse_relax(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """Lower a Relax module to fused TIR kernels, exactly as TVM's compile does before applying
    tuned schedules, so that tuned kernels match the ones compile looks up."""
    passes = [
        *relax_pipeline.library_dispatch_passes(target),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]
    with target:
        return tvm.transform.Sequential(passes)(mod)


def extract_tasks(workload: Workload, target: tvm.target.Target) -> list[Task]:
    if workload.kind == "tir":
        func = workload.mod["main"]
        mod = msc.normalize_prim_func_module(func)
        return [Task(workload.name, mod, 1, msc.prim_func_flops(mod))]
    extracted = ms.relax_integration.extract_tasks(fuse_relax(workload.mod, target), target)
    tasks = [
        Task(t.task_name, t.dispatched[0], int(t.weight), msc.prim_func_flops(t.dispatched[0]))
        for t in extracted
        if not t.mod.attrs.get("tirx.is_scheduled", False)
    ]
    return sorted(tasks, key=lambda t: -t.weighted_flops)
