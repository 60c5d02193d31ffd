"""The design spaces of a bfloat16 GEMM or convolution (``tuner.lowering.bf16.products``) on a CPU with
AVX512_BF16: register tiles of ``rows`` x ``vectors`` x 16 fp32 accumulators, computed by the
micro-kernel of ``codegen.bf16_dot`` over the input channels (``vdpbf16ps``).

The kernel's block iterates its spatial axes (batch, image rows, the tile's rows: image columns or
tokens, the output channels last) and its reduction axes (the window, then the input channels); the
weight is packed [N/16, ..., K/2, 16, 2], so that the micro-kernel reads each 16x2 operand whole.
Each parallel task computes a block of tiles; each tile's accumulators stay in registers over the
input channels and are written out once per window position, the last time through the fused
epilogue (bias, activation, the cast of the next layer's input).

A tile's shape is fixed per design space (its intrinsic is named by it, and the search's mutations
must not change it under a stored trace), and so is whether an AMX call takes a long reduction whole
or in chunks; the search samples how tiles group into tasks.
"""

from __future__ import annotations

import math

import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.tirx import IndexMap, IterVar

from codegen import amx_dot
from codegen.bf16_dot import AMX, AVX512, LANES, PAIR, register_bf16_tile, register_zeroed_tile, tile_of, unit_of

BF16_GEMM_RULE = "tuner_bf16_gemm"
UNIT_ANNOTATION = "tensor_tuner_bf16_unit"  # on the GEMM's block: the unit its micro-kernels run on
# on a stride-1 convolution's block over image rows laid end to end: the columns of a row (amx_dot.Window)
WINDOW_ANNOTATION = "tensor_tuner_window_columns"
# with it, on a first convolution reading its padded image in place: the values between its rows (amx_dot.Window)
OVERLAP_ANNOTATION = "tensor_tuner_window_overlap"
# with it, on a strided convolution's phases laid out flat: the stride and the rows of a phase (amx_dot.Window)
STRIDE_ANNOTATION = "tensor_tuner_window_stride"
PHASE_ANNOTATION = "tensor_tuner_window_phase"
MAX_ROWS = 7
VECTOR_CHOICES = (4, 3, 2, 1)
MAX_ACCUMULATORS = 24  # of AVX-512's 32 registers; the rest hold a step's weight vectors and activation pair
MAX_SPACES = 4
# enough independent vdpbf16ps chains to hide its latency: SqueezeNet's 3x4 tiles reach 93-97% of the peak, and
# padding its 27 columns to 28 for 7x2 tiles made them slower (the slice after a padded product is a pass of its own)
SATURATING_ACCUMULATORS = 12
MIN_PARALLEL_TASKS = 64  # of a loop nest left beside the GEMM: enough to balance over the cores
MIN_PADDING_GAIN = 1.15  # what padding rows must win to pay for the copy it adds before and after the product


# AMX: accumulator blocks of 16 rows; four of them (2x2, with two activation and two weight tiles) fill
# the eight tile registers
AMX_MAX_ROWS = 2 * amx_dot.TILE_ROWS
AMX_SATURATING = 4 * amx_dot.TILE_ROWS
# pairs of the reduction per call where a product's calls take it in chunks (design spaces of their own): a 32-row
# activation chunk (16 KB) and a two-block weight chunk (16 KB) stay in L1 beside each other, where a whole
# reduction of 768 streams 96 KB per call from L2: 0-12% faster alone on BERT's products and ResNet-50's 1x1s
# (experiments/amx_reduction_chunks.py)
AMX_REDUCTION_CHUNK = 128


def tile_shapes(rows: int, channel_blocks: int, unit: str = AVX512) -> list[tuple[int, int]]:
    """The (rows, vectors) tiles of the micro-kernel on ``unit`` worth a design space, most accumulators
    first."""
    if unit == AMX:
        candidates = [(r, v) for r in range(AMX_MAX_ROWS, 0, -1) for v in (3, 2, 1) if amx_dot.fits(r, v)]
    else:
        candidates = [(r, v) for r in range(MAX_ROWS, 0, -1) for v in VECTOR_CHOICES if r * v <= MAX_ACCUMULATORS]
    shapes = [(r, v) for r, v in candidates if rows % r == 0 and channel_blocks % v == 0]
    shapes.sort(key=lambda shape: (-shape[0] * shape[1], -shape[1]))
    return shapes[:MAX_SPACES]


def space_accumulators(space: Schedule) -> int:
    """The accumulators (rows x vectors) of the register tile a design space of this rule tensorizes with; 0
    for a space of any other rule."""
    tile = tile_of(_tensorized(space))
    return tile[0] * tile[1] if tile is not None else 0


def space_unit(space: Schedule) -> str | None:
    """The unit (``AVX512``, ``AMX``) a design space of this rule computes on; None for a space of any other rule."""
    return unit_of(_tensorized(space))


def _tensorized(space: Schedule) -> str:
    """The name of the first of our bf16 intrinsics ``space`` tensorizes with; "" where it takes none."""
    names = (str(inst.attrs[0]) for inst in space.trace.insts if inst.kind.name == "Tensorize")
    return next((name for name in names if tile_of(name) is not None), "")


def tile_efficiency(rows: int, channel_blocks: int, unit: str) -> float:
    saturating = AMX_SATURATING if unit == AMX else SATURATING_ACCUMULATORS
    shapes = tile_shapes(rows, channel_blocks, unit)
    return min(max((r * v for r, v in shapes), default=0), saturating) / saturating


def padded_rows(rows: int, channel_blocks: int, unit: str = AVX512) -> int:
    """How many rows a product of ``rows`` rows is best computed over: ``rows``, or a few more (zero rows
    whose outputs are dropped) where no divisor of ``rows`` makes a tile of enough accumulators (197
    tokens and 13 image columns allow only one-row tiles: a third of the peak at best)."""

    def worth(padded: int) -> float:
        return tile_efficiency(padded, channel_blocks, unit) * rows / padded

    most = AMX_MAX_ROWS if unit == AMX else MAX_ROWS
    best = max(range(rows, rows + most + 1), key=lambda padded: (worth(padded), -padded))
    return best if worth(best) >= MIN_PADDING_GAIN * worth(rows) else rows


def _shape(sch: Schedule, block: SBlockRV) -> list[int]:
    return [int(d) for d in _written(sch, block).shape]


def _size(sch: Schedule, block: SBlockRV) -> int:
    return math.prod(_shape(sch, block))


def _inline_epilogue(sch: Schedule, writeback: SBlockRV) -> bool:
    """Merge the element-wise consumers of the GEMM's output into the block that writes it back; whether
    any was. A consumer of another shape (the slice that drops padded outputs) stays a block: TVM would
    inline it with the indices it reads, and the write-back loop, sized by the GEMM, would write past its end."""
    merged = False
    while True:
        consumers = sch.get_consumers(writeback)
        if len(consumers) != 1 or _shape(sch, consumers[0]) != _shape(sch, writeback):
            return merged
        _inline_other_producers(sch, consumers[0], writeback)
        try:
            sch.reverse_compute_inline(consumers[0])
        except Exception:  # noqa: BLE001 - TVM refuses a consumer that is not element-wise: it stays a block
            return merged
        merged = True


def _merge_after_slices(sch: Schedule, writeback: SBlockRV) -> None:
    """Merge what follows the write-back's slices into them: a copy that drops padded rows into the slice
    that reads it, and the element-wise work after a slice (a bias, an activation) into the slice.
    Each was a parallel pass of its own over the whole output: SqueezeNet's classifier convolution (169
    positions computed over 176, 1000 outputs over 1008) made four, the product itself a fraction of its time."""
    # each merge removes blocks: the consumers are looked up afresh after every one
    while any(_merge_once(sch, block) for block in _around(sch, writeback, sch.get_consumers)):
        pass


def _merge_once(sch: Schedule, block: SBlockRV) -> bool:
    """Merge ``block`` into its reader if it is a copy, else its element-wise readers into it; whether it did."""
    if _is_copy(sch, block) and sch.get_consumers(block):
        try:
            sch.compute_inline(block)
            return True
        except Exception:  # noqa: BLE001 - TVM refuses it (a reader that is not element-wise): it stays
            pass
    return _inline_epilogue(sch, block)


def _is_copy(sch: Schedule, block: SBlockRV) -> bool:
    """Whether ``block`` stores what it reads, unchanged (a reshape, a slice)."""
    body = sch.get(block).body
    return isinstance(body, tvm.tirx.BufferStore) and isinstance(body.value, tvm.ir.expr.TensorLoad)


def _inline_other_producers(sch: Schedule, consumer: SBlockRV, writeback: SBlockRV) -> None:
    """Merge the blocks other than ``writeback`` that ``consumer`` reads (a residual's cast back to fp32)
    into it: TVM merges a consumer into its producer only when it reads that producer alone, and a
    residual sum left as a block of its own made the sum, the activation after it and the cast of the
    next layer's input three more passes over the whole fp32 output (ResNet-50's 56x56x256 blocks:
    4.8% of the model's time in one kernel, the product itself a tenth of it)."""
    for producer in sch.get_producers(consumer):
        # only blocks of the kernel's inputs alone: one that reads the product's result (the write-back
        # itself, GELU's pieces) must stay, or the write-back is gone before the product is tiled
        if sch.get(producer).same_as(sch.get(writeback)) or sch.get_producers(producer):
            continue
        try:
            sch.compute_inline(producer)
        except Exception:  # noqa: BLE001 - not element-wise (TVM refuses it): the consumer stays a block
            continue


def _inline_prologue(sch: Schedule, gemm: SBlockRV) -> None:
    """Merge the blocks before the ones the GEMM reads (a layout change, a cast: layout fusion puts them
    in the kernel) into those, so that one bf16 buffer is left between them and the GEMM. With two,
    TVM's StorageRewrite lets the bf16 one reuse the fp32 one's memory, and LowerAccessPtr rejects the
    micro-kernel's bf16 pointer into it (20 of DistilBERT's candidates did not build)."""
    direct = sch.get_producers(gemm)
    for producer in _around(sch, gemm, sch.get_producers):
        if any(sch.get(producer).same_as(sch.get(d)) for d in direct):
            continue
        try:
            sch.compute_inline(producer)
        except Exception:  # noqa: BLE001 - TVM refuses a producer that is not injective: it stays a block
            continue


def _parallel_loop_nest(sch: Schedule, block: SBlockRV) -> None:
    """A block left as a loop nest of its own (a pad before the GEMM, a slice after), run in parallel
    over its outer axes and vectorised along the channels, and kept from MetaSchedule's generic rules
    (which would move it into the GEMM's loops)."""
    *outer, inner = sch.get_loops(block)
    while outer and int(sch.get(inner).extent) < LANES:  # a packed operand's 16 x 2: one vector
        inner = sch.fuse(outer.pop(), inner)
    if outer:
        count = min(2, len(outer))
        while count < len(outer) and _extent(sch, outer[:count]) < MIN_PARALLEL_TASKS:  # attention's 6 heads
            count += 1
        sch.parallel(sch.fuse(*outer[:count]))
    sch.vectorize(sch.split(inner, [None, LANES])[1])
    sch.annotate(block, "schedule_rule", "None")


def _extent(sch: Schedule, loops: list[LoopRV]) -> int:
    return math.prod(int(sch.get(loop).extent) for loop in loops)


def _around(sch: Schedule, block: SBlockRV, neighbours) -> list[SBlockRV]:
    """The blocks ``neighbours`` (get_producers or get_consumers) reaches from ``block``, transitively."""
    found, frontier = [], [block]
    while frontier:
        for other in neighbours(frontier.pop()):
            if not any(sch.get(other).same_as(sch.get(seen)) for seen in found):
                found.append(other)
                frontier.append(other)
    return found


def _spatial_and_reduction(sch: Schedule, gemm: SBlockRV) -> tuple[list[LoopRV], list[LoopRV]]:
    """The GEMM's loops over its spatial axes and over its reduction axes (each loop binds one axis)."""
    loops = sch.get_loops(gemm)
    kinds = [int(iter_var.iter_type) for iter_var in sch.get(gemm).iter_vars]
    spatial = [loop for loop, kind in zip(loops, kinds, strict=True) if kind == IterVar.DataPar]
    return spatial, [loop for loop, kind in zip(loops, kinds, strict=True) if kind != IterVar.DataPar]


def _tile(
    sch: Schedule,
    gemm: SBlockRV,
    tile_rows_count: int,
    vector_count: int,
    unit: str = AVX512,
    zero_tiles: bool = True,
    chunks: bool = False,
) -> None:
    """Tile ``gemm`` for the micro-kernel of ``tile_rows_count`` x ``vector_count`` on ``unit``; ``zero_tiles``
    (AMX): a call that is its tile's whole reduction starts from zero tiles (off: loads C's zeros, to compare);
    ``chunks``: calls take the reduction in ``AMX_REDUCTION_CHUNK``s, where ``takes_chunks``."""
    chunks = chunks and takes_chunks(sch, gemm, unit)
    _inline_prologue(sch, gemm)
    for producer in _around(sch, gemm, sch.get_producers):
        _parallel_loop_nest(sch, producer)
    sch.cache_write(gemm, 0, "global")
    writeback = sch.get_consumers(gemm)[0]
    _inline_epilogue(sch, writeback)
    kept_outputs = sch.get_consumers(writeback)  # of another shape: the outputs kept, sliced or gathered
    for kept in kept_outputs:
        _inline_epilogue(sch, kept)
        # a reshape (a flat GEMM's rows, none dropped), the write-back's only reader: TVM would merge one
        # of several readers too, and leave the others reading a buffer nothing writes any more
        if len(kept_outputs) == 1 and _size(sch, kept) == _size(sch, writeback):
            try:
                sch.reverse_compute_inline(kept)
            except Exception:  # noqa: BLE001 - TVM cannot map its indices back: it stays a block
                pass
    _merge_after_slices(sch, writeback)
    _index_reader_by_product(sch, writeback)
    for consumer in _around(sch, writeback, sch.get_consumers):
        _parallel_loop_nest(sch, consumer)

    spatial, reduction = _spatial_and_reduction(sch, gemm)
    *outer, rows, channels = spatial
    *window, inputs = reduction
    pairs_extent = int(sch.get(inputs).extent) // PAIR

    channel_tiles, vectors, lanes = sch.split(channels, [None, vector_count, LANES], preserve_unit_iters=False)
    row_groups, tile_rows = sch.split(rows, [None, tile_rows_count], preserve_unit_iters=False)
    row_tiles, row_blocks = sch.split(row_groups, sch.sample_perfect_tile(row_groups, n=2))
    pairs, pair = sch.split(inputs, [None, PAIR], preserve_unit_iters=False)
    chunk_loops = []
    if chunks:
        chunk, pairs = sch.split(pairs, [None, AMX_REDUCTION_CHUNK], preserve_unit_iters=False)
        chunk_loops, pairs_extent = [chunk], AMX_REDUCTION_CHUNK
    tasks = [*outer, row_tiles, channel_tiles]
    sch.reorder(*tasks, *chunk_loops, row_blocks, *window, tile_rows, vectors, pairs, lanes, pair)
    parallel = sch.fuse(*tasks)
    sch.parallel(parallel)

    # chunked, a task's accumulators go through memory between its chunks: written back once, at its end
    at = parallel if chunk_loops else row_blocks
    sch.reverse_compute_at(writeback, at, preserve_unit_loops=True)
    sch.vectorize(sch.split(sch.get_loops(writeback)[-1], [None, LANES])[1])
    _slice_per_tile(sch, writeback, at)
    init = sch.decompose_reduction(gemm, chunk_loops[0] if chunk_loops else window[0] if window else tile_rows)
    taps = _window(sch, gemm, window, unit, tile_rows_count, pairs_extent)
    # a call that is its tile's whole reduction (no window loop outside it) starts from zero tiles on AMX
    whole = zero_tiles and not chunk_loops and (taps is not None or not window)
    _initialise(sch, init, tile_rows_count, vector_count, zeroed=whole and unit == AMX)
    name = register_bf16_tile(tile_rows_count, vector_count, pairs_extent, unit, taps, zero=whole)
    inner = window[0] if taps else tile_rows if tile_rows_count > 1 else vectors
    sch.tensorize(sch.blockize(inner, preserve_unit_iters=False), name)
    # keeps MetaSchedule's generic rules (parallelising, vectorising, unrolling) off the loops above
    sch.annotate(sch.get_sblock("root"), "schedule_rule", "None")


def _initialise(sch: Schedule, init: SBlockRV, rows: int, vectors: int, zeroed: bool) -> None:
    """The tile's initialisation vectorised; where its call starts from zero tiles (``zeroed``), none at all
    (``register_zeroed_tile``): its stores were never read."""
    loops = sch.get_loops(init)
    extents = [int(sch.get(loop).extent) for loop in loops]
    if zeroed and rows > 1 and vectors == 1 and extents[-2:] == [rows, LANES]:
        loops = [*loops[:-1], *sch.split(loops[-1], [1, LANES])]  # the intrinsic's one-vector loop
        extents = [*extents[:-1], 1, LANES]
    if zeroed and rows > 1 and extents[-3:] == [rows, vectors, LANES]:
        sch.tensorize(sch.blockize(loops[-3], preserve_unit_iters=False), register_zeroed_tile(rows, vectors))
        return
    sch.vectorize(sch.split(loops[-1], [None, LANES])[1])


def _slice_per_tile(sch: Schedule, writeback: SBlockRV, at: LoopRV) -> None:
    """Compute the write-back's one reader (a slice dropping padded rows or outputs, a gather of flat rows
    back to the image indexed by them) tile by tile beside it, the write-back's copy merged into it. As a
    pass of its own it read the whole fp32 product back from memory: SqueezeNet's first convolution (111
    columns computed over 112) took 474 us this way against 259, its 1x1 convolutions over flat rows
    0.75-0.85 of their time (AMX, Emerald Rapids). Only a reader at its own positions: TVM places a reader
    through a division (y * W + x) over the wrong part of the tile, and its results are wrong."""
    readers = sch.get_consumers(writeback)
    if len(readers) != 1 or not _reads_in_place(sch, readers[0], _written(sch, writeback)):
        return
    try:
        sch.reverse_compute_at(readers[0], at, preserve_unit_loops=True)
    except Exception:  # noqa: BLE001 - TVM refuses to place it: the slice stays a pass of its own
        return
    sch.vectorize(sch.split(sch.get_loops(readers[0])[-1], [None, LANES])[1])
    sch.compute_inline(writeback)


def _index_reader_by_product(sch: Schedule, writeback: SBlockRV) -> None:
    """Iterate the write-back's one reader over the product's rows where it reads them one to one through
    a flattening (a 1x1 convolution over a flat GEMM: image position (y, x) at row y * W + x), so that it
    reads the product at its own positions and can be computed tile by tile (``_slice_per_tile``)."""
    readers = sch.get_consumers(writeback)
    if len(readers) != 1:
        return
    product = _written(sch, writeback)
    positions = _read_positions(sch, readers[0], product)
    if positions is None or _reads_in_place(sch, readers[0], product):
        return
    own = [iter_var.var for iter_var in sch.get(readers[0]).iter_vars]
    try:
        sch.transform_block_layout(readers[0], IndexMap(own, positions, None))
    except Exception:  # noqa: BLE001 - not one to one (a convolution's columns between image rows): it stays
        pass


def _written(sch: Schedule, block: SBlockRV) -> tvm.tirx.Buffer:
    return sch.get(block).writes[0].source


def _read_positions(sch: Schedule, reader: SBlockRV, buffer: tvm.tirx.Buffer) -> list[tvm.ir.PrimExpr] | None:
    """Where ``reader`` reads ``buffer``, one value per iteration; None where it reads more or from several places."""
    regions = [region for region in sch.get(reader).reads if region.source.same_as(buffer)]
    if len(regions) != 1 or not all(is_one(r.extent) for r in regions[0].region):
        return None
    return [r.min for r in regions[0].region]


def _reads_in_place(sch: Schedule, reader: SBlockRV, buffer: tvm.tirx.Buffer) -> bool:
    """Whether ``reader`` reads ``buffer`` only at its own position (its iteration variables, in order)."""
    positions = _read_positions(sch, reader, buffer)
    own = [iter_var.var for iter_var in sch.get(reader).iter_vars]
    if positions is None or len(positions) != len(own):
        return False
    return all(position.same_as(var) for position, var in zip(positions, own, strict=True))


def is_one(extent: tvm.ir.PrimExpr) -> bool:
    """Whether an extent is the constant 1."""
    return isinstance(extent, tvm.tirx.IntImm) and int(extent) == 1


def takes_chunks(sch: Schedule, gemm: SBlockRV, unit: str) -> bool:
    """Whether ``gemm``'s AMX calls can take its reduction in chunks (``AMX_REDUCTION_CHUNK``): one tap
    (a product, a 1x1 convolution), a reduction of more than one chunk and whole chunks."""
    *window, inputs = _spatial_and_reduction(sch, gemm)[1]
    pairs = int(sch.get(inputs).extent) // PAIR
    whole_chunks = pairs > AMX_REDUCTION_CHUNK and pairs % AMX_REDUCTION_CHUNK == 0
    return unit == AMX and _extent(sch, window) == 1 and whole_chunks


def _window(
    sch: Schedule, gemm: SBlockRV, window: list[LoopRV], unit: str, rows: int, pairs: int
) -> amx_dot.Window | None:
    """The window a micro-kernel call sums over as well (``amx_dot.Window``): on AMX a stride-1
    convolution's over image rows laid end to end (``WINDOW_ANNOTATION``: their columns) or a grouped one's
    over its phases laid out flat (with ``STRIDE_ANNOTATION`` and ``PHASE_ANNOTATION``), whose
    reduction is whole steps; on either unit a first convolution's over its image read in place
    (``OVERLAP_ANNOTATION``); None for a product whose calls each take one tap."""
    columns = sch.get(gemm).annotations.get(WINDOW_ANNOTATION)
    overlap = int(sch.get(gemm).annotations.get(OVERLAP_ANNOTATION, 0))  # a window one run wide: its rows alone
    if (
        columns is None
        or len(window) != (1 if overlap else 2)
        or rows == 1
        or (unit == AMX and pairs % amx_dot.TILE_PAIRS)
        or (unit != AMX and not overlap)
    ):
        return None
    height, width = (int(sch.get(loop).extent) for loop in window) if not overlap else (sch.get(window[0]).extent, 1)
    annotations = sch.get(gemm).annotations
    stride, phase = int(annotations.get(STRIDE_ANNOTATION, 1)), int(annotations.get(PHASE_ANNOTATION, 0))
    taps = amx_dot.Window(int(height), width, int(columns), overlap, stride, phase)
    return taps if height * width > 1 else None


def schedule_bf16_gemm(sch: Schedule, gemm: SBlockRV) -> list[Schedule]:
    *_, rows_loop, channels_loop = _spatial_and_reduction(sch, gemm)[0]
    rows_extent, channels_extent = (int(sch.get(loop).extent) for loop in (rows_loop, channels_loop))
    unit = str(sch.get(gemm).annotations.get(UNIT_ANNOTATION, AVX512))
    spaces = []
    chunk_choices = (False, True) if takes_chunks(sch, gemm, unit) else (False,)
    for rows, vectors in tile_shapes(rows_extent, channels_extent // LANES, unit):
        for chunks in chunk_choices:
            space = sch.copy()
            _tile(space, gemm, rows, vectors, unit, chunks=chunks)
            spaces.append(space)
    return spaces
