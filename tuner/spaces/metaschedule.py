"""The MetaSchedule building blocks the tuner uses, behind one small interface.

Everything that depends on TVM 0.27's MetaSchedule internals lives here, so that the next TVM
release touches this file rather than the search loop.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule import _ffi_api
from tvm.s_tir.schedule import ScheduleError, Trace
from tvm.s_tir.schedule import _ffi_api as _ffi_api_schedule

from codegen.tensor_cores import ensure_intrinsics_of, ensure_tensor_intrinsics
from common.error_text import error_line
from common.target_kind import is_cuda
from tuner.targets import cuda_arch_number

from . import schedule_rules
from .gpu_tiles import GpuLimits, GpuTileDraw, tiled_blocks
from .register_tiles import RegisterFile, TileDraw, fills, tile_roles

schedule_rules.register()

MAX_SEED = 2**31 - 1
VECTOR_EXTENT = 64  # the vector of a loop nest at a kernel's root on CPUs (ParallelizeVectorizeUnroll's default)
ROOT_VECTOR_ATTR = "tuner.root_vector"  # a kernel's narrower one (``lowering.broadcast_values``)
LAYOUT_FREE_ATTR = "layout_free_buffers"  # the arguments RewriteLayout may store in the order the tiles read them


# Input types MetaSchedule's tensor-core rules have intrinsics for (f16 and s8 into f16/f32/s32).
TENSOR_CORE_INPUTS = {"float16", "int8"}
TENSOR_CORE_MIN_ARCH = 80


def rules_kind(target: tvm.target.Target, mod: tvm.IRModule | None = None) -> str:
    """MetaSchedule's rule set for ``mod`` on ``target``: "llvm", "cuda", or "cuda-tensorcore"
    (the CUDA rules plus tensor-core tiling) where tensor cores apply."""
    if not is_cuda(target):
        return "llvm"
    return "cuda-tensorcore" if mod is not None and tensor_cores_apply(mod, target) else "cuda"


def tensor_cores_apply(mod: tvm.IRModule, target: tvm.target.Target) -> bool:
    """Whether the kernel reduces over half-precision or int8 inputs (a GEMM, a convolution) on a
    GPU of sm_80 or later, where its schedules should use tensor cores."""
    arch = cuda_arch_number(target)
    if arch is None or arch < TENSOR_CORE_MIN_ARCH:
        return False
    return any(block.reduction and TENSOR_CORE_INPUTS & set(block.dtypes) for block in kernel_blocks(mod))


def make_context(mod: tvm.IRModule, target: tvm.target.Target, seed: int, num_threads: int = 1) -> ms.TuneContext:
    """A TuneContext with the default schedule rules, postprocessors and mutators for ``mod`` on
    ``target``.

    TuneContext's Python constructor imports tvm.s_tir.tensor_intrin (tens of seconds) for tensor-core
    rules whatever the task; here the context is built directly, and the intrinsics are imported
    (once) only for a task that can use tensor cores.
    """
    kind = rules_kind(target, mod)
    rules = kind
    if kind == "cuda-tensorcore":
        ensure_tensor_intrinsics()
        rules = tensor_core_rules()
    elif kind == "llvm" and root_vector(mod) != VECTOR_EXTENT:
        rules = cpu_rules(root_vector(mod))
    space = ms.space_generator.PostOrderApply(sch_rules=rules, postprocs=kind, mutator_probs=kind)
    context = _ffi_api.TuneContext(mod, target, space, None, "main", num_threads, seed, None)
    _ffi_api.TuneContextInitialize(context)
    return context


def packs_weights(mod: tvm.IRModule) -> bool:
    """Whether the kernel's schedule may lay some argument out in its tiles' order (``LAYOUT_FREE_ATTR``: a
    model's constant weights, marked at lowering; an operator's inputs are read as given)."""
    func = mod["main"]
    return bool(func.attrs and func.attrs.get(LAYOUT_FREE_ATTR))


def root_vector(mod: tvm.IRModule) -> int:
    """The vector ``mod``'s root loop nests take: ``VECTOR_EXTENT`` unless its kernel recorded a narrower one."""
    attrs = mod["main"].attrs
    return int(attrs[ROOT_VECTOR_ATTR]) if attrs is not None and ROOT_VECTOR_ATTR in attrs else VECTOR_EXTENT


def cpu_rules(vector: int) -> list:
    """TVM's "llvm" schedule rules, with the loop nests at a kernel's root vectorised ``vector`` elements at a
    time (``root_vector``)."""
    rules = list(ms.schedule_rule.ScheduleRule.create("llvm"))
    (at,) = [i for i, rule in enumerate(rules) if isinstance(rule, ms.schedule_rule.ParallelizeVectorizeUnroll)]
    rules[at] = ms.schedule_rule.ParallelizeVectorizeUnroll(
        max_jobs_per_core=16, max_vectorize_extent=vector, unroll_max_steps=[0, 16, 64, 512], unroll_explicit=True
    )
    return rules


def _wmma_group(inputs: str, output: str, trans: bool) -> dict[str, str]:
    """One WMMA intrinsic group: operands staged in static shared memory, the accumulator in dynamic."""
    suffix = "_trans" if trans else ""
    return {
        "init": f"wmma_fill_16x16x16_{output}",
        "load_a": f"wmma_load_16x16x16_{inputs}_a_shared",
        "load_b": f"wmma_load_16x16x16_{inputs}_b{suffix}_shared",
        "compute": f"wmma_sync_16x16x16_{inputs}{inputs}{output}{suffix}",
        "store": f"wmma_store_16x16x16_{output}_shared_dyn",
    }


def tensor_core_rules() -> list:
    """TVM's "cuda-tensorcore" schedule rules, changed where TVM 0.27 cannot build their output.

    TVM's own rules stage operands and accumulator alike in dynamic shared memory; its
    StorageRewrite then lets the fp32 accumulator reuse an fp16 operand's allocation, and its
    LowerAccessPtr rejects the result ("tvm_access_ptr element type must match the source buffer":
    not one such candidate builds). Operands in static and the accumulator in dynamic shared memory
    never share an allocation, and build. Its second, MMA-intrinsic rule is left out: its
    candidates fail in TransformMmaBufferLayout and InjectPermutedLayout in this TVM.
    """
    groups = [
        _wmma_group(inputs, output, trans)
        for inputs, output in (("f16", "f32"), ("f16", "f16"), ("s8", "s32"))
        for trans in (False, True)
    ]
    tiling = ms.schedule_rule.MultiLevelTilingTensorCore(
        intrin_groups=groups,
        structure="SSSRRSRS",
        tile_binds=["blockIdx.y", "blockIdx.x", "threadIdx.y"],
        max_innermost_factor=4,
        vector_load_lens=[1, 2, 3, 4, 8, 16],
        reuse_read=ms.schedule_rule.ReuseType(req="must", levels=[4], scope="shared"),
        reuse_write=ms.schedule_rule.ReuseType(req="must", levels=[2], scope="shared.dyn"),
        use_software_pipeline=False,
    )
    cuda = list(ms.schedule_rule.ScheduleRule.create("cuda"))  # ApplyCustomRule first, then the rest
    return [cuda[0], tiling, *cuda[1:]]


class DesignSpaceError(RuntimeError):
    """MetaSchedule's schedule rules fail on a kernel: it has no design space to search."""


def design_spaces(context: ms.TuneContext) -> list[Schedule]:
    """The design spaces of the context's kernel; DesignSpaceError, TVM's reason in one line, where a
    schedule rule fails on it (one of its primitives refuses the kernel: MultiLevelTiling's
    reverse_compute_at of an epilogue with a producer outside the matmul, raised as ScheduleError)."""
    try:
        spaces = list(context.generate_design_space())
    except RuntimeError as err:  # TVM's ScheduleError and InternalError
        raise DesignSpaceError(schedule_error_line(err)) from err
    if not spaces:
        raise DesignSpaceError("MetaSchedule generated no design space")
    return spaces


def schedule_error_line(err: BaseException) -> str:
    """A TVM schedule error in one line: the primitive and the first sentence of its message (the
    text between is the whole module, printed)."""
    text = str(err)
    primitive = re.search(r"in the schedule primitive '([^']+)'", text)
    message = re.search(r"^Error message: (.+?)(?:\.(?: |$)|$)", text, re.MULTILINE)
    if primitive and message:
        return f"{primitive.group(1)}: {message.group(1)}"
    return error_line(err)


def postprocessors(context: ms.TuneContext) -> list:
    return list(context.space_generator.postprocs)


def mutators(context: ms.TuneContext) -> tuple[list, list[float]]:
    pairs = list(context.space_generator.mutator_probs.items())
    return [m for m, _ in pairs], [float(p) for _, p in pairs]


# (a SamplePerfectTile decision, the extent of the loop it splits here, the design space's limit on the innermost
# factor) -> the decision to use instead
Retile = Callable[[list[int], int, int], list[int]]


def replay(
    mod: tvm.IRModule,
    trace: Trace,
    seed: int,
    postprocs: Sequence,
    retile: Retile | None = None,
    decide: Callable[[Schedule], Callable] | None = None,
) -> Schedule | None:
    """Apply ``trace`` without its postprocessing part (its random decisions kept where present,
    drawn anew where not), then the postprocessors, as MetaSchedule does; None if the trace does
    not apply or a postprocessor rejects the result. ``retile`` rewrites each SamplePerfectTile
    decision for the extent of the loop it splits here (see ``Retile``); ``decide(schedule)`` gives
    a decision provider of one's own instead."""
    sch = Schedule(mod, seed=seed)
    provider = decide(sch) if decide else (None if retile is None else _tile_provider(sch, retile))
    try:
        trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=provider)
    except (
        Exception
    ):  # a mutated or transferred trace can be invalid for this module (TVM raises InternalError); skip it
        return None
    sch.enter_postproc()  # marks where the postprocessors' instructions start, so a replay can drop them
    for postproc in postprocs:
        try:
            if not postproc.apply(sch):
                return None
        except Exception:  # TVM 0.27's postprocessors raise on some kernels instead of rejecting (RewriteLayout)
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


def sample(
    mod: tvm.IRModule,
    space: Schedule,
    seed: int,
    postprocs: Sequence,
    registers: RegisterFile | None = None,
    gpu: GpuLimits | None = None,
) -> Schedule | None:
    """A random point of a design space; with ``registers``, its CPU tiles drawn to fill them
    (``register_tiles.TileDraw``), or MetaSchedule's own draw where its loops allow no such tile; with
    ``gpu``, its GPU-tiled blocks drawn within those limits (``gpu_tiles.GpuTileDraw``)."""
    trace = Trace(space.trace.insts, {})
    if registers is not None:
        roles = tile_roles(space.trace.insts)
        fitted = replay(mod, trace, seed, postprocs, decide=lambda sch: TileDraw(sch, roles, registers, seed))
        if fitted is not None and fills(fitted, registers):
            return fitted
    if gpu is not None and (blocks := tiled_blocks(space.trace.insts)):
        return replay(mod, trace, seed, postprocs, decide=lambda sch: GpuTileDraw(sch, blocks, gpu, seed))
    return replay(mod, trace, seed, postprocs)


def mutate(mutator, trace: Trace, seed: int) -> Trace | None:
    return _ffi_api.MutatorApply(mutator, trace, seed)


def stored_trace(mod: tvm.IRModule, trace_json: str) -> Trace:
    """A stored trace as a Trace object (checked by applying it to the module it was made for)."""
    return schedule_from_json(mod, trace_json).trace


def trace_to_json(sch: Schedule) -> str:
    return json.dumps(_json_value(_ffi_api_schedule.TraceAsJSON(sch.trace, False)))


def _json_value(value):
    """TVM's JSON form of a trace as plain Python. An IndexMap (an input of TransformLayout, which
    tensor-core schedules use) becomes the JSON-graph text ``apply_json_to_schedule`` reads back."""
    if value is None or isinstance(value, int | float | str):
        return value
    if isinstance(value, tvm.tirx.IntImm | tvm.tirx.FloatImm):
        return value.value
    if isinstance(value, tvm.tirx.IndexMap):
        return tvm.ir.save_json(value)
    if isinstance(value, tvm_ffi.Array):
        return [_json_value(item) for item in value]
    if isinstance(value, tvm_ffi.Map):
        return {_json_value(k): _json_value(v) for k, v in value.items()}
    raise TypeError(f"a trace holds a {type(value).__name__}, which has no JSON form here")


def schedule_from_json(mod: tvm.IRModule, trace_json: str) -> Schedule:
    """Rebuild the schedule a stored trace describes."""
    ensure_intrinsics_of(trace_json)
    sch = Schedule(mod)
    Trace.apply_json_to_schedule(json.loads(trace_json), sch)
    return sch


def structural_key(mod: tvm.IRModule) -> str:
    """The identity of a (scheduled) module: equal programs get equal keys in every process."""
    return f"{tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFFFFFF:016x}"


def block_names(mod: tvm.IRModule) -> list[str]:
    """The names of a module's blocks in program order. Structural equality ignores them, but a
    schedule's trace finds its blocks by name, so a trace fits only a module whose names match."""
    return re.findall(r'T\.sblock\("([^"]*)"', mod.script())


def measure_candidate(sch: Schedule) -> ms.MeasureCandidate:
    return ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True))


# A block annotation giving the floating-point operations the block does, for blocks whose TIR
# estimate counts what the compiler removes (a Winograd transform's multiplications by 0 and 1).
FLOPS_ANNOTATION = "tuner.flops"


def prim_func_flops(mod: tvm.IRModule) -> float:
    try:
        flops = float(tvm.s_tir.analysis.estimate_tir_flops(mod))
    except Exception:  # some kernels (opaque loops) have no estimate; FLOPs are only informative
        return 0.0
    if FLOPS_ANNOTATION not in mod.script():
        return flops
    sch = Schedule(mod)
    for rv in sch.get_child_blocks(sch.get_sblock("root", func_name="main")):
        stated = sch.get(rv).annotations.get(FLOPS_ANNOTATION)
        if stated is not None:
            nest = sch.get(sch.get_loops(rv)[0])
            flops += float(stated) - float(tvm.s_tir.analysis.estimate_tir_flops(nest))
    return flops


def kernel_bytes(mod: tvm.IRModule) -> int:
    """Bytes of the kernel's arguments (inputs and outputs): what it must move at the least. An input is
    counted at most once per point of the blocks that read it: a gather reads the rows it picks, not its
    whole table (BERT's token embedding, 94 MB, of which a 128-token sequence reads 0.4 MB: the prediction
    said 0.93 ms for a kernel of 11 us)."""
    return sum(_argument_bytes(mod))


def weight_bytes(mod: tvm.IRModule) -> int:
    """Of ``kernel_bytes``, the weights': its layout-free arguments (``LAYOUT_FREE_ATTR``), a model's constants."""
    free = mod["main"].attrs.get(LAYOUT_FREE_ATTR, []) if mod["main"].attrs else []
    return sum(_argument_bytes(mod)[int(index)] for index in free)


def _argument_bytes(mod: tvm.IRModule) -> list[int]:
    """Each argument's bytes the kernel moves (``kernel_bytes``), in the order of its parameters."""
    reads = _points_reading(mod)
    moved = []
    for param in mod["main"].params:
        shape = [int(d) for d in getattr(param, "shape", [])]
        elements = int(np.prod(shape, dtype=np.int64))
        read = next((points for buffer, points in reads if buffer.same_as(param)), None)
        moved.append((min(elements, read) if read is not None else elements) * tvm.DataType(str(param.dtype)).bits // 8)
    return moved


def root_blocks(mod: tvm.IRModule) -> list[tvm.tirx.Stmt]:
    """The blocks under ``mod["main"]``'s root; none where it has no block named root (an extern kernel)."""
    sch = Schedule(mod)
    try:
        return [sch.get(rv) for rv in sch.get_child_blocks(sch.get_sblock("root", func_name="main"))]
    except (ScheduleError, ValueError):
        return []


def _points_reading(mod: tvm.IRModule) -> list[tuple[tvm.tirx.Buffer, int]]:
    """Per buffer read by the kernel's blocks that write nothing of it, the points of those blocks' domains;
    nothing where the kernel has no root block or a block's domain is symbolic."""
    blocks = root_blocks(mod)
    points: list[tuple[tvm.tirx.Buffer, int]] = []
    for block in blocks:
        extents = [iv.dom.extent for iv in block.iter_vars]
        if not all(isinstance(extent, tvm.tirx.IntImm) for extent in extents):
            return []
        domain = int(np.prod([int(extent) for extent in extents], dtype=np.int64))
        for region in block.reads:
            index = next((i for i, (buffer, _) in enumerate(points) if buffer.same_as(region.source)), None)
            if index is None:
                points.append((region.source, domain))
            else:
                points[index] = (region.source, points[index][1] + domain)
    written_anywhere = [region.source for block in blocks for region in block.writes]
    return [(buffer, n) for buffer, n in points if not any(buffer.same_as(w) for w in written_anywhere)]


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
        blocks.append(
            BlockShape(block.name_hint, tuple(spatial), tuple(reduction), sum(map(len, kinds.values())), tuple(dtypes))
        )
    return blocks
