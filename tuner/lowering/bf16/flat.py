"""bf16 convolutions as one GEMM whose rows run across the image's rows.

``bf16_conv2d_flat``, for AMX's tiles of 16 rows: a 7x7 image's convolution has tiles of 7 rows
along one image row, and of 32 along its 63 (7 x 9 padded) positions.

The activation, padded, is laid out per phase of the stride ([N, s, s, Y*X + extra, C'], where
position f of phase (py, px) holds the padded image's pixel (Y*s + py, X*s + px), Y = f // X,
X = f % X), so that output position q = y*X + x of window (ry, rx) reads position
q + (ry // s) * X + rx // s of phase (ry % s, rx % s): consecutive outputs read consecutive
positions, across image rows too. Each image row computes X - out_w outputs past its end
(the padding's), dropped when the result is gathered back to [N, OH, OW, O]: 2 of 9 on a 7x7
image with a 3x3 window, none for a 1x1 convolution.

``bf16_conv2d_image_windows``, for a network's first convolution: each output position's window rows
read in place from the padded image, an activation tile's rows overlapping (ResNet's 7x7 window at
stride 2 over 3 channels: rows 6 values apart, each reading the 32 from there on AMX, the 22 on
``vdpbf16ps``), no patches.

``bf16_conv2d_patches``, for a convolution over a few channels that does not read its image in place
(an activation's rather than the model's input; a window row longer than an AMX step; 3 channels: a
micro-kernel's call over its 4 packed channels does little more than set up and store its
accumulators): the window's pixels of each output position copied into one row (im2col), one window
row's KW*C pixels' channels (contiguous in NHWC) a micro-kernel call's reduction.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import te

from codegen.amx_dot import STEP_VALUES
from codegen.bf16_dot import AMX, LANES, PAIR
from tuner.spaces.bf16_product import gemm_attrs
from tuner.spaces.bf16_rule import OVERLAP_ANNOTATION, WINDOW_ANNOTATION, padded_rows, tile_efficiency
from tuner.spaces.copy_rule import BF16_COPY_RULE, PADDED_IMAGE

from .kernels import BF16, F32, bf16_dense, conv2d_flops, out_extent, pack_conv_weight, pack_dense_weight

MIN_GAIN = 1.1  # what the flat form must win over tiles along one image row to pay for its gather


def _positions(size: int, before: int, after: int, stride: int) -> int:
    return -(-(size + before + after) // stride)


def flat_rows(
    image: tuple[int, int],
    kernel: tuple[int, int],
    stride: int,
    padding: tuple[int, int, int, int],
    blocks: int,
    unit: str,
) -> int | None:
    """The rows of the flat GEMM for this convolution where it beats tiles along image rows, else None."""
    (height, width), (kernel_h, kernel_w) = image, kernel
    top, left, bottom, right = padding
    out_h, out_w = out_extent(height, top, bottom, kernel_h, stride), out_extent(width, left, right, kernel_w, stride)
    columns = _positions(width, left, right, stride)
    by_row = padded_rows(out_w, blocks, unit)
    row_worth = tile_efficiency(by_row, blocks, unit) * out_w / by_row
    flat = padded_rows(out_h * columns, blocks, unit)
    flat_worth = tile_efficiency(flat, blocks, unit) * out_h * out_w / flat
    return flat if flat_worth >= MIN_GAIN * row_worth else None


def bf16_conv2d_flat(
    data: te.Tensor,
    packed: te.Tensor,
    stride: int,
    padding: tuple[int, int, int, int],
    rows: int,
    outputs: int,
    unit: str,
    image: tuple[int, int] | None = None,
) -> te.Tensor:
    """NHWC data (bf16) convolved with the packed HWIO weight as a GEMM over ``rows`` flat positions
    (``flat_rows``): NHWC fp32 with ``outputs`` channels. ``image``: the (H, W) of data given as the
    GEMM's operand itself, [N, 1, 1, H*W, C] (``has_flat_view``): no copy to pad and lay out."""
    if image is None:
        batch, height, width, channels = (int(d) for d in data.shape)
    else:
        (batch, *_, channels), (height, width) = (int(d) for d in data.shape), image
    kernel_h, kernel_w = int(packed.shape[0]), int(packed.shape[1])
    packed_channels = int(packed.shape[3]) * PAIR
    top, left, bottom, right = padding
    out_h, out_w = out_extent(height, top, bottom, kernel_h, stride), out_extent(width, left, right, kernel_w, stride)
    columns = _positions(width, left, right, stride)
    positions = rows + (kernel_h - 1) // stride * columns + (kernel_w - 1) // stride

    def pixel(n, py, px, f, c):
        y, x = (f // columns) * stride + py - top, (f % columns) * stride + px - left
        inside = tvm.tirx.all(y >= 0, y < height, x >= 0, x < width, c < channels)
        return tvm.tirx.if_then_else(inside, data[n, y, x, c], tvm.tirx.const(0, BF16))

    phases = data if image else te.compute((batch, stride, stride, positions, packed_channels), pixel, name="bf16_pad")
    ry = te.reduce_axis((0, kernel_h), "ry")
    rx = te.reduce_axis((0, kernel_w), "rx")
    rc = te.reduce_axis((0, packed_channels), "rc")
    flops = conv2d_flops(batch, out_h, out_w, outputs, (kernel_h, kernel_w), channels)
    gemm = te.compute(
        (batch, rows, int(packed.shape[2]) * LANES),
        lambda n, q, o: te.sum(
            phases[n, ry % stride, rx % stride, q + ry // stride * columns + rx // stride, rc].astype(F32)
            * packed[ry, rx, o // LANES, rc // PAIR, o % LANES, rc % PAIR].astype(F32),
            axis=[ry, rx, rc],
        ),
        name="bf16_conv2d",
        # a stride-1 window reads rows a fixed distance apart per tap: one micro-kernel call takes them all
        attrs={**gemm_attrs(flops, unit), **({WINDOW_ANNOTATION: columns} if stride == 1 else {})},
    )
    return te.compute((batch, out_h, out_w, outputs), lambda n, y, x, o: gemm[n, y * columns + x, o], name="bf16_rows")


def has_flat_view(
    image: tuple[int, int],
    kernel: tuple[int, int],
    stride: int,
    padding: tuple[int, ...],
    zero_channels: int,
    rows: int,
) -> bool:
    """Whether the flat GEMM's operand is the activation itself, reshaped (a view, no copy): a 1x1
    stride-1 convolution, unpadded, over channels none of them added (``zero_channels``), with no zero
    rows added (ResNet-50's 1x1 convolutions copied 14 MB of activations per inference into the layout
    they already had)."""
    whole = image[0] * image[1] == rows
    return tuple(kernel) == (1, 1) and stride == 1 and not any(padding) and not zero_channels and whole


def patch_width(kernel_w: int, channels: int) -> int:
    """The part of a patch one window row fills: its KW*C pixels' channels, up to a power of two."""
    return max(PAIR, 1 << (kernel_w * channels - 1).bit_length())


def patch_rows(kernel_h: int, width: int, multiple: int) -> int:
    """The window rows of a patch, zero ones past the window's ``kernel_h`` up to a patch of a multiple of
    ``multiple`` (AMX's step: a rest would load a second tile configuration and the accumulators twice
    per call; SqueezeNet's 3x16 patches over 48 ran at 136 GFLOP/s)."""
    return max(kernel_h, -(-kernel_h * width // multiple) * multiple // width)


def pack_patch_weight(weight: np.ndarray, window_rows: int | None = None) -> np.ndarray:
    """HWIO [KH, KW, C, N] -> [N/16, rows*width/2, 16, 2]: a dense layer's packed weight over patches,
    each window row's ``patch_width`` (a zero row where KW*C is odd), ``window_rows`` rows (zero ones past KH)."""
    kh, kw, c, n = weight.shape
    width = patch_width(kw, c)
    rows = np.pad(weight.reshape(kh, kw * c, n), [(0, (window_rows or kh) - kh), (0, width - kw * c), (0, 0)])
    return pack_dense_weight(rows.reshape(-1, n))


def bf16_patches(
    data: te.Tensor,
    kernel: tuple[int, int],
    stride: int,
    padding: tuple[int, int, int, int],
    rows: int,
    channels: int,
    window_rows: int | None = None,
) -> te.Tensor:
    """The patches of NHWC data (bf16, its image rows flat: [N, H, W*C]) under a KH x KW window:
    [N, rows, ``window_rows``, width], each window row's KW*C pixels' channels (contiguous in the image
    row) in a row of ``patch_width``; rows past the output positions and window rows past KH are zero. A
    kernel of its own: reshaped to [N, rows, window_rows*width] (free), the input of a dense product by
    ``pack_patch_weight``'s weight."""
    batch, height, width = int(data.shape[0]), int(data.shape[1]), int(data.shape[2]) // channels
    (kernel_h, kernel_w), (top, left, bottom, right) = kernel, padding
    out_h, out_w = out_extent(height, top, bottom, kernel_h, stride), out_extent(width, left, right, kernel_w, stride)

    def patch(n, q, window_row, j):
        y = q // out_w * stride + window_row - top
        pixel = (q % out_w * stride - left) * channels + j  # of the image row, channels innermost
        inside = tvm.tirx.all(
            q < out_h * out_w, window_row < kernel_h, j < kernel_w * channels, y >= 0, y < height, pixel >= 0
        )
        value = data[n, y, pixel]
        return tvm.tirx.if_then_else(tvm.tirx.all(inside, pixel < width * channels), value, tvm.tirx.const(0, BF16))

    shape = (batch, rows, window_rows or kernel_h, patch_width(kernel_w, channels))
    return te.compute(shape, patch, name="bf16_patches")


def padded_image_extent(
    image: tuple[int, int],
    kernel: tuple[int, int],
    stride: int,
    padding: tuple[int, int, int, int],
    rows: int,
    channels: int,
    window_rows: int,
) -> tuple[int, int]:
    """(rows, pixels) of the padded image that ``bf16_padded_patches`` reads its ``rows`` positions'
    patches from, every read inside it: zero rows below for the window rows past KH and the positions
    past the image's (their weights and results are zero or dropped), zero pixels to the right for a
    patch row's width past KW*C."""
    (height, width), kernel_w, (top, left, bottom, right) = image, kernel[1], padding
    out_w = out_extent(width, left, right, kernel_w, stride)
    last_row = (rows - 1) // out_w * stride + window_rows
    length = (out_w - 1) * stride * channels + patch_width(kernel_w, channels)
    return max(height + top + bottom, last_row), max(width + left + right, -(-length // channels))


def bf16_padded_image(data: te.Tensor, padding: tuple[int, int, int, int], extent: tuple[int, int]) -> te.Tensor:
    """An NCHW fp32 image (a model's input) channels-last in bf16 and zero-padded: [N, rows, pixels, C]
    (``padded_image_extent``), pixel (y, x) at (y + top, x + left); its rows flat, a view, are what
    ``bf16_padded_patches`` reads. A network's first convolution reads the model's input through it: the
    transpose to channels-last, the cast and the padding in one kernel, whose copy is what the
    transpose alone costs. (Indexed by pixel and channel, not by position in the flat row: a division
    and a test per value there ran at 7.6 GB/s.)"""
    batch, channels, height, width = (int(d) for d in data.shape)
    top, left = padding[0], padding[1]

    def value(n, row, pixel, c):
        y, x = row - top, pixel - left
        inside = tvm.tirx.all(y >= 0, y < height, x >= 0, x < width)
        return tvm.tirx.if_then_else(inside, data[n, c, y, x].astype(BF16), tvm.tirx.const(0, BF16))

    # a fixed design space (parallel rows, the channels' short loop innermost): MetaSchedule's own, one
    # candidate deep, vectorised MobileNetV2's across pixels and channels, a test and a gather per lane (260 us)
    return te.compute((batch, *extent, channels), value, name=PADDED_IMAGE, attrs={"schedule_rule": BF16_COPY_RULE})


def bf16_padded_patches(
    padded: te.Tensor, kernel_w: int, stride: int, out_w: int, rows: int, channels: int, window_rows: int
) -> te.Tensor:
    """``bf16_patches``'s patches read from ``bf16_padded_image``'s image, without a condition: each
    patch row a contiguous run of the padded image's row (a vector copy; the conditional form's
    per-element tests kept MobileNetV2's 3x3 patches at 4 G values/s)."""
    width = patch_width(kernel_w, channels)

    def patch(n, q, window_row, j):
        return padded[n, q // out_w * stride + window_row, q % out_w * stride * channels + j]

    return te.compute((int(padded.shape[0]), rows, window_rows, width), patch, name="bf16_patches")


def bf16_patches_product(
    by_position: te.Tensor, packed: te.Tensor, image: tuple[int, int], outputs: int, unit: str, flops: float
) -> te.Tensor:
    """The product of the patches ([N, rows, KH*width], ``bf16_patches`` reshaped) by the packed weight,
    gathered back to the image [N, OH, OW, ``outputs``] in the same kernel: a reshape after it would be
    a kernel of its own, and the convolution's epilogue (bias, activation, the next cast) with it, a
    pass over the whole fp32 output (ResNet-50's 112x112x64: 0.1 ms)."""
    out_h, out_w = image
    gemm = bf16_dense(by_position, packed, None, unit, flops)
    return te.compute(
        (int(by_position.shape[0]), out_h, out_w, outputs),
        lambda n, y, x, o: gemm[n, y * out_w + x, o],
        name="bf16_rows",
    )


def window_run(kernel_w: int, channels: int, unit: str) -> int | None:
    """The values a micro-kernel call reads of each window row in place (``bf16_conv2d_image_windows``):
    on AMX a step's ``STEP_VALUES`` (None where a window row's KW*C are more), on ``vdpbf16ps`` the KW*C
    values up to a whole pair."""
    values = kernel_w * channels
    if unit == AMX:
        return STEP_VALUES if values <= STEP_VALUES else None
    return values + values % PAIR


def image_windows_extent(
    image: tuple[int, int],
    kernel: tuple[int, int],
    stride: int,
    padding: tuple[int, int, int, int],
    columns: int,
    channels: int,
    run: int,
) -> tuple[int, int]:
    """(rows, pixels) of the padded image ``bf16_conv2d_image_windows`` reads its ``columns`` output
    columns' windows from, every read inside it (the last column's ``run`` of values), its pixels a
    multiple of the stride (a window row's taps are whole tile rows apart)."""
    (height, width), (kernel_h, _), (top, left, bottom, right) = image, kernel, padding
    out_h = out_extent(height, top, bottom, kernel_h, stride)
    rows = max(height + top + bottom, (out_h - 1) * stride + kernel_h)
    pixels = max(width + left + right, (columns - 1) * stride + -(-run // channels))
    return rows, -(-pixels // stride) * stride


def pack_window_rows_weight(weight: np.ndarray, run: int) -> np.ndarray:
    """HWIO [KH, KW, C, N] -> [KH, 1, N/16, run/2, 16, 2]: each window row's KW*C values (as they lie in
    an image row, channels innermost), zeros after them up to ``run`` (``window_run``)."""
    kh, kw, c, n = weight.shape
    rows = np.pad(weight.reshape(kh, 1, kw * c, n), [(0, 0), (0, 0), (0, run - kw * c), (0, 0)])
    return pack_conv_weight(rows, run)


def bf16_conv2d_image_windows(
    flat: te.Tensor,
    packed: te.Tensor,
    image: tuple[int, int, int, int],
    stride: int,
    unit: str,
    flops: float,
) -> te.Tensor:
    """The convolution of the padded image (``bf16_padded_image``, flat: [N, rows * pixels * C]) by
    ``pack_window_rows_weight``'s weight: [N, out_h, columns, outputs] in fp32 (``image``: out_h,
    columns, pixels, C), output (y, x)'s window row r the run of values (``window_run``) from pixel
    (y * stride + r, x * stride) on. The values past a window row's KW*C meet zero weights (finite: the
    image's own or its padding)."""
    out_h, columns, pixels, channels = image
    kernel_h, outputs, run = int(packed.shape[0]), int(packed.shape[2]) * LANES, int(packed.shape[3]) * PAIR
    overlap, row_columns = stride * channels, pixels // stride  # a tile row's values, an image row's tile rows
    ry = te.reduce_axis((0, kernel_h), "ry")
    rc = te.reduce_axis((0, run), "rc")
    return te.compute(
        (int(flat.shape[0]), out_h, columns, outputs),
        lambda n, y, x, o: te.sum(
            flat[n, ((y * stride + ry) * row_columns + x) * overlap + rc].astype(F32)
            * packed[ry, 0, o // LANES, rc // PAIR, o % LANES, rc % PAIR].astype(F32),
            axis=[ry, rc],
        ),
        name="bf16_conv2d",
        attrs={**gemm_attrs(flops, unit), WINDOW_ANNOTATION: row_columns, OVERLAP_ANNOTATION: overlap},
    )
