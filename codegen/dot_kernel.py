"""The ``vdpbf16ps`` micro-kernel in LLVM IR (AVX512_BF16): one register tile of ``rows`` x ``vectors`` x 16 fp32
accumulators held in registers over a run of the reduction, a ``vdpbf16ps`` per accumulator vector a step; with a
window, over its taps too; with prefetches, asking for another block's lines a step. ``bf16_dot`` makes the tensor
intrinsics that call it (``amx_dot`` is AMX's).
"""

from __future__ import annotations

from .amx_dot import Window, tap_loop_end, tap_loop_start

LANES = 16  # fp32 accumulators per vector


def micro_kernel_ir(
    name: str, rows: int, vectors: int, prefetch_per_step: int = 0, window: Window | None = None
) -> str:
    """LLVM IR of ``name``(C, ldc, A, lda, B, ldb, pairs): C[r, 16v + l] += sum_p A[r, 2p:2p+2] . B[v, p, l, :].
    With ``prefetch_per_step``, two arguments more (next, lines): ``lines`` cache lines from ``next``
    asked for into L2, that many a step, while the tile computes (``prefetching_variant``). With a
    ``window`` (its rows overlapping: ``Window.overlap``), two more (the weight's strides over the
    window's rows and columns), and one call sums over its taps too, the accumulators in registers
    throughout (as AMX's window micro-kernel, ``amx_dot``)."""
    extra = ", ptr %next, i64 %lines" if prefetch_per_step else ", i64 %sbh, i64 %sbw" if window else ""
    lines = [f"define void @{name}(ptr %c, i64 %ldc, ptr %a, i64 %lda, ptr %b, i64 %ldb, i64 %pairs{extra}) #0 {{"]
    lines.append("entry:")
    accumulators = [(r, v) for r in range(rows) for v in range(vectors)]
    for r, v in accumulators:
        lines += [
            f"  %co{r}_{v} = mul i64 %ldc, {r}",
            f"  %ci{r}_{v} = add i64 %co{r}_{v}, {v * LANES}",
            f"  %cp{r}_{v} = getelementptr float, ptr %c, i64 %ci{r}_{v}",
            f"  %c{r}_{v} = load <16 x float>, ptr %cp{r}_{v}, align 4",
        ]
    back = "compute" if prefetch_per_step else "step"  # the block the loop's back edge leaves from
    entry, a, b, done = "entry", "%a", "%b", "done"  # where the step loop starts from, its operands, its exit
    lines += ["  %empty = icmp eq i64 %pairs, 0", f"  br i1 %empty, label %done, label %{'tap' if window else 'step'}"]
    if window:
        taps = tuple(
            f"  %u{r}_{v} = phi <16 x float> [ %c{r}_{v}, %entry ], [ %n{r}_{v}, %tap_done ]" for r, v in accumulators
        )
        lines += tap_loop_start(window, "%entry", taps)
        lines.append("  br label %step")
        entry, a, b, done = "tap", "%at", "%bt", "tap_done"
    lines.append("step:")
    lines.append(f"  %p = phi i64 [ 0, %{entry} ], [ %next_p, %{back} ]")
    for r, v in accumulators:
        start = f"%u{r}_{v}" if window else f"%c{r}_{v}"
        lines.append(f"  %s{r}_{v} = phi <16 x float> [ {start}, %{entry} ], [ %n{r}_{v}, %{back} ]")
    if prefetch_per_step:
        lines += _prefetch_lines(prefetch_per_step)
    lines.append("  %k = shl i64 %p, 1")
    for r in range(rows):
        lines += [
            f"  %ao{r} = mul i64 %lda, {r}",
            f"  %ai{r} = add i64 %ao{r}, %k",
            f"  %ap{r} = getelementptr i16, ptr {a}, i64 %ai{r}",
            f"  %pair{r} = load i32, ptr %ap{r}, align 2",
            f"  %one{r} = insertelement <16 x i32> poison, i32 %pair{r}, i64 0",
            f"  %all{r} = shufflevector <16 x i32> %one{r}, <16 x i32> poison, <16 x i32> zeroinitializer",
            f"  %x{r} = bitcast <16 x i32> %all{r} to <32 x bfloat>",
        ]
    for v in range(vectors):
        lines += [
            f"  %bo{v} = mul i64 %ldb, {v}",
            f"  %bk{v} = shl i64 %p, 5",
            f"  %bi{v} = add i64 %bo{v}, %bk{v}",
            f"  %bp{v} = getelementptr i16, ptr {b}, i64 %bi{v}",
            f"  %w{v} = load <32 x bfloat>, ptr %bp{v}, align 2",
        ]
    for r, v in accumulators:
        lines.append(
            f"  %n{r}_{v} = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512("
            f"<16 x float> %s{r}_{v}, <32 x bfloat> %x{r}, <32 x bfloat> %w{v})"
        )
    lines += [
        "  %next_p = add i64 %p, 1",
        "  %more = icmp ult i64 %next_p, %pairs",
        f"  br i1 %more, label %step, label %{done}",
    ]
    last = back
    if window:
        lines += tap_loop_end(window, "done")
        last = "tap_done"
    lines.append("done:")
    for r, v in accumulators:
        lines.append(f"  %f{r}_{v} = phi <16 x float> [ %c{r}_{v}, %entry ], [ %n{r}_{v}, %{last} ]")
    for r, v in accumulators:
        lines.append(f"  store <16 x float> %f{r}_{v}, ptr %cp{r}_{v}, align 4")
    lines += [
        "  ret void",
        "}",
        "declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)",
    ]
    if prefetch_per_step:
        lines.append("declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
    lines.append('attributes #0 = { alwaysinline "target-features"="+avx512f,+avx512bf16" }')
    return "\n".join(lines) + "\n"


def _prefetch_lines(per_step: int) -> list[str]:
    """A step's prefetches: lines p * per_step + j of the ``lines`` from ``next`` (those left), each into L2
    (a branch around them once all are asked for), then the step's work in the block ``compute``."""
    lines = [f"  %first = mul i64 %p, {per_step}", "  %wanted = icmp ult i64 %first, %lines"]
    lines += ["  br i1 %wanted, label %prefetch, label %compute", "prefetch:"]
    for j in range(per_step):
        lines += [
            f"  %line{j} = add i64 %first, {j}",
            f"  %lo{j} = shl i64 %line{j}, 5",  # 32 bf16 a line
            f"  %lp{j} = getelementptr i16, ptr %next, i64 %lo{j}",
            f"  call void @llvm.prefetch.p0(ptr %lp{j}, i32 0, i32 2, i32 1)",
        ]
    return [*lines, "  br label %compute", "compute:"]
