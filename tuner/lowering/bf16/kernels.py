"""The TE compute of bfloat16 products by packed weights (``tuner.lowering.bf16.products`` puts them in a
model): a dense layer and a channels-last convolution, from bf16 operands into fp32, annotated for
the design spaces of ``tuner.spaces.bf16_rule``; the weights' packing.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np
import tvm
from tvm import te

from codegen.amx_dot import STEP_VALUES
from codegen.bf16_dot import AMX, AVX512, LANES, PAIR
from tuner.spaces.bf16_product import gemm_attrs, packed_product, product_flops
from tuner.spaces.bf16_rule import PHASE_ANNOTATION, STRIDE_ANNOTATION, WINDOW_ANNOTATION

BF16 = "bfloat16"
F32 = "float32"


def to_bf16(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float32).astype(ml_dtypes.bfloat16)


def _padded(weight: np.ndarray, axis: int, multiple: int) -> np.ndarray:
    """``weight`` with zeros appended along ``axis`` up to a multiple of ``multiple``."""
    missing = -weight.shape[axis] % multiple
    if not missing:
        return weight
    widths = [(0, 0)] * weight.ndim
    widths[axis] = (0, missing)
    return np.pad(weight, widths)


def pack_dense_weight(weight: np.ndarray) -> np.ndarray:
    """[K, N] -> [N/16, K/2, 16, 2] (N padded with zero outputs to a multiple of 16)."""
    weight = _padded(weight, 1, LANES)
    k, n = weight.shape
    return np.ascontiguousarray(weight.reshape(k // PAIR, PAIR, n // LANES, LANES).transpose(2, 0, 3, 1))


def pack_conv_weight(weight: np.ndarray, channel_multiple: int = PAIR) -> np.ndarray:
    """HWIO [KH, KW, C, N] -> [KH, KW, N/16, C/2, 16, 2] (C padded with zero channels to a multiple of
    ``channel_multiple``, an even count at least; N with zero outputs to a multiple of 16)."""
    weight = _padded(_padded(weight, 2, channel_multiple), 3, LANES)
    kh, kw, c, n = weight.shape
    return np.ascontiguousarray(weight.reshape(kh, kw, c // PAIR, PAIR, n // LANES, LANES).transpose(0, 1, 4, 2, 5, 3))


def _rows_padded(data: te.Tensor, rows: int) -> te.Tensor:
    """``data`` [..., R, K] with zero rows up to ``rows``."""
    given = int(data.shape[-2])
    return te.compute(
        (*data.shape[:-2], rows, data.shape[-1]),
        lambda *i: tvm.tirx.if_then_else(i[-2] < given, data[i], tvm.tirx.const(0, BF16)),
        name="bf16_pad",
    )


def bf16_dense(
    data: te.Tensor, packed: te.Tensor, rows: int | None = None, unit: str = AVX512, flops: float | None = None
) -> te.Tensor:
    """data [..., R, K] (bf16) times the packed weight [N/16, K/2, 16, 2]: [..., R, N] in fp32, or
    [..., ``rows``, N] with zero rows added (``padded_rows``); computed on ``unit``."""
    if flops is None:
        flops = product_flops(data, packed)  # of the rows given, before any zero rows are added
    if rows is not None and rows != int(data.shape[-2]):
        data = _rows_padded(data, rows)
    return packed_product(data, packed, unit, flops)


def out_extent(size: int, before: int, after: int, kernel: int, stride: int) -> int:
    return (size + before + after - kernel) // stride + 1


def conv2d_flops(batch: int, out_h: int, out_w: int, outputs: int, kernel: tuple[int, int], channels: int) -> float:
    """A convolution's multiply-adds, twice: ``channels`` read per window tap into each of ``outputs`` (a
    grouped convolution: a group's channels, the outputs of all its groups)."""
    return 2.0 * batch * out_h * out_w * outputs * kernel[0] * kernel[1] * channels


def _phase_reader(
    data: te.Tensor, channels: int, stride: int, padding: tuple[int, int, int, int], groups: int
) -> tuple[Callable, tuple[int, int, int, int, int]]:
    """``value(n, y, phase, x, c)`` of ``_phases``'s activation, and its shape."""
    batch, height, width, given = (int(d) for d in data.shape)
    top, left, bottom, right = padding
    columns = -(-(width + left + right) // stride)
    group_given, group_padded = given // groups, channels // groups

    def value(n, y, phase, x, c):
        inside = [y >= top, y < top + height, x * stride + phase >= left, x * stride + phase < left + width]
        if groups == 1:  # the expression of before grouping: ungrouped kernels and their database keys unchanged
            inside.append(c < given)
        else:
            inside.append(c % group_padded < group_given)
            c = c // group_padded * group_given + c % group_padded
        return tvm.tirx.if_then_else(
            tvm.tirx.all(*inside), data[n, y - top, x * stride + phase - left, c], tvm.tirx.const(0, BF16)
        )

    return value, (batch, height + top + bottom, stride, columns, channels)


def _phases(
    data: te.Tensor, channels: int, stride: int, padding: tuple[int, int, int, int], groups: int = 1
) -> te.Tensor:
    """The activation padded (``channels``: with zero channels up to that count, at the end of each of its
    ``groups`` groups) [N, H', W', C'] as [N, H', stride, W'/stride, C']: column x*stride + r at
    [.., r, x, ..]. A strided convolution's output columns then read consecutive columns of one phase,
    so that a register tile's rows are evenly spaced in memory, as the micro-kernel reads them."""
    value, shape = _phase_reader(data, channels, stride, padding, groups)
    return te.compute(shape, value, name="bf16_pad")


def _flat_phases(
    data: te.Tensor, channels: int, stride: int, padding: tuple[int, int, int, int], groups: int
) -> tuple[te.Tensor, int, int]:
    """``_phases``'s activation laid out flat, [N * H' * stride * phase, C'] (row ((n * H' + y) * stride + r)
    * phase + x holds column x * stride + r of padded row y), its rows H' and ``phase``, the columns of one:
    a window tap's rows then lie a fixed number of rows from its tile's first (``amx_dot.Window``)."""
    value, (batch, height, _, phase, _) = _phase_reader(data, channels, stride, padding, groups)

    def flat(f, c):
        x, rest = f % phase, f // phase
        return value(rest // (stride * height), rest // stride % height, rest % stride, x, c)

    return te.compute((batch * height * stride * phase, channels), flat, name="bf16_pad"), height, phase


def _output_extents(
    data: te.Tensor, kernel: tuple[int, int], stride: int, padding: tuple[int, int, int, int], columns: int | None
) -> tuple[int, int, int, tuple[int, int, int, int]]:
    """A convolution's output rows and columns, the columns it computes (``columns``, past the image's:
    ``padded_rows``) and the padding that computes them (zero columns added on the right)."""
    height, width = int(data.shape[1]), int(data.shape[2])
    top, left, bottom, right = padding
    out_h = out_extent(height, top, bottom, kernel[0], stride)
    out_w = out_extent(width, left, right, kernel[1], stride)
    if columns is None or columns == out_w:
        return out_h, out_w, out_w, padding
    return out_h, out_w, columns, (top, left, bottom, right + (columns - out_w) * stride)


def _copies_activation(data: te.Tensor, channels: int, stride: int, padding: tuple[int, int, int, int]) -> bool:
    """Whether a convolution reads its activation through a copy (``_phases``): strided, padded, or with zero
    channels added; else it reads the activation itself."""
    return stride > 1 or any(padding) or channels != int(data.shape[3])


def _tap_reader(
    data: te.Tensor, packed_channels: int, stride: int, padding: tuple[int, int, int, int], groups: int = 1
) -> Callable:
    """How a window tap reads the activation: ``read(n, y, x, ry, rx, c)`` at output (y, x), ``c`` one of the
    ``packed_channels`` of each of ``groups`` groups, one group after the other (zero channels past a group's)."""
    if _copies_activation(data, packed_channels * groups, stride, padding):
        phases = _phases(data, packed_channels * groups, stride, padding, groups)
        return lambda n, y, x, ry, rx, c: phases[n, y * stride + ry, rx % stride, x + rx // stride, c]
    return lambda n, y, x, ry, rx, c: data[n, y + ry, x + rx, c]


def bf16_conv2d_nhwc(
    data: te.Tensor,
    packed: te.Tensor,
    stride: int,
    padding: tuple[int, int, int, int],
    columns: int | None = None,
    unit: str = AVX512,
) -> te.Tensor:
    """NHWC data (bf16) convolved with the packed HWIO weight: NHWC fp32; ``columns``: output columns
    computed, past the image's (zero columns added on the right, ``padded_rows``); computed on ``unit``."""
    batch, channels = int(data.shape[0]), int(data.shape[3])
    kernel = (int(packed.shape[0]), int(packed.shape[1]))
    out_channels = int(packed.shape[2]) * LANES
    packed_channels = int(packed.shape[3]) * PAIR  # an odd channel count gets a zero channel
    out_h, out_w, columns, padding = _output_extents(data, kernel, stride, padding, columns)
    flops = conv2d_flops(batch, out_h, out_w, out_channels, kernel, channels)
    read = _tap_reader(data, packed_channels, stride, padding)
    ry = te.reduce_axis((0, kernel[0]), "ry")
    rx = te.reduce_axis((0, kernel[1]), "rx")
    rc = te.reduce_axis((0, packed_channels), "rc")
    return te.compute(
        (batch, out_h, columns, out_channels),
        lambda n, y, x, o: te.sum(
            read(n, y, x, ry, rx, rc).astype(F32)
            * packed[ry, rx, o // LANES, rc // PAIR, o % LANES, rc % PAIR].astype(F32),
            axis=[ry, rx, rc],
        ),
        name="bf16_conv2d",
        attrs=gemm_attrs(flops, unit),
    )


def pack_grouped_conv_weight(weight: np.ndarray, groups: int, channel_multiple: int = PAIR) -> np.ndarray:
    """A grouped convolution's HWIO [KH, KW, C/G, N] -> [G, KH, KW, N/G/16, C'/2, 16, 2]: each group's
    as ``pack_conv_weight`` packs a convolution's."""
    outputs = weight.shape[3] // groups
    return np.stack(
        [pack_conv_weight(weight[..., g * outputs : (g + 1) * outputs], channel_multiple) for g in range(groups)]
    )


def bf16_grouped_conv2d_nhwc(
    data: te.Tensor,
    packed: te.Tensor,
    stride: int,
    padding: tuple[int, int, int, int],
    outputs: int,
    columns: int | None = None,
    unit: str = AVX512,
) -> te.Tensor:
    """NHWC data (bf16) convolved by a grouped convolution's weights packed per group
    (``pack_grouped_conv_weight``): NHWC fp32, ``outputs`` of each group, group after group. One product
    whose groups are a spatial axis between the image rows and the tile's rows (image columns), so that
    ``bf16_rule`` tiles it as any convolution and each parallel task takes one group's tiles; the outputs
    gathered back to channels-last in the write-back."""
    batch, channels = int(data.shape[0]), int(data.shape[3])
    groups, kernel = int(packed.shape[0]), (int(packed.shape[1]), int(packed.shape[2]))
    computed = int(packed.shape[3]) * LANES  # a group's outputs, with zero ones up to a multiple of 16
    packed_channels = int(packed.shape[4]) * PAIR
    out_h, out_w, columns, padding = _output_extents(data, kernel, stride, padding, columns)
    flops = conv2d_flops(batch, out_h, out_w, groups * outputs, kernel, channels // groups)
    attrs = gemm_attrs(flops, unit)
    # where the activation is copied anyway, the copy laid out flat: one AMX call sums a tile's window
    windowed = kernel[0] * kernel[1] > 1 and _copies_activation(data, packed_channels * groups, stride, padding)
    if unit == AMX and packed_channels % STEP_VALUES == 0 and windowed:
        flat, height, phase = _flat_phases(data, packed_channels * groups, stride, padding, groups)
        pitch = stride * phase  # rows of the flat activation per padded image row

        def read(n, y, x, ry, rx, c):
            return flat[(n * height + y * stride + ry) * pitch + rx % stride * phase + x + rx // stride, c]

        attrs = {**attrs, WINDOW_ANNOTATION: pitch, STRIDE_ANNOTATION: stride, PHASE_ANNOTATION: phase}
    else:
        read = _tap_reader(data, packed_channels, stride, padding, groups)
    ry = te.reduce_axis((0, kernel[0]), "ry")
    rx = te.reduce_axis((0, kernel[1]), "rx")
    rc = te.reduce_axis((0, packed_channels), "rc")
    product = te.compute(
        (batch, out_h, groups, columns, computed),
        lambda n, y, g, x, o: te.sum(
            read(n, y, x, ry, rx, g * packed_channels + rc).astype(F32)
            * packed[g, ry, rx, o // LANES, rc // PAIR, o % LANES, rc % PAIR].astype(F32),
            axis=[ry, rx, rc],
        ),
        name="bf16_conv2d",
        attrs=attrs,
    )
    return te.compute(
        (batch, out_h, out_w, groups * outputs),
        lambda n, y, x, c: product[n, y, c // outputs, x, c % outputs],
        name="bf16_groups",
    )


def bf16_batch_matmul(a: te.Tensor, b: te.Tensor, rows: int, unit: str) -> te.Tensor:
    """a [..., M, K] times b [..., K, N], two bf16 activations (attention's products), into fp32: ``a``
    over ``rows`` rows (zero rows past M, a zero column where K is odd), ``b`` packed
    [..., N/16, K/2, 16, 2] as a weight is, both in the kernel; the result gathered back to [..., M, N].
    The operands come cast (by the kernels that produce them): a cast inside would round in a built
    candidate and not in the unscheduled reference it is checked against, whose bf16 buffers inside
    a kernel TVM keeps in fp32."""
    *lead, m, k = (int(d) for d in a.shape)
    n = int(b.shape[-1])
    reduction, blocks = k + k % PAIR, -(-n // LANES)

    def cast(*i):
        inside = tvm.tirx.all(i[-2] < m, i[-1] < k)
        return tvm.tirx.if_then_else(inside, a[i], tvm.tirx.const(0, BF16))

    def pack(*i):
        *batch, block, pair, lane, half = i
        row, column = pair * PAIR + half, block * LANES + lane
        inside = tvm.tirx.all(row < k, column < n)
        return tvm.tirx.if_then_else(inside, b[(*batch, row, column)], tvm.tirx.const(0, BF16))

    rows_cast = te.compute((*lead, rows, reduction), cast, name="bf16_pad")
    packed = te.compute((*lead, blocks, reduction // PAIR, LANES, PAIR), pack, name="bf16_pack")
    r = te.reduce_axis((0, reduction), "r")
    gemm = te.compute(
        (*lead, rows, blocks * LANES),
        lambda *i: te.sum(
            rows_cast[(*i[:-1], r)].astype(F32)
            * packed[(*i[:-2], i[-1] // LANES, r // PAIR, i[-1] % LANES, r % PAIR)].astype(F32),
            axis=r,
        ),
        name="bf16_dense",
        attrs=gemm_attrs(2.0 * float(np.prod(lead, dtype=np.float64)) * m * n * k, unit),
    )
    return te.compute((*lead, m, n), lambda *i: gemm[i], name="bf16_rows")
