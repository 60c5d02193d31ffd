"""The MetaSchedule building blocks the tuner uses, behind one small interface.

Everything that depends on TVM 0.27's MetaSchedule internals lives here, so that the next TVM
release touches this file rather than the search loop.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import tvm
import tvm_ffi
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule import _ffi_api
from tvm.s_tir.meta_schedule.utils import _json_de_tvm
from tvm.s_tir.schedule import _ffi_api as _ffi_api_schedule
from tvm.s_tir.schedule import Trace

MAX_SEED = 2**31 - 1


def rules_kind(target: tvm.target.Target) -> str:
    return "cuda" if target.kind.name == "cuda" else "llvm"


def make_context(mod: tvm.IRModule, target: tvm.target.Target, seed: int, num_threads: int = 1) -> ms.TuneContext:
    """A TuneContext with the target's default schedule rules, postprocessors and mutators.

    TuneContext's Python constructor imports tvm.s_tir.tensor_intrin (20-30 s) for tensor-core
    rules; the default rules used here do not need it, so the context is built directly.
    """
    kind = rules_kind(target)
    space = ms.space_generator.PostOrderApply(sch_rules=kind, postprocs=kind, mutator_probs=kind)
    context = _ffi_api.TuneContext(mod, target, space, None, "main", num_threads, seed, None)
    _ffi_api.TuneContextInitialize(context)
    return context


def design_spaces(context: ms.TuneContext) -> list[Schedule]:
    return list(context.generate_design_space())


def postprocessors(context: ms.TuneContext) -> list:
    return list(context.space_generator.postprocs)


def mutators(context: ms.TuneContext) -> tuple[list, list[float]]:
    pairs = list(context.space_generator.mutator_probs.items())
    return [m for m, _ in pairs], [float(p) for _, p in pairs]


def replay(mod: tvm.IRModule, trace: Trace, seed: int, postprocs: Sequence) -> Schedule | None:
    """Apply ``trace`` (its random decisions kept where present, drawn anew where not) and the
    postprocessors; None if a postprocessor rejects the result."""
    sch = Schedule(mod, seed=seed)
    try:
        trace.apply_to_schedule(sch, remove_postproc=True)
    except Exception:  # a mutated trace can be invalid for this module (TVM raises InternalError); skip it
        return None
    for postproc in postprocs:
        if not postproc.apply(sch):
            return None
    return sch


def sample(mod: tvm.IRModule, space: Schedule, seed: int, postprocs: Sequence) -> Schedule | None:
    """A random point of a design space."""
    return replay(mod, Trace(space.trace.insts, {}), seed, postprocs)


def mutate(mutator, trace: Trace, seed: int) -> Trace | None:
    return _ffi_api.MutatorApply(mutator, trace, seed)


def trace_to_json(sch: Schedule) -> str:
    return json.dumps(_json_de_tvm(_ffi_api_schedule.TraceAsJSON(sch.trace, False)))


def schedule_from_json(mod: tvm.IRModule, trace_json: str) -> Schedule:
    """Rebuild the schedule a stored trace describes."""
    sch = Schedule(mod)
    Trace.apply_json_to_schedule(json.loads(trace_json), sch)
    return sch


def structural_key(mod: tvm.IRModule) -> str:
    """The identity of a (scheduled) module: equal programs get equal keys in every process."""
    return f"{tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFFFFFF:016x}"


def measure_candidate(sch: Schedule) -> ms.MeasureCandidate:
    return ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True))


def prim_func_flops(mod: tvm.IRModule) -> float:
    try:
        return float(tvm.s_tir.analysis.estimate_tir_flops(mod))
    except Exception:  # some kernels (opaque loops) have no estimate; FLOPs are only informative
        return 0.0


def normalize_prim_func_module(func: tvm.tirx.PrimFunc) -> tvm.IRModule:
    """The module MetaSchedule keys a single PrimFunc by (as tune_tir / compile_tir do)."""
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
