"""float32 products on AVX-512 FMAs as TVM tensor intrinsics: one register tile of a GEMM (``rows`` x
``vectors`` x 16 fp32 accumulators) over a run of the reduction, each step one ``vfmadd231ps`` per
accumulator, its activation value broadcast from memory and its weights one vector per 16 columns.

MetaSchedule's CPU space reaches such a tile only where its random tile factors happen to make one
(``tuner.register_tiles``), and TVM's vectoriser then keeps the accumulators in registers only as
LLVM manages to: BERT's and Llama's fp32 products ran at 61-81% of the sgemm peak measured beside
them. The micro-kernel (LLVM IR, linked into the kernel with ``pragma_import_llvm`` and inlined, as
``measure.bf16_dot``'s) holds the tile in registers over its whole run of the reduction.

Operands: the activation's rows, the weight packed [N/16, K, 16] once at compile time, the
accumulators as fp32 rows. The tile's shape is part of the intrinsic's name
(``tensor_tuner_fma_r6_v4_p768``), so that a process replaying a schedule can register it.
"""

from __future__ import annotations

import re
import threading

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from .bf16_dot import prefetch_lines

LANES = 16  # fp32 lanes of an AVX-512 vector
FMA = "fma"  # the unit, as intrinsic names spell it
_NAME = re.compile(r"tensor_tuner_fma_r(\d+)_v(\d+)_p(\d+)")
_lock = threading.Lock()


def intrinsic_name(rows: int, vectors: int, steps: int) -> str:
    return f"tensor_tuner_{FMA}_r{rows}_v{vectors}_p{steps}"


def micro_kernel_ir(name: str, rows: int, vectors: int, prefetch_per_step: int = 0) -> str:
    """LLVM IR of ``name``(C, ldc, A, lda, B, ldb, steps): C[r, 16v + l] += sum_k A[r, k] * B[v, k, l].
    With ``prefetch_per_step``, two arguments more (next, lines): ``lines`` cache lines from ``next`` asked
    for into L2, that many a step, while the tile computes (``prefetching_variant``)."""
    accumulators = [(r, v) for r in range(rows) for v in range(vectors)]
    extra = ", ptr %next, i64 %lines" if prefetch_per_step else ""
    lines = [f"define void @{name}(ptr %c, i64 %ldc, ptr %a, i64 %lda, ptr %b, i64 %ldb, i64 %steps{extra}) #0 {{"]
    lines.append("entry:")
    for r, v in accumulators:
        lines += [
            f"  %co{r}_{v} = mul i64 %ldc, {r}",
            f"  %ci{r}_{v} = add i64 %co{r}_{v}, {v * LANES}",
            f"  %cp{r}_{v} = getelementptr float, ptr %c, i64 %ci{r}_{v}",
            f"  %c{r}_{v} = load <16 x float>, ptr %cp{r}_{v}, align 4",
        ]
    lines += ["  %empty = icmp eq i64 %steps, 0", "  br i1 %empty, label %done, label %step", "step:"]
    back = "compute" if prefetch_per_step else "step"  # the block the loop's back edge leaves from
    lines.append(f"  %k = phi i64 [ 0, %entry ], [ %next_k, %{back} ]")
    for r, v in accumulators:
        lines.append(f"  %s{r}_{v} = phi <16 x float> [ %c{r}_{v}, %entry ], [ %n{r}_{v}, %{back} ]")
    if prefetch_per_step:
        lines += prefetch_lines(prefetch_per_step, step="%k", element="float")
    for r in range(rows):
        lines += [
            f"  %ao{r} = mul i64 %lda, {r}",
            f"  %ai{r} = add i64 %ao{r}, %k",
            f"  %ap{r} = getelementptr float, ptr %a, i64 %ai{r}",
            f"  %value{r} = load float, ptr %ap{r}, align 4",
            f"  %one{r} = insertelement <16 x float> poison, float %value{r}, i64 0",
            f"  %x{r} = shufflevector <16 x float> %one{r}, <16 x float> poison, <16 x i32> zeroinitializer",
        ]
    for v in range(vectors):
        lines += [
            f"  %bo{v} = mul i64 %ldb, {v}",
            f"  %bk{v} = shl i64 %k, 4",
            f"  %bi{v} = add i64 %bo{v}, %bk{v}",
            f"  %bp{v} = getelementptr float, ptr %b, i64 %bi{v}",
            f"  %w{v} = load <16 x float>, ptr %bp{v}, align 4",
        ]
    for r, v in accumulators:
        lines.append(
            f"  %n{r}_{v} = call <16 x float> @llvm.fma.v16f32(<16 x float> %x{r}, <16 x float> %w{v}, "
            f"<16 x float> %s{r}_{v})"
        )
    lines += [
        "  %next_k = add i64 %k, 1",
        "  %more = icmp ult i64 %next_k, %steps",
        "  br i1 %more, label %step, label %done",
        "done:",
    ]
    for r, v in accumulators:
        lines.append(f"  %f{r}_{v} = phi <16 x float> [ %c{r}_{v}, %entry ], [ %n{r}_{v}, %{back} ]")
    for r, v in accumulators:
        lines.append(f"  store <16 x float> %f{r}_{v}, ptr %cp{r}_{v}, align 4")
    lines += [
        "  ret void",
        "}",
        "declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)",
    ]
    if prefetch_per_step:
        lines.append("declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
    lines.append('attributes #0 = { alwaysinline "target-features"="+avx512f,+fma" }')
    return "\n".join(lines) + "\n"


def prefetching_variant(kernel: str, per_step: int) -> tuple[str, str] | None:
    """The name and LLVM IR of ``kernel`` (a micro-kernel's function, as the intrinsics call it) asking for
    ``per_step`` lines of another block a step; None for a kernel of another unit."""
    match = _NAME.fullmatch(kernel.replace("tensor_tuner_kernel_", "tensor_tuner_"))
    if match is None:
        return None
    name = f"{kernel}_pf{per_step}"
    return name, micro_kernel_ir(name, int(match.group(1)), int(match.group(2)), per_step)


def _intrinsic(rows: int, vectors: int, steps: int):
    width = vectors * LANES
    kernel = intrinsic_name(rows, vectors, steps).replace("tensor_tuner_", "tensor_tuner_kernel_")
    ir_text = micro_kernel_ir(kernel, rows, vectors)

    @T.prim_func(s_tir=True)
    def description(a: T.handle, b: T.handle, c: T.handle) -> None:
        lda, ldb, ldc = T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (rows, steps), "float32", strides=[lda, 1], offset_factor=1)
        B = T.match_buffer(b, (vectors, steps, LANES), "float32", strides=[ldb, LANES, 1], offset_factor=1)
        C = T.match_buffer(c, (rows, width), "float32", strides=[ldc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:width], A[0:rows, 0:steps], B[0:vectors, 0:steps, 0:LANES])
            T.writes(C[0:rows, 0:width])
            for r, v, k, lane in T.grid(rows, vectors, steps, LANES):
                with T.sblock("update"):
                    vr = T.axis.spatial(rows, r)
                    vn = T.axis.spatial(width, v * LANES + lane)
                    vk = T.axis.reduce(steps, k)
                    C[vr, vn] = C[vr, vn] + A[vr, vk] * B[vn // LANES, vk, vn % LANES]

    # a one-row tile: the schedule's block has no row axis left to match
    @T.prim_func(s_tir=True)
    def one_row_description(a: T.handle, b: T.handle, c: T.handle) -> None:
        lda, ldb, ldc = T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (1, steps), "float32", strides=[lda, 1], offset_factor=1)
        B = T.match_buffer(b, (vectors, steps, LANES), "float32", strides=[ldb, LANES, 1], offset_factor=1)
        C = T.match_buffer(c, (1, width), "float32", strides=[ldc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0, 0:width], A[0, 0:steps], B[0:vectors, 0:steps, 0:LANES])
            T.writes(C[0, 0:width])
            for v, k, lane in T.grid(vectors, steps, LANES):
                with T.sblock("update"):
                    vn = T.axis.spatial(width, v * LANES + lane)
                    vk = T.axis.reduce(steps, k)
                    C[0, vn] = C[0, vn] + A[0, vk] * B[vn // LANES, vk, vn % LANES]

    @T.prim_func(s_tir=True)
    def implementation(a: T.handle, b: T.handle, c: T.handle) -> None:
        lda, ldb, ldc = T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (rows, steps), "float32", strides=[lda, 1], offset_factor=1)
        B = T.match_buffer(b, (vectors, steps, LANES), "float32", strides=[ldb, LANES, 1], offset_factor=1)
        C = T.match_buffer(c, (rows, width), "float32", strides=[ldc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:width], A[0:rows, 0:steps], B[0:vectors, 0:steps, 0:LANES])
            T.writes(C[0:rows, 0:width])
            T.attr(0, "pragma_import_llvm", ir_text)
            T.evaluate(
                T.call_extern(
                    "void",
                    kernel,
                    C.access_ptr("rw"),
                    T.Cast("int64", ldc),
                    A.access_ptr("r"),
                    T.Cast("int64", lda),
                    B.access_ptr("r"),
                    T.Cast("int64", ldb),
                    T.int64(steps),
                )
            )

    return (description if rows > 1 else one_row_description), implementation


def register_fma_tile(rows: int, vectors: int, steps: int) -> str:
    """Register the intrinsic of one tile shape in this process (idempotent); returns its name."""
    name = intrinsic_name(rows, vectors, steps)
    with _lock:
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *_intrinsic(rows, vectors, steps))
    return name


def register_if_ours(name: str) -> bool:
    """Register ``name`` if it names one of these intrinsics (a stored trace tensorizes with it); whether it did."""
    match = _NAME.fullmatch(name)
    if match:
        register_fma_tile(*(int(group) for group in match.groups()))
    return match is not None
