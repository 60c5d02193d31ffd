"""The MetaSchedule building blocks the tuner uses, behind one small interface.

Everything that depends on TVM 0.27's MetaSchedule internals lives here, so that the next TVM
release touches this file rather than the search loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


# (a SamplePerfectTile decision, the extent of the loop it splits here, the design space's limit on the innermost
# factor) -> the decision to use instead
Retile = Callable[[list[int], int, int], list[int]]


def replay(mod: tvm.IRModule, trace: Trace, seed: int, postprocs: Sequence, retile: Retile | None = None) -> Schedule | None:
    """Apply ``trace`` without its postprocessing part (its random decisions kept where present,
    drawn anew where not), then the postprocessors, as MetaSchedule does; None if the trace does
    not apply or a postprocessor rejects the result. ``retile`` rewrites each SamplePerfectTile
    decision for the extent of the loop it splits here (see ``Retile``)."""
    sch = Schedule(mod, seed=seed)
    provider = None if retile is None else _tile_provider(sch, retile)
    try:
        trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=provider)
    except Exception:  # a mutated or transferred trace can be invalid for this module (TVM raises InternalError); skip it
        return None
    sch.enter_postproc()  # marks where the postprocessors' instructions start, so a replay can drop them
    for postproc in postprocs:
        if not postproc.apply(sch):
            return None
    return sch


def _tile_provider(sch: Schedule, retile: Retile) -> Callable:
    def provide(inst, inputs, attrs, decision):
        if inst.kind.name != "SamplePerfectTile" or decision is None:
            return decision
        extent = sch.get(inputs[0]).extent
        if not isinstance(extent, tvm.tirx.IntImm):
            return None  # a symbolic extent: let the schedule draw a tiling
        return retile([int(d) for d in decision], int(extent), int(attrs[1]))

    return provide


def sample(mod: tvm.IRModule, space: Schedule, seed: int, postprocs: Sequence) -> Schedule | None:
    """A random point of a design space."""
    return replay(mod, Trace(space.trace.insts, {}), seed, postprocs)


def mutate(mutator, trace: Trace, seed: int) -> Trace | None:
    return _ffi_api.MutatorApply(mutator, trace, seed)


def stored_trace(mod: tvm.IRModule, trace_json: str) -> Trace:
    """A stored trace as a Trace object (checked by applying it to the module it was made for)."""
    return schedule_from_json(mod, trace_json).trace


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


@dataclass(frozen=True)
class BlockShape:
    """One computation block of an unscheduled kernel."""

    name: str
    spatial: tuple[int, ...]  # extents of its spatial (data-parallel) iterators
    reduction: tuple[int, ...]  # extents of its reduction iterators
    other: int  # iterators of other kinds (scan, opaque)
    dtypes: tuple[str, ...]  # of the buffers it reads and writes


def kernel_blocks(mod: tvm.IRModule) -> list[BlockShape]:
    """The blocks of ``mod["main"]`` under its root, in program order (a symbolic extent is -1)."""
    sch = Schedule(mod)
    blocks = []
    for rv in sch.get_child_blocks(sch.get_sblock("root", func_name="main")):
        block = sch.get(rv)
        kinds: dict[int, list[int]] = {}
        for iv in block.iter_vars:
            extent = iv.dom.extent
            kinds.setdefault(int(iv.iter_type), []).append(int(extent) if isinstance(extent, tvm.tirx.IntImm) else -1)
        dtypes = sorted({str(region.source.dtype) for region in (*block.reads, *block.writes)})
        spatial, reduction = kinds.pop(tvm.tirx.IterVar.DataPar, []), kinds.pop(tvm.tirx.IterVar.CommReduce, [])
        blocks.append(BlockShape(block.name_hint, tuple(spatial), tuple(reduction), sum(map(len, kinds.values())), tuple(dtypes)))
    return blocks
