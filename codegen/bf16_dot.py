"""bfloat16 products on AVX512_BF16 as TVM tensor intrinsics: one register tile of a GEMM
(``rows`` x ``vectors`` x 16 fp32 accumulators) over a run of the reduction, each step one
``vdpbf16ps`` per accumulator vector (32 multiply-adds per instruction, twice the FMA's work).

TVM 0.27's code generator cannot emit the instruction (its bf16 legalizer turns every bf16 operand
into fp32 before LLVM sees it, and its LLVM intrinsic calls cannot bitcast integer pairs to
``<32 x bfloat>``: ``../shared/research/bf16-x86.md``), so an intrinsic's implementation calls a
micro-kernel written in LLVM IR (``dot_kernel``; AMX's: ``amx_dot``), which TVM links into the kernel
(``pragma_import_llvm``) and LLVM inlines. The micro-kernel holds the whole tile in registers over the
reduction: a tile of one step per call would store its accumulators after every step, as LLVM cannot
tell them apart from the operands inside TVM's parallel closures.

Operands: the activation's rows (a pair of bf16 along the reduction broadcast to all 16 lanes), the
weight packed [N/16, K/2, 16, 2] once at compile time, the accumulators as fp32 rows. A tile's shape
is part of its intrinsic's name (``tensor_tuner_bf16_r4_v2_p64``), so that any process replaying a
schedule can register the intrinsics it names (``register_if_ours``).
"""

from __future__ import annotations

import re
import threading

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T
from tvm.script.parser._core import parse, utils

from .amx_dot import Window, amx_micro_kernel_ir
from .dot_kernel import LANES, micro_kernel_ir
from .intrinsic_cache import cached_intrinsic

PAIR = 2  # bf16 products summed into each
AVX512 = "bf16"  # the units computing a tile, as intrinsic names spell them
AMX = "amx"
_NAME = re.compile(
    r"tensor_tuner_(bf16|amx)_r(\d+)_v(\d+)_p(\d+)(?:_w(\d+)x(\d+)c(\d+)(?:o(\d+))?(?:s(\d+)h(\d+))?)?(_z)?"
)
_ZEROED_NAME = re.compile(r"tensor_tuner_amx_zeroed_r(\d+)_v(\d+)")
_lock = threading.Lock()


class _Script:
    """``T.prim_func`` without the ``inspect.stack()`` its decorator takes, which reads the source of every
    frame on the stack (0.1-0.7 s a function in a tuning process: seconds for each bf16 model, in every
    worker too). The functions parsed here are defined inside others and capture only bound names, which
    is all the frames were for; the parser reads ``s_tir=True`` from the decorator's line as before."""

    @staticmethod
    def prim_func(s_tir: bool = False):
        def parsed(func):
            return parse(func, utils.inspect_function_capture(func))

        parsed.dispatch_token = "tirx"
        return parsed


_script = _Script()


def intrinsic_name(
    rows: int, vectors: int, pairs: int, unit: str = AVX512, window: Window | None = None, zero: bool = False
) -> str:
    """``zero`` (AMX): a call that is its tile's whole reduction, its accumulators starting from zero tiles."""
    name = f"tensor_tuner_{unit}_r{rows}_v{vectors}_p{pairs}"
    if window is not None:
        overlap = f"o{window.overlap}" if window.overlap else ""
        strided = f"s{window.stride}h{window.phase}" if window.stride > 1 else ""
        name += f"_w{window.height}x{window.width}c{window.columns}{overlap}{strided}"
    return name + ("_z" if zero else "")


def prefetching_variant(kernel: str, per_step: int) -> tuple[str, str] | None:
    """The name and LLVM IR of ``kernel`` (a ``vdpbf16ps`` micro-kernel's function, as the intrinsics
    call it) asking for ``per_step`` lines of another block a step; None for a kernel of another unit."""
    match = _NAME.fullmatch(kernel.replace("tensor_tuner_kernel_", "tensor_tuner_"))
    if match is None or match.group(1) != AVX512 or match.group(5) is not None:
        return None
    name = f"{kernel}_pf{per_step}"
    return name, micro_kernel_ir(name, int(match.group(2)), int(match.group(3)), per_step)


def _intrinsic(rows: int, vectors: int, pairs: int, unit: str, zero: bool):
    width = vectors * LANES
    kernel = intrinsic_name(rows, vectors, pairs, unit, None, zero).replace("tensor_tuner_", "tensor_tuner_kernel_")
    ir_text = (
        amx_micro_kernel_ir(kernel, rows, vectors, pairs, None, zero)
        if unit == AMX
        else micro_kernel_ir(kernel, rows, vectors)
    )

    @_script.prim_func(s_tir=True)
    def description(a: T.handle, b: T.handle, c: T.handle) -> None:
        lda, ldb, ldc = T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (rows, pairs * PAIR), "bfloat16", strides=[lda, 1], offset_factor=1)
        B = T.match_buffer(b, (vectors, pairs, LANES, PAIR), "bfloat16", strides=[ldb, 32, 2, 1], offset_factor=1)
        C = T.match_buffer(c, (rows, width), "float32", strides=[ldc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:width], A[0:rows, 0 : pairs * PAIR], B[0:vectors, 0:pairs, 0:LANES, 0:PAIR])
            T.writes(C[0:rows, 0:width])
            for r, v, p, lane, e in T.grid(rows, vectors, pairs, LANES, PAIR):
                with T.sblock("update"):
                    vr = T.axis.spatial(rows, r)
                    vn = T.axis.spatial(width, v * LANES + lane)
                    vk = T.axis.reduce(pairs * PAIR, p * PAIR + e)
                    C[vr, vn] = C[vr, vn] + T.cast(A[vr, vk], "float32") * T.cast(
                        B[vn // LANES, vk // PAIR, vn % LANES, vk % PAIR], "float32"
                    )

    # a one-row tile: the schedule's block has no row axis left to match
    @_script.prim_func(s_tir=True)
    def one_row_description(a: T.handle, b: T.handle, c: T.handle) -> None:
        lda, ldb, ldc = T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (1, pairs * PAIR), "bfloat16", strides=[lda, 1], offset_factor=1)
        B = T.match_buffer(b, (vectors, pairs, LANES, PAIR), "bfloat16", strides=[ldb, 32, 2, 1], offset_factor=1)
        C = T.match_buffer(c, (1, width), "float32", strides=[ldc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0, 0:width], A[0, 0 : pairs * PAIR], B[0:vectors, 0:pairs, 0:LANES, 0:PAIR])
            T.writes(C[0, 0:width])
            for v, p, lane, e in T.grid(vectors, pairs, LANES, PAIR):
                with T.sblock("update"):
                    vn = T.axis.spatial(width, v * LANES + lane)
                    vk = T.axis.reduce(pairs * PAIR, p * PAIR + e)
                    C[0, vn] = C[0, vn] + T.cast(A[0, vk], "float32") * T.cast(
                        B[vn // LANES, vk // PAIR, vn % LANES, vk % PAIR], "float32"
                    )

    @_script.prim_func(s_tir=True)
    def implementation(a: T.handle, b: T.handle, c: T.handle) -> None:
        lda, ldb, ldc = T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (rows, pairs * PAIR), "bfloat16", strides=[lda, 1], offset_factor=1)
        B = T.match_buffer(b, (vectors, pairs, LANES, PAIR), "bfloat16", strides=[ldb, 32, 2, 1], offset_factor=1)
        C = T.match_buffer(c, (rows, width), "float32", strides=[ldc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:width], A[0:rows, 0 : pairs * PAIR], B[0:vectors, 0:pairs, 0:LANES, 0:PAIR])
            T.writes(C[0:rows, 0:width])
            T.attr(0, "pragma_import_llvm", ir_text)
            # operand pointers typed uint16: the storage TVM's bf16 legalizer gives bf16 buffers
            T.evaluate(
                T.call_extern(
                    "void",
                    kernel,
                    C.access_ptr("rw"),
                    T.Cast("int64", ldc),
                    T.tvm_access_ptr(T.type_annotation("uint16"), A.data, A.elem_offset, rows * lda, 1),
                    T.Cast("int64", lda),
                    T.tvm_access_ptr(T.type_annotation("uint16"), B.data, B.elem_offset, vectors * ldb, 1),
                    T.Cast("int64", ldb),
                    T.int64(pairs),
                )
            )

    return (description if rows > 1 else one_row_description), implementation


def _window_intrinsic(rows: int, vectors: int, pairs: int, window: Window, zero: bool):
    """The AMX tile summed over a convolution's window too (``amx_dot.Window``, strided or not): the activation
    rows of every tap (``span`` of them from the tile's first), the packed weight [KH, KW, ...]."""
    width, reduction = vectors * LANES, pairs * PAIR
    height, taps_w, columns = window.height, window.width, window.columns
    stride, phase = window.stride, window.phase
    # the rows the workload's read region spans: its bound takes a tap's phase and column as independent
    span = rows + (height - 1) * columns + min(stride - 1, taps_w - 1) * phase + (taps_w - 1) // stride
    b_shape = (height, taps_w, vectors, pairs, LANES, PAIR)
    kernel = intrinsic_name(rows, vectors, pairs, AMX, window, zero).replace("tensor_tuner_", "tensor_tuner_kernel_")
    ir_text = amx_micro_kernel_ir(kernel, rows, vectors, pairs, window, zero)

    def tap_row(vr, vy, vx):  # the stride-1 expression as it was: those intrinsics' descriptions unchanged
        if stride == 1:
            return vr + vy * columns + vx
        return vr + vy * columns + vx % stride * phase + vx // stride

    @_script.prim_func(s_tir=True)
    def description(a: T.handle, b: T.handle, c: T.handle) -> None:
        lda, ldb, ldc, sbh, sbw = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (span, reduction), "bfloat16", strides=[lda, 1], offset_factor=1)
        B = T.match_buffer(b, b_shape, "bfloat16", strides=[sbh, sbw, ldb, 32, 2, 1], offset_factor=1)
        C = T.match_buffer(c, (rows, width), "float32", strides=[ldc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(
                C[0:rows, 0:width],
                A[0:span, 0:reduction],
                B[0:height, 0:taps_w, 0:vectors, 0:pairs, 0:LANES, 0:PAIR],
            )
            T.writes(C[0:rows, 0:width])
            for ty, tx, r, v, p, lane, e in T.grid(height, taps_w, rows, vectors, pairs, LANES, PAIR):
                with T.sblock("update"):
                    vr = T.axis.spatial(rows, r)
                    vn = T.axis.spatial(width, v * LANES + lane)
                    vy = T.axis.reduce(height, ty)
                    vx = T.axis.reduce(taps_w, tx)
                    vk = T.axis.reduce(reduction, p * PAIR + e)
                    C[vr, vn] = C[vr, vn] + T.cast(A[tap_row(vr, vy, vx), vk], "float32") * T.cast(
                        B[vy, vx, vn // LANES, vk // PAIR, vn % LANES, vk % PAIR], "float32"
                    )

    @_script.prim_func(s_tir=True)
    def implementation(a: T.handle, b: T.handle, c: T.handle) -> None:
        lda, ldb, ldc, sbh, sbw = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (span, reduction), "bfloat16", strides=[lda, 1], offset_factor=1)
        B = T.match_buffer(b, b_shape, "bfloat16", strides=[sbh, sbw, ldb, 32, 2, 1], offset_factor=1)
        C = T.match_buffer(c, (rows, width), "float32", strides=[ldc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(
                C[0:rows, 0:width],
                A[0:span, 0:reduction],
                B[0:height, 0:taps_w, 0:vectors, 0:pairs, 0:LANES, 0:PAIR],
            )
            T.writes(C[0:rows, 0:width])
            T.attr(0, "pragma_import_llvm", ir_text)
            T.evaluate(
                T.call_extern(
                    "void",
                    kernel,
                    C.access_ptr("rw"),
                    T.Cast("int64", ldc),
                    T.tvm_access_ptr(T.type_annotation("uint16"), A.data, A.elem_offset, span * lda, 1),
                    T.Cast("int64", lda),
                    T.tvm_access_ptr(T.type_annotation("uint16"), B.data, B.elem_offset, height * sbh, 1),
                    T.Cast("int64", ldb),
                    T.int64(pairs),
                    T.Cast("int64", sbh),
                    T.Cast("int64", sbw),
                )
            )

    return description, implementation


def _overlap_intrinsic(rows: int, vectors: int, pairs: int, window: Window, zero: bool, unit: str):
    """A tile summed over a window whose activation rows overlap (``Window.overlap``), on ``unit``: one
    flat buffer, row r of window row y starting ``(r + y * columns) * overlap`` values on, its reduction
    the run of values from there (a window row's taps are one run: the window is one tap wide)."""
    width, reduction, lda = vectors * LANES, pairs * PAIR, window.overlap
    height, taps_w, columns = window.height, window.width, window.columns
    assert taps_w == 1, "an overlapping window's rows are one run each"
    span = (rows - 1 + (height - 1) * columns) * lda + reduction
    b_shape = (height, taps_w, vectors, pairs, LANES, PAIR)
    kernel = intrinsic_name(rows, vectors, pairs, unit, window, zero).replace("tensor_tuner_", "tensor_tuner_kernel_")
    ir_text = (
        amx_micro_kernel_ir(kernel, rows, vectors, pairs, window, zero)
        if unit == AMX
        else micro_kernel_ir(kernel, rows, vectors, window=window)
    )

    @_script.prim_func(s_tir=True)
    def description(a: T.handle, b: T.handle, c: T.handle) -> None:
        ldb, ldc, sbh, sbw = T.int32(), T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (span,), "bfloat16", offset_factor=1)
        B = T.match_buffer(b, b_shape, "bfloat16", strides=[sbh, sbw, ldb, 32, 2, 1], offset_factor=1)
        C = T.match_buffer(c, (rows, width), "float32", strides=[ldc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:width], A[0:span], B[0:height, 0:taps_w, 0:vectors, 0:pairs, 0:LANES, 0:PAIR])
            T.writes(C[0:rows, 0:width])
            for ty, r, v, p, lane, e in T.grid(height, rows, vectors, pairs, LANES, PAIR):
                with T.sblock("update"):
                    vr = T.axis.spatial(rows, r)
                    vn = T.axis.spatial(width, v * LANES + lane)
                    vy = T.axis.reduce(height, ty)
                    vk = T.axis.reduce(reduction, p * PAIR + e)
                    C[vr, vn] = C[vr, vn] + T.cast(A[(vr + vy * columns) * lda + vk], "float32") * T.cast(
                        B[vy, 0, vn // LANES, vk // PAIR, vn % LANES, vk % PAIR], "float32"
                    )

    @_script.prim_func(s_tir=True)
    def implementation(a: T.handle, b: T.handle, c: T.handle) -> None:
        ldb, ldc, sbh, sbw = T.int32(), T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (span,), "bfloat16", offset_factor=1)
        B = T.match_buffer(b, b_shape, "bfloat16", strides=[sbh, sbw, ldb, 32, 2, 1], offset_factor=1)
        C = T.match_buffer(c, (rows, width), "float32", strides=[ldc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:width], A[0:span], B[0:height, 0:taps_w, 0:vectors, 0:pairs, 0:LANES, 0:PAIR])
            T.writes(C[0:rows, 0:width])
            T.attr(0, "pragma_import_llvm", ir_text)
            T.evaluate(
                T.call_extern(
                    "void",
                    kernel,
                    C.access_ptr("rw"),
                    T.Cast("int64", ldc),
                    T.tvm_access_ptr(T.type_annotation("uint16"), A.data, A.elem_offset, span, 1),
                    T.int64(lda),
                    T.tvm_access_ptr(T.type_annotation("uint16"), B.data, B.elem_offset, height * sbh, 1),
                    T.Cast("int64", ldb),
                    T.int64(pairs),
                    T.Cast("int64", sbh),
                    T.Cast("int64", sbw),
                )
            )

    return description, implementation


def register_bf16_tile(
    rows: int, vectors: int, pairs: int, unit: str = AVX512, window: Window | None = None, zero: bool = False
) -> str:
    """Register the intrinsic of one tile shape on ``unit`` (over a ``window``'s taps too: on AMX any, on
    ``vdpbf16ps`` one whose rows overlap) in this process (idempotent); returns its name."""
    zero = zero and unit == AMX
    name = intrinsic_name(rows, vectors, pairs, unit, window, zero)
    if window is not None and not window.overlap and unit != AMX:
        raise ValueError(f"a vdpbf16ps micro-kernel sums a window only over overlapping rows, not {window}")

    def parsed_pair():
        if window is None:
            return _intrinsic(rows, vectors, pairs, unit, zero)
        if window.overlap:
            return _overlap_intrinsic(rows, vectors, pairs, window, zero, unit)
        return _window_intrinsic(rows, vectors, pairs, window, zero)

    with _lock:
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *cached_intrinsic(name, parsed_pair))
    return name


def register_zeroed_tile(rows: int, vectors: int) -> str:
    """Register the initialisation of an AMX tile whose call starts from zero tiles (``zero``: the call is the
    tile's whole reduction) in this process (idempotent); returns its name. Such a call reads nothing of C, so
    the zeros the schedule's initialisation stored there (4 KB a 32x32 tile, every tile) were never read: 16% of a
    64-deep product's time (3136x256x64 with a bias and ReLU on a 2-core Xeon, 90.6 -> 76.5 us without them). Its
    implementation emits nothing: correct only where such a call follows over the same tile. Its loops are the
    tile's rows, vectors and lanes, a one-vector tile's too."""
    name = f"tensor_tuner_amx_zeroed_r{rows}_v{vectors}"
    with _lock:
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *cached_intrinsic(name, lambda: _zeroed_intrinsic(rows, vectors)))
    return name


def _zeroed_intrinsic(rows: int, vectors: int):
    width = vectors * LANES

    @_script.prim_func(s_tir=True)
    def description(c: T.handle) -> None:
        ldc = T.int32()
        C = T.match_buffer(c, (rows, width), "float32", strides=[ldc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:rows, 0:width])
            for r, v, lane in T.grid(rows, vectors, LANES):
                with T.sblock("init"):
                    vr = T.axis.spatial(rows, r)
                    vn = T.axis.spatial(width, v * LANES + lane)
                    C[vr, vn] = T.float32(0)

    @_script.prim_func(s_tir=True)
    def implementation(c: T.handle) -> None:
        ldc = T.int32()
        C = T.match_buffer(c, (rows, width), "float32", strides=[ldc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:rows, 0:width])
            T.evaluate(0)

    return description, implementation


def tile_of(name: str) -> tuple[int, int] | None:
    """The (rows, vectors) register tile of one of these intrinsics, by its name; None for any other name."""
    match = _NAME.fullmatch(name)
    return (int(match.group(2)), int(match.group(3))) if match else None


def unit_of(name: str) -> str | None:
    """The unit (``AVX512``, ``AMX``) one of these intrinsics runs on, by its name; None for any other name."""
    match = _NAME.fullmatch(name)
    return match.group(1) if match else None


def register_if_ours(name: str) -> bool:
    """Register ``name`` if it is the name of one of these intrinsics (a stored trace tensorizes with it);
    whether it was."""
    zeroed = _ZEROED_NAME.fullmatch(name)
    if zeroed:
        register_zeroed_tile(*(int(d) for d in zeroed.groups()))
        return True
    match = _NAME.fullmatch(name)
    if match:
        unit, rows, vectors, pairs, *window, zero = match.groups()
        height, width, columns, overlap, stride, phase = (int(d or 0) for d in window)
        taps = Window(height, width, columns, overlap, stride or 1, phase) if window[0] is not None else None
        register_bf16_tile(int(rows), int(vectors), int(pairs), unit, taps, zero is not None)
    return match is not None
