"""The bf16 GEMM micro-kernel on Intel's AMX (Sapphire Rapids and later): one call computes a tile of
up to 32 rows x up to 48 outputs over the whole reduction with ``tdpbf16ps``, each instruction a
16x16 fp32 block's 16x32 by 32x16 bf16 product (8,192 multiply-adds, 16 times a ``vdpbf16ps``).

It has the same operands as the AVX512_BF16 micro-kernel of ``codegen.bf16_dot``: the activation's
rows (bf16, ``lda`` apart), the weight packed [N/16, K/2, 16, 2] (a channel block's 16 pairs of
the reduction are one 16-row by 64-byte tile of AMX's pair-interleaved layout, as they are), the
accumulators as fp32 rows (``ldc`` apart). Eight tile registers: the accumulators' blocks, one
activation tile per 16 rows and one weight tile per channel block. A reduction that is not a
multiple of 32 ends with a step over tiles configured to the rest (the lowering avoids it on AMX: zero
channels up to whole steps). A stride-1 convolution's call can sum over its whole window too
(``Window``). A call loads its tile configuration only when the thread holds another.

Linux lets a process use AMX's tile data only once it asks (``arch_prctl(ARCH_REQ_XCOMP_PERM)``),
so each micro-kernel asks on its first call in a process: a built model runs wherever it is
loaded, by whatever loads it.
"""

from __future__ import annotations

from dataclasses import dataclass

TILE_ROWS = 16  # of an activation tile and an accumulator block
TILE_PAIRS = 16  # pairs of the reduction per step (64 bytes of an activation row)
STEP_VALUES = 2 * TILE_PAIRS  # bf16 values of the reduction per step
TILE_REGISTERS = 8
_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def row_tiles(rows: int) -> list[int]:
    """The rows of each activation tile of a micro-kernel tile of ``rows`` rows."""
    return [min(TILE_ROWS, rows - start) for start in range(0, rows, TILE_ROWS)]


def fits(rows: int, vectors: int) -> bool:
    """Whether a tile of ``rows`` x ``vectors`` channel blocks fits AMX's eight tile registers."""
    tiles = len(row_tiles(rows))
    return rows > 0 and vectors > 0 and tiles * vectors + tiles + vectors <= TILE_REGISTERS


def _config(row_counts: list[int], vectors: int, pairs: int) -> str:
    """LLVM's constant of a 64-byte tile configuration (palette 1): accumulator blocks first, then the
    activation tiles, then the weight tiles, over ``pairs`` pairs of the reduction."""
    colsb, rows = [0] * 16, [0] * 16
    tile = 0
    for count in row_counts:
        for _ in range(vectors):
            colsb[tile], rows[tile] = 4 * 16, count
            tile += 1
    for count in row_counts:
        colsb[tile], rows[tile] = 4 * pairs, count
        tile += 1
    for _ in range(vectors):
        colsb[tile], rows[tile] = 4 * 16, pairs
        tile += 1
    data = [1] + [0] * 15 + [byte for width in colsb for byte in width.to_bytes(2, "little")] + rows
    return "[64 x i8] [" + ", ".join(f"i8 {byte}" for byte in data) + "]"


def _tile_load(tag: str, tile: int, base: str, leading: str, rows: int, column: str, stride: str) -> list[str]:
    """Load tile register ``tile`` from bf16 ``base`` + ``rows`` x ``leading`` + ``column`` elements."""
    return [
        f"  %{tag}o = mul i64 {leading}, {rows}",
        f"  %{tag}i = add i64 %{tag}o, {column}",
        f"  %{tag}p = getelementptr i16, ptr {base}, i64 %{tag}i",
        f"  call void @llvm.x86.tileloadd64(i8 {tile}, ptr %{tag}p, i64 {stride})",
    ]


def _configure(config: str, tag: str) -> list[str]:
    """Load the tile configuration ``config`` unless it is the one loaded: ``ldtilecfg`` costs 70-150 ns
    (measured on a Sapphire Rapids class VM), a third of a 32x32 tile's call over 64 channels, and the
    check (``sttilecfg`` and a compare) next to nothing. Checked rather than assumed: other code on the
    thread (oneDNN in the same process, another tile shape of ours) loads configurations of its own."""
    return [
        "  call void @llvm.x86.sttilecfg(ptr %loaded)",
        f"  %have{tag} = load i512, ptr %loaded, align 64",
        f"  %want{tag} = load i512, ptr {config}, align 1",
        f"  %same{tag} = icmp eq i512 %have{tag}, %want{tag}",
        f"  br i1 %same{tag}, label %configured{tag}, label %configure{tag}",
        f"configure{tag}:",
        f"  call void @llvm.x86.ldtilecfg(ptr {config})",
        f"  br label %configured{tag}",
        f"configured{tag}:",
    ]


@dataclass(frozen=True)
class Window:
    """A convolution's window over an activation whose image rows are laid end to end
    (``tuner.lowering.bf16.flat``): tap (y, x) reads the rows ``y * columns + x`` further on, and the
    weight ``y * B's stride over y + x * its stride over x`` further on.

    ``overlap``: the activation's rows are ``overlap`` values apart in one flat buffer, fewer than a
    step reads (a first convolution's image read in place, ``bf16_flat.bf16_conv2d_image_windows``:
    each row's 32 values run over the next rows' pixels); 0 for rows of their own.

    ``stride`` > 1: a strided convolution's activation split into phases of ``phase`` rows each (column
    ``x * stride + r`` of an image row at row ``r * phase + x`` of it, ``kernels._phases``): tap (y, x) reads
    the rows ``y * columns + (x % stride) * phase + x // stride`` further on."""

    height: int
    width: int
    columns: int
    overlap: int = 0
    stride: int = 1
    phase: int = 0

    @property
    def taps(self) -> int:
        return self.height * self.width


def tap_loop_start(window: Window, entry: str, phis: tuple[str, ...] = ()) -> list[str]:
    """The loop over a window's taps, opening (entered from block ``entry``, ``phis`` more at its head):
    %at, %bt the tap's activation rows and weight."""
    return [
        "tap:",
        f"  %t = phi i64 [ 0, {entry} ], [ %tnext, %tap_done ]",
        *phis,
        f"  %ty = udiv i64 %t, {window.width}",
        f"  %tx = urem i64 %t, {window.width}",
        f"  %trow = mul i64 %ty, {window.columns}",
        *(
            ["  %tr = add i64 %trow, %tx"]
            if window.stride == 1
            else [
                f"  %txp = urem i64 %tx, {window.stride}",
                f"  %txq = udiv i64 %tx, {window.stride}",
                f"  %txr = mul i64 %txp, {window.phase}",
                "  %txo = add i64 %txr, %txq",
                "  %tr = add i64 %trow, %txo",
            ]
        ),
        "  %toff = mul i64 %tr, %lda",
        "  %at = getelementptr i16, ptr %a, i64 %toff",
        "  %tby = mul i64 %ty, %sbh",
        "  %tbx = mul i64 %tx, %sbw",
        "  %tb = add i64 %tby, %tbx",
        "  %bt = getelementptr i16, ptr %b, i64 %tb",
    ]


def tap_loop_end(window: Window, done: str) -> list[str]:
    return [
        "tap_done:",
        "  %tnext = add i64 %t, 1",
        f"  %tmore = icmp ult i64 %tnext, {window.taps}",
        f"  br i1 %tmore, label %tap, label %{done}",
    ]


def amx_micro_kernel_ir(
    name: str, rows: int, vectors: int, pairs: int, window: Window | None = None, zero: bool = False
) -> str:
    """LLVM IR of ``name``(C, ldc, A, lda, B, ldb, pairs), as ``codegen.bf16_dot``'s micro-kernels:
    C[r, 16v + l] += sum_p A[r, 2p:2p+2] . B[v, p, l, :], for a reduction of ``pairs`` pairs.

    With a ``window`` (and two more arguments, the weight's strides over the window's rows and
    columns), one call sums over every tap of the window as well: the accumulators are loaded and
    stored once per tile rather than once per tap (a 3x3 window over 64 channels loaded and stored them
    as often as it loaded its operands). Whole steps only: a rest would switch configurations per tap.

    ``zero``: the call is its tile's whole reduction, and C holds zeros (the schedule's initialisation):
    its accumulators start as zero tiles rather than loaded from C, which the initialisation's vector
    stores have only just written (AMX's tile loads wait for them to reach the cache)."""
    if not fits(rows, vectors):
        raise ValueError(f"an AMX tile of {rows} rows x {vectors} channel blocks needs more than 8 tile registers")
    counts = row_tiles(rows)
    steps, rest = divmod(pairs, TILE_PAIRS)
    if window is not None and (rest or not steps):
        raise ValueError(f"a window's micro-kernel sums whole steps of {TILE_PAIRS} pairs, not {pairs}")
    strides = ", i64 %sbh, i64 %sbw" if window is not None else ""
    blocks = [(i, v, i * vectors + v) for i in range(len(counts)) for v in range(vectors)]
    a_tile = {i: len(blocks) + i for i in range(len(counts))}
    b_tile = {v: len(blocks) + len(counts) + v for v in range(vectors)}
    lines = [
        f"@{name}_ready = internal global i8 0",
        f"@{name}_steps = private constant {_config(counts, vectors, TILE_PAIRS)}",
        f"@{name}_rest = private constant {_config(counts, vectors, max(rest, 1))}",
        f"define void @{name}(ptr %c, i64 %ldc, ptr %a, i64 %lda, ptr %b, i64 %ldb, i64 %pairs{strides}) #0 {{",
        "entry:",
        "  %loaded = alloca [64 x i8], align 64",
        f"  %ready = load i8, ptr @{name}_ready",
        "  %asked = icmp ne i8 %ready, 0",
        "  br i1 %asked, label %start, label %ask",
        "ask:",
        '  %granted = call i64 asm sideeffect "syscall", "={rax},{rax},{rdi},{rsi},~{rcx},~{r11},~{memory}"'
        f"(i64 {_SYS_ARCH_PRCTL}, i64 {_ARCH_REQ_XCOMP_PERM}, i64 {_XFEATURE_XTILEDATA})",
        f"  store i8 1, ptr @{name}_ready",
        "  br label %start",
        "start:",
        "  %cs = shl i64 %ldc, 2",
        "  %as = shl i64 %lda, 1",
    ]

    def c_blocks(load: bool, tag: str) -> list[str]:
        out = []
        for i, v, tile in blocks:
            pointer = f"%cp{tag}{tile}"
            call = (
                f"tileloadd64(i8 {tile}, ptr {pointer}, i64 %cs)"
                if load
                else f"tilestored64(i8 {tile}, ptr {pointer}, i64 %cs)"
            )
            out += [
                f"  %co{tag}{tile} = mul i64 %ldc, {i * TILE_ROWS}",
                f"  %ci{tag}{tile} = add i64 %co{tag}{tile}, {v * 16}",
                f"  {pointer} = getelementptr float, ptr %c, i64 %ci{tag}{tile}",
                f"  call void @llvm.x86.{call}",
            ]
        return out

    def step(label: str, pair_offset: str, a: str = "%a", b: str = "%b") -> list[str]:
        # the step's first column of the activation (2 per pair) and of a channel block's weight (32)
        out = [f"  %ka{label} = shl i64 {pair_offset}, 1", f"  %kb{label} = shl i64 {pair_offset}, 5"]
        for i, tile in a_tile.items():
            out += _tile_load(f"a{label}{i}", tile, a, "%lda", i * TILE_ROWS, f"%ka{label}", "%as")
        for v, tile in b_tile.items():
            out += _tile_load(f"b{label}{v}", tile, b, "%ldb", v, f"%kb{label}", "64")
        out += [f"  call void @llvm.x86.tdpbf16ps(i8 {t}, i8 {a_tile[i]}, i8 {b_tile[v]})" for i, v, t in blocks]
        return out

    def start(tag: str) -> list[str]:
        return [f"  call void @llvm.x86.tilezero(i8 {tile})" for *_, tile in blocks] if zero else c_blocks(True, tag)

    if steps:
        lines += [*_configure(f"@{name}_steps", "s"), *start("l")]
        a, b, entry, done = "%a", "%b", "%configureds", "steps_done"
        if window is not None:
            lines += ["  br label %tap", *tap_loop_start(window, "%configureds")]
            a, b, entry, done = "%at", "%bt", "%tap", "tap_done"
        lines += ["  br label %step", "step:", f"  %s = phi i64 [ 0, {entry} ], [ %next, %step ]"]
        lines += ["  %p = shl i64 %s, 4", *step("s", "%p", a, b)]
        lines += [
            "  %next = add i64 %s, 1",
            f"  %more = icmp ult i64 %next, {steps}",
            f"  br i1 %more, label %step, label %{done}",
        ]
        if window is not None:
            lines += tap_loop_end(window, "steps_done")
        lines += ["steps_done:"]
        if rest:  # loading another configuration clears the tiles: the accumulators go through memory
            lines += c_blocks(False, "m")
    if rest:
        lines += [*_configure(f"@{name}_rest", "r"), *(c_blocks(True, "r") if steps else start("r"))]
        lines += step("r", f"{steps * TILE_PAIRS}")
    lines += c_blocks(False, "s")
    lines += [
        "  ret void",
        "}",
        "declare void @llvm.x86.ldtilecfg(ptr)",
        "declare void @llvm.x86.sttilecfg(ptr)",
        "declare void @llvm.x86.tileloadd64(i8 immarg, ptr, i64)",
        "declare void @llvm.x86.tilestored64(i8 immarg, ptr, i64)",
        "declare void @llvm.x86.tdpbf16ps(i8 immarg, i8 immarg, i8 immarg)",
        "declare void @llvm.x86.tilezero(i8 immarg)",
        'attributes #0 = { alwaysinline "target-features"="+amx-tile,+amx-bf16" }',
    ]
    return "\n".join(lines) + "\n"
