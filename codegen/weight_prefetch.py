"""Weights asked for a block ahead: software prefetches in CPU kernels that re-read weight blocks.

MetaSchedule tiles a product so that each block of its weight is read by several row groups of the
activation in turn (SSRSRS: row loops between the reduction's loops). The first row group reads the
block from memory at the rate its FMAs consume it, the others from cache; tuned with the weight
already in cache, such a kernel runs slower inside a model, where nothing has touched its weight
since the last inference: BERT-base's FFN product 2.06 ms alone and 2.56 in the model, the time
of reading its 9.4 MB weight once at 20 GB/s added to the product's instead of overlapped with it.

This pass, run on lowered kernels, finds contiguous vector reads of a read-only argument whose
address moves with an outer loop (the block) and not with a loop inside it (the row groups that
re-read the block), and spreads prefetches of the next block over the whole of this one's work: a
few cache lines (into L2) before each run of the innermost reduction loop. Not inside that loop:
a call there stops LLVM from keeping the accumulators in registers across it, since it cannot tell
the arguments apart inside TVM's parallel closures.

A bf16 product on ``vdpbf16ps`` reads its weight inside micro-kernel calls (``bf16_dot``), which the
loads above do not see: there the call itself is swapped for a variant that asks for a few lines a
step of its loop, of the next tasks' slice where the task re-reads its own (row blocks) or of the
next call's where each call reads a slice of its own (a convolution's taps). On a Zen 4 VM the same
schedules ran BERT-base at 0.88-0.93 of their time without, ResNet-18 0.93, ResNet-50 0.94.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import tirx
from tvm.sym import Analyzer, detect_linear_equation
from tvm.tirx import stmt as s

from .bf16_dot import prefetching_variant
from .tir_walk import binds, contains_loop, exprs_of, vars_of, walk_expr, walk_stmts

CACHE_LINE = 64  # bytes
MIN_BLOCK_BYTES = 16 << 10  # a smaller block stays in L1 and needs no help
# a convolution's call reading a tap's slice of its own: from 4 KB, ResNet-18 0.978-0.993 and ResNet-50 0.990 of
# their time with 16 KB (Zen 4 VM, within its noise; experiments/README.md, Zen 4)
MIN_TAP_BYTES = 4 << 10
MAX_BLOCK_BYTES = 1 << 20  # the block being computed and the next one must both fit a core's L2
MAX_LINES_PER_RUN = 64  # more at once and the prefetches queue behind each other
MAX_LINES_PER_STEP = 4  # of a micro-kernel's step (bf16_dot): its own loads are 5-11 (a tile's rows and vectors)
MAX_TASKS_EXAMINED = 256  # parallel tasks whose reads are worked out to find how many share a block
_LOCALITY_L2 = 2  # prefetcht1: into L2, where the next block waits for its turn


@dataclass(frozen=True)
class _Read:
    """``length`` contiguous elements of ``buffer`` (TVM 0.27: a variable of buffer type), from ``start``."""

    buffer: tirx.Var
    dtype: str
    start: tirx.Expr
    length: int


@dataclass(frozen=True)
class _Loop:
    var: tirx.Var
    min: tirx.Expr
    extent: int | None  # None where not a constant


def with_weight_prefetches(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with prefetches of the next weight block (see the module's docstring), or itself."""
    written: list[tirx.Var] = []  # buffers allocated or stored to here (compared by identity: same_as)

    def note_writes(stmt: s.Stmt) -> None:
        if isinstance(stmt, (s.AllocBuffer, s.BufferStore)):
            written.append(stmt.buffer)

    walk_stmts(func.body, note_writes)
    read_only = lambda buffer: not any(buffer.same_as(other) for other in written)  # noqa: E731
    body = _Rewriter(read_only).visit(func.body, None, {})
    return func if body.same_as(func.body) else func.with_body(body)


@tvm.transform.module_pass(opt_level=0, name="WeightPrefetch")
def weight_prefetch(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """:func:`with_weight_prefetches` on every kernel of ``mod``."""
    updates = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            new = with_weight_prefetches(func)
            if not new.same_as(func):
                updates[gv] = new
    if not updates:
        return mod
    mod = mod.clone()
    for gv, func in updates.items():
        mod.update_func(gv, func)
    return mod


class _Rewriter:
    def __init__(self, read_only: Callable[[tirx.Var], bool]):
        self.read_only = read_only
        self.before_loop: dict[tirx.Var, list[s.Stmt]] = {}  # prefetches to put before a reduction loop
        self.parallel: _Loop | None = None  # the innermost parallel loop around the statement visited

    def visit(self, stmt: s.Stmt, loops: list[_Loop] | None, lets: dict) -> s.Stmt:
        """``loops``: the serial loops inside the innermost parallel loop so far (None outside one)."""
        if isinstance(stmt, s.SeqStmt):
            children, changed = [], False
            for child in stmt.seq:
                if isinstance(child, s.Bind):
                    lets[child.var] = child.value
                new = self.visit(child, loops, lets)
                changed |= not new.same_as(child)
                children.append(new)
            return s.SeqStmt(children) if changed else stmt
        if isinstance(stmt, s.For):
            return self._visit_for(stmt, loops, lets)
        if isinstance(stmt, s.AttrStmt):
            if loops is not None and stmt.attr_key == "pragma_import_llvm" and self.parallel is not None:
                call = _prefetching_call(stmt, loops, lets, self.parallel, self.read_only)
                if call is not None:
                    return call
            body = self.visit(stmt.body, loops, lets)
            return stmt if body.same_as(stmt.body) else s.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body)
        if isinstance(stmt, s.IfThenElse):
            then = self.visit(stmt.then_case, loops, lets)
            other = None if stmt.else_case is None else self.visit(stmt.else_case, loops, lets)
            unchanged = then.same_as(stmt.then_case) and (other is None or other.same_as(stmt.else_case))
            return stmt if unchanged else s.IfThenElse(stmt.condition, then, other)
        return stmt

    def _visit_for(self, loop: s.For, loops: list[_Loop] | None, lets: dict) -> s.Stmt:
        extent = int(loop.extent) if isinstance(loop.extent, tirx.IntImm) else None
        if loop.kind == s.ForKind.PARALLEL:
            inner: list[_Loop] | None = []
            self.parallel = _Loop(loop.loop_var, loop.min, extent)
        elif loops is None:
            inner = None
        else:
            inner = [*loops, _Loop(loop.loop_var, loop.min, extent)]
        if inner and not contains_loop(loop.body):
            self._plan_prefetches(loop.body, inner, lets)
        body = self.visit(loop.body, inner, dict(lets))
        if not body.same_as(loop.body):
            loop = s.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, loop.annotations)
        prefetches = self.before_loop.pop(loop.loop_var, None)
        return s.SeqStmt([*prefetches, loop]) if prefetches else loop

    def _plan_prefetches(self, body: s.Stmt, loops: list[_Loop], lets: dict) -> None:
        """Notes the prefetches the vector loads of ``body`` (the innermost loop's) want, for the loop
        they go before."""
        lets_inside = binds(body)
        reduction = _innermost_reduction_loop(body, loops, lets_inside)
        if reduction is None or any(loop.extent is None for loop in loops):
            return
        analyzer = _with_lets({**lets, **lets_inside})
        by_buffer: list[list[_Read]] = []  # TVM's variables compare by identity with same_as, not ==
        for read in filter(lambda read: self.read_only(read.buffer), _vector_reads(body)):
            group = next((reads for reads in by_buffer if reads[0].buffer.same_as(read.buffer)), None)
            if group is None:
                by_buffer.append([read])
            else:
                group.append(read)
        for reads in by_buffer:
            pattern = _pattern(reads, loops, analyzer)
            if pattern is None:
                continue
            prefetches = _next_block_in_task(pattern, loops, reduction) or _next_block_across_tasks(
                pattern, loops, reduction, self.parallel
            )
            if prefetches:
                self.before_loop.setdefault(loops[reduction].var, []).extend(prefetches)


def _innermost_reduction_loop(body: s.Stmt, loops: list[_Loop], lets_inside: dict) -> int | None:
    """Index in ``loops`` of the innermost loop that no store of ``body`` moves with (LLVM keeps the
    stored values in registers across it), or None. ``lets_inside``: the lets ``body`` binds."""
    stored_vars: set = set()

    def note(node: s.Stmt) -> None:
        if isinstance(node, s.BufferStore):
            for index in node.indices:
                stored_vars.update(vars_of(index))

    walk_stmts(body, note)
    lets_inside = dict(lets_inside)  # consumed below
    pending = [var for var in stored_vars if var in lets_inside]
    while pending:  # a let's value may name other lets of the body
        value = lets_inside.pop(pending.pop(), None)
        for var in [] if value is None else vars_of(value):
            stored_vars.add(var)
            if var in lets_inside:
                pending.append(var)
    for i in range(len(loops) - 1, -1, -1):
        if not any(loops[i].var.same_as(v) for v in stored_vars):
            return i
    return None


@dataclass(frozen=True)
class _Pattern:
    """Where a kernel's reads of one buffer go: ``offset`` (the loops at their first values) plus
    ``steps[i]`` elements per iteration of ``loops[i]``, ``length`` contiguous elements each time."""

    buffer: tirx.Var
    dtype: str
    steps: list[int]
    offset: tirx.Expr
    length: int

    def block_bytes(self, elements: int) -> int:
        return elements * tvm.DataType(self.dtype).bits // 8


def _with_lets(lets: dict) -> Analyzer:
    """An analyzer that knows the lets' values."""
    analyzer = Analyzer()
    for var, value in lets.items():
        try:
            analyzer.bind(var, value)
        except TypeError:  # a pointer, not index arithmetic
            continue
    return analyzer


def _pattern(reads: list[_Read], loops: list[_Loop], analyzer: Analyzer) -> _Pattern | None:
    """The reads of one buffer as one pattern (the vectors of an unrolled tile side by side), or None
    where they do not move together by constant steps."""
    steps, base, low, high = None, None, 0, 0
    for read in reads:
        coefficients = detect_linear_equation(analyzer.simplify(read.start), [loop.var for loop in loops])
        if not coefficients or not all(isinstance(c, tirx.IntImm) for c in coefficients[:-1]):
            return None
        these = [int(c) for c in coefficients[:-1]]
        if steps is None:
            steps, base, high = these, coefficients[-1], read.length
            continue
        delta = analyzer.simplify(coefficients[-1] - base)
        if these != steps or not isinstance(delta, tirx.IntImm):
            return None
        low, high = min(low, int(delta)), max(high, int(delta) + read.length)
    offset = base + low
    for step, loop in zip(steps, loops, strict=True):
        offset = offset + step * loop.min
    return _Pattern(reads[0].buffer, reads[0].dtype, steps, offset, high - low)


def _next_block_in_task(pattern: _Pattern, loops: list[_Loop], reduction: int) -> list[s.Stmt]:
    """The next block when a loop of the task moves between blocks and a loop inside it re-reads one."""
    steps = pattern.steps
    rereaders = [i for i, step in enumerate(steps) if step == 0]
    blocks = [i for i in range(rereaders[0]) if steps[i]] if rereaders else []
    if not blocks or blocks[-1] >= reduction:
        return []
    block = blocks[-1]
    span = sum(steps[i] * (loops[i].extent - 1) for i in range(block + 1, len(loops))) + pattern.length
    if span != steps[block]:
        return []  # not one contiguous block
    start = _call_offset(pattern, loops[: block + 1]) + steps[block]  # the loops inside this one at their first
    return _spread(pattern, start, steps[block], loops[block + 1 : reduction], 1, None)


def _next_block_across_tasks(
    pattern: _Pattern, loops: list[_Loop], reduction: int, parallel: _Loop | None
) -> list[s.Stmt]:
    """The next block when consecutive parallel tasks (a thread runs a contiguous range of them) each
    read the whole of one block, ``repeat`` tasks a block (or one task, reading it more than once):
    each asks for its share of the next."""
    span = sum(step * (loop.extent - 1) for step, loop in zip(pattern.steps, loops, strict=True)) + pattern.length
    tasks = _tasks_per_block(pattern, parallel, rereads=0 in pattern.steps)
    if tasks is None or tasks[1] != span:
        return []  # the next task's block does not follow this one's
    repeat = tasks[0]
    share = tirx.floormod(parallel.var - parallel.min, repeat)
    return _spread(pattern, pattern.offset + span, span, loops[:reduction], repeat, share)


def _tasks_per_block(pattern: _Pattern, parallel: _Loop | None, rereads: bool) -> tuple[int, int] | None:
    """How many consecutive parallel tasks read one block, and how far (elements) the next tasks' block
    starts from theirs; None where tasks do not move over blocks so, or where one task reads its block
    once (``rereads`` false) and shares it with none: a stream the hardware's prefetchers follow."""
    if parallel is None or parallel.extent is None:
        return None
    starts = []
    for task in range(min(parallel.extent, MAX_TASKS_EXAMINED)):
        analyzer = Analyzer()  # the offset names no let: the analyzer that made it put in their values
        analyzer.bind(parallel.var, parallel.min + task)
        value = analyzer.simplify(pattern.offset)
        if not isinstance(value, tirx.IntImm):
            return None
        starts.append(int(value))
    repeat = next((i for i, start in enumerate(starts) if start != starts[0]), None)
    if repeat is None or (repeat < 2 and not rereads) or 2 * repeat > len(starts):
        return None
    distance = starts[repeat] - starts[0]
    if any(starts[i] != starts[0] + (i // repeat) * distance for i in range(2 * repeat)):
        return None
    return repeat, distance


def _prefetching_call(
    stmt: s.AttrStmt, loops: list[_Loop], lets: dict, parallel: _Loop, read_only: Callable[[tirx.Var], bool]
) -> s.Stmt | None:
    """A ``vdpbf16ps`` micro-kernel's call (``stmt``: its import around it) made to ask for weight lines a
    later call reads, a few each step of the tile (``bf16_dot.prefetching_variant``): its share of the next
    tasks' slice where the task re-reads its slice (a row-block loop around the call) or shares it with
    the tasks beside it (``_next_tasks_lines``), else the next call's slice where each call reads a slice
    of its own (a convolution's window taps, ``_next_call_lines``). None where it is neither."""
    call = stmt.body.value if isinstance(stmt.body, s.Evaluate) else None
    if not _is_op(call, "tirx.call_extern") or len(call.args) != 8 or not _is_op(call.args[5], "tirx.tvm_access_ptr"):
        return None
    kind, data, offset, extent = call.args[5].args[:4]
    if not _is_op(data, "tirx.buffer_data") or not read_only(data.args[0]):
        return None
    if any(loop.extent is None for loop in loops):
        return None
    weight = data.args[0]
    pattern = _pattern([_Read(weight, str(weight.dtype), offset, int(extent))], loops, _with_lets(lets))
    if pattern is None:
        return None
    wanted = _next_tasks_lines(pattern, loops, parallel) or _next_call_lines(pattern, loops)
    per_step = math.ceil(wanted[1] / int(call.args[7])) if wanted else 0
    variant = prefetching_variant(str(call.args[0].value), per_step) if 0 < per_step <= MAX_LINES_PER_STEP else None
    if variant is None:
        return None
    start, lines = wanted
    lines_from = tirx.tvm_access_ptr(kind, data, start, lines * CACHE_LINE // pattern.block_bytes(1), 1)
    args = [tvm.ir.expr.StringImm(variant[0]), *call.args[1:], lines_from, tirx.const(lines, "int64")]
    prefetching = s.Evaluate(tirx.call_extern("void", *args))
    return s.AttrStmt(stmt.node, stmt.attr_key, tvm.ir.expr.StringImm(variant[1]), prefetching)


def _next_tasks_lines(pattern: _Pattern, loops: list[_Loop], parallel: _Loop) -> tuple[tirx.Expr, int] | None:
    """Where a call's lines of the next tasks' slice start, and how many: the slice shared out among the
    tasks that read it together and the calls of each task that re-read it."""
    rereaders = [loop for step, loop in zip(pattern.steps, loops, strict=True) if step == 0]
    tasks = _tasks_per_block(pattern, parallel, rereads=bool(rereaders))
    movers = math.prod(loop.extent for step, loop in zip(pattern.steps, loops, strict=True) if step)
    if tasks is None or not MIN_BLOCK_BYTES <= pattern.block_bytes(pattern.length) * movers <= MAX_BLOCK_BYTES:
        return None
    repeat, distance = tasks
    share = math.ceil(math.ceil(pattern.block_bytes(pattern.length) / CACHE_LINE) / repeat)
    per_call = math.ceil(share / math.prod(loop.extent for loop in rereaders))
    first = tirx.floormod(parallel.var - parallel.min, repeat) * share + _run_index(rereaders) * per_call
    return _call_offset(pattern, loops) + distance + first * (CACHE_LINE // pattern.block_bytes(1)), per_call


def _next_call_lines(pattern: _Pattern, loops: list[_Loop]) -> tuple[tirx.Expr, int] | None:
    """Where the next call's slice starts and its lines, where the innermost loop moves each call to a slice
    of its own (a convolution's taps, laid out one after the other: past the last tap of a row of the
    window, the next row's first) and no call re-reads one."""
    if not loops or 0 in pattern.steps or loops[-1].extent < 2:
        return None
    if not MIN_TAP_BYTES <= pattern.block_bytes(pattern.length) <= MAX_BLOCK_BYTES:
        return None
    lines = math.ceil(pattern.block_bytes(pattern.length) / CACHE_LINE)
    return _call_offset(pattern, loops) + pattern.steps[-1], lines


def _call_offset(pattern: _Pattern, loops: list[_Loop]) -> tirx.Expr:
    """Where the read at the current values of ``loops`` (the pattern's, or its outermost few: the rest at
    their first) starts (``pattern.offset`` is at the first of all)."""
    offset = pattern.offset
    for step, loop in zip(pattern.steps[: len(loops)], loops, strict=True):
        offset = offset + step * (loop.var - loop.min)
    return offset


def _run_index(loops: list[_Loop]) -> tirx.Expr:
    """Which run of the code inside ``loops`` this is, counted from 0 over all of them (outermost first)."""
    run = tirx.const(0, "int32")
    for loop in loops:
        run = run * loop.extent + (loop.var - loop.min)
    return run


def _is_op(expr: object, name: str) -> bool:
    return isinstance(expr, tvm.ir.expr.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def _spread(
    pattern: _Pattern, start: tirx.Expr, elements: int, sharing: list[_Loop], tasks: int, task: tirx.Expr | None
) -> list[s.Stmt]:
    """Prefetches of the ``elements`` from ``start``: this task's 1/``tasks`` of them (``task`` its
    index among them), a share before each run of the loop after ``sharing``. None where one run
    would take too many lines: cutting the reduction loop into chunks to spread them further
    measured slower (LLVM stores the accumulators between chunks; HF BERT 1.00 of its time without
    prefetches, 0.97 without the cut)."""
    block_bytes = pattern.block_bytes(elements)
    if not MIN_BLOCK_BYTES <= block_bytes <= MAX_BLOCK_BYTES:
        return []  # a block that needs no help, or one that does not fit twice in L2
    per_task = math.ceil(math.ceil(block_bytes / CACHE_LINE) / tasks)
    per_run = math.ceil(per_task / math.prod(loop.extent for loop in sharing))
    if per_run > MAX_LINES_PER_RUN:
        return []
    per_line = CACHE_LINE // pattern.block_bytes(1)
    run = _run_index(sharing)
    first = start if task is None else start + task * per_task * per_line

    def address(line: int) -> tirx.Expr:
        return first + (run * per_run + line) * per_line

    return [
        s.Evaluate(
            tirx.call_llvm_intrin(
                "void",
                "llvm.prefetch.p0",
                tirx.tvm_access_ptr(tirx.type_annotation(pattern.dtype), pattern.buffer.data, address(line), 1, 1),
                0,
                _LOCALITY_L2,
                1,
            )
        )
        for line in range(per_run)
    ]


def _vector_reads(stmt: s.Stmt) -> list[_Read]:
    """Loads of contiguous vectors (one ``Ramp`` index of stride 1) anywhere in ``stmt``."""
    reads: list[_Read] = []

    def note(expr: tirx.Expr) -> None:
        if isinstance(expr, tvm.ir.TensorLoad) and len(expr.indices) == 1:
            index = expr.indices[0]
            if isinstance(index, tirx.Ramp) and isinstance(index.stride, tirx.IntImm) and int(index.stride) == 1:
                reads.append(_Read(expr.source, str(expr.source.dtype), index.base, int(index.lanes)))

    walk_stmts(stmt, lambda node: [walk_expr(expr, note) for expr in exprs_of(node)])
    return reads


PIPELINE = "tensor_tuner_cpu"
DISABLE_ENV = "TENSOR_TUNER_WEIGHT_PREFETCH"  # "0": CPU kernels built without the prefetches, to compare


def _cpu_pipeline():
    lower, finalize_host, finalize_device = tvm.tirx.get_tir_pipeline("default")
    return tvm.transform.Sequential([lower, weight_prefetch]), finalize_host, finalize_device


def tir_pipeline(target: tvm.target.Target) -> str:
    """The TIR pipeline kernels for ``target`` are built with: TVM's default, followed on CPUs by
    the weights' prefetches."""
    if target.kind.name != "llvm" or os.environ.get(DISABLE_ENV) == "0":
        return "default"
    tvm.tirx.register_tir_pipeline(PIPELINE, _cpu_pipeline)
    return PIPELINE
